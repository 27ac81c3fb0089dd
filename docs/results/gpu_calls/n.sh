#!/usr/bin/env bash
# Calls N (seventh session, one nvidia-h100-x4 lease = 4 GPUs) and P (eighth, nvidia-h100-x2): usage n.sh SECONDS PHASE; chain the phases on the warm
# machine (each call within 30 s of the last). Start each call with
#   export CALL_START=$(date +%s) && bash .device/setup.sh > /tmp/setup.log 2>&1 && source .device/env.sh &&
#   BIM_GIT_COMMIT=<commit> bash docs/results/gpu_calls/n.sh <limit - 12> n1|n2|n3|n4
# Every run is at the paper's length (10,000 iterations, LR warm-up 10 epochs) and 1e-4 unless named otherwise.
#   n1  GPU 0: the full method's [pre10k] pre-training (cut near the end; it resumes from its last checkpoint, every
#       200 iterations). GPUs 1-3, why is our baseline so far below the paper's (LV, 1 scan, seeds 0-2):
#       Baseline [long] at the LRs 2e-5 (the paper's) and 5e-4; without flips ([longnoflip]); with the pre-training's
#       stronger augmentation, rotation ±45°, zoom 0.8-1.3, gamma 0.5-2 ([longaug]); and Baseline [long] seeds 2 of RV/Myo.
#   n2  all 4 GPUs: [pre10k] finishes, then its fine-tunes: 1 scan (LV seed 2, RV/Myo seeds 0-2; LV seeds 0/1 are call
#       L's) and 2/4 scans seed 0; Baseline [long] 2/4 scans seed 0; whatever n1 left unfinished.
#   n3  the same runners again (each resumes what is left), then everything is collected.
#   n4  [pre10kaug]: the [pre10k] pre-training fine-tuned with T's ranges (LV seeds 0-2, RV/Myo seeds 0/1), and
#       Baseline [longaug] for RV/Myo seeds 0/1.
#   o1, o2, o3 (prepared for the next 4-GPU lease, not run): the acdc_paper preset at LR 1e-4, which since
#       finetune_seg 0.3.0 is [longaug] / [pre10kaug] under their own names, for the cells those rows lack: RV/Myo
#       seed 2 at 1 scan and 2/4 scans for 3 seeds, Baseline and the full method (20 + 20 fine-tunes, one new
#       pre-training). o1: the pre-training on GPU 0, baselines on GPUs 1-3; o2: the full method's fine-tunes and
#       what is left, on all 4; o3: what is left, then everything is collected. Expect o3 to be needed.
#   p1, p2, p3 (eighth session, one nvidia-h100-x2 lease = 2 GPUs, as o1-o3 scaled down): acdc_paper at LR 1e-4,
#       Baseline and the full method at 2 and 4 labelled scans, seeds 0 and 1 (12 + 12 fine-tunes, one pre-training),
#       all in one work dir. p1: the pre-training on GPU 0, baselines seed 0 on GPU 1; p2: the pre-training resumes and
#       the full method's seed-0 fine-tunes follow on GPU 0, baselines on GPU 1; p3: one runner for both rows on both GPUs.
#   prof (ninth session): the pre-training step's profile (GPU 0) and the Mean Teacher step with and without CUDA
#       graphs (GPU 1), each alone on its GPU.
#   padab (ninth session, one GPU): benchmark_pretrain with MONAI's decoder pad, then with UpCatPadIfNeeded.
#   abl (2 GPUs, about 2 calls): the alpha ablation (run by phase r), 5 pre-trainings of 5,000 iterations, 15 LV fine-tunes;
#       ONLY="[\"*lambda_cc*\"]" or ONLY="[\"*num_clusters*\"]" for the other two.
#   bench4 (prepared in the nineteenth session, run in the twentieth; 2 GPUs, about 3 minutes, no data): the Mean Teacher step, the
#       cost of 0.7.0's separate teacher forwards and cuDNN autotuning, each setting twice (see the phase below).
#   bench2 (prepared, not run; 2 GPUs, about 5 minutes): cuDNN deterministic against autotuned (benchmark_pretrain,
#       GPU 0); meanteacher_seg in the default compile mode against CUDA graphs, 3 short epochs each (GPU 1).
#   plan (prepared in the tenth session): PLAN=docs/results/gpu_calls/plans/NAME.json [GPUS=0,1] [JOBS=12] n.sh SECONDS plan
#       runs a plan file (a list of grids, see tools/experiments.py run_plan) in $W/NAME; run it again until all is
#       done. plans/s.json: the full method's LR choice at 1 scan (a 10,000-iteration pre-training, 18 fine-tunes at
#       2e-5 / 5e-4) and the lambda_CC ablation of the full method ([pre5k], 4 pre-trainings, 12 fast fine-tunes).
#   t (eleventh session, 4 GPUs, about 3 calls: FIRST=1 n.sh 588 t, then n.sh 588 t until all is done): plans/t.json,
#       the full method's LR choice at 1 scan (one 10,000-iteration pre-training alone on GPU 0 in the first call,
#       18 fine-tunes at 2e-5 / 5e-4), the lambda_CC and K ablations of the full method ([pre5k]; their shared
#       default point is calls R's alpha = 0.5), then the baseline's LR choice at 2 and 4 scans (36 fine-tunes).
#   u (prepared in the eleventh session, 4 GPUs, about 3 calls: FIRST=1 n.sh 588 u, then n.sh 588 u): plans/u.json, the
#       full method at all three LRs at 1 and 2 scans from one pre-training ([onepre], 54 fine-tunes) and the
#       baseline's 11 Myo runs at 2e-5 / 5e-4 that calls T left; about 6,400 GPU-seconds by calls T's timings.
#   v (prepared in the eleventh session, 4 GPUs, FIRST=1 n.sh 588 v, then n.sh 588 v until done): plans/v.json, Mean
#       Teacher and MT + Ours at the paper's length (10,000 iterations, the bundles' default augmentation), 1 scan,
#       LV/RV/Myo, seeds 0-2, LR 1e-4; untimed at this length (the step alone: benchmark_meanteacher.py).
#   r (tenth session, 2 GPUs, about 3 calls: run it again until all is done): the plan plans/r.json, two grids,
#       abl's alpha ablation and the baseline's LR choice on RV at 1 scan (acdc_paper, LRs 2e-5 and 5e-4, seeds 0-2;
#       1e-4 ran in calls N-Q). When the grid is done and more than 240 s are left: cuDNN deterministic against
#       autotuned (benchmark_pretrain, 100 iterations), on both GPUs at once, then swapped.
# Each runner stops at SECONDS - 25 from CALL_START (20 s of grace for its bundles), then results are tarred to $OUT.
export BIM_GIT_COMMIT=${BIM_GIT_COMMIT:?set BIM_GIT_COMMIT} TORCHINDUCTOR_COMPILE_THREADS=4
T=${1:?seconds}; PHASE=${2:?phase}; START=${CALL_START:-$(date +%s)}; PRESET=acdc_fast; PNG_RUNS=pre10k
TW=${N_TMP:-/tmp/w}  # the work root (a test points it elsewhere)
D=$TW/acdc; RAW=/tmp/data/acdc_u8/training; DATA=acdc; W=$TW/n; mkdir -p $W
[ $PHASE = p12 ] && { D=$TW/promise12; RAW=/tmp/data/promise12_nifti/training_data; DATA=promise12; }  # prepare.sh promise12
left() { echo $(( T - ($(date +%s) - START) )); }
[ $PHASE = bench3 ] || [ $PHASE = bench4 ] || [ -f $D/datalist.json ] || python -m data_prep $DATA $RAW $D --workers 16 > /tmp/w_prep.log 2>&1 || { cat /tmp/w_prep.log; exit 1; }
# a plan phase's work dir carried from an earlier lease (CARRY, default .carry/PHASE, an ignored folder the run call
# carries): n_PHASE.tgz, the results tar of that lease's last call, and pre_*_fp16.pt, its pre-trainings' model.pt in
# float16 (experiments.py weights); restored once, before anything runs, so that the runner skips every finished run
# and fine-tunes from those pre-trainings (the p12 calls of the seventeenth session brought back pre_full)
CARRY=${CARRY:-.carry/$PHASE}
if [ -f $CARRY/n_$PHASE.tgz ] && [ ! -d $W/$PHASE ]; then
  tar xzf $CARRY/n_$PHASE.tgz -C $TW || exit 1
  for f in $CARRY/pre_*_fp16.pt; do
    [ -f $f ] || continue; q=$(basename $f _fp16.pt)
    python tools/experiments.py weights $f $W/$PHASE/runs/$q/model.pt --dtype float32 || exit 1
  done
  echo "restored $W/$PHASE from $CARRY: $(ls $W/$PHASE/runs/*/result.json | wc -l) finished runs"
