#!/usr/bin/env bash
# One device call for notes/bwd.md v17: the GPU eval cases of HELP and CONV2,
# then HELP=1 and CONV2=1 against the served defaults (whose cubins are the
# pinned ones) on the public backward shapes and the trace shapes, then one
# traced launch of powerlaw_short / pl_long with HELP=1 (trace_help.sh).
# Few files under $OUT. OUT must be set; BUDGET seconds in all (500).
set -u
export LD_LIBRARY_PATH=$PWD/.bundle/lib:/usr/local/cuda/lib64
B=.bundle/bin
end=$(( $(date +%s) + ${BUDGET:-500} ))
left() { local l=$(( end - $(date +%s) )); [ "$l" -gt "$1" ] && echo "$1" || echo $(( l > 5 ? l : 5 )); }
{ nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader; date -u +%FT%TZ; git log --oneline -1; } > $OUT/ab.txt
timeout "$(left 150)" $B/eval_gpu_test --gtest_filter='EvalGpu.BwdSm90HelpVerify:EvalGpu.BwdSm90Conv2Verify' > $OUT/eval.log 2>&1
echo "eval rc=$?" >> $OUT/ab.txt
grep -E '^\[ +(OK|FAILED) +\]|Failure' $OUT/eval.log | head -8 >> $OUT/ab.txt
python3 bench/attention/lengths.py bench/shapes.json > /tmp/pub.json
short() { grep -hE "OK |BAD" "$@" | sed -E 's/BLOCK_M=(64|128) BLOCK_N=128 //; s/CSKIP=1 //; s/ORDER=1 //; s/STAGES=2 TMA=1//; s/ +rel_l2.*//'; }
run() {  # name lengths only settings
  local n=$1 len=$2 only=$3 set=$4
  timeout "$(left 200)" $B/kforge-bench-attn --lengths $len --only $only --op bwd --variants default \
    --templates bwd_sm90 --settings "$set" > $OUT/$n.log 2>&1
  echo "== $n rc=$?" >> $OUT/ab.txt; short $OUT/$n.log >> $OUT/ab.txt
}
run pub /tmp/pub.json hstu_prod_causal,gdpa_dense,hstu_imbal_causal,d64_self_causal,gdpa_self,pffn_cross_d64 \
  "bwd_sm90:CONV2=1;bwd_sm90:HELP=1"
run pls /tmp/pub.json powerlaw_short "bwd_sm90:HELP=2;bwd_sm90:HELP=1;bwd_sm90:CONV2=1;bwd_sm90:HELP=2,SPLIT=0"
run tr1 kernels/dev/trace_shapes.json powerlaw_short,pl_long,dense32 "bwd_sm90:HELP=2;bwd_sm90:CONV2=1"
run pls2 /tmp/pub.json powerlaw_short "bwd_sm90:HELP=2;bwd_sm90:HELP=1"
l=$(left 120); [ "$l" -gt 40 ] && TLIM=$l bash kernels/dev/trace_help.sh
cat $OUT/ab.txt
