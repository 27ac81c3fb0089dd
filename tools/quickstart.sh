#!/usr/bin/env bash
# Quick start on the embedded synthetic demo data (CPU is fine; a few minutes on 2 idle cores):
#   1. installs requirements.txt,
#   2. pre-trains the U-Net without labels (pretrain_bim; the demo data is generated on first use),
#   3. fine-tunes it on ONE labelled synthetic scan (finetune_seg, LV task) and evaluates the test scans.
# Outputs go to ./runs/quickstart (override with OUT=...).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/quickstart}"
# A U-Net of half the paper's widths keeps the demo quick on a CPU; FEATURES="[32,64,128,256,512,32]" is the paper's.
FEATURES="${FEATURES:-[16,32,64,128,256,16]}"
# BatchNorm's running statistics of the authors' U-Net average over ~100 steps (momentum 0.01): runs of a few hundred
# steps need 0.1 for evaluation to see them settled
BN="--bn_momentum 0.1"
python3 -m pip install -q -r requirements.txt

python3 -m monai.bundle run --config_file bundles/pretrain_bim/configs/train.json \
  --output_dir "$OUT/pretrain" --epochs 4 --iters_per_epoch 10 --warmup_epochs 1 \
  --crop_size 96 --scans_per_batch 2 --log_every 10 --panel_every 40 --progress_bar False --features "$FEATURES" $BN

if [ -f bundles/finetune_seg/configs/train.json ]; then
  python3 -m monai.bundle run --config_file bundles/finetune_seg/configs/train.json \
    --pretrained "$OUT/pretrain/model.pt" --task lv --labelled_scans 1 \
    --output_dir "$OUT/finetune" --epochs 6 --iters_per_epoch 40 --warmup_epochs 1 --batch_size 8 \
    --crop_size 96 --learning_rate 3e-3 --progress_bar False --features "$FEATURES" $BN
  python3 -m monai.bundle run --config_file "['bundles/finetune_seg/configs/train.json','bundles/finetune_seg/configs/evaluate.json']" \
    --task lv --labelled_scans 1 --output_dir "$OUT/finetune" --features "$FEATURES"
fi
echo "quickstart done: cluster panels in $OUT/pretrain/panels, weights in $OUT/pretrain/model.pt"
[ -d "$OUT/finetune/eval" ] && echo "test Dice: $(cat "$OUT"/finetune/eval/*summary.json)"
exit 0
