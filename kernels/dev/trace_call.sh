#!/usr/bin/env bash
# One device call: the new GPU eval case, then the trace shapes timed plainly and traced
# (kforge-bench-attn --trace-dir), each trace read by trace_bwd.py. OUT must be set.
set -u
export LD_LIBRARY_PATH=$PWD/.bundle/lib:/usr/local/cuda/lib64
B=.bundle/bin
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
date -u +%FT%TZ
timeout 200 $B/eval_gpu_test --gtest_filter='EvalGpu.BwdSm90SkipAndTmaVerify' > $OUT/eval.log 2>&1; echo "eval rc=$?"
grep -E '^\[ +(OK|FAILED) +\]|Failure' $OUT/eval.log | head -20
L=kernels/dev/trace_shapes.json
timeout 150 $B/kforge-bench-attn --lengths $L --op bwd --variants default --templates bwd_sm90 --out $OUT/plain.json > $OUT/plain.log 2>&1; echo "plain rc=$?"
timeout 150 $B/kforge-bench-attn --lengths $L --op bwd --variants default --templates bwd_sm90 --trace-dir $OUT/tr > $OUT/traced.log 2>&1; echo "traced rc=$?"
for j in $OUT/tr/*.json; do s=${j%.json}; python3 kernels/dev/trace_bwd.py $s --tiles 6 > $s.txt 2>&1; gzip -f $s.bin; done
grep -E "OK |BAD|us " $OUT/plain.log | head; grep -E "OK |BAD|trace" $OUT/traced.log | head -20
cat $OUT/tr/*.txt | head -150
# knob A/B on powerlaw_short (untraced build)
timeout 120 $B/kforge-bench-attn --lengths $L --only powerlaw_short,pl_short64 --op bwd --variants default --templates bwd_sm90 --settings "bwd_sm90:DQ_DIRECT=1;bwd_sm90:SPLIT=0;bwd_sm90:SPLIT=0,DQ_DIRECT=1;bwd_sm90:SPLIT=0,KVFIRST=0" > $OUT/ab.log 2>&1; echo "ab rc=$?"
grep -E "OK |BAD" $OUT/ab.log
