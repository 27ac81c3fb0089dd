#!/usr/bin/env bash
# CPU proxy (2 cores, ~30 min): do the clusters of Ours (Dec) MI+CC and of the full method mean the same structure in
# every scan after a longer pre-training? Tiny U-Net (8-128), 96-pixel crops, 3 scans x 3 partitions a batch,
# 15 x 100 iterations each (both at once, one thread each), then pretrain_bim's evaluate.json on the 16 test scans
# (cluster_quality_test.json: best single-cluster Dice pooled over scans and per scan, NMI).
# Data: python -m data_prep acdc <100 ACDC patients> /tmp/acdc384     Usage: cpu_proxy_cluster_quality.sh [DATA] [WORK]
cd "$(dirname "$0")/../.."  # the repository root
D=${1:-/tmp/acdc384}; W=${2:-/tmp/cpu_cq}; F='[8,16,32,64,128,8]'; mkdir -p $W
one() { v=$1
  cfg="['bundles/pretrain_bim/configs/train.json','bundles/pretrain_bim/configs/variants/$v.json']"
  OMP_NUM_THREADS=1 python -m monai.bundle run --config_file "$cfg" --dataset_dir $D --output_dir $W/$v --features "$F" \
    --crop_size 96 --scans_per_batch 3 --epochs 15 --iters_per_epoch 100 --warmup_epochs 2 --progress_bar False \
    --log_every 100 --panel_every 500 --save_every 500 > $W/$v.log 2>&1 || { echo "$v failed"; tail -5 $W/$v.log; return; }
  cfg="['bundles/pretrain_bim/configs/train.json','bundles/pretrain_bim/configs/variants/$v.json','bundles/pretrain_bim/configs/evaluate.json']"
  OMP_NUM_THREADS=1 python -m monai.bundle run --config_file "$cfg" --dataset_dir $D --output_dir $W/$v --features "$F" \
    >> $W/$v.log 2>&1
  grep -h "cluster quality on" $W/$v.log | sed "s/^.*cluster quality/$v: cluster quality/"
}
one ours_mi_cc & one full & wait
