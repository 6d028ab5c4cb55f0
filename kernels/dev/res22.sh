#!/usr/bin/env bash
# A results run of the public backward shapes with the anchors (notes/bwd.md v18):
# the served defaults beside SETTINGS (default SPLIT=0 KVFIRST=0, powerlaw_short's
# best setting in the v18 A/B, in the tuner's space), so the table's "best variant"
# column is the best of them for each shape. ONLY=a,b: those shapes alone (09:25 ran
# ONLY=powerlaw_short SETTINGS='bwd_sm90:SPLIT=0,KVFIRST=0;bwd_sm90:CSKIP=1,HELP=0').
# OP=both times the forward too (all templates' forward defaults; issue 10's "the
# forward does not regress"). OUT must be set.
set -u
R=/tmp/rr; rm -rf $R
{ nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader; date -u +%FT%TZ; } > $OUT/res.txt
BUNDLE=.bundle OUT=$R OP=${OP:-bwd} VARIANTS=default TEMPLATES=bwd_sm90 ONLY="${ONLY:-}" \
  SETTINGS="${SETTINGS:-bwd_sm90:SPLIT=0,KVFIRST=0}" OURS_TIMEOUT=${OURS_TIMEOUT:-260} ANCHOR_TIMEOUT=${ANCHOR_TIMEOUT:-330} \
  bash bench/attention/run.sh > $OUT/run.log 2>&1
echo "== results rc=$?" >> $OUT/res.txt
cp $R/ours.json $R/anchors.jsonl $R/table.md $OUT/ 2>/dev/null
grep -hE "OK |BAD" $R/ours.log | sed -E 's/BLOCK_M=(64|128) BLOCK_N=128 //; s/ORDER=1 //; s/STAGES=2 //; s/TMA=1//; s/ +rel_l2.*//' >> $OUT/res.txt
cat $OUT/res.txt; if [ "${OP:-bwd}" = both ]; then cat $R/table.md; else tail -14 $R/table.md; fi