fi
nvidia-smi -L; echo "data ready at $(( $(date +%s) - START )) s"
# the machine's GPUs (a lease brings 1, 2 or 4; N_GPUS where nvidia-smi is missing, as in the tests, default 4): the
# plan phases run on all of them unless GPUS / PRE_GPUS / REST_GPUS say otherwise, and refuse a GPU it lacks
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); [ "$NGPU" -gt 0 ] || NGPU=${N_GPUS:-4}
ALL_GPUS=$(seq -s, 0 $(( NGPU - 1 )))
check_gpus() {  # check_gpus NAME LIST: exit at once if LIST names a GPU this machine lacks (else its runs would fail)
  local g; for g in ${2//,/ }; do [ "$g" = none ] || [ "$g" -lt "$NGPU" ] ||
    { echo "$1=$2: this machine has $NGPU GPU(s), $ALL_GPUS; set $1 (and GPUS / PRE_GPUS / REST_GPUS) to fit"; exit 2; }
  done
}
LONG='"epochs": 50, "iters_per_epoch": 200, "warmup_epochs": 10'
bench_det() {  # bench_det True|False: benchmark_pretrain on the visible GPU, JSON and log to $OUT
  python tools/benchmark_pretrain.py --dataset_dir $D --compile True --bare False --iterations 100 \
    --cudnn_deterministic $1 --out $OUT/bench_det_$1_gpu$CUDA_VISIBLE_DEVICES.json > $OUT/bench_det_$1_gpu$CUDA_VISIBLE_DEVICES.log 2>&1
}
plan_runner() {  # plan_runner PLAN_FILE [ONLY]: run_plan in the foreground, in $W/NAME (NAME = the file's name); its rc.
  # ONLY: run-name patterns narrowing the plan, so that two runners on other GPUs share one work dir (phase t)
  [ -f "$1" ] || { echo "plan $1: no such file"; exit 2; }
  # LAST=1 (the last call of a lease, whose cut runs are lost with the machine): --finish_by, so that a fresh run
  # whose grid's expected_s would not end before the runner's timeout (less 10 s) is held, and a shorter one runs
  NAME=$(basename "$1" .json); PNG_RUNS=$NAME; local budget=$(( $(left) - 25 ))
  CUDA_VISIBLE_DEVICES=${GPUS:-0,1} timeout -k 30 $budget python tools/experiments.py run_plan "$1" \
    --dataset_dir $D --work_dir $W/$NAME --gpus $(echo ${GPUS:-0,1} | tr ',' '\n' | wc -l) --jobs ${JOBS:-12} \
    --only "${2:-[\"*\"]}" ${LAST:+--finish_by $(( budget - 10 ))} >> $W/$NAME.out 2>&1
}
runner() {  # runner NAME CUDA_VISIBLE_DEVICES ARGS...: one grid in the background, in its own work dir
  local name=$1 gpus=$2; shift 2
  CUDA_VISIBLE_DEVICES=$gpus timeout -k 30 $(( $(left) - 25 )) python tools/experiments.py run $PRESET \
    --dataset_dir $D --work_dir $W/${WDIR:-$name} "$@" >> $W/$name.out 2>&1 &
}
pre10k() {  # the full method at the paper's lengths; same pre-training arguments in every phase
  runner pre10k "$1" --gpus "$2" --jobs 14 --tasks lv,rv,myo --counts 1,2,4 --seeds 0,1,2 --lrs 1e-4 \
    --methods "Contrast (Enc) + Ours (Dec)" --tag pre10k --overrides "{$LONG}" \
    --pretrain_overrides '{"epochs": 50, "warmup_epochs": 10}' --only "$3"
}
diagnostics() {  # the baseline variants of n1, on the GPUs given
  runner base_lr "$1" --gpus "$2" --jobs 6 --tasks lv --counts 1 --seeds 0,1,2 --lrs 2e-5,5e-4 --methods Baseline \
    --tag long --overrides "{$LONG}"
  runner base_noflip "$1" --gpus "$2" --jobs 3 --tasks lv --counts 1 --seeds 0,1,2 --lrs 1e-4 --methods Baseline \
    --tag longnoflip --overrides "{$LONG, \"flip_prob\": 0.0}"
  runner base_aug "$1" --gpus "$2" --jobs 3 --tasks lv --counts 1 --seeds 0,1,2 --lrs 1e-4 --methods Baseline \
    --tag longaug --overrides "{$LONG, \"max_rotation_deg\": 45.0, \"scale_range\": [0.8, 1.3], \"gamma_range\": [0.5, 2.0]}"
}
base_long() {  # Baseline [long] at 1e-4, the cells next to the [pre10k] ones
  runner base_long "$1" --gpus "$2" --jobs 8 --tasks lv,rv,myo --counts 1,2,4 --seeds 0,1,2 --lrs 1e-4 --methods Baseline \
    --tag long --overrides "{$LONG}" --only "$3"
}
PRE_N1='["pre_*"]'
PRE_ALL='["pre_*", "*_lv_n1_s2_*", "*_rv_n1_*", "*_myo_n1_*", "*_n2_s0_*", "*_n4_s0_*"]'
BASE_N1='["*_rv_n1_s2_*", "*_myo_n1_s2_*"]'
BASE_ALL='["*_rv_n1_s2_*", "*_myo_n1_s2_*", "*_n2_s0_*", "*_n4_s0_*"]'
case $PHASE in
n1) pre10k 0 1 "$PRE_N1"; diagnostics 1,2,3 3; base_long 1,2,3 3 "$BASE_N1" ;;
n2|n3) pre10k 0,1,2,3 4 "$PRE_ALL"; base_long 1,2,3 3 "$BASE_ALL"; diagnostics 0,1,2,3 4 ;;
n4)  # the stronger augmentation for both rows: [pre10k] fine-tunes and baselines (the pre-training is n1/n2's)
  AUG="{$LONG, \"max_rotation_deg\": 45.0, \"scale_range\": [0.8, 1.3], \"gamma_range\": [0.5, 2.0]}"
  mkdir -p $W/pre10k_aug/runs && ln -sfn $W/pre10k/runs/pre_full_pre10k $W/pre10k_aug/runs/pre_full_pre10kaug
  runner pre10k_aug 0,1,2,3 4 --jobs 7 --tasks lv,rv,myo --counts 1 --seeds 0,1,2 --lrs 1e-4 \
    --methods "Contrast (Enc) + Ours (Dec)" --tag pre10kaug --overrides "$AUG" --pretrain_overrides '{"epochs": 50, "warmup_epochs": 10}' \
    --only '["*_lv_n1_*", "*_rv_n1_s[01]_*", "*_myo_n1_s[01]_*"]'
  runner base_aug 0,1,2,3 4 --jobs 4 --tasks rv,myo --counts 1 --seeds 0,1 --lrs 1e-4 --methods Baseline \
    --tag longaug --overrides "$AUG" ;;
