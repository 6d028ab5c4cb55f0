#!/usr/bin/env bash
# DET=1 with the interleaved "levels" order (notes/bwd.md v21): its eval cases, then
# one bench binary on three shapes, served defaults beside DET=1. OUT must be set.
set -u
source kernels/dev/call_env.sh
timeout 30 $B/eval_gpu_test --gtest_filter='EvalGpu.BwdSm90DetIsBitwiseDeterministic' > $OUT/det.log 2>&1
echo "det eval rc=$?" | tee $OUT/ab.txt
python3 bench/attention/lengths.py bench/shapes.json > /tmp/l.json
timeout ${T:-100} $B/kforge-bench-attn --lengths /tmp/l.json --out $OUT/ab.json --op bwd --variants default \
  --templates bwd_sm90 --only ${ONLY:-hstu_prod_causal,powerlaw_short,gdpa_dense} \
  --settings 'bwd_sm90:ORDER=0,DET=1,SPLIT=0,DQW=0,DQZ=1' > $OUT/ab.log 2>&1
grep -E "OK |BAD" $OUT/ab.log | sed -E 's/ +rel_l2.*//; s/BLOCK_M=64 BLOCK_N=128 //; s/STAGES=2 TMA=1//' | tee -a $OUT/ab.txt
