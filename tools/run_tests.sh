#!/usr/bin/env bash
# The README's test command: installs requirements, then runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -r requirements.txt
exec python3 -m pytest -q -p no:cacheprovider tests "$@"
