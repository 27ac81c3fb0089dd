#!/usr/bin/env bash
# Calls G1, G2 (nvidia-h100-x2, 2026-11-26): ACDC, 1 labelled scan, LV/RV/Myo, seeds 0/1/2, LR 1e-4, every Table 1 row,
# spread over the two GPUs. G2 is the same command on the still-warm machine: the runner resumes. Usage: g.sh SECONDS
export BIM_GIT_COMMIT=${BIM_GIT_COMMIT:?set BIM_GIT_COMMIT} TORCHINDUCTOR_COMPILE_THREADS=4
D=/tmp/w/acdc; W=/tmp/w/acdc_fast_g
[ -f $D/datalist.json ] || python -m data_prep acdc /tmp/data/acdc_u8/training $D --workers 16 > /tmp/w_prep.log 2>&1 || { cat /tmp/w_prep.log; exit 1; }
timeout ${1:-480} python tools/experiments.py run acdc_fast --dataset_dir $D --work_dir $W --jobs 20 --gpus 2 --seeds 0,1,2 \
  --counts 1 --lrs 1e-4 --methods "Baseline,IIC (Dec),Contrast (Enc),Ours (Dec) MI+CC,Contrast (Enc) + Ours (Dec),Mean Teacher,MT + Ours" \
  > $W.out 2>&1; echo "runner rc $?"
grep -E "^(done|FAILED|skip)|runs," $W.out | tail -80
python tools/experiments.py collect $W > /dev/null 2>&1
tar czf $OUT/${2:-g}.tgz -C /tmp/w --exclude='*.pt' --exclude=tensorboard --exclude='*.png' acdc_fast_g acdc_fast_g.out
tar czf $OUT/${2:-g}_panels.tgz -C /tmp/w $(cd /tmp/w && ls -d acdc_fast_g/runs/pre_*/panels/clusters_latest.png 2>/dev/null)
