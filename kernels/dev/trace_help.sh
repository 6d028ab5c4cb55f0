#!/usr/bin/env bash
# Development: one traced launch of powerlaw_short with the served defaults
# and with HELP=2 (notes/bwd.md v16, v17: why HELP=1 did not move
# powerlaw_short, and what HELP=2 left). Traces stay in /tmp; only trace_bwd.py's summaries, in one
# file, go to $OUT/trace.txt. OUT must be set; TLIM seconds for the bench (120).
set -u
export LD_LIBRARY_PATH=$PWD/.bundle/lib:/usr/local/cuda/lib64
B=.bundle/bin
T=/tmp/kf_tr; rm -rf $T; mkdir -p $T
timeout "${TLIM:-120}" $B/kforge-bench-attn --lengths kernels/dev/trace_shapes.json --only powerlaw_short \
  --op bwd --variants default --templates bwd_sm90 --settings "bwd_sm90:HELP=2" --trace-dir $T > $T/bench.log 2>&1
echo "traced rc=$?" > $OUT/trace.txt
grep -hE "OK |BAD|trace" $T/bench.log | sed -E 's/ +rel_l2.*//' | head -12 >> $OUT/trace.txt
for j in $T/*.json; do s=${j%.json}; echo "#### $(basename $s)" >> $OUT/trace.txt
  python3 kernels/dev/trace_bwd.py $s --tiles 0 >> $OUT/trace.txt 2>&1; done
