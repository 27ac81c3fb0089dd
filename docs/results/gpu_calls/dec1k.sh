#!/usr/bin/env bash
# Calls D1-D2 (fifteenth session, one nvidia-h100-x1, the session's last 4 minutes of device time): do Ours (Dec)
# MI+CC's clusters already differ from the full method's after 1,000 pre-training iterations, and does lambda_CC or a
# wider gamma in T change them? Four short pre-trainings of the paper's U-Net, two at a time on one GPU, uncompiled
# (no compile time to pay), then their cluster_quality.json, logs and last panels to $OUT. Usage, on the GPU machine
# (bash ../shared/device/prepare.sh acdc, carry .device):
#   bash .device/setup.sh > /tmp/setup.log 2>&1 && source .device/env.sh && bash docs/results/gpu_calls/dec1k.sh
cd "$(dirname "$0")/../../.."  # the repository root
D=/tmp/w/acdc; CFG=bundles/pretrain_bim/configs
[ -f $D/datalist.json ] || python -m data_prep acdc /tmp/data/acdc_u8/training $D --workers 16 > /tmp/prep.log 2>&1
one() {  # one NAME VARIANT [OVERRIDES...]: 5 x 200 iterations, one warm-up epoch
  local name=$1 variant=$2; shift 2
  timeout 165 python -m monai.bundle run --config_file "['$CFG/train.json','$CFG/variants/$variant.json']" \
    --dataset_dir $D --output_dir /tmp/w/$name --epochs 5 --iters_per_epoch 200 --warmup_epochs 1 --compile False \
    --progress_bar False --panel_every 1000 --save_every 10000 --log_every 200 "$@" > $OUT/$name.log 2>&1
  cp /tmp/w/$name/cluster_quality.json $OUT/cq_$name.json; cp /tmp/w/$name/panels/clusters_latest.png $OUT/panel_$name.png
}
one cc0.0 ours_mi_cc --lambda_cc 0.0 & one cc1.0 ours_mi_cc --lambda_cc 1.0 & wait          # call D1 (160 s)
one full full & one g4 ours_mi_cc --train#pair_transform#gamma_range "[0.25,4.0]" & wait   # call D2 (155 s)
grep -h "cluster quality on" $OUT/*.log
