#!/usr/bin/env bash
# One device call for notes/bwd.md v19 (branch wip/bwd-kvstore): KVSTORE=1's eval
# cases and gates, then the public backward shapes with KVSTORE=1 beside the
# served defaults (one bench binary, no anchors). OUT must be set; BUDGET s (200).
set -u
DEFAULT_BUDGET=200 source kernels/dev/call_env.sh
{ nvidia-smi --query-gpu=name --format=csv,noheader; date -u +%FT%TZ; } > $OUT/kv.txt
timeout "$(left 45)" $B/eval_gpu_test --gtest_filter='EvalGpu.BwdSm90KvStoreVerify' > $OUT/eval.log 2>&1
echo "== eval rc=$?" >> $OUT/kv.txt; grep -E '^\[ +(OK|FAILED) +\]|Failure|kind' $OUT/eval.log | head -8 >> $OUT/kv.txt
python3 bench/attention/lengths.py bench/shapes.json > /tmp/pub.json
timeout "$(left 90)" $B/kforge-bench-attn --lengths /tmp/pub.json --op bwd --variants default --templates bwd_sm90 \
  --only hstu_prod_causal,gdpa_dense,pffn_cross_d64,powerlaw_short --settings 'bwd_sm90:KVSTORE=1' > /tmp/kv.log 2>&1
echo "== bench rc=$?" >> $OUT/kv.txt
grep -hE "OK |BAD" /tmp/kv.log | sed -E 's/BLOCK_M=(64|128) BLOCK_N=128 //; s/ORDER=1 //; s/STAGES=2 //; s/TMA=1//; s/ +rel_l2.*//' >> $OUT/kv.txt
timeout "$(left 70)" $B/worker_gpu_test --gtest_filter='WorkerGpuSequence.BwdSm90KvStorePassesEveryGate' > $OUT/gate.log 2>&1
echo "== gate rc=$?" >> $OUT/kv.txt
grep -E '^\[ +(OK|FAILED|  SKIPPED) +\]|Failure|gates that run|confirm' $OUT/gate.log | cut -c1-120 | head -8 >> $OUT/kv.txt
cat $OUT/kv.txt
