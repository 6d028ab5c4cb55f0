#!/usr/bin/env bash
# The H200 figure of v22 (notes/bwd.md): the backward results run of the three
# shapes issue 10 names, with the anchors. On another card it stops at once
# (the H100 figures are in RESULTS.md 18:51). OUT must be set.
set -u
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$name"
case "$name" in *H200*) ;; *) [ "${ANY_CARD:-0}" = 1 ] || exit 0 ;; esac
ONLY=${ONLY:-hstu_prod_causal,gdpa_dense,powerlaw_short} SETTINGS='bwd_sm90:SPLIT=0,KVFIRST=0' \
  OURS_TIMEOUT=100 ANCHOR_TIMEOUT=100 bash kernels/dev/res22.sh > $OUT/res22.out 2>&1
tail -8 $OUT/res22.out
