#!/usr/bin/env bash
# On an H200: issue 10's two 400 TFLOP/s shapes (hstu_prod_causal, gdpa_dense), backward,
# served defaults with the anchors in the same run (res22.sh; ONLY, OURS_TIMEOUT and
# ANCHOR_TIMEOUT pass through); FULL=1: the full results run instead (h200_26.sh). On
# any other card, nothing (a draw of another card then costs only its start). OUT must
# be set.
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$name"
case "$name" in
  *H200*)
    if [ "${FULL:-0}" = 1 ]; then exec bash kernels/dev/h200_26.sh; fi
    ONLY=${ONLY:-hstu_prod_causal,gdpa_dense} OP=bwd SETTINGS='bwd_sm90:KVSTORE=0' \
      OURS_TIMEOUT=${OURS_TIMEOUT:-150} ANCHOR_TIMEOUT=${ANCHOR_TIMEOUT:-200} \
      bash kernels/dev/res22.sh ;;
esac
