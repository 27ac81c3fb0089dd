#!/usr/bin/env bash
# Planned calls K0-K3 (written in the fourth session, not run yet) on an nvidia-h100-x2 lease (2 GPUs); chain each
# call on the warm machine within 30 s. Usage: k.sh SECONDS NAME.
#   k.sh 300 k0  data preparation, and the fine-tuning step's throughput with and without CUDA graphs
#                (tools/benchmark_meanteacher.py --method supervised, compile_mode default vs reduce-overhead);
#   k.sh 580 k1  the ACDC headline (seed 1) alone on the host: GPU 0, its own empty TorchInductor cache, no other
#                work competing for the CPUs while it compiles (J1 projected it at about 555 s with company);
#   k.sh 580 k2  GPU 0: gamma augmentation (gamma_range [0.5, 2]) for Baseline and the full method, LV/RV/Myo,
#                1 scan, seeds 0/1/2 (`[gamma]`); GPU 1: Ours (Dec) after a 5,000-iteration pre-training, LV, 1 scan,
#                seeds 0/1/2 (`[pre5k]`, the preset's fine-tuning); GPU 0 also pre-trains Ours (Dec) for 2,000
#                iterations (no fine-tunes), so that its cluster scores compare with pre5k's and pre_full's;
#   k.sh 400 k3  the same as k2, if device time remains: the runner resumes what k2 left.
# Every pre-training also writes cluster_quality.json, which the CSVs carry as cq_* columns.
export BIM_GIT_COMMIT=${BIM_GIT_COMMIT:?set BIM_GIT_COMMIT} TORCHINDUCTOR_COMPILE_THREADS=4
T=${1:-580}; NAME=${2:-k}; START=$(date +%s)
D=/tmp/w/acdc; mkdir -p /tmp/w
left() { echo $(( T - ($(date +%s) - START) )); }
[ -f $D/datalist.json ] || python -m data_prep acdc /tmp/data/acdc_u8/training $D --workers 16 > /tmp/w_prep.log 2>&1 || { cat /tmp/w_prep.log; exit 1; }
nvidia-smi -L
case $NAME in
  k0) echo "data ready: $(ls $D/images | wc -l) scans"
      # the fine-tuning step (batch 5, 224 x 224), compiled, with and without CUDA graphs, one per GPU at once
      B="python tools/benchmark_meanteacher.py --method supervised --batch_size 5 --unlabelled_batch_size 0 --compile True"
      CUDA_VISIBLE_DEVICES=0 $B > /tmp/w/bench_default.json 2> /tmp/w/bench_default.err &
      CUDA_VISIBLE_DEVICES=1 $B --compile_mode reduce-overhead > /tmp/w/bench_cudagraphs.json 2> /tmp/w/bench_cudagraphs.err &
      wait; tail -n 2 /tmp/w/bench_*.json /tmp/w/bench_*.err; exit 0 ;;
  k1) CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_CACHE_DIR=/tmp/w/inductor_headline timeout $(( $(left) - 8 )) \
        python tools/experiments.py run acdc_fast --dataset_dir $D --work_dir /tmp/w/headline_k --jobs 10 --seeds 1 \
        --lrs 1e-4 --methods "Baseline,Contrast (Enc) + Ours (Dec)" > /tmp/w/headline_k.out 2>&1; echo "headline rc $?"
      grep -E "runs,|wall_s|FAILED" /tmp/w/headline_k.out
      tar czf $OUT/$NAME.tgz -C /tmp/w --exclude='*.pt' --exclude=tensorboard --exclude='*.png' headline_k headline_k.out
      exit 0 ;;
esac
grid() {  # grid GPU WORK_DIR [runner args...]: one runner on one physical GPU until the call's time is up
  local gpu=$1 work=$2; shift 2
  CUDA_VISIBLE_DEVICES=$gpu timeout $(( $(left) - 20 )) python tools/experiments.py run acdc_fast --dataset_dir $D \
    --work_dir $work --lrs 1e-4 --counts 1 "$@" >> $work.out 2>&1; echo "grid rc $? (GPU $gpu, $work)"; }
grid 0 /tmp/w/acdc_gamma --jobs 19 --seeds 0,1,2 --methods "Baseline,Contrast (Enc) + Ours (Dec)" \
  --tag gamma --overrides '{"gamma_range": [0.5, 2.0]}' &
grid 0 /tmp/w/acdc_gamma --jobs 1 --methods "Ours (Dec) MI+CC" --only '["pre_ours_mi_cc"]' &  # cq_* at 2,000 it.
grid 1 /tmp/w/acdc_pre5k --jobs 4 --tasks lv --seeds 0,1,2 --methods "Ours (Dec) MI+CC" \
  --tag pre5k --pretrain_overrides '{"epochs": 25, "warmup_epochs": 5}'
wait
grep -hE "runs,|^(done|FAILED)" /tmp/w/acdc_pre5k.out /tmp/w/acdc_gamma.out 2>/dev/null
for w in acdc_pre5k acdc_gamma; do [ -d /tmp/w/$w/runs ] && python tools/experiments.py collect /tmp/w/$w > /dev/null 2>&1; done
tar czf $OUT/$NAME.tgz -C /tmp/w --exclude='*.pt' --exclude=tensorboard --exclude='*.png' \
  $(cd /tmp/w && ls -d acdc_pre5k* acdc_gamma* 2>/dev/null)
tar czf $OUT/${NAME}_png.tgz -C /tmp/w $(cd /tmp/w && ls acdc_*/runs/ft_*_lv_n1_s0_*/eval/*_predictions.png acdc_*/runs/pre_*/panels/clusters_latest.png 2>/dev/null)
