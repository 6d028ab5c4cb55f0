#!/usr/bin/env bash
# HELP=1 against the served defaults in one device call (notes/bwd.md v16):
# the backward GPU eval cases, then kforge-bench-attn with --settings HELP=1 on
# the trace shapes (twice) and the public backward shapes. HELP=0's cubins are
# byte-identical to the pinned ones of the commit before the knob
# (TemplatesCompileSm90.BwdSm90SettingsKeepTheWgmmaPipelineAndArePinned), so
# each run's HELP=0 line is the served kernel. Few files under $OUT (the call
# returns at most a handful). OUT must be set; BUDGET seconds in all (400).
set -u
export LD_LIBRARY_PATH=$PWD/.bundle/lib:/usr/local/cuda/lib64
B=.bundle/bin
end=$(( $(date +%s) + ${BUDGET:-400} ))
left() { local l=$(( end - $(date +%s) )); [ "$l" -gt "$1" ] && echo "$1" || echo $(( l > 5 ? l : 5 )); }
{ nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader; date -u +%FT%TZ; } > $OUT/ab.txt
timeout "$(left 70)" $B/eval_gpu_test --gtest_filter='EvalGpu.BwdSm90HelpVerify' > $OUT/eval.log 2>&1
echo "eval rc=$?" >> $OUT/ab.txt
grep -E '^\[ +(OK|FAILED) +\]|Failure' $OUT/eval.log | head -8 >> $OUT/ab.txt
python3 bench/attention/lengths.py bench/shapes.json > /tmp/pub.json
short() { grep -hE "OK |BAD" "$@" | sed -E 's/BLOCK_M=64 BLOCK_N=128 CSKIP=1 //; s/ORDER=1 //; s/STAGES=2 TMA=1//; s/ +rel_l2.*//'; }
run() {  # name lengths only [extra args]
  local n=$1 len=$2 only=$3; shift 3
  timeout "$(left 150)" $B/kforge-bench-attn --lengths $len --only $only --op bwd --variants default \
    --templates bwd_sm90 --settings "bwd_sm90:HELP=1" "$@" > $OUT/$n.log 2>&1
  echo "== $n rc=$?" >> $OUT/ab.txt; short $OUT/$n.log >> $OUT/ab.txt
}
L=kernels/dev/trace_shapes.json
run tr1 $L powerlaw_short,pl_long,dense32
run pub /tmp/pub.json hstu_prod_causal,hstu_imbal_causal,gdpa_self,gdpa_dense,pffn_cross_d64,powerlaw_short,d64_self_causal
cat $OUT/ab.txt
