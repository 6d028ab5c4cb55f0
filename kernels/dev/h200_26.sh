#!/usr/bin/env bash
# Session 26's device call (notes/bwd.md v22). On an H200: the full results run,
# forward and backward, anchors in the same run (res22.sh OP=both), with two more
# backward settings beside the served defaults and SPLIT=0 KVFIRST=0, so the
# "best variant" column covers them. On another card (H100): hstu_prod_causal's
# backward under those settings only, without anchors (which settings to carry
# into the next H200 run). OUT must be set.
set -u
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$name"
S='bwd_sm90:SPLIT=0,KVFIRST=0;bwd_sm90:DQZ=0;bwd_sm90:HELP=1'
case "$name" in
  *H200*)
    OP=both SETTINGS="$S" OURS_TIMEOUT=300 ANCHOR_TIMEOUT=250 bash kernels/dev/res22.sh > $OUT/res22.out 2>&1
    tail -40 $OUT/res22.out ;;
  *)
    source kernels/dev/call_env.sh
    python3 bench/attention/lengths.py bench/shapes.json > /tmp/l.json
    timeout 200 $B/kforge-bench-attn --lengths /tmp/l.json --out $OUT/h.json --op bwd --variants default \
      --templates bwd_sm90 --only hstu_prod_causal,gdpa_dense --settings "$S;bwd_sm90:KVSTORE=0" > $OUT/h.log 2>&1
    grep -E "OK |BAD" $OUT/h.log | sed -E 's/ +rel_l2.*//; s/BLOCK_M=64 BLOCK_N=128 //; s/STAGES=2 TMA=1//' ;;
esac