o1|o2|o3)
  PRESET=acdc_paper; PNG_RUNS=paper_*
  GRID=(--tasks lv,rv,myo --counts 1,2,4 --seeds 0,1,2 --lrs 1e-4)
  CELLS='["pre_*", "*_rv_n1_s2_*", "*_myo_n1_s2_*", "*_n2_*", "*_n4_*"]'
  if [ $PHASE = o1 ]; then
    runner paper_full 0 --gpus 1 --jobs 1 "${GRID[@]}" --methods "Contrast (Enc) + Ours (Dec)" --only '["pre_*"]'
    runner paper_base 1,2,3 --gpus 3 --jobs 15 "${GRID[@]}" --methods Baseline --only "$CELLS"
  else
    runner paper_full 0,1,2,3 --gpus 4 --jobs 16 "${GRID[@]}" --methods "Contrast (Enc) + Ours (Dec)" --only "$CELLS"
    runner paper_base 0,1,2,3 --gpus 4 --jobs 8 "${GRID[@]}" --methods Baseline --only "$CELLS"
  fi ;;
p1|p2|p3)  # both rows share the work dir $W/paper, so p3's single runner sees every result of p1/p2
  # SEEDS, COUNTS, LRS, ONLY (run-name patterns) and, for p3, METHODS narrow the grid; the defaults are calls P's
  PRESET=acdc_paper; PNG_RUNS=paper; WDIR=paper; FULL="Contrast (Enc) + Ours (Dec)"
  GRID=(--tasks lv,rv,myo --counts ${COUNTS:-2,4} --lrs ${LRS:-1e-4})
  ONLY=(--only "${ONLY:-[\"*\"]}")
  FIRST=${SEEDS:-0,1}; FIRST=${FIRST%%,*}
  case $PHASE in
  p1) runner paper_full 0 --gpus 1 --jobs 1 "${GRID[@]}" --seeds $FIRST --methods "$FULL" --only '["pre_*"]'
      runner paper_base 1 --gpus 1 --jobs 5 "${GRID[@]}" "${ONLY[@]}" --seeds $FIRST --methods Baseline ;;
  p2) runner paper_full 0 --gpus 1 --jobs 4 "${GRID[@]}" "${ONLY[@]}" --seeds $FIRST --methods "$FULL"
      runner paper_base 1 --gpus 1 --jobs 5 "${GRID[@]}" "${ONLY[@]}" --seeds ${SEEDS:-0,1} --methods Baseline ;;
  p3) runner paper 0,1 --gpus 2 --jobs ${JOBS:-8} "${GRID[@]}" "${ONLY[@]}" --seeds ${SEEDS:-0,1} \
        --methods "${METHODS:-Baseline,$FULL}" ;;
  esac ;;
prof)  # ninth session, after seed 2: each benchmark alone on a GPU of its own (about 3 minutes), nothing tarred
  CUDA_VISIBLE_DEVICES=0 python tools/benchmark_pretrain.py --dataset_dir $D --compile True --profile $OUT/ops.txt \
    --profile_steps 20 --out $OUT/bench_pretrain.json > $OUT/bench_pretrain.log 2>&1 &
  (for a in "" "--compile_mode reduce-overhead"; do
     CUDA_VISIBLE_DEVICES=1 python tools/benchmark_meanteacher.py --batch_size 5 --unlabelled_batch_size 5 \
       --iterations 200 --warmup 20 --compile True $a 2>&1 | tail -n 2
   done) > $OUT/bench_meanteacher.log 2>&1 &
  wait; tail -n 5 $OUT/bench_pretrain.log $OUT/bench_meanteacher.log; exit 0 ;;
padab)  # ninth session: MONAI's decoder pad against UpCatPadIfNeeded, the bundle's channels_last, one after the other
  for pad in always if_needed; do
    python tools/benchmark_pretrain.py --dataset_dir $D --compile True --bare False --iterations 100 --decoder_pad $pad \
      --profile $OUT/ops_$pad.txt --profile_steps 20 --out $OUT/bench_$pad.json > $OUT/bench_$pad.log 2>&1
    grep -E '"(ms_per_step|images_per_s|gpu_busy_share|channels_last)"' $OUT/bench_$pad.json
  done; exit 0 ;;
