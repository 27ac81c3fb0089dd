#!/usr/bin/env bash
# The GPU calls of docs/results since calls N: n.sh SECONDS PHASE, on the device machine, from the repository root.
# Start each call with
#   export CALL_START=$(date +%s) && bash .device/setup.sh > /tmp/setup.log 2>&1 && source .device/env.sh &&
#   BIM_GIT_COMMIT=<commit> bash docs/results/gpu_calls/n.sh SECONDS PHASE
# and issue a lease's calls back to back (each within 30 s of the last), so that the work dir /tmp/w carries over
# and cut runs resume from their checkpoints. What each call ran and found: ../README.md (*What was run*, *Findings*)
# and README.md beside this file; the phases' longer comments and every "As run" note before the p12c calls:
# git show 65358d6:docs/results/gpu_calls/n.sh.
# Phases (every run at the paper's lengths and LR 1e-4 unless named otherwise):
#   n1-n4 (calls N), o1-o3 (prepared, never run), p1-p3 (calls P-R: acdc_paper, narrowed by SEEDS, COUNTS, LRS, ONLY,
#       METHODS), abl (ablations; ONLY picks "*alpha*", "*lambda_cc*" or "*num_clusters*"), r (plans/r.json, then the
#       cuDNN A/B if time is left).
#   prof, padab, bench2, bench3, bench4, bench5, bench6: benchmarks, each described at its phase below; cgsmoke: a check.
#   plan: PLAN=docs/results/gpu_calls/plans/NAME.json n.sh SECONDS plan runs any plan file (run it again until done).
#   stage: the ACDC data prepared and nothing else, the first call of a lease whose next calls carry .carry/PHASE.
#   t u v w x y z mt2 mt3 mt4 mtlr mtlr12 mtlr24 lr12 rows rows2 decdiag decdiag2 p12 abl2 abl3 abl4 base1e3 base2e3 mt1e3:
#   plans/$PHASE.json, with FIRST and LAST (below).
# Each runner stops at SECONDS - 25 from CALL_START (20 s of grace for its bundles), then results are tarred to $OUT.
export BIM_GIT_COMMIT=${BIM_GIT_COMMIT:?set BIM_GIT_COMMIT} TORCHINDUCTOR_COMPILE_THREADS=4
T=${1:?seconds}; PHASE=${2:?phase}; START=${CALL_START:-$(date +%s)}; PRESET=acdc_fast; PNG_RUNS=pre10k
TW=${N_TMP:-/tmp/w}  # the work root (a test points it elsewhere)
DR=${N_DATA:-/tmp/data}  # where .device/setup.sh unpacks the data pack (a test points it elsewhere)
D=$TW/acdc; RAW=$DR/acdc_u8/training; DATA=acdc; W=$TW/n; mkdir -p $W
[ $PHASE = p12 ] && { D=$TW/promise12; RAW=$DR/promise12_nifti/training_data; DATA=promise12; }  # prepare.sh promise12
left() { echo $(( T - ($(date +%s) - START) )); }
# the data set, prepared once a machine; a call on a machine without the data or the wheels stops here (an ACDC call
# that carries .carry/PHASE instead of the pack needs the lease's staging call first: ../README.md, *Carrying
# pre-trainings to an ACDC lease*)
if [ $PHASE != bench3 ] && [ $PHASE != bench4 ] && [ ! -f $D/datalist.json ]; then
  [ -d $RAW ] || { echo "no $RAW and no $D/datalist.json: this machine is not staged (carry .device and start the call with bash .device/setup.sh, or stage it with n.sh 120 stage that way and give this call within 30 s)"; exit 2; }
  python -m data_prep $DATA $RAW $D --workers 16 > $TW/prep.log 2>&1 || { cat $TW/prep.log; exit 1; }
fi
python -c "import monai, ignite" 2>/dev/null ||
  { echo "monai / pytorch-ignite not importable: source .device/env.sh, or export PYTHONPATH=/tmp/site on a staged machine"; exit 2; }
# a plan phase's work dir carried from an earlier lease (CARRY, default .carry/PHASE, an ignored folder the run call
# carries): n_PHASE.tgz, the results tar of that lease's last call, and pre_*_fp16.pt, its pre-trainings' model.pt in
# float16 (experiments.py weights); restored once, before anything runs, so that the runner skips every finished run
# and fine-tunes from those pre-trainings (the p12 calls of the seventeenth session brought back pre_full). Into a work
# dir that an earlier call of this lease started (a first call that carried .device and ran a pre-training), without
# replacing any of its files (--skip-old-files), so that no carried file overwrites a newer one; a marker file keeps
# the lease's later calls from restoring again.
CARRY=${CARRY:-.carry/$PHASE}
if [ -f $CARRY/n_$PHASE.tgz ] && [ ! -f $W/.restored_$PHASE ]; then
  tar xzf $CARRY/n_$PHASE.tgz -C $TW --skip-old-files || exit 1
  for f in $CARRY/pre_*_fp16.pt; do
    [ -f $f ] || continue; q=$(basename $f _fp16.pt); [ -f $W/$PHASE/runs/$q/model.pt ] && continue
    python tools/experiments.py weights $f $W/$PHASE/runs/$q/model.pt --dtype float32 || exit 1
  done
  touch $W/.restored_$PHASE
  echo "restored $W/$PHASE from $CARRY: $(ls $W/$PHASE/runs/*/result.json | wc -l) finished runs"
