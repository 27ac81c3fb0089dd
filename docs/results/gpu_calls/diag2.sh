#!/usr/bin/env bash
# Which part of the Mean Teacher step breaks eval-mode predictions? random init, LV 1 scan, 2000 its, LR 1e-4, regulariser weight 0.
W=/tmp/w/diag; mkdir -p $W; D=/tmp/w/acdc
one() { local n=$1; shift
  python -m monai.bundle run --config_file bundles/meanteacher_seg/configs/train.json --dataset_dir $D --task lv --labelled_scans 1 \
     --learning_rate 1e-4 --epochs 20 --iters_per_epoch 100 --warmup_epochs 2 --rampup_epochs 5 --progress_bar False --log_every 100 --save_every 1000 --output_dir $W/$n "$@" > $W/$n.log 2>&1
  python -m monai.bundle run --config_file "['bundles/meanteacher_seg/configs/train.json','bundles/meanteacher_seg/configs/evaluate.json']" --dataset_dir $D --task lv --labelled_scans 1 --output_dir $W/$n "$@" >> $W/$n.log 2>&1 ; }
one entmin_w0 --method entropy_min --entropy_weight 0.0 &
one mt_w0_noview --consistency_weight 0.0 --view_rotation_deg 0.0 --view_scale_range "[1.0,1.0]" --view_flip_prob 0.0 &
wait
for n in entmin_w0 mt_w0_noview; do echo "== $n val: $(grep -o 'val_mean_dice: [0-9.]*' $W/$n.log | awk '{printf "%.3f ", $2}')"; done
