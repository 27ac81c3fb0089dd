#!/usr/bin/env bash
# Regenerates README.md and the PNGs of this folder (or of OUT) from the CSVs, the notes in report_note.md and
# report_panels_note.md (the cluster maps' section: figures made by hand from other pre-trainings) and the
# datalist of the full ACDC set (for the test Dice by patient group; "none" leaves that section out):
#   bash docs/results/acdc_paper_length/report.sh DST/datalist.json|none [OUT]
# Then run ../acdc_fast/report.sh: it counts its tables' order against this report's table_cells.json.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DATALIST=${1:?usage: report.sh DST/datalist.json|none [OUT]}; OUT=$(realpath -m "${2:-$HERE}")
GROUP_ARGS=()
[ "$DATALIST" = none ] || GROUP_ARGS=(--groups "$(realpath "$DATALIST")" --group_focus NOR)
cd "$HERE"
"${PYTHON:-python}" ../../../tools/experiments.py report \
  "[../acdc_fast/results_calls_J_long.csv.gz, ../acdc_fast/results_calls_L_pre10k.csv.gz, ../acdc_fast/results_call_M4_long.csv.gz, ../acdc_fast/results_calls_N.csv.gz, results_calls_P.csv.gz, results_calls_Q.csv.gz, results_calls_R.csv.gz, results_calls_T.csv.gz, results_calls_W.csv.gz, results_calls_X.csv.gz, results_calls_Y.csv.gz, results_calls_rows.csv.gz, results_calls_decdiag.csv.gz, results_calls_decdiag2.csv.gz, results_calls_Z.csv.gz, results_calls_mt2.csv.gz, results_calls_mt3.csv.gz, results_calls_mt3b.csv.gz, results_calls_mt4.csv.gz, results_calls_mtlr.csv.gz, results_calls_mtlr12.csv.gz, results_calls_rows2a.csv.gz, results_calls_rows2b.csv.gz, results_calls_rows2c.csv.gz]" \
  --per_scan "[results_calls_P_per_scan.csv.gz, results_calls_Q_per_scan.csv.gz, results_calls_R_per_scan.csv.gz, results_calls_T_per_scan.csv.gz, results_calls_W_per_scan.csv.gz, results_calls_X_per_scan.csv.gz, results_calls_Y_per_scan.csv.gz, results_calls_rows_per_scan.csv.gz, results_calls_decdiag_per_scan.csv.gz, results_calls_decdiag2_per_scan.csv.gz, results_calls_Z_per_scan.csv.gz, results_calls_mt2_per_scan.csv.gz, results_calls_mt3_per_scan.csv.gz, results_calls_mt3b_per_scan.csv.gz, results_calls_mt4_per_scan.csv.gz, results_calls_mtlr_per_scan.csv.gz, results_calls_mtlr12_per_scan.csv.gz, results_calls_rows2a_per_scan.csv.gz, results_calls_rows2b_per_scan.csv.gz, results_calls_rows2c_per_scan.csv.gz]" \
  --out_dir "$OUT" --title "ACDC at the paper's training lengths" --note "$(cat report_note.md)" --panels_note "$(cat report_panels_note.md)" \
  --methods '["Baseline", "IIC (Dec)", "Contrast (Enc)", "Ours (Dec) MI+CC", "Contrast (Enc) + Ours (Dec)", "Baseline [dicece]", "Baseline [long]", "Baseline [longnoflip]", "Contrast (Enc) + Ours (Dec) [pre10k]", "Ours (Dec) MI+CC [pre10k]", "Baseline [longaug]", "Contrast (Enc) + Ours (Dec) [pre10kaug]", "Contrast (Enc) + Ours (Dec) [onepre]", "Contrast (Enc) + Ours (Dec) [samepre]", "Contrast (Enc) + Ours (Dec) [samepre0]", "Mean Teacher [tsep]", "Mean Teacher [joint]", "Mean Teacher [cg]", "Mean Teacher [ct]", "Mean Teacher [gamma]", "Mean Teacher [unlab]", "Mean Teacher [nogamma]", "Mean Teacher [nogamma-labbn]", "Mean Teacher [nogamma-w0.5]", "MT + Ours", "MT + Ours [onepre]", "MT + Ours [nogamma]", "Ours (Dec) MI+CC [rep]", "Ours (Dec) MI+CC [cc0]", "Ours (Dec) MI+CC [dl3]", "Ours (Dec) MI+CC [nogam]", "Ours (Dec) MI+CC [k10]", "Ours (Dec) MI+CC [edgeg]", "Contrast (Enc) + Ours (Dec) [con01]"]' \
  --relabel '{"Baseline [longaug]": "Baseline", "Mean Teacher [tsep]": "Mean Teacher", "Contrast (Enc) + Ours (Dec) [pre10kaug]": "Contrast (Enc) + Ours (Dec)"}' \
  --paper_lr 1e-4 \
  --per_scan_methods '["Baseline", "IIC (Dec)", "Contrast (Enc)", "Ours (Dec) MI+CC", "Contrast (Enc) + Ours (Dec)", "Mean Teacher", "MT + Ours", "Baseline [dicece]", "Contrast (Enc) + Ours (Dec) [samepre]"]' \
  --pair_with '{"Contrast (Enc) + Ours (Dec)": ["Baseline", "Contrast (Enc)", "Ours (Dec) MI+CC"], "MT + Ours": "Mean Teacher", "Mean Teacher [joint]": "Mean Teacher", "Mean Teacher [cg]": "Mean Teacher", "Mean Teacher [ct]": "Mean Teacher [cg]", "MT + Ours [onepre]": "Mean Teacher", "Contrast (Enc) + Ours (Dec) [samepre]": "MT + Ours", "Contrast (Enc) + Ours (Dec) [samepre0]": "Contrast (Enc) + Ours (Dec)", "Mean Teacher [gamma]": "Mean Teacher", "Mean Teacher [unlab]": "Mean Teacher", "Baseline [longnoflip]": "Baseline [long]", "Contrast (Enc) + Ours (Dec) [pre10k]": "Baseline [long]", "Ours (Dec) MI+CC [pre10k]": "Baseline [long]"}' \
  --lr_pools '{"Contrast (Enc) + Ours (Dec), [samepre] and [samepre0]": ["Contrast (Enc) + Ours (Dec) [samepre]", "Contrast (Enc) + Ours (Dec) [samepre0]"]}' \
  "${GROUP_ARGS[@]}"