fi
nvidia-smi -L; echo "data ready at $(( $(date +%s) - START )) s"
[ $PHASE = stage ] && { echo "staged: $D and /tmp/site for the lease's next call"; exit 0; }
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
  # whose grid's expected_s would not end before the runner's timeout (less 10 s) is held, and a shorter one runs.
  # SKIP_COLLECTED (a later lease of a plan): the committed results CSVs of its earlier leases, whose runs it skips,
  # e.g. SKIP_COLLECTED='["docs/results/acdc_paper_length/results_calls_mt3.csv.gz"]'.
  NAME=$(basename "$1" .json); PNG_RUNS=$NAME; local budget=$(( $(left) - 25 ))
  CUDA_VISIBLE_DEVICES=${GPUS:-0,1} timeout -k 30 $budget python tools/experiments.py run_plan "$1" \
    --dataset_dir $D --work_dir $W/$NAME --gpus $(echo ${GPUS:-0,1} | tr ',' '\n' | wc -l) --jobs ${JOBS:-12} \
    --only "${2:-[\"*\"]}" ${LAST:+--finish_by $(( budget - 10 ))} \
    ${SKIP_COLLECTED:+--skip_collected "$SKIP_COLLECTED"} >> $W/$NAME.out 2>&1
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
bench5|bench6)  # bench5: twenty-first session, one GPU, the ACDC pack: bench2's open question for meanteacher_seg 0.7.1 (separate teacher
  # forwards, autotuned cuDNN): does the bundle run under CUDA graphs (compile_mode reduce-overhead), and how long is
  # an epoch against the default mode? LV, 1 scan, 3 epochs of 100 iterations with validation; the first run half the
  # time left, the second the rest. As run (commit a668580, one nvidia-h100-x1, 189 s): the default mode ended (epoch
  # 1 54.3 s with its cold compile, epochs 2-3 6.1 / 6.4 s); the CUDA-graph run got only a quarter of the call (the
  # first run took half of what was left, the second again half: since fixed) and was cut inside its first epoch; run
  # again at once by hand on the warm machine (its compile cache partly filled): epochs 12.4 / 4.8 / 4.6 s, the same
  # validation Dice (0.0686 / 0.0702 against 0.0684 / 0.0702 at epochs 2-3).
  # bench6 (prepared in the twenty-fifth session, one GPU, the ACDC pack, `n.sh 330 bench6`): the same runs under CUDA
  # graphs (0.7.2's default) with compile_teacher False, then True. tools/benchmark_meanteacher.py found the compiled
  # teacher 1.1-1.5x faster a step under CUDA graphs (no faster in the default mode); does an epoch of the bundle agree?
  # As run (commit dfd9a54, one nvidia-h100-x1, n.sh 330 bench6, 163 s): epochs 2-3 3.07 / 2.96 s eager teacher, 2.29 / 2.42 s compiled
  # (1.28x), validation Dice 0.0685 / 0.0702 against 0.0685 / 0.0703; the first epoch 42.5 against 24.9 s (the second
  # run found the student's compile cached, so that is no comparison).
  if [ $PHASE = bench5 ]; then KEY=compile_mode; VALUES="None reduce-overhead"; else KEY=compile_teacher; VALUES="False True"; fi
  for v in $VALUES; do
    budget=$(( $(left) / 2 - 5 )); [ $v = ${VALUES##* } ] && budget=$(( $(left) - 5 ))
    timeout $budget python -m monai.bundle run --config_file bundles/meanteacher_seg/configs/train.json \
      --dataset_dir $D --task lv --labelled_scans 1 --epochs 3 --iters_per_epoch 100 --warmup_epochs 1 --rampup_epochs 1 \
      --$KEY $v --progress_bar False --output_dir $TW/mt_${KEY}_$v > $TW/mt_${KEY}_$v.log 2>&1
    echo "meanteacher_seg $KEY $v: rc $? at $(( T - $(left) )) s"
    grep -hE "Complete. Time taken|Key metric|Error|error" $TW/mt_${KEY}_$v.log | tail -n 8
  done 2>&1 | tee $OUT/$PHASE.log
  exit 0 ;;
cgsmoke)  # prepared in the twenty-second session, one GPU, the ACDC pack, about 3 minutes: meanteacher_seg 0.7.2 runs
  # under CUDA graphs by default, measured at full length for mean_teacher only (the mt3 calls' [cg]). Each of its
  # seven methods (configs/variants), all at once on the one GPU: LV, 1 scan, one epoch of 40 iterations and its
  # validation in the default (CUDA-graph) mode. A method passes if the bundle exits 0 with a finite validation Dice.
  for v in bundles/meanteacher_seg/configs/variants/*.json; do
    m=$(basename $v .json)
    (timeout $(( $(left) - 15 )) python -m monai.bundle run --config_file "['bundles/meanteacher_seg/configs/train.json','$v']" \
       --dataset_dir $D --task lv --labelled_scans 1 --epochs 1 --iters_per_epoch 40 --warmup_epochs 0 --rampup_epochs 1 \
       --progress_bar False --output_dir $TW/cg_$m > $TW/cg_$m.log 2>&1
     echo "cgsmoke $m: rc $? at $(( T - $(left) )) s; $(grep -hoE 'val_mean_dice: [0-9.naNinf]+' $TW/cg_$m.log | tail -n 1)") &
  done 2>&1 | tee $OUT/cgsmoke.log
  wait; sleep 1; for v in bundles/meanteacher_seg/configs/variants/*.json; do m=$(basename $v .json)
    grep -hE "Error|error|overwritten" $TW/cg_$m.log | tail -n 3 | sed "s/^/$m: /"; done | tee -a $OUT/cgsmoke.log
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
t|u|v|w|x|y|z|mt2|mt3|mt4|mtlr|mtlr12|mtlr24|lr12|rows|rows2|decdiag|decdiag2|p12|abl2|abl3|abl4|base1e3|base2e3|mt1e3)  # a plan phase, usually 4 GPUs and 3
  # calls: plans/$PHASE.json.
  # What each plan holds: README.md beside this file; the calls to give it: ../README.md, *Next steps*. Ran: mt4, p12d,
  # mtlr, decdiag2 but its RV runs, mtlr12 (its seed 2's MT + Ours through rows2), rows2 (the rows2a to rows2c calls,
  # as run below), p12 (p12e), lr12's Ours (Dec) MI+CC but Myo 4 and mtlr24's Mean Teacher at 2 scans seed 0 (the
  # lr12b lease, as run below; the rows2c lease's lr12 pre-trainings were lost with .carry/lr12, which is ignored by git
  # and so lasts one session), lr12's Contrast (Enc) and mtlr24's Mean Teacher at 2 scans seed 1 and RV 4 scans seed 0
  # (the lr12c lease, as run below), lr12's IIC (Dec) and Myo 4 and mtlr24's other Mean Teacher runs (the lr12d lease,
  # as run below; lr12 is done), base1e3 (the baseline at LR 1e-3, above the LR grid whose top it picked in 18 of 27
  # units; the base1e3 lease, as run below) and base2e3's three 1-scan seed-0 runs (a probe one step further), mtlr24's
  # MT + Ours at 2 scans and 8 of mt1e3's 21 runs (the mtlr24d lease, as run below), mt1e3's other 1- and 2-scan runs
  # (the mt1e3b lease, as run below), mtlr24's MT + Ours at 4 scans seed 0 and mt1e3's 4-scan runs of seed 0 (the
  # mtlr24e lease, as run below), the rest of mtlr24 and mt1e3 (4 scans seed 1, the mtlr24f lease; both done). Left:
  # what u, v and z left, base2e3's other 24. Also ran: abl3 (lambda_CC and K's second pre-training, all of it, the
  # abl3 lease on 2 GPUs with GPUS=0,1 JOBS=7 then JOBS=14, as run below; on 4 GPUs JOBS=20 takes them all) and abl4
  # (a third pre-training of the default point, lambda_CC = 0 and K = 20; one call, as run below).
  # FIRST=1 (the first call): the pre-training(s) (PRE, run-name patterns; default the full method's) alone on
  # PRE_GPUS (default GPU 0), the runs that do not need them (REST) on REST_GPUS (default the other GPUs); later calls:
  # one runner on all the machine's GPUs (GPUS; ONLY narrows it, e.g. ONLY='["ft_random_myo_*"]'). Since the fifteenth session every plan
  # phase also runs pretrain_bim's path_dependence.json on each of its finished pre-trainings that lacks one (in the
  # background at the start of a later call and again after its runner, for those that ended in it; after the runners
  # in a FIRST call; each only if a minute is left).
  P=docs/results/gpu_calls/plans/$PHASE.json
  [ $PHASE = t ] && REST=${REST:-'["pre_full_*", "ft_pre_full_*_pre5k", "ft_random_*"]'}
  case $PHASE in v|mt2|mt3|mt4|mtlr|mtlr12|mtlr24|mt1e3) REST=${REST:-'["mt_random_*"]'} ;; esac
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
  # (GPUS defaults to 0,1: give GPUS=0,1,2,3 on 4 GPUs; the abl2 calls ran plans/abl2.json so)
  plan_runner "${PLAN:?set PLAN to a plan file}" ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
wait
for r in pre10k pre10k_aug base_lr base_noflip base_aug base_long paper_full paper_base paper abl ${NAME:-}; do
  [ -d $W/$r ] && python tools/experiments.py collect $W/$r > /dev/null 2>&1 &&
    echo "== $r: $(ls $W/$r/runs 2>/dev/null | wc -l) run folders, $(ls $W/$r/runs/*/result.json 2>/dev/null | wc -l) results"
  [ -f $W/$r.out ] && echo "-- $r.out" && grep -hE "runs,|^(done|FAILED)" $W/$r.out | tail -n 16
