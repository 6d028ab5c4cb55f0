#!/usr/bin/env bash
# powerlaw_short alone, with the anchors in the same run: the served defaults
# beside SPLIT=0 KVFIRST=0 (notes/bwd.md v18). For a card not yet measured. OUT must be set.
set -u
R=/tmp/rp; rm -rf $R
{ nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader; date -u +%FT%TZ; } > $OUT/pls.txt
BUNDLE=.bundle OUT=$R OP=bwd VARIANTS=default TEMPLATES=bwd_sm90 ONLY=powerlaw_short \
  SETTINGS='bwd_sm90:SPLIT=0,KVFIRST=0;bwd_sm90:CSKIP=1,HELP=0' OURS_TIMEOUT=90 ANCHOR_TIMEOUT=200 \
  bash bench/attention/run.sh > $OUT/run.log 2>&1
echo "== rc=$?" >> $OUT/pls.txt
grep -hE "OK |BAD" $R/ours.log | sed -E 's/BLOCK_M=(64|128) BLOCK_N=128 //; s/ORDER=1 //; s/STAGES=2 //; s/TMA=1//; s/ +rel_l2.*//' >> $OUT/pls.txt
cat $OUT/pls.txt; tail -6 $R/table.md
