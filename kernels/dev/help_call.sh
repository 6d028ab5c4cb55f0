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
timeout 200 $B/eval_gpu_test --gtest_filter='EvalGpu.BwdSm90HelpVerify:EvalGpu.BwdSm90Verifies:EvalGpu.BwdSm90DqwVerify' > $OUT/eval.log 2>&1; echo "eval rc=$?"
grep -E '^\[ +(OK|FAILED) +\]|Failure' $OUT/eval.log | head -20
python3 bench/attention/lengths.py bench/shapes.json > $OUT/pub.json
short() { grep -hE "OK |BAD" "$@" | sed -E 's/BLOCK_M=64 BLOCK_N=128 CSKIP=1 //; s/ORDER=1 //; s/STAGES=2 TMA=1//; s/ +rel_l2.*//'; }
run() {  # name binary lengths only [extra args]
  local n=$1 bin=$2 len=$3 only=$4; shift 4
  timeout 90 $bin --lengths $len --only $only --op bwd --variants default --templates bwd_sm90 "$@" > $OUT/$n.log 2>&1
  echo "== $n rc=$?"; short $OUT/$n.log
}
L=kernels/dev/trace_shapes.json
run tr_new $B/kforge-bench-attn $L powerlaw_short,pl_long,dense32 --settings "bwd_sm90:HELP=1"
run tr_old $B/kforge-bench-attn-old $L powerlaw_short,pl_long,dense32
run pub_new $B/kforge-bench-attn $OUT/pub.json hstu_prod_causal,gdpa_dense --reps 10 --settings "bwd_sm90:HELP=1"
run pub_old $B/kforge-bench-attn-old $OUT/pub.json hstu_prod_causal,gdpa_dense --reps 10
# where powerlaw_short's time goes with HELP=1 (traced build: proportions, not totals)
timeout 90 $B/kforge-bench-attn --lengths $L --only powerlaw_short,pl_long --op bwd --variants default --templates bwd_sm90 --settings "bwd_sm90:HELP=1" --trace-dir $OUT/tr > $OUT/traced.log 2>&1; echo "traced rc=$?"
for j in $OUT/tr/*.json; do s=${j%.json}; python3 kernels/dev/trace_bwd.py $s --tiles 4 > $s.txt 2>&1; rm -f $s.bin; done
for t in $OUT/tr/*.txt; do echo "== $t"; head -40 $t; done
