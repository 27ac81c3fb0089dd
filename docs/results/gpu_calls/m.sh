#!/usr/bin/env bash
# Calls M (sixth session, nvidia-h100-x1 leases): usage m.sh SECONDS MODE [cg]; chain each call on the warm machine.
#   m.sh 330 m0         the fine-tuning step with and without CUDA graphs: tools/benchmark_meanteacher.py alone, then
#                       6 baseline fine-tunes at once through the runner (3 x 100 iterations), default compile against
#                       --compile_mode reduce-overhead.
#   m.sh 600 headline   the ACDC headline (seed 1), its own empty TorchInductor cache, the whole GPU and 16 CPUs.
#   m.sh 600 long       Baseline [long] (the paper's fine-tuning length, LR 1e-4) at 1 scan: LV seed 2, RV and Myo
#                       seeds 0-2 (LV seeds 0/1 are call J's).
#   m.sh 600 pre10k     the full method's [pre10k] pre-training (resumed from its last checkpoint when cut), then its
#                       fine-tunes over the same 7 cells as `long` (LV seeds 0/1 are call L's).
#   m.sh 575 pre5k cg   the full method pre-trained for 5,000 iterations (25 x 200, warm-up 5: `[pre5k]`), its cluster
#                       scores, then the fast preset's LV fine-tunes at 1 scan, seeds 0-2.
#   m.sh 590 mt        (prepared, not run) the Mean Teacher step at the bundle's batch (5 + 5) with and without CUDA
#                       graphs, then MT + Ours at 1 scan (LV/RV/Myo, seeds 0-2) from a fresh fast pre-training.
#   ONLY='[...]' narrows `long` and `pre10k` to other cells (run names, fnmatch patterns; default: the 7 cells above).
#   A last argument `cg` adds --compile_mode reduce-overhead (CUDA graphs) to every fine-tune (finetune_seg >= 0.2.2
#   does so by default).
#   SECONDS counts from CALL_START when it is set: start the call's command with `export CALL_START=$(date +%s) && bash
#   .device/setup.sh ...` and pass the call's own limit, so that setup time is counted (calls M1 and M3 overran).
#   Each runner stops at SECONDS - 25 (20 s of grace for its bundles, then collection).
export BIM_GIT_COMMIT=${BIM_GIT_COMMIT:?set BIM_GIT_COMMIT} TORCHINDUCTOR_COMPILE_THREADS=4
T=${1:-600}; MODE=${2:?mode}; CG=${3:-}; START=${CALL_START:-$(date +%s)}
D=/tmp/w/acdc; mkdir -p /tmp/w
left() { echo $(( T - ($(date +%s) - START) )); }
[ -f $D/datalist.json ] || python -m data_prep acdc /tmp/data/acdc_u8/training $D --workers 16 > /tmp/w_prep.log 2>&1 || { cat /tmp/w_prep.log; exit 1; }
nvidia-smi -L; echo "data ready at $(( $(date +%s) - START )) s"
CGO=""; [ "$CG" = cg ] && CGO=', "compile_mode": "reduce-overhead"'
LONG="{\"epochs\": 50, \"iters_per_epoch\": 200, \"warmup_epochs\": 10$CGO}"
NEW=${ONLY:-'["*_lv_n1_s2_*", "*_rv_n1_*", "*_myo_n1_*", "pre_*"]'}
epoch_times() {  # per run: seconds per training epoch (ignite's "Complete. Time taken"), first epoch included
  for r in "$@"; do [ -f $r/log.txt ] && echo "$(basename $r): $(grep -oP 'Trainer - INFO - Epoch\[\d+\] Complete\. Time taken: 00:0\K[0-9:.]+' $r/log.txt | tr '\n' ' ')"; done
}
case $MODE in
m0)
  for m in default reduce-overhead; do
    a=""; [ $m = reduce-overhead ] && a="--compile_mode reduce-overhead"
    python tools/benchmark_meanteacher.py --method supervised --batch_size 5 --unlabelled_batch_size 0 \
      --iterations 200 --warmup 20 --compile True $a 2>&1 | tail -n 1
  done
  for m in default cg; do
    # the default mode named explicitly: finetune_seg >= 0.2.2 would otherwise run CUDA graphs in both groups
    o='{"epochs": 3, "iters_per_epoch": 100, "compile_mode": null}'; [ $m = cg ] && o='{"epochs": 3, "iters_per_epoch": 100, "compile_mode": "reduce-overhead"}'
    s=$(date +%s)
    timeout $(( $(left) - 15 )) python tools/experiments.py run acdc_fast --dataset_dir $D --work_dir /tmp/w/m0_$m --jobs 6 \
      --tasks lv,rv,myo --counts 1 --seeds 0,1 --lrs 1e-4 --methods Baseline --tag m0$m --overrides "$o" > /tmp/w/m0_$m.out 2>&1
    echo "$m: rc $? in $(( $(date +%s) - s )) s"; grep -E "FAILED|Error" /tmp/w/m0_$m.out | head -n 5
    epoch_times /tmp/w/m0_$m/runs/ft_*
  done
  tar czf $OUT/m0.tgz -C /tmp/w --exclude='*.pt' --exclude=tensorboard --exclude='*.png' m0_default m0_cg m0_default.out m0_cg.out
  ;;
