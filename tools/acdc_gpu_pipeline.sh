#!/usr/bin/env bash
# The ACDC GPU protocol behind the numbers in the bundles' docs (one GPU, ~10 minutes per stage).
#   bash tools/acdc_gpu_pipeline.sh pretrain-finetune RAW_ACDC_TRAINING_DIR WORK_DIR
#   bash tools/acdc_gpu_pipeline.sh meanteacher RAW_ACDC_TRAINING_DIR WORK_DIR      (after the first stage)
# Stage 1: prepare ACDC (reference split), pre-train BIM (full method) for PRETRAIN_ITERS iterations, then
# fine-tune LV from 1 labelled scan (split seed 0) from random init and from the BIM checkpoint at each
# learning rate of FT_LRS, selecting the best-validation checkpoint, and evaluate it on the 16 test scans.
# Stage 2: Mean Teacher on the same task from random init and from the BIM checkpoint (pre-trains first
# when WORK_DIR holds no checkpoint). Stage `pretrain` alone is there too.
# Results: WORK_DIR/results/*.json (one summary per run) and WORK_DIR/results/summary.csv.
set -euo pipefail
stage="$1"; raw="$2"; work="$3"
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
PRETRAIN_EPOCHS="${PRETRAIN_EPOCHS:-10}"; PRETRAIN_ITERS="${PRETRAIN_ITERS:-200}"
EXTRA="${EXTRA:-}"   # extra overrides for every bundle run (e.g. a small --crop_size for a CPU check)
# the light labelled augmentation that the docs' numbers were measured with (the bundles' ACDC default before 0.3.0);
# AUG= (empty) takes the bundles' current default, T's ranges (bundles/bim/tasks.py)
AUG="${AUG---max_rotation_deg 15.0 --scale_range [0.9,1.1] --gamma_range None}"
FT_EPOCHS="${FT_EPOCHS:-20}"; FT_ITERS="${FT_ITERS:-100}"
FT_LRS="${FT_LRS:-2e-5 1e-4}"
MT_LR="${MT_LR:-1e-4}"
TASK="${TASK:-lv}"; N="${N:-1}"; SEED="${SEED:-0}"
data="$work/acdc"; res="$work/results"; mkdir -p "$res"
[ -f "$data/datalist.json" ] || $PY -m data_prep acdc "$raw" "$data" --workers "$(nproc)"

run() { echo "+ $*" >&2; /usr/bin/time -f "wall %e s" "$@"; }
summary() {  # name json_dir
  cp "$2"/eval/*_summary.json "$res/$1.json"
}
segment() {  # bundle name pretrained lr: train, then evaluate the best checkpoint on the test scans
  local cfg="bundles/$1/configs" out="$work/$2"
  run $PY -m monai.bundle run --config_file "$cfg/train.json" --dataset_dir "$data" \
    --task "$TASK" --labelled_scans "$N" --split_seed "$SEED" --pretrained "$3" --learning_rate "$4" \
    --epochs "$FT_EPOCHS" --iters_per_epoch "$FT_ITERS" --warmup_epochs 2 --progress_bar False $AUG $EXTRA \
    --output_dir "$out" > "$work/$2.log" 2>&1
  run $PY -m monai.bundle run --config_file "['$cfg/train.json','$cfg/evaluate.json']" \
    --dataset_dir "$data" --task "$TASK" --labelled_scans "$N" --split_seed "$SEED" --output_dir "$out" $EXTRA >> "$work/$2.log" 2>&1
  summary "$2" "$out"
}

pretrain() {
    run $PY -m monai.bundle run --config_file bundles/pretrain_bim/configs/train.json --dataset_dir "$data" \
      --output_dir "$work/pretrain" --epochs "$PRETRAIN_EPOCHS" --iters_per_epoch "$PRETRAIN_ITERS" --warmup_epochs 2 $EXTRA \
      --panel_every 1000 --save_every 1000 --log_every 200 --progress_bar False > "$work/pretrain.log" 2>&1
}

case "$stage" in
  pretrain) pretrain ;;
  pretrain-finetune)
    pretrain
    for lr in $FT_LRS; do
      segment finetune_seg "ft_${TASK}_n${N}_random_lr${lr}" None "$lr"
      segment finetune_seg "ft_${TASK}_n${N}_bim_lr${lr}" "$work/pretrain/model.pt" "$lr"
    done ;;
  meanteacher)
    [ -f "$work/pretrain/model.pt" ] || pretrain
    segment meanteacher_seg "mt_${TASK}_n${N}_random_lr${MT_LR}" None "$MT_LR"
    segment meanteacher_seg "mt_${TASK}_n${N}_bim_lr${MT_LR}" "$work/pretrain/model.pt" "$MT_LR" ;;
  *) echo "unknown stage $stage (pretrain-finetune | meanteacher)" >&2; exit 2 ;;
esac
$PY - "$res" <<'PYEOF'
import csv, json, pathlib, sys
res = pathlib.Path(sys.argv[1])
rows = [dict(run=p.stem, **{k: v for k, v in json.loads(p.read_text()).items() if not isinstance(v, (dict, list))}) for p in sorted(res.glob("*.json"))]
keys = sorted({k for r in rows for k in r}, key=lambda k: (k != "run", k))
with open(res / "summary.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=keys); w.writeheader(); w.writerows(rows)
for r in rows: print(r)
PYEOF