abl)  # prepared in the ninth session; its alpha grid ran in phase r (2 GPUs, about 2 calls: run the phase again until all is done).
  # The alpha ablation at 1 labelled LV scan, seeds 0-2: acdc_ablation_fast with call M5's 5,000 pre-training
  # iterations ([pre5k]: 25 x 200, warm-up 5), which recovered most of the full method's gain (LV 69.6 against 44.8
  # after 2,000), then the fast preset's fine-tuning at 1e-4. Five pre-trainings, 15 fine-tunes, one runner.
  PRESET=acdc_ablation_fast; PNG_RUNS=abl
  runner abl 0,1 --gpus 2 --jobs ${JOBS:-10} --tasks lv --counts 1 --seeds 0,1,2 --lrs 1e-4 --tag pre5k \
    --pretrain_overrides '{"epochs": 25, "warmup_epochs": 5}' --only "${ONLY:-[\"*alpha*\"]}" ;;
bench3)  # prepared in the eighteenth session, run in the nineteenth (the z calls); GPU 0 alone, about 4 minutes, no data (any pack, even prepare.sh none):
  # cuDNN deterministic (the fine-tuning and Mean Teacher bundles' default) against autotuned (pretrain_bim's since
  # 0.2.6: 1.13-1.21x) for finetune_seg's step (batch 5, CUDA graphs, its default) and the Mean Teacher step (5 + 5,
  # its default compile mode); each setting twice, in either order. One JSON line a run in $OUT/bench3.jsonl.
  for det in True False False True; do
    for args in "--method supervised --unlabelled_batch_size 0 --compile_mode reduce-overhead" "--unlabelled_batch_size 5"; do
      CUDA_VISIBLE_DEVICES=0 timeout 120 python tools/benchmark_meanteacher.py --batch_size 5 $args --iterations 200 \
        --warmup 20 --compile True --cudnn_deterministic $det 2>> $OUT/bench3.log | tail -n 1 >> $OUT/bench3.jsonl
    done
  done
  cat $OUT/bench3.jsonl; exit 0 ;;
bench4)  # prepared in the nineteenth session, run in the twentieth (190 s); 2 GPUs, no data (any pack): the Mean Teacher step
  # at the ACDC batch (5 + 5, the default compile mode), each run 300 iterations, 120 s at most (a cold compile took
  # over 45 s). GPU 0: what meanteacher_seg 0.7.0's separate teacher forwards cost (joint_teacher_batch False against
  # True, deterministic cuDNN, the bundle's default). GPU 1 at the same time: deterministic cuDNN against autotuned with
  # the separate forwards (bench3's two pairs varied by 29 % within one setting). Each setting twice, in either order.
  # One JSON line a run in $OUT/bench4_gpu0.jsonl and $OUT/bench4_gpu1.jsonl.
  mt_step() {  # mt_step GPU ARGS...: one benchmark_meanteacher run on GPU, its JSON line appended to $OUT/bench4_gpuGPU.jsonl
    local gpu=$1; shift
    CUDA_VISIBLE_DEVICES=$gpu timeout 120 python tools/benchmark_meanteacher.py --batch_size 5 --unlabelled_batch_size 5 \
      --iterations 300 --warmup 30 --compile True "$@" 2>> $OUT/bench4_gpu$gpu.log | tail -n 1 >> $OUT/bench4_gpu$gpu.jsonl
  }
  (for j in False True True False; do mt_step 0 --cudnn_deterministic True --joint_teacher_batch $j; done) &
  (for d in True False False True; do mt_step 1 --cudnn_deterministic $d --joint_teacher_batch False; done) &
  wait; cat $OUT/bench4_gpu*.jsonl; exit 0 ;;
bench5)  # twenty-first session, one GPU, the ACDC pack: bench2's open question for meanteacher_seg 0.7.1 (separate teacher
  # forwards, autotuned cuDNN): does the bundle run under CUDA graphs (compile_mode reduce-overhead), and how long is
  # an epoch against the default mode? LV, 1 scan, 3 epochs of 100 iterations with validation; the first run half the
  # time left, the second the rest. As run (commit a668580, one nvidia-h100-x1, 189 s): the default mode ended (epoch
  # 1 54.3 s with its cold compile, epochs 2-3 6.1 / 6.4 s); the CUDA-graph run got only a quarter of the call (the
  # first run took half of what was left, the second again half: since fixed) and was cut inside its first epoch; run
  # again at once by hand on the warm machine (its compile cache partly filled): epochs 12.4 / 4.8 / 4.6 s, the same
  # validation Dice (0.0686 / 0.0702 against 0.0684 / 0.0702 at epochs 2-3).
  for mode in None reduce-overhead; do
    budget=$(( $(left) / 2 - 5 )); [ $mode = None ] || budget=$(( $(left) - 5 ))
    timeout $budget python -m monai.bundle run --config_file bundles/meanteacher_seg/configs/train.json \
      --dataset_dir $D --task lv --labelled_scans 1 --epochs 3 --iters_per_epoch 100 --warmup_epochs 1 --rampup_epochs 1 \
      --compile_mode $mode --progress_bar False --output_dir /tmp/w/mt_$mode > /tmp/w/mt_$mode.log 2>&1
    echo "meanteacher_seg compile_mode $mode: rc $? at $(( T - $(left) )) s"
    grep -hE "Complete. Time taken|Key metric|Error|error" /tmp/w/mt_$mode.log | tail -n 8
  done 2>&1 | tee $OUT/bench5.log
  exit 0 ;;
bench2)  # prepared in the ninth session, not run. GPU 0: the pre-training step with cuDNN's deterministic algorithms
  # (the bundles' default) against its autotuner. GPU 1: meanteacher_seg (LV, 1 scan, 3 x 100 iterations with
  # validation) in the default compile mode, then under CUDA graphs: does it run, and how long is an epoch?
  (for det in True False; do
     CUDA_VISIBLE_DEVICES=0 python tools/benchmark_pretrain.py --dataset_dir $D --compile True --bare False \
       --iterations 100 --cudnn_deterministic $det --out $OUT/bench_det_$det.json > $OUT/bench_det_$det.log 2>&1
   done) &
  (for mode in None reduce-overhead; do
     CUDA_VISIBLE_DEVICES=1 timeout $(( $(left) / 2 - 10 )) python -m monai.bundle run \
       --config_file bundles/meanteacher_seg/configs/train.json --dataset_dir $D --task lv --labelled_scans 1 \
       --epochs 3 --iters_per_epoch 100 --warmup_epochs 1 --compile_mode $mode --progress_bar False \
       --output_dir /tmp/w/mt_$mode > /tmp/w/mt_$mode.log 2>&1; echo "meanteacher_seg compile_mode $mode: rc $?"
     grep -hE "Complete. Time taken|Key metric|ERROR|Error" /tmp/w/mt_$mode.log | tail -n 8
   done) > $OUT/mt_cudagraphs.log 2>&1 &
  wait; grep -hE '"(ms_per_step|images_per_s|cudnn_deterministic)"' $OUT/bench_det_*.json; cat $OUT/mt_cudagraphs.log
  exit 0 ;;
