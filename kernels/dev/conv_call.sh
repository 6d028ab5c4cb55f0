#!/usr/bin/env bash
# One device call for the paired dQ conversion (notes/bwd.md v15): the backward GPU eval
# cases, then the old bench binary (kforge-bench-attn-old, from the commit before) and the
# new one on the trace shapes and the long public shapes, alternating. OUT must be set.
set -u
export LD_LIBRARY_PATH=$PWD/.bundle/lib:/usr/local/cuda/lib64
B=.bundle/bin
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
date -u +%FT%TZ
timeout 240 $B/eval_gpu_test --gtest_filter='EvalGpu.BwdSm90*' > $OUT/eval.log 2>&1; echo "eval rc=$?"
grep -E '^\[ +(OK|FAILED) +\]|Failure' $OUT/eval.log | head -20
python3 bench/attention/lengths.py bench/shapes.json > $OUT/pub.json
L=kernels/dev/trace_shapes.json
for r in 1 2; do
  for b in old new; do
    bin=$B/kforge-bench-attn; [ $b = old ] && bin=$B/kforge-bench-attn-old
    timeout 100 $bin --lengths $L --only powerlaw_short,pl_long,pl_rest,dense32 --op bwd --variants default --templates bwd_sm90 > $OUT/tr_$b$r.log 2>&1
    timeout 100 $bin --lengths $OUT/pub.json --only hstu_prod_causal,gdpa_dense,hstu_imbal_causal --op bwd --variants default --templates bwd_sm90 --reps 10 > $OUT/pub_$b$r.log 2>&1
    echo "== $b run $r"; grep -hE "^== |OK |BAD" $OUT/tr_$b$r.log $OUT/pub_$b$r.log | sed -E 's/BLOCK_M=64 BLOCK_N=128 CSKIP=1 //; s/ORDER=1 //; s/STAGES=2 TMA=1//; s/ +rel_l2.*//'
  done
done
# the new build's timeline of pl_long and dense32 (traced build)
timeout 60 $B/kforge-bench-attn --lengths $L --only pl_long,dense32 --op bwd --variants default --templates bwd_sm90 --trace-dir $OUT/tr > $OUT/traced.log 2>&1
for j in $OUT/tr/*.json; do s=${j%.json}; python3 kernels/dev/trace_bwd.py $s > $s.txt 2>&1; rm -f $s.bin; done
grep -hE "^[a-z]|head end|tile total|last event|idle" $OUT/tr/*.txt
