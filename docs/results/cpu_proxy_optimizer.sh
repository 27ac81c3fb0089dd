#!/usr/bin/env bash
# CPU proxy of the fast protocol's fine-tuning (2 cores, ~3 min a run): 10 shared ACDC patients, LV, 1 labelled scan,
# tiny U-Net (8-128), 128-pixel crops, 8 x 100 iterations; RAdam vs Adam. Data: python -m data_prep acdc ../shared/data/acdc/training /tmp/acdc10
cd "$(dirname "$0")/../.."  # the repository root
one() { n=$1; shift
  python -m monai.bundle run --config_file bundles/finetune_seg/configs/train.json --dataset_dir /tmp/acdc10 --task lv --labelled_scans 1 --features "[8,16,32,64,128,8]" --crop_size 128 --epochs 8 --iters_per_epoch 100 --warmup_epochs 1 --output_dir /tmp/cpu_ft/$n --progress_bar False --log_every 100 "$@" > /tmp/cpu_ft/$n.log 2>&1
  python -m monai.bundle run --config_file "['bundles/finetune_seg/configs/train.json','bundles/finetune_seg/configs/evaluate.json']" --dataset_dir /tmp/acdc10 --task lv --labelled_scans 1 --features "[8,16,32,64,128,8]" --output_dir /tmp/cpu_ft/$n >> /tmp/cpu_ft/$n.log 2>&1
  echo "$n val: $(grep -o 'val_mean_dice: [0-9.]*' /tmp/cpu_ft/$n.log | awk '{printf "%.3f ", $2}') loss: $(grep -o 'train_loss: [0-9.]*' /tmp/cpu_ft/$n.log | awk '{printf "%s ", $2}') test: $(grep -h '"mean"' /tmp/cpu_ft/$n/eval/*summary.json)"
}
mkdir -p /tmp/cpu_ft
one radam1e-4 --learning_rate 1e-4
one adam1e-4 --learning_rate 1e-4 --optimizer#_target_ torch.optim.Adam
one radam1e-3 --learning_rate 1e-3