r)  # tenth session, see the header: the plan plans/r.json, then the cuDNN A/B if the grid finished in time
  if plan_runner docs/results/gpu_calls/plans/r.json && [ $(left) -gt 240 ]; then  # each setting once on each GPU
    for first in 0 1; do
      CUDA_VISIBLE_DEVICES=$first bench_det True &
      CUDA_VISIBLE_DEVICES=$(( 1 - first )) bench_det False &
      wait
    done
    grep -HE '"(gpu|ms_per_step|images_per_s|cudnn_deterministic|gpu_busy_share)"' $OUT/bench_det_*.json
  fi ;;
t|u|v|w|x|y|z|mt2|mt3|rows|rows2|decdiag|decdiag2|p12)  # 4 GPUs, about 3 calls each: the plan plans/$PHASE.json. t (eleventh session): the full method's LR choice at
  # 1 scan, the lambda_CC and K ablations, the baseline's LR choice at 2 and 4 scans. u (prepared in the eleventh
  # session, not run): the full method at 2e-5 / 1e-4 / 5e-4 at 1 and 2 scans, all from one pre-training (tag
  # [onepre]), and the baseline's Myo runs calls T left (2e-5 / 5e-4 at 2 and 4 scans). v (prepared, not run): Mean
  # Teacher and MT + Ours at the paper's length, 1 scan, LV/RV/Myo, seeds 0-2, LR 1e-4 (18 runs, one pre-training).
  # w (twelfth session): what one lease holds of u and v: Mean Teacher and MT + Ours for seed 0 at 1 scan (a Mean
  # Teacher step is ~5x a fine-tune's), the full method's three LRs at 1 scan from the pre-training MT + Ours uses
  # ([onepre]), then the baseline's missing Myo runs. x (prepared in the twelfth session, not run): Mean Teacher's
  # consistency weight searched on validation, 0 / 1 / 10 (meanteacher_seg 0.4.0's L_MT), LV/RV/Myo at 1 scan, seed 0
  # first (LV and Myo, then the BatchNorm diagnosis [labbn]: unlabelled_bn_stats false at weights 0 and 1, then RV),
  # then seeds 1-2; no pre-training, so no FIRST; JOBS=8 (two Mean Teacher runs a GPU) keeps seed 0 ahead. Calls X
  # (thirteenth session) ran seed 0 and LV seed 1, without gamma (meanteacher_seg < 0.5.0 dropped it). y (prepared
  # in the thirteenth session, not run): the weight search again with meanteacher_seg 0.5.0 (gamma applied), tag
  # [gamma]: LV seed 0 first, then [unlab] (consistency_on_labelled false, the paper's L_MT; at weight 0 the
  # supervised step but for the running statistics) LV seed 0 at weights 0 and 1, then Myo seed 0, LV seeds 1-2, RV seeds 0-2, Myo seeds 1-2,
  # [unlab] Myo seed 0; 31 runs, JOBS=8, no FIRST; about two leases.
  # Calls Y (fourteenth session) ran 16 of them. z (prepared in the fourteenth session, not run; JOBS=8, no FIRST;
  # JOBS=8 n.sh 588 z twice, then LAST=1 JOBS=8 n.sh 588 z): why did the paper's L_MT ([unlab]) beat ours on LV seed 0
  # (calls Y: 86.1 against [gamma]'s 57.8 at weight 1)? [unlab], and [tsep] (our L_MT with the teacher's labelled and
  # unlabelled views in separate forwards, meanteacher_seg 0.6.0's joint_teacher_batch false, as the student's are) at
  # weight 1 for LV seeds 0-2, Myo seed 0 (and [unlab] RV seed 0), then both at weight 10 (16 runs, a lease's worth);
  # then the rest of y (RV seeds 0-2, Myo seeds 1-2). (Its Baseline [dicece] fillers on RV were dropped: rows ran them.)
  # The z calls (nineteenth session, 2 x H200: GPUS=0,1 JOBS=4) ran its first 8 runs (see As run below): separate
  # teacher forwards won, meanteacher_seg 0.7.0's default. mt2 (prepared in the nineteenth session, not run; ACDC pack):
  # Table 1's Mean Teacher with 0.7.0's teacher ([tsep], as the z calls ran it) on RV seeds 0-2 and Myo seeds 1-2,
  # the joint forward again on LV seed 0 ([joint]: a same-machine control of the z calls' +30 there), then MT + Ours
  # at 1 scan, LV/RV/Myo, seeds 0-2, from a new pre_full (weight 1, LR 1e-4; 16 runs), reordered in the twenty-first
  # session, when only two-GPU kinds were lent at first: RV seeds 0-1, MT + Ours seed 0, the other seeds, the control
  # last (on 2 GPUs: FIRST=1 JOBS=2, then JOBS=4 twice). The mt2 calls (twenty-first session, 4 x H100) ran it: see
  # As run below.
  # mt3 (prepared in the twenty-first session, not run; ACDC pack): Mean Teacher ([tsep]) and MT + Ours at 2 and 4
  # scans, and the full method fine-tuned from MT + Ours's own pre-training ([samepre], so that the two compare from
  # one pre-training), seed 0, with LV and RV at 2 scans again under CUDA graphs ([cg]: compile_mode reduce-overhead,
  # the full-length A/B bench5 asks for), then MT + Ours Myo seed 2 at 1 scan, then seed 1 (39 runs, one pre_full).
  # On 4 GPUs as mt2: FIRST=1 JOBS=6 n.sh 588 mt3, JOBS=8 n.sh 588 mt3, LAST=1 JOBS=8 n.sh 578 mt3.
  # p12 (prepared in the thirteenth session, not run; carry the PROMISE12 pack: prepare.sh promise12): PROMISE12 at
  # the paper's lengths (promise12_paper: 20,000 pre-training iterations, 20,000 fine-tuning), Baseline and the full
  # method at 4/6/8 scans, seeds 0-2, the paper's LR 2e-4 first, then 2e-5 and 5e-4 (55 runs). FIRST=1 n.sh 588 p12
  # twice: the pre-training alone on GPU 0 (it resumes in the second call and should end there: ~950 s alone), the
  # baselines on GPUs 1-3; then n.sh 588 p12 for the full method's fine-tunes (expect its 2e-5 / 5e-4 runs not to finish).
  # The p12 calls (seventeenth session) ran the pre-training and the 27 baselines (see As run below); the plan then
  # put the full method's 2e-5 / 5e-4 before Mean Teacher and MT + Ours (seed 0 first, then 1-2: 45 runs left). The
  # next lease carries .carry/p12 (the results tar and pre_full's weights in float16, restored above) with .device:
  # ONLY='["ft_*"]' JOBS=12 n.sh 588 p12 twice, then LAST=1 ONLY='["ft_*"]' JOBS=12 WEIGHTS_OUT=pre_full n.sh 578 p12,
  # no FIRST (the pre-training has run); Mean Teacher later, in a lease of its own (ONLY='["mt_*_s0_*"]' JOBS=6).
  # The p12b calls (eighteenth session) did so (see As run below): the full method's 27 fine-tunes; 18 Mean Teacher
  # runs left, from .carry/p12 as those calls' last results tar left it.
  # rows (prepared in the fourteenth session, not run): the other Table 1 rows at the paper's lengths, IIC (Dec),
  # Contrast (Enc) and Ours (Dec) MI+CC, 1 scan, then 2, then 4 (seeds 0-2, LR 1e-4; 3 pre-trainings, 81 fine-tunes),
  # with Baseline [dicece] on RV after the 1-scan cells. FIRST=1 JOBS=3 n.sh 588 rows: the three pre-trainings on
  # GPUs 0-2, one a GPU (10,000 x 10.5-12 s / 200 with the machine busy: they resume in the second call), [dicece] on
  # GPU 3, three at a time; then n.sh 588 rows, then LAST=1 n.sh 588 rows. Expect the 1-scan cells and part of 2.
  # The rows calls (fifteenth session) ran the 1-scan cells, [dicece] and 11 of the 2-scan runs (see As run below).
  # rows2 (prepared in the fifteenth session, not run): the rest of rows from three new pre-trainings (the first
  # ones were lost with the machine; after collection, python tools/experiments.py rename_pretraining CSV pre_iic_dec
  # pre_iic_dec_rows2, and the same for the other two, renames each row and its fine-tunes' init): Ours (Dec) MI+CC and Contrast (Enc) at 2 scans (but Contrast (Enc) LV seeds 0/1, which
  # rows ran), Baseline [dicece] for LV and Myo at 1 scan (GPU 3 in the first call), then all three rows at 4 scans
  # (3 pre-trainings, 49 fine-tunes; expected_s 340, what 3 fine-tunes a GPU took in the rows calls).
  # FIRST=1 JOBS=3 n.sh 588 rows2, n.sh 588 rows2, LAST=1 n.sh 578 rows2.
  # decdiag (prepared in the fifteenth session, not run): why do Ours (Dec) MI+CC's clusters follow edges, not anatomy
  # (the rows calls: LV cluster Dice 28.5 against the full method's 53-75)? Four 10,000-iteration pre-trainings, one a
  # GPU: ours_mi_cc at lambda_CC 0 ([cc0]: L_MI with alpha 0.5 alone) and 1 again ([rep]: the spread between two
  # pre-trainings of the same settings), ours_mi_cc clustering upcat_3 ([dl3]: pretrain_bim's dense_level 3, at 1/4
  # resolution, the remedy if the skips are the shortcut), and the full method ([ctl], no fine-tunes) as the control of
  # pretrain_bim's path_dependence.json probe, which this phase runs on each finished pre-training (how many pixels
  # change cluster when an encoder level reaches the decoder without its spatial information: do the clusters use
  # the deep path?); their cluster_quality.json is the first answer; then LV, RV, Myo at 1 scan, seeds 0-2, and [rep]
  # also at the paper's LR 2e-5 (36 fine-tunes). FIRST=1 n.sh 588 decdiag (the four pre-trainings on GPUs 0-3, nothing else; the probes if time is
  # left), n.sh 588 decdiag (the probes first, in the background), LAST=1 n.sh 578 decdiag.
  # The decdiag calls (sixteenth session) ran it (see As run below): the skips are not the shortcut, lambda_CC and
  # dense_level 3 change nothing. decdiag2 (prepared in the sixteenth session, not run): what, then, would make Ours
  # (Dec)'s clusters anatomical? Four more 10,000-iteration pre-trainings, one a GPU, read first by their
  # cluster_quality.json and probe: ours_mi_cc without gamma in T ([nogam]: gamma_range [1, 1]; its clusters look like
  # bands parallel to the edges, which a monotone gamma leaves unchanged), with K = 10 ([k10]), with the authors' edge
  # map ([edgeg]: |grad I|^0.75 in place of Sobel), and the full method with L_con at weight 0.1 ([con01]: how much of
  # the meta-label signal makes the clusters anatomical?); then LV at 1 scan for all four, then RV and Myo (seeds 0-2,
  # 36 fine-tunes). Same calls as decdiag: FIRST=1 n.sh 588 decdiag2, n.sh 588 decdiag2 (straight after, within
  # 30 s: four pre-trainings at once took 8.4-11.2 s an epoch, so those with L_con or L_CC at full width end a few
  # epochs into the second call, from their last checkpoint), LAST=1 n.sh 578 decdiag2.
  # FIRST=1 (the first call): the pre-training(s) (PRE, run-name patterns; default the full method's) alone on
  # PRE_GPUS (default GPU 0), the runs that do not need them (REST) on REST_GPUS (default the other GPUs); later calls:
  # one runner on all the machine's GPUs (GPUS; ONLY narrows it, e.g. ONLY='["ft_random_myo_*"]'). Since the fifteenth session every plan
  # phase also runs pretrain_bim's path_dependence.json on each of its finished pre-trainings that lacks one (in the
  # background at the start of a later call and again after its runner, for those that ended in it; after the runners
  # in a FIRST call; each only if a minute is left).
  P=docs/results/gpu_calls/plans/$PHASE.json
  [ $PHASE = t ] && REST=${REST:-'["pre_full_*", "ft_pre_full_*_pre5k", "ft_random_*"]'}
  [ $PHASE = v ] || [ $PHASE = mt2 ] || [ $PHASE = mt3 ] && REST=${REST:-'["mt_random_*"]'}
  [ $PHASE = w ] && REST=${REST:-'["mt_random_*", "ft_random_*"]'}
  [ $PHASE = rows ] || [ $PHASE = rows2 ] && { PRE=${PRE:-'["pre_*"]'}; PRE_GPUS=${PRE_GPUS:-0,1,2}; REST_GPUS=${REST_GPUS:-3}; }
  [ $PHASE = decdiag ] || [ $PHASE = decdiag2 ] && { PRE=${PRE:-'["pre_*"]'}; PRE_GPUS=${PRE_GPUS:-0,1,2,3}; REST_GPUS=${REST_GPUS:-none}; }
  probe_paths() {  # pretrain_bim's path_dependence.json on each finished pre-training of the plan that lacks it,
    # with the arguments it was trained with (experiments.py probe; a variant without a cluster head is skipped)
    for q in $W/$PHASE/runs/pre_*/; do
      [ -f $q/checkpoint_final.pt ] && [ ! -f $q/path_dependence_validation.json ] && [ $(left) -gt 60 ] &&
        timeout $(( $(left) - 40 )) python tools/experiments.py probe $q >> $W/$PHASE.probe.out 2>&1
    done
  }
  [ "${FIRST:-0}" != 1 ] && { probe_paths & }  # every plan phase: the probes of its finished pre-trainings first
  if [ "${FIRST:-0}" = 1 ]; then  # REST_GPUS=none: the pre-trainings only
    # REST_GPUS default: the GPUs PRE_GPUS leaves (all of them on a one-GPU machine)
    REST_GPUS=${REST_GPUS:-$(echo $ALL_GPUS | tr ',' '\n' | grep -vxF "$(echo ${PRE_GPUS:-0} | tr ',' '\n')" | paste -sd,)}
    REST_GPUS=${REST_GPUS:-$ALL_GPUS}; check_gpus PRE_GPUS ${PRE_GPUS:-0}; check_gpus REST_GPUS $REST_GPUS
    GPUS=${PRE_GPUS:-0} JOBS=$(echo ${PRE_GPUS:-0} | tr ',' '\n' | wc -l) plan_runner $P "${PRE:-[\"pre_full\"]}" &
    [ "${REST_GPUS:-}" = none ] ||
      GPUS=$REST_GPUS JOBS=${JOBS:-12} plan_runner $P "${REST:-[\"ft_random_*\"]}" &
    wait
    probe_paths  # if time is left
  else
    GPUS=${GPUS:-$ALL_GPUS}; check_gpus GPUS $GPUS
    GPUS=$GPUS JOBS=${JOBS:-14} plan_runner $P "${ONLY:-}"
    wait; probe_paths  # the pre-trainings that ended during this call (the decdiag calls' [rep] and [ctl] missed it)
  fi
  NAME=$PHASE; PNG_RUNS=none ;;  # only the cluster panels in the PNG tar (T3's predictions of every RV run went over 16 MiB)
