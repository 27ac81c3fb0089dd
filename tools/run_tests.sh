#!/usr/bin/env bash
# The README's test command: installs requirements, then runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -r requirements.txt
python3 -m pip install -q --no-deps -r requirements-monailabel.txt
exec python3 -m pytest -q -p no:cacheprovider tests "$@"