done
# a plan phase's unfinished runs: epoch, seconds an epoch and seconds left, to narrow the lease's next call (ONLY) to the
# runs that can end in it, before it starts (experiments.py progress)
[ -n "${NAME:-}" ] && [ -d $W/$NAME/runs ] && echo "-- unfinished runs" && python tools/experiments.py progress $W/$NAME | head -n 24
# the phase's pre-trainings' cluster maps side by side, as the report draws them (experiments.py panels)
[ -n "${NAME:-}" ] && [ -f $W/$NAME/results.csv ] &&
  python tools/experiments.py panels $W/$NAME/results.csv $OUT/cluster_panels_$NAME.png > /dev/null 2>&1
for q in $W/*/runs/pre_full*/; do  # the pre-trainings: cluster scores and the last logged iteration
  echo "$q"; cat $q/cluster_quality.json 2>/dev/null | head -c 600; echo
  grep -h "Epoch\[\|Iteration" $q/log.txt 2>/dev/null | tail -n 2
done
# WEIGHTS_OUT="pre_full ..." (a plan phase's last call): those pre-trainings' model.pt in float16 to $OUT, to be carried
# to the next lease in .carry/PHASE with the results tar (15.6 MB each: one fits beside the PROMISE12 pack, none
# beside the ACDC pack, so an ACDC lease that carries them stages its machine first: phase stage, at the top)
for q in ${WEIGHTS_OUT:-}; do
  [ -f $W/${NAME:-}/runs/$q/model.pt ] && python tools/experiments.py weights $W/$NAME/runs/$q/model.pt $OUT/${q}_fp16.pt --dtype float16