plan)  # any plan file: PLAN=docs/results/gpu_calls/plans/NAME.json n.sh SECONDS plan; run it again until all is done
  plan_runner "${PLAN:?set PLAN to a plan file}" ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
wait
for r in pre10k pre10k_aug base_lr base_noflip base_aug base_long paper_full paper_base paper abl ${NAME:-}; do
  [ -d $W/$r ] && python tools/experiments.py collect $W/$r > /dev/null 2>&1 &&
    echo "== $r: $(ls $W/$r/runs 2>/dev/null | wc -l) run folders, $(ls $W/$r/runs/*/result.json 2>/dev/null | wc -l) results"
  [ -f $W/$r.out ] && echo "-- $r.out" && grep -hE "runs,|^(done|FAILED)" $W/$r.out | tail -n 16
done
# the phase's pre-trainings' cluster maps side by side, as the report draws them (experiments.py panels)
[ -n "${NAME:-}" ] && [ -f $W/$NAME/results.csv ] &&
  python tools/experiments.py panels $W/$NAME/results.csv $OUT/cluster_panels_$NAME.png > /dev/null 2>&1
for q in $W/*/runs/pre_full*/; do  # the pre-trainings: cluster scores and the last logged iteration
  echo "$q"; cat $q/cluster_quality.json 2>/dev/null | head -c 600; echo
  grep -h "Epoch\[\|Iteration" $q/log.txt 2>/dev/null | tail -n 2
