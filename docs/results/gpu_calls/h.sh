#!/usr/bin/env bash
# Call H (nvidia-h100-x2, 2026-11-26): the ACDC headline (pre-train full + LV/RV/Myo x 1/2/4 fine-tunes + the baseline)
# timed on one H100 each, seed 1 on GPU 0 (--jobs 10) and seed 2 on GPU 1 (--jobs 19), each in a fresh work dir.
export BIM_GIT_COMMIT=${BIM_GIT_COMMIT:?set BIM_GIT_COMMIT} TORCHINDUCTOR_COMPILE_THREADS=4
D=/tmp/w/acdc
[ -f $D/datalist.json ] || python -m data_prep acdc /tmp/data/acdc_u8/training $D --workers 16 > /tmp/w_prep.log 2>&1 || { cat /tmp/w_prep.log; exit 1; }
headline() { CUDA_VISIBLE_DEVICES=$1 timeout ${4:-540} python tools/experiments.py run acdc_fast --dataset_dir $D --work_dir /tmp/w/headline_s$2 \
  --jobs $3 --seeds $2 --lrs 1e-4 --methods "Baseline,Contrast (Enc) + Ours (Dec)" > /tmp/w/headline_s$2.out 2>&1; echo "seed $2 rc $?"; }
headline 0 1 10 & headline 1 2 19 & wait
for s in 1 2; do grep -E "^(done|FAILED)|runs,|wall_s" /tmp/w/headline_s$s.out; done
tar czf $OUT/h.tgz -C /tmp/w --exclude='*.pt' --exclude=tensorboard --exclude='*.png' headline_s1 headline_s2 headline_s1.out headline_s2.out
