#!/usr/bin/env bash
# Regenerates README.md and the PNGs of this folder (or of OUT) from results.csv.gz and the note in report_note.md:
#   bash docs/results/promise12_fast/report.sh [OUT]
# The cluster panels need the pre-training folder as runs/NAME beside the CSV (not in the repository; without it the
# section and cluster_panels.png are left out, and the committed ones stay as they were drawn).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$(realpath -m "${1:-$HERE}")
cd "$HERE"
"${PYTHON:-python}" ../../../tools/experiments.py report results.csv.gz --out_dir "$OUT" \
  --title "PROMISE12, fast protocol (promise12_fast), seed 0, one NVIDIA H100" --note "$(cat report_note.md)"