done
# WEIGHTS_OUT="pre_full ..." (a plan phase's last call): those pre-trainings' model.pt in float16 to $OUT, to be carried
# to the next lease in .carry/PHASE with the results tar (15.6 MB each: one fits beside the PROMISE12 pack, none
# beside the ACDC pack)
for q in ${WEIGHTS_OUT:-}; do
  [ -f $W/${NAME:-}/runs/$q/model.pt ] && python tools/experiments.py weights $W/$NAME/runs/$q/model.pt $OUT/${q}_fp16.pt --dtype float16
done
# results only: no checkpoints, no TensorBoard, no PNGs, and nothing over 300 kB (call P2's tar went over 16 MiB,
# most likely with the .*.tmp files of checkpoint writes its timeout cut; P3 dropped everything over 300 kB)
(cd $TW && find n -size +300k) > $TW/big.txt
tar czf $OUT/n_$PHASE.tgz -C $TW --exclude='*.pt' --exclude='*.tmp' --exclude=tensorboard --exclude='*.png' -X $TW/big.txt n
[ $PHASE = n1 ] || [ $PHASE = o1 ] || [ $PHASE = p1 ] || tar czf $OUT/n_${PHASE}_png.tgz -C $TW $(cd $TW && ls n/$PNG_RUNS/runs/ft_*_rv_*/eval/*_predictions.png n/*/runs/pre_*/panels/clusters_latest.png 2>/dev/null)
echo "phase $PHASE ended at $(( $(date +%s) - START )) s"
exit 0

