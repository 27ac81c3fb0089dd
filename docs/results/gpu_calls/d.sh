#!/usr/bin/env bash
# LR chosen on validation: Baseline and Contrast (Enc) + Ours (Dec) at 2e-5 and 5e-4, LV/RV/Myo 1 scan, seed 0; MT diagnostics
export BIM_GIT_COMMIT=8e539a1
mkdir -p /tmp/w && python -m data_prep acdc /tmp/data/acdc_u8/training /tmp/w/acdc --workers 16 > /tmp/w/prep.log 2>&1
(timeout 500 bash gpu_jobs/diag2.sh > /tmp/w/diag2.out 2>&1 &)
timeout 505 python tools/experiments.py run acdc_fast --dataset_dir /tmp/w/acdc --work_dir /tmp/w/acdc_fast --jobs 10 --seeds 0 --lrs '[2e-5,5e-4]' --counts 1 --methods '["Baseline","Contrast (Enc) + Ours (Dec)"]'
sleep 3; cat /tmp/w/diag2.out
tar czf $OUT/d.tgz -C /tmp/w --exclude='*.pt' --exclude=tensorboard acdc_fast diag
