#!/usr/bin/env bash
# Regenerates README.md and the PNGs of this folder (or of OUT) from the CSVs and the note in report_note.md:
#   bash docs/results/acdc_fast/report.sh [OUT]
# The cluster panels need the pre-training folders as runs/NAME beside the CSVs (not in the repository; without
# them the cluster_panels.png already in OUT is kept and linked). It also writes table_cells.json (each table's means).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$(realpath -m "${1:-$HERE}")
cd "$HERE"
"${PYTHON:-python}" ../../../tools/experiments.py report \
  "[results_calls_A-D.csv.gz, results_call_H_seed1.csv.gz, results_call_G.csv.gz, results_call_I_adam.csv.gz, results_calls_J_long.csv.gz, results_call_L_cq2k.csv.gz, results_calls_L_pre10k.csv.gz, results_call_M4_long.csv.gz, results_call_M5_pre5k.csv.gz, results_calls_N.csv.gz]" \
  --out_dir "$OUT" --title "ACDC, fast protocol" --note "$(cat report_note.md)" \
  --order_against ../acdc_paper_length/table_cells.json --order_against_name "our runs at the paper's lengths (../acdc_paper_length)" \
  --pair_with '{"Baseline [longaug]": "Baseline [long]", "Baseline [longnoflip]": "Baseline [long]", "Contrast (Enc) + Ours (Dec) [long]": "Baseline [long]", "Ours (Dec) MI+CC [long]": "Baseline [long]", "Contrast (Enc) + Ours (Dec) [pre10k]": "Baseline [long]", "Ours (Dec) MI+CC [pre10k]": "Baseline [long]", "Contrast (Enc) + Ours (Dec) [pre10kaug]": "Baseline [longaug]"}'
