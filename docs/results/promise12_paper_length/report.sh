#!/usr/bin/env bash
# Regenerates README.md and the PNGs of this folder (or of OUT) from the CSVs and the note in report_note.md:
#   bash docs/results/promise12_paper_length/report.sh [OUT]
# The cluster panels need the pre-training folder as runs/pre_full beside the CSV (not in the repository; without it
# the committed cluster_panels.png is kept as it was drawn).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$(realpath -m "${1:-$HERE}")
cd "$HERE"
"${PYTHON:-python}" ../../../tools/experiments.py report "[results_calls_p12.csv.gz, results_calls_p12b.csv.gz, results_calls_p12c.csv.gz, results_calls_p12d.csv.gz, results_calls_p12e.csv.gz]" --per_scan "[results_calls_p12_per_scan.csv.gz, results_calls_p12b_per_scan.csv.gz, results_calls_p12c_per_scan.csv.gz, results_calls_p12d_per_scan.csv.gz, results_calls_p12e_per_scan.csv.gz]" \
  --out_dir "$OUT" --title "PROMISE12 at the paper's training lengths (promise12_paper), 4 x H100" --note "$(cat report_note.md)" \
  --pair_with '{"MT + Ours": "Mean Teacher"}'
