#!/usr/bin/env bash
# Calls L1-L3 (fifth session, nvidia-h100-x2 lease): usage l.sh SECONDS NAME; chain each call on the warm machine.
#   l.sh 585 l1  does the paper's pre-training length (50 x 200 = 10,000 iterations, 10 warm-up epochs) put
#                Ours (Dec) MI+CC above the baseline?  `[pre10k]`: pre-train Ours (Dec) and the full method at that
#                length (one per GPU), then fine-tune LV, 1 scan, seeds 0/1 at the paper's fine-tuning length
#                (10,000 iterations, LR 1e-4), i.e. exactly call J's `[long]` fine-tunes, whose baseline is the
#                reference (26.8 / 52.9). The runner resumes a pre-training from its last checkpoint (every 500 it.).
#   l.sh 465 l2  the same grid resumed (then l.sh 115 l2b, which timed out); GPU 1 also pre-trains Ours (Dec) and the full method at the fast preset's
#                2,000 iterations, so that their cluster scores (cq_*) compare with [pre10k]'s.
#   L2c, L3      ran as one-liners on the warm machine (recorded at the end of this file, not as modes):
#                L2c the [pre10k] runner alone (timeout 100); L3 the [pre10k] runner over LV/RV/Myo x seeds 0-2
#                next to the baseline at `[long]` over the same cells (timeout 405): 12 runs at once, none finished.
#   l.sh 580 headline  (prepared, not run) the ACDC headline (seed 1) alone on the host: GPU 0 only, CPUs 0-15 only (as on a one-GPU
#                nvidia-h100-x1 machine), its own empty TorchInductor cache.
export BIM_GIT_COMMIT=${BIM_GIT_COMMIT:?set BIM_GIT_COMMIT} TORCHINDUCTOR_COMPILE_THREADS=4
T=${1:-580}; NAME=${2:-l}; START=$(date +%s)
D=/tmp/w/acdc; mkdir -p /tmp/w
left() { echo $(( T - ($(date +%s) - START) )); }
[ -f $D/datalist.json ] || python -m data_prep acdc /tmp/data/acdc_u8/training $D --workers 16 > /tmp/w_prep.log 2>&1 || { cat /tmp/w_prep.log; exit 1; }
nvidia-smi -L; echo "data ready at $(( $(date +%s) - START )) s"
if [ "$NAME" = headline ]; then
  CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_CACHE_DIR=/tmp/w/inductor_headline timeout $(( $(left) - 25 )) \
    taskset -c 0-15 python tools/experiments.py run acdc_fast --dataset_dir $D --work_dir /tmp/w/headline_l3 --jobs 10 \
    --seeds 1 --lrs 1e-4 --methods "Baseline,Contrast (Enc) + Ours (Dec)" > /tmp/w/headline_l3.out 2>&1
  echo "headline rc $?"; grep -E "runs,|wall_s|FAILED" /tmp/w/headline_l3.out
  tar czf $OUT/$NAME.tgz -C /tmp/w --exclude='*.pt' --exclude=tensorboard --exclude='*.png' headline_l3 headline_l3.out
  exit 0
fi
W=/tmp/w/acdc_pre10k
LONG='{"epochs": 50, "iters_per_epoch": 200, "warmup_epochs": 10}'
PRE10K='{"epochs": 50, "warmup_epochs": 10, "save_every": 500}'
CUDA_VISIBLE_DEVICES=0,1 timeout $(( $(left) - 25 )) python tools/experiments.py run acdc_fast --dataset_dir $D \
  --work_dir $W --gpus 0,1 --jobs 6 --tasks lv --counts 1 --seeds 0,1 --lrs 1e-4 \
  --methods "Ours (Dec) MI+CC,Contrast (Enc) + Ours (Dec)" --tag pre10k --overrides "$LONG" --pretrain_overrides "$PRE10K" \
  >> $W.out 2>&1 &
if [ "$NAME" = l2 ]; then  # cluster scores at the fast preset's 2,000 pre-training iterations (no fine-tunes)
  CUDA_VISIBLE_DEVICES=1 timeout $(( $(left) - 25 )) python tools/experiments.py run acdc_fast --dataset_dir $D \
    --work_dir /tmp/w/acdc_cq2k --jobs 2 --methods "Ours (Dec) MI+CC,Contrast (Enc) + Ours (Dec)" \
    --only '["pre_ours_mi_cc", "pre_full"]' >> /tmp/w/acdc_cq2k.out 2>&1 &
fi
wait
grep -hE "runs,|^(start|done|FAILED)" $W.out /tmp/w/acdc_cq2k.out 2>/dev/null | tail -n 30
for p in $W/runs/pre_* /tmp/w/acdc_cq2k/runs/pre_*; do [ -d $p ] && echo "$p: $(ls $p | tr '\n' ' ')" && cat $p/cluster_quality.json 2>/dev/null | head -c 600; echo; done
for w in $W /tmp/w/acdc_cq2k; do [ -d $w/runs ] && python tools/experiments.py collect $w > /dev/null 2>&1; done
for r in $W/runs/ft_*; do [ -f $r/log.txt ] && echo "$(basename $r): val: $(grep -oP 'val_mean_dice: \K[0-9.]+' $r/log.txt | tr '\n' ' ')"; done
tar czf $OUT/$NAME.tgz -C /tmp/w --exclude='*.pt' --exclude=tensorboard --exclude='*.png' \
  $(cd /tmp/w && ls -d acdc_pre10k acdc_pre10k.out acdc_cq2k acdc_cq2k.out 2>/dev/null)
tar czf $OUT/${NAME}_png.tgz -C /tmp/w $(cd /tmp/w && ls acdc_*/runs/ft_*/eval/*_predictions.png acdc_*/runs/pre_*/panels/clusters_latest.png 2>/dev/null)
exit 0

# L2c, as run:  timeout 100 python tools/experiments.py run acdc_fast --dataset_dir /tmp/w/acdc --work_dir $W --gpus 0,1
#   --jobs 6 --tasks lv --counts 1 --seeds 0,1 --lrs 1e-4 --methods "Ours (Dec) MI+CC,Contrast (Enc) + Ours (Dec)"
#   --tag pre10k --overrides "$LONG" --pretrain_overrides "$PRE10K"
# L3, as run:  the same with --jobs 8 --tasks lv,rv,myo --seeds 0,1,2 and timeout 405, next to
#   timeout 405 python tools/experiments.py run acdc_fast --dataset_dir /tmp/w/acdc --work_dir /tmp/w/acdc_long
#   --gpus 0,1 --jobs 4 --tasks lv,rv,myo --counts 1 --seeds 0,1,2 --lrs 1e-4 --methods Baseline --tag long --overrides "$LONG"