done
# results only: no checkpoints, no TensorBoard, no PNGs, and nothing over 300 kB (call P2's tar went over 16 MiB,
# most likely with the .*.tmp files of checkpoint writes its timeout cut; P3 dropped everything over 300 kB). A plan
# phase (NAME) tars its own work dir and logs only, so that two n.sh side by side in one call (the rows2c and lr12b
# leases) do not both bring back everything; the other phases tar all of $TW/n.
TAR_ITEMS=n; PANELS='n/*'
[ -n "${NAME:-}" ] && [ -d $W/$NAME ] && { TAR_ITEMS=$(cd $TW && ls -d n/$NAME n/$NAME.*); PANELS=n/$NAME; }
(cd $TW && find $TAR_ITEMS -size +300k) > $TW/big.txt
tar czf $OUT/n_$PHASE.tgz -C $TW --exclude='*.pt' --exclude='*.tmp' --exclude=tensorboard --exclude='*.png' -X $TW/big.txt $TAR_ITEMS
PNGS=$(cd $TW && ls n/$PNG_RUNS/runs/ft_*_rv_*/eval/*_predictions.png $PANELS/runs/pre_*/panels/clusters_latest.png 2>/dev/null)
# (none, as in the PROMISE12 calls, whose pre-training came from .carry without its panels: no empty tar, no error)
[ $PHASE = n1 ] || [ $PHASE = o1 ] || [ $PHASE = p1 ] || [ -z "$PNGS" ] || tar czf $OUT/n_${PHASE}_png.tgz -C $TW $PNGS
echo "phase $PHASE ended at $(( $(date +%s) - START )) s"
exit 0

