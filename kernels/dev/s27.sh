#!/usr/bin/env bash
# Session 26's device call (its bundle had
# main's bench binary beside the branch's as kforge-bench-attn.old). On an H200:
# the full results run, forward and backward, anchors in the same run (res22.sh
# OP=both: issue 10's targets, the grouped list's tail dealt; DET=0's kernels and
# lists are main's byte for byte), then v23's DET test (det26.sh). On another
# card: det26.sh, then hstu_prod_causal and gdpa_dense under a few settings.
# OUT must be set; the summary is $OUT/s27.txt.
set -u
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$name" > $OUT/s27.txt
case "$name" in
  *H200*)
    OP=both OURS_TIMEOUT=240 ANCHOR_TIMEOUT=240 bash kernels/dev/res22.sh > $OUT/res22.out 2>&1
    cp $OUT/table.md $OUT/res_table.md 2>/dev/null
    BUDGET=300 bash kernels/dev/det26.sh > $OUT/det26.out 2>&1 ;;
  *)
    BUDGET=200 bash kernels/dev/det26.sh > $OUT/det26.out 2>&1
    bash kernels/dev/h200_26.sh > $OUT/sweep.out 2>&1 ;;
esac
{ tail -3 $OUT/det26.out; echo; [ -f $OUT/res22.out ] && tail -45 $OUT/res22.out; [ -f $OUT/sweep.out ] && cat $OUT/sweep.out; } >> $OUT/s27.txt
cat $OUT/s27.txt
