#!/usr/bin/env bash
# One device call for the grouped dQ conversion and the help queue (notes/bwd.md
# v15, v16): the backward GPU eval cases, then the new bench binary (defaults, and
# HELP=1 over them) and the old one (kforge-bench-attn-old, built from the commit
# before) on the trace shapes and two long public shapes. OUT must be set.
set -u
export LD_LIBRARY_PATH=$PWD/.bundle/lib:/usr/local/cuda/lib64
B=.bundle/bin
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
date -u +%FT%TZ
timeout 130 $B/eval_gpu_test --gtest_filter='EvalGpu.BwdSm90HelpVerify:EvalGpu.BwdSm90Verifies' > $OUT/eval.log 2>&1; echo "eval rc=$?"
grep -E '^\[ +(OK|FAILED) +\]|Failure' $OUT/eval.log | head -20
python3 bench/attention/lengths.py bench/shapes.json > $OUT/pub.json
short() { grep -hE "OK |BAD" "$@" | sed -E 's/BLOCK_M=64 BLOCK_N=128 CSKIP=1 //; s/ORDER=1 //; s/STAGES=2 TMA=1//; s/ +rel_l2.*//'; }
run() {  # name binary lengths only [extra args]
  local n=$1 bin=$2 len=$3 only=$4; shift 4
  timeout 60 $bin --lengths $len --only $only --op bwd --variants default --templates bwd_sm90 "$@" > $OUT/$n.log 2>&1
  echo "== $n rc=$?"; short $OUT/$n.log
}
L=kernels/dev/trace_shapes.json
run tr_new $B/kforge-bench-attn $L powerlaw_short,pl_long,dense32 --settings "bwd_sm90:HELP=1"
run tr_old $B/kforge-bench-attn-old $L powerlaw_short,pl_long,dense32
run pub_new $B/kforge-bench-attn $OUT/pub.json hstu_prod_causal,gdpa_dense --reps 10 --settings "bwd_sm90:HELP=1"
run pub_old $B/kforge-bench-attn-old $OUT/pub.json hstu_prod_causal,gdpa_dense --reps 10
