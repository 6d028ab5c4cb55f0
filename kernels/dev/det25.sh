#!/usr/bin/env bash
# One device call (notes/bwd.md v21, DET=1): the deterministic variants' eval cases
# (EvalGpu.BwdSm90DetIsBitwiseDeterministic, verified and no two launches apart),
# then a results run of issue 10's target shapes with the anchors: the served
# defaults, powerlaw_short's best (SPLIT=0 KVFIRST=0) and, if the eval passed,
# DET=1 (ORDER=0 SPLIT=0 DQW=0 DQZ=1 over each shape's defaults) for its cost.
# OUT must be set.
set -u
DEFAULT_BUDGET=400 source kernels/dev/call_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/det.txt
timeout 90 $B/eval_gpu_test --gtest_filter='EvalGpu.BwdSm90DetIsBitwiseDeterministic' > $OUT/det.log 2>&1
rc=$?; echo "det eval rc=$rc" >> $OUT/det.txt
grep -E '^\[ +(OK|FAILED)|Failure|passed|kind' $OUT/det.log | cut -c1-200 | head -24 >> $OUT/det.txt
S='bwd_sm90:SPLIT=0,KVFIRST=0'
[ $rc = 0 ] && S="$S;bwd_sm90:ORDER=0,DET=1,SPLIT=0,DQW=0,DQZ=1"
ONLY=${ONLY:-hstu_prod_causal,gdpa_dense,powerlaw_short} SETTINGS="$S" bash kernels/dev/res22.sh > /dev/null 2>&1
cat $OUT/det.txt $OUT/res.txt; tail -6 /tmp/rr/table.md
