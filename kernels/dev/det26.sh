#!/usr/bin/env bash
# notes/bwd.md v23: DET=1's adds last key block first. The DET
# eval cases (eight hostile batches: bitwise the same launch to launch, and right),
# the Python op's deterministic backward (bit for bit in three runs, and against the
# reference), then the bench: the served defaults beside DET=1, with main's binary
# (kforge-bench-attn.old: key order) and the new one (last first; session 26 also
# timed a DET=2, since removed), in
# turn; then bwd_mma DET=1 (notes v23) beside its plain default. OUT must be set.
set -u
source kernels/dev/call_env.sh
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader | tee $OUT/ab.txt
timeout $(left 150) $B/eval_gpu_test --gtest_filter='EvalGpu.Bwd*DetIsBitwiseDeterministic' > $OUT/det.log 2>&1
echo "det eval rc=$?" | tee -a $OUT/ab.txt; grep -E "Failure|FAILED|deadlock|timed out" $OUT/det.log | head -5 | tee -a $OUT/ab.txt
KFORGE_RUNTIME_LIB=$PWD/.bundle/lib/libkforge_runtime.so.1 PYTHONPATH=$PWD/python timeout $(left 120) \
  python3 tests/runtime/python/gpu_correctness_test.py Correctness.test_deterministic_backward_repeats_bit_for_bit \
  > $OUT/py.log 2>&1
echo "python deterministic rc=$?" | tee -a $OUT/ab.txt
python3 bench/attention/lengths.py bench/shapes.json > /tmp/l.json
for v in old new; do
  bin=$B/kforge-bench-attn; [ $v = old ] && bin=$B/kforge-bench-attn.old
  timeout $(left 120) $bin --lengths /tmp/l.json --out $OUT/$v.json --op bwd --variants default --templates bwd_sm90 \
    --only ${ONLY:-hstu_prod_causal,hstu_imbal_causal,d64_self_causal,gdpa_dense} \
    --settings 'bwd_sm90:ORDER=0,DET=1,SPLIT=0,DQW=0,DQZ=1' > $OUT/$v.log 2>&1
  echo "$v rc=$?" >> $OUT/ab.txt
  grep -E "OK |BAD" $OUT/$v.log | sed -E 's/ +rel_l2.*//; s/BLOCK_M=(64|128) BLOCK_N=128 //; s/STAGES=2 TMA=1//' | sed "s/^/$v /" >> $OUT/ab.txt
done
# bwd_mma DET=1 beside its plain default (the deterministic kernel off sm_90a)
timeout $(left 60) $B/kforge-bench-attn --lengths /tmp/l.json --out $OUT/mma.json --op bwd --variants default \
  --templates bwd_mma --only hstu_imbal_causal,gdpa_self --settings 'bwd_mma:DET=1' > $OUT/mma.log 2>&1
echo "mma rc=$?" >> $OUT/ab.txt
grep -E "OK |BAD" $OUT/mma.log | sed -E 's/ +rel_l2.*//' | sed "s/^/mma /" >> $OUT/ab.txt
cat $OUT/ab.txt
