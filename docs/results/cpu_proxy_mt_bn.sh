#!/usr/bin/env bash
# CPU proxy (2 cores): why does Mean Teacher from random init score below the supervised baseline at 1 labelled scan
# (calls W, seed 0: LV 28.9 against the baseline's 64.7)? meanteacher_seg, LV, 1 labelled scan, seed ${SEED:-0}, tiny U-Net (8-128),
# 128-pixel crops, 8 x 100 iterations, LR 1e-3, the ACDC default augmentation. Four runs that differ in one thing each:
#   supervised     the labelled cross-entropy only (no unlabelled forward);
#   mt_w0          Mean Teacher with consistency weight 0: the same loss, plus the student's forward of the unlabelled
#                  batch (which updates BatchNorm's running statistics) and the teacher;
#   mt_w0_labbn    mt_w0 with unlabelled_bn_stats false: the unlabelled forward leaves the running statistics alone;
#   mt_w1          Mean Teacher at consistency weight 1 (meanteacher_seg 0.4.0's L_MT: twice calls W's term).
# Needs meanteacher_seg >= 0.4.0 (the runs quoted in docs/results/README.md, Next steps 4, ran at commit 9782131).
# Full ACDC prepared with python -m data_prep acdc <ACDC>/training /tmp/acdc384. Prints val per epoch and test Dice.
cd "$(dirname "$0")/../.."  # the repository root
D=${DATA:-/tmp/acdc384}; O=${OUT_DIR:-/tmp/cpu_mt_bn}; S=${SEED:-0}
one() { n=$1; shift
  common=(--dataset_dir $D --task lv --labelled_scans 1 --split_seed $S --seed $S --features "[8,16,32,64,128,8]"
          --output_dir $O/$n)
  OMP_NUM_THREADS=1 python -m monai.bundle run --config_file bundles/meanteacher_seg/configs/train.json "${common[@]}" \
    --crop_size 128 --epochs 8 --iters_per_epoch 100 --warmup_epochs 1 --rampup_epochs 2 --progress_bar False \
    --log_every 100 --save_every 100000 --learning_rate 1e-3 "$@" > $O/$n.log 2>&1
  OMP_NUM_THREADS=1 python -m monai.bundle run \
    --config_file "['bundles/meanteacher_seg/configs/train.json','bundles/meanteacher_seg/configs/evaluate.json']" \
    "${common[@]}" >> $O/$n.log 2>&1
  echo "$n val: $(grep -o 'val_mean_dice: [0-9.]*' $O/$n.log | awk '{printf "%.3f ", $2}') test: $(python -c "import json,glob; print(round(json.load(open(glob.glob('$O/$n/eval/*summary.json')[0]))['mean'], 3))")"
}
mkdir -p $O
one supervised --method supervised &
one mt_w0 --method mean_teacher --consistency_weight 0.0 &
wait
one mt_w0_labbn --method mean_teacher --consistency_weight 0.0 --unlabelled_bn_stats False &
one mt_w1 --method mean_teacher --consistency_weight 1.0 &
wait
