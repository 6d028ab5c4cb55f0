#!/usr/bin/env bash
# One device call for the grouped dQ conversion (notes/bwd.md v15): the backward GPU eval
# cases, then the new bench binary and the old one (kforge-bench-attn-old, built from the
# commit before) on the trace shapes and two long public shapes. OUT must be set.
set -u
export LD_LIBRARY_PATH=$PWD/.bundle/lib:/usr/local/cuda/lib64
B=.bundle/bin
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
date -u +%FT%TZ
timeout 150 $B/eval_gpu_test --gtest_filter='EvalGpu.BwdSm90*' > $OUT/eval.log 2>&1; echo "eval rc=$?"
grep -E '^\[ +(OK|FAILED) +\]|Failure' $OUT/eval.log | head -20
python3 bench/attention/lengths.py bench/shapes.json > $OUT/pub.json
L=kernels/dev/trace_shapes.json
for b in new old; do
  bin=$B/kforge-bench-attn; [ $b = old ] && bin=$B/kforge-bench-attn-old
  timeout 60 $bin --lengths $L --only powerlaw_short,pl_long,dense32 --op bwd --variants default --templates bwd_sm90 > $OUT/tr_$b.log 2>&1
  echo "== $b"; grep -hE "OK |BAD" $OUT/tr_$b.log | sed -E 's/BLOCK_M=64 BLOCK_N=128 CSKIP=1 //; s/ORDER=1 //; s/STAGES=2 TMA=1//; s/ +rel_l2.*//'
done
for b in new old; do
  bin=$B/kforge-bench-attn; [ $b = old ] && bin=$B/kforge-bench-attn-old
  timeout 60 $bin --lengths $OUT/pub.json --only hstu_prod_causal,gdpa_dense --op bwd --variants default --templates bwd_sm90 --reps 10 > $OUT/pub_$b.log 2>&1
  echo "== $b"; grep -hE "OK |BAD" $OUT/pub_$b.log | sed -E 's/BLOCK_M=64 BLOCK_N=128 CSKIP=1 //; s/ORDER=1 //; s/STAGES=2 TMA=1//; s/ +rel_l2.*//'
done
