#!/usr/bin/env bash
# Mean Teacher with separate student forwards for the labelled and unlabelled batches (joint_student_batch False); ACDC LV 1 scan, LR 1e-4, 2000 its
export BIM_GIT_COMMIT=e81a5ba
mkdir -p /tmp/w && python -m data_prep acdc /tmp/data/acdc_u8/training /tmp/w/acdc --workers 16 > /tmp/w/prep.log 2>&1
W=/tmp/w/diag; mkdir -p $W; D=/tmp/w/acdc
one() { local n=$1; shift
  python -m monai.bundle run --config_file bundles/meanteacher_seg/configs/train.json --dataset_dir $D --task lv --labelled_scans 1 \
     --learning_rate 1e-4 --epochs 20 --iters_per_epoch 100 --warmup_epochs 2 --rampup_epochs 5 --progress_bar False --log_every 100 --save_every 1000 --output_dir $W/$n "$@" > $W/$n.log 2>&1
  python -m monai.bundle run --config_file "['bundles/meanteacher_seg/configs/train.json','bundles/meanteacher_seg/configs/evaluate.json']" --dataset_dir $D --task lv --labelled_scans 1 --output_dir $W/$n "$@" >> $W/$n.log 2>&1 ; }
s=$(date +%s)
(timeout 400 python tools/experiments.py run acdc_fast --dataset_dir $D --work_dir /tmp/w/acdc_fast --jobs 1 --only pre_full > /tmp/w/pre.out 2>&1; echo "pretrain done at $(( $(date +%s) - s )) s" >> /tmp/w/pre.out; timeout 240 bash -c "$(declare -f one); W=$W D=$D one mt_sep_bim --joint_student_batch False --pretrained /tmp/w/acdc_fast/runs/pre_full/model.pt") &
one mt_sep --joint_student_batch False &
one entw0_sep --method entropy_min --entropy_weight 0.0 --joint_student_batch False &
wait
cat /tmp/w/pre.out
for n in mt_sep entw0_sep mt_sep_bim; do echo "== $n val: $(grep -o 'val_mean_dice: [0-9.]*' $W/$n.log | awk '{printf "%.3f ", $2}')"; grep -h '"mean"' $W/$n/eval/*summary.json; done
echo "total $(( $(date +%s) - s )) s"
tar czf $OUT/f.tgz -C /tmp/w --exclude='*.pt' --exclude=tensorboard diag acdc_fast