# As run: the calls before the p12c calls: git show 65358d6:docs/results/gpu_calls/n.sh; the p12c to mt4 calls:
#   git show e1f0c39:docs/results/gpu_calls/n.sh (and ../README.md, *What was run*, which gives each call as given).
# As run (commit 2780654, one nvidia-h100-x4 lease, 4 x H100; the p12d calls, twenty-fifth session, the PROMISE12 pack
#   and .carry/p12): ONLY='["mt_*_prostate_n6_s0_*", "mt_*_prostate_n4_s1_*", "mt_*_prostate_n6_s1_*",
#   "mt_*_prostate_n8_s1_*"]' JOBS=8 n.sh 588 p12 (568 s: the eight at epochs 23-24 of 50, 18.1-19.0 s an epoch), the
#   same again (566 s: four ended, four cut at epoch 50 before their test), the same with LAST=1 and n.sh 300 p12
#   (63 s: they ended). Device time 1,368 of 1,800 s.
# As run (commit 7513bc5, one nvidia-h100-x4 lease, 4 x H100; the mtlr calls, twenty-sixth session, the ACDC pack):
#   FIRST=1 JOBS=8 n.sh 588 mtlr (566 s: pre_full in 498 s; the eight random-init runs on GPUs 1-3, three a GPU, two
#   ended, six cut at epochs 45-50), JOBS=9 n.sh 588 mtlr (566 s: those ended; four MT + Ours ended, five cut),
#   LAST=1 JOBS=9 n.sh 330 mtlr (155 s: all 17 done), then by hand run_plan of the full method's [samepre] at 2 / 4
#   scans, seed 0, three LRs, 18 at once, under timeout 330 in /tmp/w/n/mtlr: none ended (epochs 41-50 of 50).
#   Device time 1,716 of 1,800 s.
# As run (commit 574dc50, one nvidia-h100-x4 lease, 4 x H100; the decdiag2 calls, twenty-seventh session, the ACDC
#   pack): FIRST=1 n.sh 588 decdiag2 (539 s: the four pre-trainings in 445-523 s), LAST=1 JOBS=12
#   ONLY='["ft_*_lv_*"]' n.sh 560 decdiag2 (308 s: 12 done, 296-305 s), LAST=1 JOBS=12 ONLY='["ft_*_myo_*"]' n.sh 335
#   decdiag2 then n.sh 200 cgsmoke (94 s: --finish_by held the 12 runs, expected_s 340 > 310 s; cgsmoke 89 s), the Myo
#   line again with n.sh 385 (274 s: 12 done). RV's 12 fine-tunes not run. 1,534 s held (a 280 s start), and 181 s
#   lost to three refused starts before it.
# As run (commit 2358fa7, one nvidia-h100-x4 lease, 4 x H100; the mtlr12 calls, twenty-eighth session, the ACDC pack;
#   a quick start, about 50 s): FIRST=1 JOBS=6 REST='["mt_random_*_s1_*"]' n.sh 588 mtlr12 (544 s: pre_full in 530 s,
#   the six random-init runs of seed 1 on GPUs 1-3 in 468-483 s), ONLY='["pre_full", "*_s1_*"]' JOBS=9 n.sh 588 mtlr12
#   (563 s: the nine MT + Ours [onepre] of seed 1 in 451-560 s, all ended), ONLY='["mt_random_*_s2_*"]' JOBS=6 n.sh
#   588 mtlr12 (456 s: seed 2's six random-init runs on 4 GPUs in 352-452 s). 1,684 s held; pre_full renamed
#   pre_full_mtlr1 in the CSV.
# As run (commit 028e4a4, one nvidia-h100-x2 lease, 2 x H100, after two refused nvidia-h100-x4 starts; the rows2a
#   calls, twenty-ninth session, the ACDC pack; a start of about 300 s): FIRST=1 JOBS=6 PRE='["pre_iic_dec"]'
#   PRE_GPUS=0 REST_GPUS=1 REST='["ft_random_*"]' n.sh 588 rows2 (519 s: pre_iic_dec in 437 s, the six [dicece] at
#   once on GPU 1 in 476-482 s), LAST=1 JOBS=10 ONLY='["ft_pre_iic_dec_*"]' n.sh 588 rows2 (387 s: IIC (Dec)'s nine
#   4-scan fine-tunes, five a GPU, in 320-384 s), then, with rows2.json's IIC (Dec) LR entry added in the checkout,
#   JOBS=12 ONLY='["ft_pre_iic_dec_*_lr2e-5", "ft_pre_iic_dec_*_lr5e-4"]' n.sh 515 rows2 (445 s: all 12, six a GPU,
#   in 432-442 s). 1,702 s held, 181 s lost to the refused starts; pre_iic_dec renamed pre_iic_dec_rows2 in the CSV.
# As run (commit 5c35b04, one nvidia-h100-x4 lease, 4 x H100; the rows2b calls, thirtieth session, the ACDC pack; a
#   start of about 80 s): FIRST=1 PRE='["pre_contrast_enc", "pre_ours_mi_cc"]' PRE_GPUS=0,1 REST_GPUS=none n.sh 588
#   rows2 (554 s: pre_contrast_enc in 271 s, pre_ours_mi_cc in 514 s), JOBS=24 ONLY='["ft_pre_contrast_enc_*",
#   "ft_pre_ours_mi_cc_*"]' n.sh 588 rows2 (571 s: 24 ended, six a GPU, in 509-517 s), then LAST=1 JOBS=20
#   WEIGHTS_OUT=pre_contrast_enc ONLY='["ft_pre_ours_mi_cc_*", "ft_pre_contrast_enc_myo_n4_s2_*",
#   "ft_pre_contrast_enc_*_s0_lr*", "ft_pre_contrast_enc_lv_n4_s1_*", "ft_pre_contrast_enc_myo_n4_s1_*"]' n.sh 538
#   rows2 (473 s: 20 ended, five a GPU, in 388-422 s; the two RV seed-1 LR runs left out to fit). 1,714 s held;
#   pre_contrast_enc and pre_ours_mi_cc renamed *_rows2 in the CSV; .carry/rows2 holds the last call's tar and weights.
# As run (commit 86ca7d8, one nvidia-h100-x4 lease, 4 x H100; the p12e calls, thirty-first session, the PROMISE12
#   pack and .carry/p12): JOBS=6 n.sh 560 p12 (538 s: the six seed-2 Mean Teacher runs at epochs 28-36 of 50,
#   10.8-13.9 s an epoch), JOBS=6 n.sh 450 p12 (414 s: all six ended, 237-391 s a run over the two calls). p12 is
#   done. 1,011 s held. Then, a fresh lease with the ACDC pack (the abl2 calls, commit cfeba64; a start of about
#   60 s): GPUS=0,1,2,3 JOBS=20 PLAN=docs/results/gpu_calls/plans/abl2.json n.sh 520 plan (497 s: the five
#   pre-trainings side by side in 311-448 s, nine fine-tunes in 124-132 s, six cut before they began), the same
#   with n.sh 185 (106 s: the six in 74-87 s). Device time 1,699 of 1,800 s.
# As run (commit 79867c7, one nvidia-h100-x4 lease, 4 x H100; the rows2c calls, thirty-second session, the ACDC pack;
#   a start of about 40 s): carrying .device, `n.sh 120 stage && { (FIRST=1 PRE='["pre_full"]' PRE_GPUS=0
#   REST_GPUS=none n.sh 590 rows2 > /tmp/c1_rows2.log 2>&1) & (FIRST=1 PRE='["pre_*"]' PRE_GPUS=1,2,3 REST_GPUS=none
#   n.sh 590 lr12 > /tmp/c1_lr12.log 2>&1) & wait; rm -f $OUT/n_rows2_png.tgz; }` (553 s: staged in 38 s; pre_full
#   in 486 s, lr12's pre_contrast_enc / pre_iic_dec / pre_ours_mi_cc in 261 / 414 / 466 s, one a GPU); carrying
#   .carry/rows2 (restored in 38 s into the started work dir: 47 finished runs), JOBS=11 ONLY='["pre_full",
#   "mt_pre_full_*_s2_*", "ft_pre_contrast_enc_*"]' n.sh 588 rows2 (565 s: the two Contrast (Enc) runs in 259-262 s,
#   six MT + Ours in 462-505 s, three cut at epochs 47-48); carrying nothing, `experiments.py weights` of lr12's three
#   pre-trainings to $OUT beside LAST=1 JOBS=21 WEIGHTS_OUT=pre_full ONLY='["mt_pre_full_*_s2_*",
#   "ft_pre_full_*_samepre0"]' n.sh 575 rows2 (481 s: the three resumed and ended, the 18 [samepre0], 4-5 a GPU, in
#   332-441 s). rows2 is done. 1,670 s held; pre_full renamed pre_full_mtlr2 in the CSV.
# As run (commit 4e37995, one nvidia-h100-x4 lease, 4 x H100; the lr12b calls, thirty-third session, the ACDC pack; a
#   start of about 40 s): carrying .device, `n.sh 120 stage && { (GPUS=0,1,2,3 JOBS=24 ONLY='["pre_ours_mi_cc",
#   "ft_pre_ours_mi_cc_*"]' n.sh 590 lr12 > /tmp/c1_lr12.log 2>&1) & (GPUS=1,2,3 JOBS=6 ONLY='["mt_random_*_n2_s0_*"]'
#   n.sh 590 mtlr24 > /tmp/c1_mt.log 2>&1) & wait; rm -f $OUT/n_mtlr24_png.tgz; }` (566 s: the six Mean Teacher runs,
#   two a GPU, in 474-482 s; pre_ours_mi_cc cut at its last epoch, 7.5 s an epoch); carrying nothing, with
#   `export CALL_START=$(date +%s) PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 BIM_GIT_COMMIT=...`, JOBS=24
#   ONLY='["pre_ours_mi_cc", "ft_pre_ours_mi_cc_*"]' n.sh 588 lr12 (568 s: the pre-training ended in 34 s, 24
#   fine-tunes, six a GPU, in 472-490 s, 24 more started in the last minute), the same with LAST=1 and n.sh 572 (509 s:
#   the 24 resumed and ended in 442-488 s; Myo 4's six held). 1,700 s held; pre_ours_mi_cc renamed
#   pre_ours_mi_cc_lr12b in the CSV.
# As run (commit 90553f3, one nvidia-h200-x4 lease, 4 x H200; the lr12c calls, thirty-fourth session, the ACDC pack; a
#   start of about 40 s): the lr12b shape with ONLY='["pre_contrast_enc", "ft_pre_contrast_enc_*"]' and the Mean
#   Teacher line narrowed to "mt_random_*_n2_s1_*" (570 s: pre_contrast_enc in 239 s, 24 fine-tunes cut after about
#   325 s); carrying nothing, both lines side by side, the Mean Teacher one on GPUS=0,1,2,3, n.sh 585 (564 s: the 24
#   ended, the six Mean Teacher runs too, Myo's 12 fine-tunes started late); LAST=1, n.sh 570 lr12 beside
#   ONLY='["mt_random_*_n4_s0_*"]' n.sh 570 mtlr24 (151 s: the 12 ended; the Mean Teacher six held, expected_s 560 >
#   545 s); that Mean Teacher line without LAST, n.sh 405 (382 s: RV's two ended in 317-320 s, four cut at epochs 48-50
#   of 50 and lost) and n.sh 57 (33 s: nothing). 1,776 s held; pre_contrast_enc renamed pre_contrast_enc_lr12c.
# As run (commit 772a19d, one nvidia-h200-x4 lease, 4 x H200; the lr12d calls, thirty-fifth session, the ACDC pack):
#   carrying .device, n.sh 120 stage, then side by side GPUS=0,1,2,3 JOBS=24 ONLY='["pre_iic_dec", "ft_pre_iic_dec_*",
#   "pre_ours_mi_cc", "ft_pre_ours_mi_cc_myo_n4_*"]' n.sh 590 lr12 and GPUS=1,2,3 JOBS=10 ONLY='["mt_random_lv_n4_s0_*",
#   "mt_random_myo_n4_s0_*", "mt_random_*_n4_s1_*"]' n.sh 590 mtlr24 (571 s: pre_iic_dec in 354 s, pre_ours_mi_cc cut at
#   epoch 29; six Mean Teacher runs near their end); carrying nothing, PYTHONPATH=/tmp/site, both lines with n.sh 585,
#   the Mean Teacher one on GPUS=0,1,2,3 (566 s: 23 fine-tunes and six Mean Teacher runs ended, pre_ours_mi_cc in 429 s
#   more, 19 fine-tunes and 4 Mean Teacher runs cut); the same with LAST=1 on the lr12 line and n.sh 565 (313 s: all
#   ended, nothing held). 1,518 s held; pre_iic_dec and pre_ours_mi_cc renamed pre_*_lr12d. lr12 is done.
# As run (commit d564b11, one nvidia-h100-x2 lease that came as 2 x H200; the base1e3 calls, thirty-sixth session, the
#   ACDC pack; 4 x GPU kinds were not lent): carrying .device, `n.sh 120 stage && GPUS=0,1 JOBS=14 n.sh 590 base1e3`
#   (568 s: 14 fine-tunes, seven a GPU, ended in 474-489 s; 13 started in the last minute); carrying nothing, with
#   `export CALL_START=$(date +%s) PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 BIM_GIT_COMMIT=...`, `GPUS=0,1 JOBS=14 LAST=1
#   n.sh 585 base1e3` (472 s: the 13 resumed and ended). base1e3 is done; 1,101 s held, given back with 699 s left.
#   Then (commit dc33b5c, one nvidia-h200, H200; the base2e3a call) carrying .device, `GPUS=0 JOBS=3
#   ONLY='["ft_random_*_n1_s0_*"]' n.sh 400 base2e3` (337 s: three fine-tunes on one GPU in 284-294 s); 322 s left.
# As run (commit 79d39dd, one nvidia-h100-x4 lease that came as 4 x H200; the mtlr24d calls, thirty-seventh session,
#   the ACDC pack; a start of about 45 s): carrying .device, `n.sh 120 stage && { (GPUS=0,1,2,3 JOBS=18
#   ONLY='["pre_full", "mt_pre_full_*_n2_*"]' n.sh 590 mtlr24 > /tmp/c1_mtlr24.log 2>&1) & (GPUS=1,2,3 JOBS=6
#   ONLY='["mt_random_*_n1_s0_*", "mt_random_*_n1_s1_*"]' n.sh 590 mt1e3 > /tmp/c1_mt1e3.log 2>&1) & wait; rm -f
#   $OUT/n_mtlr24_png.tgz; }` (569 s: pre_full in 445 s on GPU 0, the six Mean Teacher runs two a GPU in 420-429 s, the
#   18 MT + Ours runs started as pre_full ended); carrying nothing, PYTHONPATH=/tmp/site, the mtlr24 line with n.sh 585
#   (564 s: the 18 at epochs 37-44 of 50); the mtlr24 line with LAST=1 and n.sh 562 beside GPUS=0,1,2,3 JOBS=6
#   ONLY='["mt_random_*_n1_s2_*", "mt_random_*_n2_s0_*"]' n.sh 562 mt1e3 (541 s: the 18 ended in 184-362 s, two Mean
#   Teacher runs in 405-409 s, four cut at epoch 45 of 50 and lost). 1,749 s held; pre_full renamed pre_full_mtlr24d.
# As run (commit 7c77e54, one nvidia-h200; the mt1e3b calls, thirty-eighth session, the ACDC pack; a start of about
#   33 s): carrying .device, `GPUS=0 JOBS=7 ONLY='["mt_random_lv_n1_s2_*", "mt_random_rv_n1_s2_*",
#   "mt_random_rv_n2_s0_*", "mt_random_myo_n2_s0_*", "mt_random_*_n2_s1_*"]' n.sh 590 mt1e3` (568 s: the seven at
#   epoch 24-25 of 50, 18.1-18.5 s an epoch); carrying nothing, PYTHONPATH=/tmp/site, the same line with LAST=1 and
#   n.sh 585 (591 s: all at epoch 50, stopped before their final test, the runner killed 30 s after its stop signal);
#   the same line with n.sh 555 (94 s: the seven ended in 68-72 s). 1,301 s held, given back with 492 s left. Then
#   (commit a9a3ebb, a fresh H200, a start of about 36 s) carrying .device, `GPUS=0 JOBS=1
#   ONLY='["mt_random_lv_n4_s0_*"]' n.sh 440 mt1e3` (417 s: 5.7 s an epoch, epoch 50 reached, its final test cut:
#   a lone Mean Teacher run needs about 390 s of runner), then carrying nothing `python tools/experiments.py weights
#   RUN/model.pt $OUT/model_fp16.pt --dtype float16` (16 s; tested on CPU, not collected).
# As run (commit 5b5a086, one nvidia-h200-x2, 2 x H200; the mtlr24e calls, thirty-ninth session, the ACDC pack; a
#   start of about 31 s): carrying .device, `n.sh 120 stage && (GPUS=0,1 JOBS=9 ONLY='["pre_full",
#   "mt_pre_full_*_n4_s0_*"]' n.sh 590 mtlr24 > /tmp/a.log 2>&1 & GPUS=1 JOBS=3 ONLY='["mt_random_*_n4_s0_*"]' n.sh
#   590 mt1e3 > /tmp/b.log 2>&1 & wait); rm -f $OUT/n_mtlr24_png.tgz` (568 s: pre_full in 421 s on GPU 0, the three
#   Mean Teacher runs at epoch 50 on GPU 1 before their final test, the nine MT + Ours runs started as pre_full ended,
#   five on GPU 0 and four on GPU 1); carrying nothing, PYTHONPATH=/tmp/site, both lines with n.sh 585 (563 s: the three
#   ended in 62-66 s, the nine at epochs 42-48 of 50); the mtlr24 line with LAST=1 and n.sh 420 (192 s: the nine ended
#   in 91-176 s). 1,370 s held, 426 s of device time left; pre_full renamed pre_full_mtlr24e.
# As run (commit cb563a7, a fresh nvidia-h200-x2, the same session's last 426 s; the rerun call, the ACDC pack; a start
#   of about 42 s): carrying .device, `PLAN=docs/results/gpu_calls/plans/rerun.json GPUS=0,1 JOBS=6 n.sh 362 plan`
#   (311 s: six of base1e3's baseline runs again, three a GPU, 264-273 s).
# As run (commit 2f0c763, one nvidia-h200-x2, 2 x H200; the mtlr24f calls, fortieth session, the ACDC pack; a start
#   of about 33 s): the mtlr24e lines with s1 for s0 (`ONLY='["pre_full", "mt_pre_full_*_n4_s1_*"]'` and
#   `ONLY='["mt_random_*_n4_s1_*"]'`), n.sh 590 carrying .device (567 s: pre_full in 463 s on GPU 0, the three Mean
#   Teacher runs on GPU 1 not yet at their final test, the nine MT + Ours runs started as pre_full ended); carrying
#   nothing, PYTHONPATH=/tmp/site, both lines with n.sh 585 (563 s: the three ended in 70-98 s); the mtlr24 line with
#   LAST=1 and n.sh 575 (261 s: the nine ended in 96-243 s). 1,445 s of device time with the machine given back at
#   once; pre_full renamed pre_full_mtlr24f. Plans mtlr24 and mt1e3 are done.
# As run (commit d4e2627, a fresh nvidia-h200-x2, the session's last 355 s; the abl3probe call, the ACDC pack; a
#   start of about 40 s): carrying .device, `GPUS=0,1 JOBS=7 n.sh 265 abl3` (242 s: the 7 pre-trainings at once, four
#   on GPU 0 and three on GPU 1, first epoch 46-82 s, then 17.1-23.8 s and 13.9-16.1 s an epoch, epochs 5-9 of 25 when
#   the runner stopped; lost with the machine, a timing only).
# As run (commit b5de931, a fresh nvidia-h200-x2, the abl3 calls, forty-first session, the ACDC pack; a start of about
#   31 s): carrying .device, `n.sh 120 stage && GPUS=0,1 JOBS=7 n.sh 590 abl3` (568 s: GPU 1's three pre-trainings in
#   451-464 s, GPU 0's four cut at epochs 19-24 of 25, three fine-tunes cut); carrying nothing, PYTHONPATH=/tmp/site,
#   `GPUS=0,1 JOBS=14 n.sh 585 abl3` (411 s: the four resumed from their checkpoints, 142-215 s more, and all 21
#   fine-tunes, 75-156 s). abl3 is done; the machine given back at once, 1,018 s held.
# As run (commit 897bfd5, a fresh nvidia-h200-x2, the same session; the abl4 call; a start of about 35 s): carrying
#   .device, `n.sh 120 stage && GPUS=0,1 JOBS=12 n.sh 555 abl4` (504 s: lambda_CC = 0's pre-training alone on GPU 1 in
#   204 s, the default point's and K = 20's on GPU 0 in 339-349 s, the nine fine-tunes 87-111 s). abl4 is done.
