#!/usr/bin/env bash
# Calls I1, I2, ... (fourth session, 2026-11-26): does Adam in place of RAdam restore the paper's ordering of the fast
# protocol at 1 labelled ACDC scan?  Usage: i.sh SECONDS NAME.  Each call resumes the same work dir (chain the calls on
# the warm machine). On an H100 host, the first call also times the headline on GPU 0 with a cold compile cache.
# Note: the `--gpus 1` below means "one GPU" (GPU 0), not "GPU 1", so in call I1 both halves shared GPU 0. Since then
# the runner counts --gpus within the parent's CUDA_VISIBLE_DEVICES; j.sh sets CUDA_VISIBLE_DEVICES instead.
export BIM_GIT_COMMIT=${BIM_GIT_COMMIT:?set BIM_GIT_COMMIT} TORCHINDUCTOR_COMPILE_THREADS=4
T=${1:-500}; NAME=${2:-i}; START=$(date +%s)
D=/tmp/w/acdc; W=/tmp/w/acdc_fast_i; mkdir -p /tmp/w
left() { echo $(( T - ($(date +%s) - START) )); }
[ -f $D/datalist.json ] || python -m data_prep acdc /tmp/data/acdc_u8/training $D --workers 16 > /tmp/w_prep.log 2>&1 || { cat /tmp/w_prep.log; exit 1; }
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $GPU"; nvidia-smi -L
ADAM='{"optimizer#_target_": "torch.optim.Adam"}'
ROWS1="Baseline,Ours (Dec) MI+CC,Contrast (Enc) + Ours (Dec)"
ROWS2="$ROWS1,IIC (Dec),Contrast (Enc)"
grid() {  # grid SECONDS GPUS METHODS [extra args...]
  local t=$1 g=$2 m=$3; shift 3
  timeout $t python tools/experiments.py run acdc_fast --dataset_dir $D --work_dir $W --jobs 20 --gpus $g --counts 1 \
    --lrs 1e-4 --methods "$m" "$@" >> $W.out 2>&1; echo "grid rc $? ($m $*)"; }
if [[ $GPU == *H100* && ! -d /tmp/w/headline_h100 ]]; then
  # GPU 0: the headline (seed 1), alone on its GPU, with its own empty TorchInductor cache; GPU 1: the Adam grid.
  ( CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_CACHE_DIR=/tmp/w/inductor_headline timeout $(( $(left) - 25 )) \
      python tools/experiments.py run acdc_fast --dataset_dir $D --work_dir /tmp/w/headline_h100 --jobs 10 --seeds 1 \
      --lrs 1e-4 --methods "Baseline,Contrast (Enc) + Ours (Dec)" > /tmp/w/headline_h100.out 2>&1; echo "headline rc $?" ) &
  grid $(( $(left) - 25 )) 1 "$ROWS1" --seeds 0,1 --tag adam --overrides "$ADAM"
  wait; grep -E "runs,|wall_s|FAILED" /tmp/w/headline_h100.out
else
  grid $(( $(left) - 25 )) 2 "$ROWS2" --seeds 0,1,2 --tag adam --overrides "$ADAM"
fi
grep -E "^(done|FAILED)|runs," $W.out | tail -60
python tools/experiments.py collect $W > /dev/null 2>&1
python - $W/results.csv <<'PY'
import csv, sys, collections
m = collections.defaultdict(list)
for r in csv.DictReader(open(sys.argv[1])):
    if r["test_dice"]: m[(r["method"], r["task"])].append(float(r["test_dice"]))
for k in sorted(m): print(f"{k[0]:38s}{k[1]:4s} n={len(m[k])} mean {sum(m[k])/len(m[k]):.3f}  {[round(v, 3) for v in m[k]]}")
PY
tar czf $OUT/$NAME.tgz -C /tmp/w --exclude='*.pt' --exclude=tensorboard --exclude='*.png' --exclude='inductor*' \
  $(cd /tmp/w && ls -d acdc_fast_i acdc_fast_i.out headline_h100 headline_h100.out 2>/dev/null)
tar czf $OUT/${NAME}_png.tgz -C /tmp/w $(cd /tmp/w && ls acdc_fast_i/runs/ft_*_n1_s0_*/eval/*_predictions.png acdc_fast_i/runs/pre_*/panels/clusters_latest.png 2>/dev/null)
