#!/usr/bin/env bash
# Table 1 rows IIC (Dec), Contrast (Enc), Ours (Dec) MI+CC: pre-training + LV 1 scan, seed 0, LR 1e-4 (acdc_fast)
export BIM_GIT_COMMIT=8e539a1
mkdir -p /tmp/w && python -m data_prep acdc /tmp/data/acdc_u8/training /tmp/w/acdc --workers 16 > /tmp/w/prep.log 2>&1
timeout 510 python tools/experiments.py run acdc_fast --dataset_dir /tmp/w/acdc --work_dir /tmp/w/acdc_fast --jobs 10 --seeds 0 --lrs 1e-4 --counts 1 --tasks lv --methods '["IIC (Dec)","Contrast (Enc)","Ours (Dec) MI+CC"]'
tar czf $OUT/c.tgz -C /tmp/w --exclude='*.pt' --exclude=tensorboard acdc_fast
