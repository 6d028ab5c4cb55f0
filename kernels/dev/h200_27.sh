#!/usr/bin/env bash
# Session 27's device call. On an H200: the full results run, forward and backward,
# anchors in the same run (as h200_26.sh; issue 10's last figure). On another card:
# where bwd_sm90 DET=1's extra time goes (notes/bwd.md v23 left it unmeasured): the
# served default and DET=1 on hstu_prod_causal and gdpa_dense, traced
# (--trace-dir, read by trace_bwd.py), so the phases of a step can be compared
# (c: stage -> dS barrier holds DET's publish wait, d: dS barrier -> dQ issued holds
# its ordered-add wait). OUT must be set.
set -u
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$name"
case "$name" in
  *H200*) exec bash kernels/dev/h200_26.sh ;;
esac
DEFAULT_BUDGET=230 source kernels/dev/call_env.sh
python3 bench/attention/lengths.py bench/shapes.json > /tmp/l.json
D='bwd_sm90:ORDER=0,DET=1,SPLIT=0,DQW=0,DQZ=1'
timeout $(left 200) $B/kforge-bench-attn --lengths /tmp/l.json --op bwd --variants default --templates bwd_sm90 \
  --only hstu_prod_causal,gdpa_dense --settings "$D" --trace-dir $OUT/tr > $OUT/traced.log 2>&1
echo "traced rc=$?"
for j in $OUT/tr/*.json; do s=${j%.json}; python3 kernels/dev/trace_bwd.py $s > $s.txt 2>&1; gzip -f $s.bin; done
grep -E "OK |BAD|trace " $OUT/traced.log | sed -E 's/ +rel_l2.*//; s/BLOCK_M=64 BLOCK_N=128 //; s/STAGES=2 TMA=1//'
for t in $OUT/tr/*.txt; do echo "== $t"; head -30 $t; done
