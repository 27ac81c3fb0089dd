#!/usr/bin/env bash
# CPU diagnosis (2 cores): does the labelled scan move the teacher's targets on the unlabelled views when they share
# its train-mode BatchNorm batch (meanteacher_seg's joint_teacher_batch true, the default), and does seed 0's scan
# (patient034 ED, where the default Mean Teacher fell below the baseline in calls Y) move them more than seed 1's
# (patient096 ES, where it rose 20 points above)? Two paper-width U-Nets fine-tuned on the CPU (finetune_seg, LV,
# 1 labelled scan of seed 0 / seed 1, 224-pixel crops, 6 x 50 iterations, LR 5e-4), then cpu_proxy_teacher_bn.py
# for the labelled scans of seeds 0-2 with each. Full ACDC prepared with python -m data_prep acdc <ACDC>/training DST.
#   DATA=DST bash docs/results/cpu_proxy_teacher_bn.sh
cd "$(dirname "$0")/../.."  # the repository root
D=${DATA:-/tmp/acdc384}; O=${OUT_DIR:-/tmp/cpu_teacher_bn}
mkdir -p $O
for S in 0 1; do
  [ -f $O/ft_seed$S/model.pt ] || python -m monai.bundle run --config_file bundles/finetune_seg/configs/train.json \
    --dataset_dir $D --task lv --labelled_scans 1 --split_seed $S --seed $S --output_dir $O/ft_seed$S \
    --epochs 6 --iters_per_epoch 50 --warmup_epochs 1 --learning_rate 5e-4 --progress_bar False \
    --save_every 100000 > $O/ft_seed$S.log 2>&1 || { tail -5 $O/ft_seed$S.log; exit 1; }
  echo "network fine-tuned on seed $S: val $(grep -o 'val_mean_dice: [0-9.]*' $O/ft_seed$S.log | awk '{printf "%.3f ", $2}')"
  python docs/results/cpu_proxy_teacher_bn.py --dataset_dir $D --checkpoint $O/ft_seed$S/model.pt --task lv --seeds 0,1,2
done
