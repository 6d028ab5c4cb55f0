#!/usr/bin/env bash
# Everything needed to land the grouped dQ conversion and the help queue
# (notes/bwd.md v16) in one device call, for sessions where a machine is rare:
#   1. the backward GPU eval cases (HELP's hostile ones included);
#   2. the results run with the anchors (run.sh OP=both, defaults and HELP=1);
#   3. the binary built from main before it (kforge-bench-attn-old) on the
#      trace shapes and the public backward shapes, then the new one on the
#      trace shapes, for a same-call A/B;
#   4. the sanitizer gate, if time is left.
# Each step's timeout comes out of one budget (BUDGET seconds, default 560) so the
# call returns its logs before the device limit. OUT must be set.
set -u
DEFAULT_BUDGET=560 source kernels/dev/call_env.sh
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader | tee $OUT/gpu.txt
date -u +%FT%TZ | tee -a $OUT/gpu.txt
timeout "$(left 120)" $B/eval_gpu_test --gtest_filter='EvalGpu.BwdSm90HelpVerify:EvalGpu.BwdSm90Verifies' > $OUT/eval.log 2>&1
echo "eval rc=$?" | tee $OUT/steps.txt
BUNDLE=.bundle OUT=$OUT/res OP=both VARIANTS=default TEMPLATES=bwd_sm90 SETTINGS="bwd_sm90:HELP=1" \
  OURS_TIMEOUT="$(left 200)" ANCHOR_TIMEOUT=230 bash bench/attention/run.sh > $OUT/res.log 2>&1
echo "results rc=$?" | tee -a $OUT/steps.txt
short() { grep -hE "OK |BAD" "$@" | sed -E 's/BLOCK_M=64 BLOCK_N=128 CSKIP=1 //; s/ORDER=1 //; s/STAGES=2 TMA=1//; s/ +rel_l2.*//'; }
run() {  # name binary lengths only [extra args]
  local n=$1 bin=$2 len=$3 only=$4; shift 4
  timeout "$(left 70)" $bin --lengths $len --only $only --op bwd --variants default --templates bwd_sm90 "$@" > $OUT/$n.log 2>&1
  echo "== $n rc=$?" >> $OUT/ab.txt; short $OUT/$n.log >> $OUT/ab.txt
}
L=kernels/dev/trace_shapes.json
run tr_old $B/kforge-bench-attn-old $L powerlaw_short,pl_long,dense32
run pub_old $B/kforge-bench-attn-old $OUT/res/lengths.json hstu_prod_causal,gdpa_dense,powerlaw_short,hstu_imbal_causal
run tr_new $B/kforge-bench-attn $L powerlaw_short,pl_long,dense32 --settings "bwd_sm90:HELP=1"
timeout "$(left 150)" $B/worker_gpu_test --gtest_filter=WorkerGpuSequence.BwdSm90PassesEveryGate > $OUT/gate.log 2>&1
echo "gate rc=$?" >> $OUT/steps.txt
grep -E '^\[ +(OK|FAILED) +\]|Failure' $OUT/eval.log | head -16
cat $OUT/ab.txt
cat $OUT/res/table.md 2>/dev/null | tail -24
cat $OUT/steps.txt