headline)
  HO=(); [ "$CG" = cg ] && HO=(--tag cg --overrides '{"compile_mode": "reduce-overhead"}')
  TORCHINDUCTOR_CACHE_DIR=/tmp/w/inductor_headline timeout $(( $(left) - 25 )) \
    python tools/experiments.py run acdc_fast --dataset_dir $D --work_dir /tmp/w/headline_m --jobs 10 \
    --seeds 1 --lrs 1e-4 --methods "Baseline,Contrast (Enc) + Ours (Dec)" "${HO[@]}" > /tmp/w/headline_m.out 2>&1
  echo "headline rc $?"; grep -E "runs,|wall_s|FAILED" /tmp/w/headline_m.out
  tar czf $OUT/headline.tgz -C /tmp/w --exclude='*.pt' --exclude=tensorboard --exclude='*.png' headline_m headline_m.out
  ;;
long)
  timeout $(( $(left) - 25 )) python tools/experiments.py run acdc_fast --dataset_dir $D --work_dir /tmp/w/acdc_long \
    --jobs 7 --tasks lv,rv,myo --counts 1 --seeds 0,1,2 --lrs 1e-4 --methods Baseline --tag long --overrides "$LONG" \
    --only "$NEW" >> /tmp/w/acdc_long.out 2>&1
  echo "long rc $?"; grep -hE "runs,|^(start|done|FAILED)" /tmp/w/acdc_long.out | tail -n 20
  python tools/experiments.py collect /tmp/w/acdc_long > /dev/null 2>&1; epoch_times /tmp/w/acdc_long/runs/ft_*
  tar czf $OUT/long.tgz -C /tmp/w --exclude='*.pt' --exclude=tensorboard --exclude='*.png' acdc_long acdc_long.out
  ;;
pre10k)
  W=/tmp/w/acdc_pre10k
  timeout $(( $(left) - 25 )) python tools/experiments.py run acdc_fast --dataset_dir $D --work_dir $W --jobs 7 \
    --tasks lv,rv,myo --counts 1 --seeds 0,1,2 --lrs 1e-4 --methods "Contrast (Enc) + Ours (Dec)" --tag pre10k \
    --overrides "$LONG" --pretrain_overrides '{"epochs": 50, "warmup_epochs": 10, "save_every": 500}' \
    --only "$NEW" >> $W.out 2>&1
  echo "pre10k rc $?"; grep -hE "runs,|^(start|done|FAILED)" $W.out | tail -n 20
  cat $W/runs/pre_full_pre10k/cluster_quality.json 2>/dev/null | head -c 600; echo
  python tools/experiments.py collect $W > /dev/null 2>&1; epoch_times $W/runs/ft_*
  tar czf $OUT/pre10k.tgz -C /tmp/w --exclude='*.pt' --exclude=tensorboard --exclude='*.png' acdc_pre10k acdc_pre10k.out
  tar czf $OUT/pre10k_png.tgz -C /tmp/w $(cd /tmp/w && ls acdc_pre10k/runs/ft_*/eval/*_predictions.png acdc_pre10k/runs/pre_*/panels/clusters_latest.png 2>/dev/null)
  ;;
