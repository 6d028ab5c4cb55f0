#!/usr/bin/env bash
# A results run of every public shape, forward and backward, with the anchors in the
# same run (issue 10's targets, for an H200): the served defaults beside SETTINGS
# (default powerlaw_short's best, SPLIT=0 KVFIRST=0 KVSTORE=1, in the tuner's space).
# OUT must be set.
set -u
R=/tmp/rr; rm -rf $R
{ nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader; date -u +%FT%TZ; } > $OUT/res.txt
BUNDLE=.bundle OUT=$R OP=both VARIANTS=default TEMPLATES=bwd_sm90 ONLY="${ONLY:-}" \
  SETTINGS="${SETTINGS:-bwd_sm90:SPLIT=0,KVFIRST=0,KVSTORE=1}" OURS_TIMEOUT=260 ANCHOR_TIMEOUT=300 \
  bash bench/attention/run.sh > $OUT/run.log 2>&1
echo "== results rc=$?" >> $OUT/res.txt
cp $R/ours.json $R/anchors.jsonl $R/table.md $OUT/ 2>/dev/null
grep -hE "OK |BAD" $R/ours.log | sed -E 's/BLOCK_M=(64|128) BLOCK_N=128 //; s/ORDER=1 //; s/STAGES=2 //; s/TMA=1//; s/ +rel_l2.*//' >> $OUT/res.txt
cat $OUT/res.txt; grep -E "geomean|^\| (hstu|gdpa|pffn|power|d64)" $R/table.md
