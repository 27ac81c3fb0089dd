#!/usr/bin/env bash
# Planned calls K0, K1, K2 (written in the fourth session, not run yet): usage k.sh SECONDS NAME; chain each call on
# the warm machine within 30 s. Needs an nvidia-h100-x2 lease (2 GPUs). K0 (`k.sh 60 k0`) only prepares the data, so
# that K1 can give the headline almost the whole 600 s call (J1 projected it at about 550 s).
# GPU 0, K1: the ACDC headline (seed 1), first thing on a fresh machine, alone on its GPU, with its own empty
#   TorchInductor cache and the whole call (the ≤ 10-minute target on an H100).
# GPU 1, K1 and K2: does 2.5x longer pre-training (5,000 iterations) lift Ours (Dec) above the baseline? LV, 1 scan,
#   seeds 0/1/2, the preset's fine-tuning (runs tagged `pre5k`).
# GPU 0, K2: does gamma augmentation (gamma_range [0.5, 2]) help 1-scan generalisation? Baseline and the full method,
#   LV/RV/Myo, seeds 0/1/2 (runs tagged `gamma`).
export BIM_GIT_COMMIT=${BIM_GIT_COMMIT:?set BIM_GIT_COMMIT} TORCHINDUCTOR_COMPILE_THREADS=4
T=${1:-570}; NAME=${2:-k}; START=$(date +%s)
D=/tmp/w/acdc; mkdir -p /tmp/w
left() { echo $(( T - ($(date +%s) - START) )); }
[ -f $D/datalist.json ] || python -m data_prep acdc /tmp/data/acdc_u8/training $D --workers 16 > /tmp/w_prep.log 2>&1 || { cat /tmp/w_prep.log; exit 1; }
nvidia-smi -L
[ "$NAME" = k0 ] && { echo "data ready: $(ls $D/images | wc -l) scans"; exit 0; }
grid() {  # grid GPU WORK_DIR [runner args...]: one runner on one physical GPU until the call's time is up
  local gpu=$1 work=$2; shift 2
  CUDA_VISIBLE_DEVICES=$gpu timeout $(( $(left) - 20 )) python tools/experiments.py run acdc_fast --dataset_dir $D \
    --work_dir $work --lrs 1e-4 --counts 1 "$@" >> $work.out 2>&1; echo "grid rc $? (GPU $gpu, $work)"; }
if [ ! -d /tmp/w/headline_k ]; then
  ( CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_CACHE_DIR=/tmp/w/inductor_headline timeout $(( $(left) - 20 )) \
      python tools/experiments.py run acdc_fast --dataset_dir $D --work_dir /tmp/w/headline_k --jobs 10 --seeds 1 \
      --lrs 1e-4 --methods "Baseline,Contrast (Enc) + Ours (Dec)" > /tmp/w/headline_k.out 2>&1; echo "headline rc $?" ) &
else
  grid 0 /tmp/w/acdc_gamma --jobs 19 --seeds 0,1,2 --methods "Baseline,Contrast (Enc) + Ours (Dec)" \
    --tag gamma --overrides '{"gamma_range": [0.5, 2.0]}' &
fi
grid 1 /tmp/w/acdc_pre5k --jobs 4 --tasks lv --seeds 0,1,2 --methods "Ours (Dec) MI+CC" \
  --tag pre5k --pretrain_overrides '{"epochs": 25, "warmup_epochs": 5}'
wait
grep -hE "runs,|wall_s|^(done|FAILED)" /tmp/w/headline_k.out /tmp/w/acdc_pre5k.out /tmp/w/acdc_gamma.out 2>/dev/null
for w in headline_k acdc_pre5k acdc_gamma; do [ -d /tmp/w/$w/runs ] && python tools/experiments.py collect /tmp/w/$w > /dev/null 2>&1; done
tar czf $OUT/$NAME.tgz -C /tmp/w --exclude='*.pt' --exclude=tensorboard --exclude='*.png' --exclude='inductor*' \
  $(cd /tmp/w && ls -d headline_k* acdc_pre5k* acdc_gamma* 2>/dev/null)
tar czf $OUT/${NAME}_png.tgz -C /tmp/w $(cd /tmp/w && ls acdc_*/runs/ft_*_lv_n1_s0_*/eval/*_predictions.png acdc_*/runs/pre_*/panels/clusters_latest.png 2>/dev/null)