pre5k)
  W=/tmp/w/acdc_pre5k; PO=(); [ "$CG" = cg ] && PO=(--overrides '{"compile_mode": "reduce-overhead"}')
  timeout $(( $(left) - 25 )) python tools/experiments.py run acdc_fast --dataset_dir $D --work_dir $W --jobs 3 \
    --tasks lv --counts 1 --seeds 0,1,2 --lrs 1e-4 --methods "Contrast (Enc) + Ours (Dec)" --tag pre5k "${PO[@]}" \
    --pretrain_overrides '{"epochs": 25, "warmup_epochs": 5}' >> $W.out 2>&1
  echo "pre5k rc $?"; grep -hE "runs,|wall_s|^(start|done|FAILED)" $W.out | tail -n 20
  cat $W/runs/pre_full_pre5k/cluster_quality.json 2>/dev/null | head -c 600; echo
  python tools/experiments.py collect $W > /dev/null 2>&1
  tar czf $OUT/pre5k.tgz -C /tmp/w --exclude='*.pt' --exclude=tensorboard --exclude='*.png' acdc_pre5k acdc_pre5k.out
  tar czf $OUT/pre5k_png.tgz -C /tmp/w $(cd /tmp/w && ls acdc_pre5k/runs/ft_*/eval/*_predictions.png acdc_pre5k/runs/pre_*/panels/clusters_latest.png 2>/dev/null)
  ;;
mt)
  for a in "" "--compile_mode reduce-overhead"; do
    python tools/benchmark_meanteacher.py --batch_size 5 --unlabelled_batch_size 5 --iterations 200 --warmup 20 \
      --compile True $a 2>&1 | tail -n 1
  done
  W=/tmp/w/acdc_mtours
  timeout $(( $(left) - 25 )) python tools/experiments.py run acdc_fast --dataset_dir $D --work_dir $W --jobs 10 \
    --tasks lv,rv,myo --counts 1 --seeds 0,1,2 --lrs 1e-4 --methods "MT + Ours" >> $W.out 2>&1
  echo "mt rc $?"; grep -hE "runs,|wall_s|^(start|done|FAILED)" $W.out | tail -n 20
  python tools/experiments.py collect $W > /dev/null 2>&1
  tar czf $OUT/mt.tgz -C /tmp/w --exclude='*.pt' --exclude=tensorboard --exclude='*.png' acdc_mtours acdc_mtours.out
  ;;
*) echo "unknown mode $MODE"; exit 2 ;;
esac
exit 0

# M1 returned nothing: T=595 left the runner 570 s, and with setup and the 20 s of grace the call overran its 600 s.
#   A 1-second call on the still-warm machine tarred /tmp/w/headline_m.
# M2, as run (the headline with CUDA graphs, on the same warm machine; setup as above):
#   TORCHINDUCTOR_CACHE_DIR=/tmp/w/inductor_headline_cg timeout 550 python tools/experiments.py run acdc_fast
#   --dataset_dir /tmp/w/acdc --work_dir /tmp/w/headline_cg --jobs 10 --seeds 1 --lrs 1e-4
#   --methods "Baseline,Contrast (Enc) + Ours (Dec)" --tag cg --overrides '{"compile_mode": "reduce-overhead"}'
#   (finetune_seg >= 0.2.2 runs CUDA graphs by default: the same runs without --tag/--overrides)
# M3: `m.sh 583 long cg` trained all 7 fine-tunes but its timeout stopped their evaluation; M4 re-ran 5 of them.
