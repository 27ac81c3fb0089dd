#!/usr/bin/env bash
# Calls J1, J2 (fourth session, nvidia-h100-x2 lease): usage j.sh SECONDS NAME; chain J2 on the warm machine.
# GPU 0 (J1 only): the ACDC headline, seed 1, alone on its GPU, with its own empty TorchInductor cache.
# GPU 1: does the paper's fine-tuning length (50 x 200 = 10,000 iterations, 10 warm-up epochs; RAdam, LR 1e-4 as
# the fast preset) lift the 1-scan baseline and put Ours (Dec) above it?  LV, seeds 0 and 1.
# J2 also gives GPU 0 the full method at that length (its own pre-training).
export BIM_GIT_COMMIT=${BIM_GIT_COMMIT:?set BIM_GIT_COMMIT} TORCHINDUCTOR_COMPILE_THREADS=4
T=${1:-540}; NAME=${2:-j}; START=$(date +%s)
D=/tmp/w/acdc; W=/tmp/w/acdc_fast_j; mkdir -p /tmp/w
left() { echo $(( T - ($(date +%s) - START) )); }
[ -f $D/datalist.json ] || python -m data_prep acdc /tmp/data/acdc_u8/training $D --workers 16 > /tmp/w_prep.log 2>&1 || { cat /tmp/w_prep.log; exit 1; }
nvidia-smi -L
LONG='{"epochs": 50, "iters_per_epoch": 200, "warmup_epochs": 10}'
long() {  # long GPU METHODS: the LV grid at the paper's length on one physical GPU
  CUDA_VISIBLE_DEVICES=$1 timeout $(( $(left) - 30 )) python tools/experiments.py run acdc_fast --dataset_dir $D \
    --work_dir $W --jobs 6 --tasks lv --counts 1 --seeds 0,1 --lrs 1e-4 --methods "$2" --tag long --overrides "$LONG" \
    >> $W.gpu$1.out 2>&1; echo "long rc $? (GPU $1: $2)"; }
if [ ! -d /tmp/w/headline_h100 ]; then
  ( CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_CACHE_DIR=/tmp/w/inductor_headline timeout $(( $(left) - 30 )) \
      python tools/experiments.py run acdc_fast --dataset_dir $D --work_dir /tmp/w/headline_h100 --jobs 10 --seeds 1 \
      --lrs 1e-4 --methods "Baseline,Contrast (Enc) + Ours (Dec)" > /tmp/w/headline_h100.out 2>&1; echo "headline rc $?" ) &
else
  long 0 "Contrast (Enc) + Ours (Dec)" &
fi
long 1 "Baseline,Ours (Dec) MI+CC"
wait
grep -E "runs,|wall_s|FAILED|^\{" /tmp/w/headline_h100.out
grep -hE "^(done|FAILED)|runs," $W.gpu*.out
python tools/experiments.py collect $W > /dev/null 2>&1
for r in $W/runs/ft_*; do echo "$(basename $r): $(grep -c 'val_mean_dice:' $r/log.txt) epochs, val: $(grep -oP 'val_mean_dice: \K[0-9.]+' $r/log.txt | tr '\n' ' ')"; done
tar czf $OUT/$NAME.tgz -C /tmp/w --exclude='*.pt' --exclude=tensorboard --exclude='*.png' --exclude='inductor*' \
  $(cd /tmp/w && ls -d acdc_fast_j acdc_fast_j.gpu*.out headline_h100 headline_h100.out 2>/dev/null)
tar czf $OUT/${NAME}_png.tgz -C /tmp/w $(cd /tmp/w && ls acdc_fast_j/runs/ft_*/eval/*_predictions.png acdc_fast_j/runs/pre_*/panels/clusters_latest.png 2>/dev/null)
