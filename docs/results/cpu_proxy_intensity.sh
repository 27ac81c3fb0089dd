#!/usr/bin/env bash
# CPU proxy (2 cores): does stronger intensity augmentation help a 1-scan fine-tune generalise to other scans?
# Full ACDC (100 patients, prepared with python -m data_prep acdc <ACDC>/training /tmp/acdc384), LV, 1 labelled scan,
# seeds 0/1/2, tiny U-Net (8-128), 128-pixel crops, 8 x 100 iterations, Adam 1e-4; the preset's jitter
# (contrast ±0.1, brightness ±0.1) vs a strong one (contrast ±0.5, brightness ±0.2). Prints val per epoch and test Dice.
cd "$(dirname "$0")/../.."  # the repository root
D=${DATA:-/tmp/acdc384}; O=/tmp/cpu_int
one() { n=$1; s=$2; shift 2
  common=(--dataset_dir $D --task lv --labelled_scans 1 --split_seed $s --seed $s --features "[8,16,32,64,128,8]" --output_dir $O/$n)
  OMP_NUM_THREADS=1 python -m monai.bundle run --config_file bundles/finetune_seg/configs/train.json "${common[@]}" --crop_size 128 \
    --epochs 8 --iters_per_epoch 100 --warmup_epochs 1 --progress_bar False --log_every 100 --save_every 100000 \
    --learning_rate 1e-4 --optimizer#_target_ torch.optim.Adam "$@" > $O/$n.log 2>&1
  OMP_NUM_THREADS=1 python -m monai.bundle run --config_file "['bundles/finetune_seg/configs/train.json','bundles/finetune_seg/configs/evaluate.json']" \
    "${common[@]}" >> $O/$n.log 2>&1
  echo "$n val: $(grep -o 'val_mean_dice: [0-9.]*' $O/$n.log | awk '{printf "%.3f ", $2}') test: $(python -c "import json,glob; print(round(json.load(open(glob.glob('$O/$n/eval/*summary.json')[0]))['mean'], 3))")"
}
mkdir -p $O
for s in 0 1 2; do
  one default_s$s $s &
  one strong_s$s $s --contrast 0.5 --brightness 0.2 &
  wait
done
