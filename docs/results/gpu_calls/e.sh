#!/usr/bin/env bash
# PROMISE12 (acdc_fast budget): Baseline and Ours (full) at 4/6/8 scans, Mean Teacher and MT + Ours at 4 scans, seed 0, LR 1e-4
export BIM_GIT_COMMIT=8e539a1
mkdir -p /tmp/w && python -m data_prep promise12 /tmp/data/promise12_nifti/training_data /tmp/w/promise12 --workers 16 > /tmp/w/prep.log 2>&1 || { cat /tmp/w/prep.log; exit 1; }
timeout 510 python tools/experiments.py run promise12_fast --dataset_dir /tmp/w/promise12 --work_dir /tmp/w/promise12_fast --jobs 10 --seeds 0 --lrs 1e-4 --only '["pre_full","ft_*","mt_*_n4_*"]'
tar czf $OUT/e.tgz -C /tmp/w --exclude='*.pt' --exclude=tensorboard promise12_fast
