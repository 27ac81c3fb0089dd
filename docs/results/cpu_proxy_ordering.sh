#!/usr/bin/env bash
# CPU proxy of the fast protocol's ordering problem (2 cores, ~30 min): does decoder-only MI+CC pre-training
# (Ours (Dec)) fall below random initialisation with RAdam, and does Adam change that? Tiny U-Net (8-128),
# 128-pixel crops (pre-training: 96, 3 scans x 3 partitions a batch, 3 x 100 iterations), fine-tuning LV with 1 labelled scan, 8 x 100 iterations.
# Data: python -m data_prep acdc <100 ACDC patients> /tmp/acdc384     Usage: cpu_proxy_ordering.sh [DATA] [WORK]
cd "$(dirname "$0")/../.."  # the repository root
D=${1:-/tmp/acdc384}; W=${2:-/tmp/cpu_order}; F='[8,16,32,64,128,8]'; mkdir -p $W
for v in ours_mi_cc full; do
  python -m monai.bundle run --config_file "['bundles/pretrain_bim/configs/train.json','bundles/pretrain_bim/configs/variants/$v.json']" \
    --dataset_dir $D --output_dir $W/pre_$v --features "$F" --crop_size 96 --scans_per_batch 3 --epochs 3 --iters_per_epoch 100 --warmup_epochs 1 \
    --progress_bar False --log_every 20 --panel_every 300 > $W/pre_$v.log 2>&1 || { echo "pre_$v failed"; tail -5 $W/pre_$v.log; }
done
ft() { local n=$1 init=$2; shift 2
  python -m monai.bundle run --config_file bundles/finetune_seg/configs/train.json --dataset_dir $D --task lv --labelled_scans 1 \
    --features "$F" --crop_size 128 --epochs 8 --iters_per_epoch 100 --warmup_epochs 1 --learning_rate 1e-4 --pretrained $init \
    --output_dir $W/$n --progress_bar False --log_every 100 "$@" > $W/$n.log 2>&1
  python -m monai.bundle run --config_file "['bundles/finetune_seg/configs/train.json','bundles/finetune_seg/configs/evaluate.json']" \
    --dataset_dir $D --task lv --labelled_scans 1 --features "$F" --output_dir $W/$n >> $W/$n.log 2>&1
  echo "$n best val $(python -c "import json; print(round(json.load(open('$W/$n/best_metric.json'))['value'], 3))") test $(python -c "import json,glob; print(round(json.load(open(glob.glob('$W/$n/eval/*summary.json')[0]))['mean'], 3))")"
}
for opt in radam adam; do
  extra=(); [ $opt = adam ] && extra=(--optimizer#_target_ torch.optim.Adam)
  ft ${opt}_random None "${extra[@]}"
  ft ${opt}_ours_mi_cc $W/pre_ours_mi_cc/model.pt "${extra[@]}"
  ft ${opt}_full $W/pre_full/model.pt "${extra[@]}"
done
