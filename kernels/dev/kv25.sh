#!/usr/bin/env bash
# One device call (notes/bwd.md v20, KVSTORE=1 served): the gate tests one after
# another (gate processes that share a GPU can push a plain run past its limit), the
# eval and runtime tests beside them, then a results run of every public shape with
# the anchors (res22.sh), the served KVSTORE=1 beside KVSTORE=0 and powerlaw_short's
# best setting. OUT must be set; LIM s per gate test (150); PART=checks or results
# runs one half alone (both halves may not fit one 600 s call).
set -u
DEFAULT_BUDGET=580 source kernels/dev/call_env.sh
L=${LIM:-150}
summ() { grep -E '^\[ +(OK|FAILED|  SKIPPED) +\]|Failure|gates that run|confirm' "$1" | cut -c1-130 | head -${2:-16}; }
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/kv.txt
if [ "${PART:-checks}" = checks ]; then
( for t in BwdSm90KvStorePassesEveryGate BwdSm90CrossPassesEveryGate BwdSm90PassesEveryGate; do
    s=$(date +%s); timeout $L $B/worker_gpu_test --gtest_filter="WorkerGpuSequence.$t" > $OUT/g_$t.log 2>&1
    echo "$t rc=$? $(( $(date +%s) - s ))s" >> $OUT/gt.txt
  done ) &
timeout $L $B/eval_gpu_test --gtest_filter='EvalGpu.BwdSm90Verifies:EvalGpu.BwdSm90HeavyTailedDefaultsVerify:EvalGpu.BwdSm90KvStoreVerify' > $OUT/e.log 2>&1 &
timeout $L $B/runtime_gpu_test --gtest_filter='*Backward*:*Hostile*' > $OUT/r.log 2>&1 &
wait
cat $OUT/gt.txt >> $OUT/kv.txt
for f in $OUT/g_*.log $OUT/e.log $OUT/r.log; do echo "== $(basename $f)"; summ $f 14; done >> $OUT/kv.txt
fi
if [ "${PART:-results}" = results ]; then
SETTINGS=${SETTINGS:-'bwd_sm90:KVSTORE=0;bwd_sm90:SPLIT=0,KVFIRST=0,KVSTORE=1'} bash kernels/dev/res22.sh > /dev/null 2>&1
cat $OUT/res.txt; tail -12 /tmp/rr/table.md
fi
cat $OUT/kv.txt