# As run (commit c07971c, one nvidia-h100-x4 lease, 4 x H100): n.sh 588 n1 (564 s), n.sh 586 n2 (564 s),
# n.sh 330 n3 (92 s), then phase n4 was added and committed after the call: n.sh 405 n4 (310 s).
# N2 and N4 tarred the predictions of every fine-tune and went over the 16 MiB a file; N3's command narrowed them to
# pre10k with sed, as this file now does.
# As run (commit 8d19947, one nvidia-h100-x2 lease, 2 x H100): n.sh 588 p1 (563 s), n.sh 588 p2 (569 s; its results
# tar went over 16 MiB and did not come back), JOBS=10 n.sh 580 p3 (460 s; the command re-made the tar without files
# over 300 kB, as this file now does). Device time: 1,649 of 1,800 s.
# As run (commit 0ba48f5, one nvidia-h100-x2 lease, 2 x H100; calls Q, ninth session), each call with
#   SEEDS=2 COUNTS=1,2,4 ONLY='["pre_*", "*_n2_*", "*_n4_*", "*_rv_n1_*", "*_myo_n1_*"]':
#   n.sh 588 p1 (564 s), JOBS=10 n.sh 588 p3 (565 s), JOBS=10 n.sh 500 p3 (85 s), timeout 370 n.sh 380 prof (177 s).
#   Device time 1,447 s. Then, on a one-GPU lease (nvidia-h100-x1, commit f4364a9): n.sh 330 padab (237 s).
# As run (commit 37336a7, one nvidia-h100-x4 lease, 4 x H100; calls T, eleventh session): FIRST=1 n.sh 588 t (565 s),
#   n.sh 588 t (565 s), n.sh 578 t (556 s; 72 of 84 runs done, 11 baseline Myo runs at 2/4 scans left; its PNG tar,
#   with the predictions of every RV run, went over 16 MiB: phase t now tars the cluster panels only). Device time
#   1,736 of 1,800 s.
# As run (commit ef4abfc, one nvidia-h100-x2 lease, 2 x H100; calls R, tenth session): n.sh 588 r (565 s), n.sh 588 r
#   (455 s; all 26 runs done, too little time left for the cuDNN A/B), then the baseline's other LRs at 1 scan for LV
#   and Myo: SEEDS=0,1,2 COUNTS=1 LRS=2e-5,5e-4 METHODS=Baseline ONLY='["*_lv_n1_*"]' JOBS=6 n.sh 420 p3 (276 s) and
#   the same with ONLY='["*_myo_n1_*"]' and n.sh 380 (269 s). Device time 1,625 s. Phase abl's alpha grid is what r ran;
#   abl stays for the lambda_CC and K grids (ONLY='["*lambda_cc*"]' or '["*num_clusters*"]').
# As run (commit 993d08e, one nvidia-h100-x4 lease, 4 x H100; the rows calls, fifteenth session): FIRST=1 JOBS=3
#   n.sh 588 rows (564 s: the three pre-trainings ended in 250 / 473 / 531 s, so none had to resume), n.sh 588 rows
#   (565 s), LAST=1 n.sh 578 rows (366 s: the runner returned when the plan's next runs, at expected_s 420, would
#   not have ended in time; they took 210-340 s at three a GPU, hence rows2's 340). 50 of 93 runs. Device time
#   1,560 of 1,800 s.
# As run (commit 0126c92, one nvidia-h100-x4 lease, 4 x H100; the decdiag calls, sixteenth session): FIRST=1 n.sh 588
#   decdiag (564 s: [dl3] ended in 412 s, [cc0] in 514 s; [rep] and [ctl], at 9.7-11.2 s an epoch with four
#   pre-trainings on the machine, were 3 and 5 epochs short), ONLY='["ft_pre_ours_mi_cc_cc0_*",
#   "ft_pre_ours_mi_cc_dl3_*"]' n.sh 588 decdiag (564 s: 16 of those 18 fine-tunes, 231-384 s each, four or five a
#   GPU; the probes of [cc0] and [dl3]), LAST=1 n.sh 578 decdiag (436 s: [rep] and [ctl] resumed from their last
#   checkpoints and ended in 85 / 107 s, then 14 of [rep]'s fine-tunes and the two left over; [rep] Myo at 1e-4 and RV
#   seed 2 at 1e-4 were held back by LAST), then, by hand, python tools/experiments.py probe on [rep] and [ctl] (44 s,
#   one a GPU; the call's probes start before the runner, so they missed the two that ended in it). 36 of 40 runs.
#   Device time 1,694 of 1,800 s.
# As run (commit 8477523, one nvidia-h100-x4 lease, 4 x H100; the p12 calls, seventeenth session, the PROMISE12 pack):
#   FIRST=1 n.sh 588 p12 (564 s: the pre-training alone on GPU 0 at 21-22 s an epoch of 400 iterations, 20 of 50
#   epochs; 12 baselines on GPUs 1-3, four a GPU, cut some 50 s short), FIRST=1 n.sh 588 p12 (565 s: the 12 ended
#   in 48-53 s, 12 more cut; the pre-training at epoch 42), ONLY='["pre_full", "ft_random_*"]' n.sh 545 p12 (385 s:
#   the pre-training ended in 224 s and was probed, the last 15 baselines ended), then in the same call a Python line
#   that saved pre_full's checkpoint network in float16 to $OUT (experiments.py weights does it since, from model.pt),
#   and experiments.py probe (24 s, a no-op). 28 of then 55 runs. Device time 1,622 of 1,800 s.
# As run (commit ec2478a, one nvidia-h100-x4 lease, 4 x H100; the p12b calls, eighteenth session, the PROMISE12 pack and
#   .carry/p12, restored in 28 s with the data): ONLY='["ft_*"]' JOBS=12 n.sh 588 p12 (567 s: 12 fine-tunes in 465-478 s,
#   12 more cut), the same again (566 s: those 12 in 461-479 s, 3 cut), LAST=1 ONLY='["ft_*"]' JOBS=12 n.sh 570 p12
#   (264 s: the last 3, one a GPU, 253-261 s). The full method's 27 fine-tunes. Device time 1,457 of 1,800 s.
# As run (commit c849b83, one nvidia-h200-x2 lease, 2 x H200, as no 4-GPU machine was lent; the z calls, nineteenth
#   session): GPUS=0,1 JOBS=4 n.sh 575 z (551 s: [unlab] LV seeds 1-2, Myo / RV seed 0 in 484-488 s; the four [tsep]
#   runs started), the same again (552 s: those four cut at epochs 46-48 of 50), LAST=1 GPUS=0,1 JOBS=4 n.sh 400 z
#   (114 s: they ended, 690-715 s over three attempts; LAST held the rest) and in the same call n.sh 280 bench3
#   (266 s). 8 of 29 runs. Device time 1,535 of 1,800 s.
# As run (commit c0effb4, one nvidia-h100-x4 lease, 4 x H100; the p12c calls, twentieth session, the PROMISE12 pack and
#   .carry/p12, restored in 27 s): ONLY='["mt_random_prostate_n4_s0_*", "mt_random_prostate_n8_s0_*",
#   "mt_pre_full_prostate_n4_s0_*", "mt_pre_full_prostate_n8_s0_*"]' JOBS=4 n.sh 588 p12 (565 s: the four started,
#   one a GPU), the same again (566 s: cut at epochs 48-49 of 50, 22-26 s an epoch), the same with LAST=1 and
#   n.sh 380 p12 (111 s: they ended, 1,181-1,205 s over three attempts), then n.sh 390 bench4 (190 s).
#   Device time 1,496 of 1,800 s.
# As run (commit 3c6e22b, one nvidia-h100-x4 lease, 4 x H100; the mt2 calls, twenty-first session, the ACDC pack):
#   FIRST=1 JOBS=6 n.sh 588 mt2 (565 s: pre_full alone on GPU 0 in 484 s; the six random-init runs on GPUs 1-3, two a
#   GPU, cut), JOBS=8 n.sh 588 mt2 (566 s: those ended in 89-125 s; MT + Ours started, cut), LAST=1 JOBS=8 n.sh 578 mt2
#   (235 s: the eight ended; MT + Ours Myo seed 2 held). Device time 1,439 of 1,800 s.
