#!/usr/bin/env bash
# Mean Teacher step throughput (issue 5), one benchmark per GPU at a time on an otherwise idle nvidia-h100-x2.
b() { CUDA_VISIBLE_DEVICES=$1 timeout 150 python tools/benchmark_meanteacher.py --compile True "${@:2}" 2>/dev/null | tail -1; }
(b 0 --batch_size 12 --unlabelled_batch_size 12; b 0 --batch_size 24 --unlabelled_batch_size 24) > /tmp/w/bench0.txt &
(b 1 --batch_size 12 --unlabelled_batch_size 12 --joint_student_batch True; b 1 --batch_size 24 --unlabelled_batch_size 24 --joint_student_batch True) > /tmp/w/bench1.txt &
wait; cat /tmp/w/bench0.txt /tmp/w/bench1.txt | tee $OUT/bench_mt.jsonl
