#!/usr/bin/env bash
# The first call for branch wip/bwd-det (notes/bwd.md v21): DET=1's eval cases, the
# Python op's deterministic backward (bit for bit over three runs, and against the
# reference), then one bench binary on three shapes: served defaults beside DET=1
# in the dealt "levels" order. OUT must be set.
set -u
source kernels/dev/call_env.sh
timeout 40 $B/eval_gpu_test --gtest_filter='EvalGpu.BwdSm90DetIsBitwiseDeterministic' > $OUT/det.log 2>&1
echo "det eval rc=$?" | tee $OUT/ab.txt
KFORGE_RUNTIME_LIB=$PWD/.bundle/lib/libkforge_runtime.so.1 PYTHONPATH=$PWD/python timeout 120 \
  python3 tests/runtime/python/gpu_correctness_test.py Correctness.test_deterministic_backward_repeats_bit_for_bit \
  > $OUT/py.log 2>&1
echo "python deterministic rc=$?" | tee -a $OUT/ab.txt; grep -E "deterministic [0-9]|OK|FAIL|Error" $OUT/py.log | head -8 | tee -a $OUT/ab.txt
python3 bench/attention/lengths.py bench/shapes.json > /tmp/l.json
timeout ${T:-100} $B/kforge-bench-attn --lengths /tmp/l.json --out $OUT/ab.json --op bwd --variants default \
  --templates bwd_sm90 --only ${ONLY:-hstu_prod_causal,powerlaw_short,gdpa_dense} \
  --settings 'bwd_sm90:ORDER=0,DET=1,SPLIT=0,DQW=0,DQZ=1' > $OUT/ab.log 2>&1
grep -E "OK |BAD" $OUT/ab.log | sed -E 's/ +rel_l2.*//; s/BLOCK_M=64 BLOCK_N=128 //; s/STAGES=2 TMA=1//' | tee -a $OUT/ab.txt
