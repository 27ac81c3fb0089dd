#!/usr/bin/env bash
# Regenerates README.md and the PNGs of this folder (or of OUT) from the CSVs and the note in report_note.md:
#   bash docs/results/acdc_ablation/report.sh [OUT]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$(realpath -m "${1:-$HERE}")
cd "$HERE"
"${PYTHON:-python}" ../../../tools/experiments.py report "[results_calls_R_alpha.csv.gz, results_calls_T_ablations.csv.gz, results_calls_abl2_alpha.csv.gz, results_calls_abl3_lambda_cc_k.csv.gz, results_calls_abl4_third.csv.gz]" \
  --per_scan "[results_calls_R_alpha_per_scan.csv.gz, results_calls_T_ablations_per_scan.csv.gz, results_calls_abl2_alpha_per_scan.csv.gz, results_calls_abl3_lambda_cc_k_per_scan.csv.gz, results_calls_abl4_third_per_scan.csv.gz]" \
  --out_dir "$OUT" --title "ACDC ablations (alpha, lambda_CC, K), 5,000 pre-training iterations, fast fine-tuning" \
  --note "$(cat report_note.md)"
