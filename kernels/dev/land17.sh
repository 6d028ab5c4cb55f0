#!/usr/bin/env bash
# The call that would make HELP=2 the heavy class's default at head dim 128
# (notes/bwd.md v17): that setting through the sanitizer gates, the backward
# eval cases, and powerlaw_short's served default (HELP=0) against HELP=2 in
# one bench run. OUT must be set.
set -u
export LD_LIBRARY_PATH=$PWD/.bundle/lib:/usr/local/cuda/lib64
B=.bundle/bin
{ nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader; date -u +%FT%TZ; } > $OUT/land.txt
timeout 150 $B/worker_gpu_test --gtest_filter='WorkerGpuSequence.BwdSm90Help2PassesEveryGate' > $OUT/gate.log 2>&1
echo "gate rc=$?" >> $OUT/land.txt; grep -E '^\[ +(OK|FAILED|  SKIPPED) +\]|Failure|rror' $OUT/gate.log | head -6 >> $OUT/land.txt
timeout 100 $B/eval_gpu_test --gtest_filter='EvalGpu.BwdSm90Verifies' > $OUT/eval.log 2>&1
echo "eval rc=$?" >> $OUT/land.txt; grep -E '^\[ +(OK|FAILED) +\]|Failure' $OUT/eval.log | head -6 >> $OUT/land.txt
python3 bench/attention/lengths.py bench/shapes.json > /tmp/pub.json
timeout 60 $B/kforge-bench-attn --lengths /tmp/pub.json --only powerlaw_short --op bwd --variants default \
  --templates bwd_sm90 --settings "bwd_sm90:HELP=2" > /tmp/pls.log 2>&1
echo "bench rc=$?" >> $OUT/land.txt; grep -hE "OK |BAD" /tmp/pls.log | sed -E 's/ +rel_l2.*//' >> $OUT/land.txt
cat $OUT/land.txt
