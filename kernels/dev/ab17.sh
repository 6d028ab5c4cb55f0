#!/usr/bin/env bash
# One device call for notes/bwd.md v17: the HELP eval cases (HELP=1 and 2),
# then a results run (anchors in the same run) of powerlaw_short and
# hstu_prod_causal with HELP=2, CONV2=1 and HELP=1 beside the served
# defaults, then, time permitting, the other public shapes' A/B and a traced
# powerlaw_short. (Call 2 ran it at aa2fa03, with CONV2=1 in the A/B: a knob
# since dropped.) Few files under $OUT. OUT must be set; BUDGET seconds (450).
set -u
DEFAULT_BUDGET=450 source kernels/dev/call_env.sh
{ nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader; date -u +%FT%TZ; } > $OUT/ab.txt
timeout "$(left 100)" $B/eval_gpu_test --gtest_filter='EvalGpu.BwdSm90HelpVerify' > $OUT/eval.log 2>&1
echo "eval rc=$?" >> $OUT/ab.txt
grep -E '^\[ +(OK|FAILED) +\]|Failure' $OUT/eval.log | head -8 >> $OUT/ab.txt
R=/tmp/r17; rm -rf $R
BUNDLE=.bundle OUT=$R OP=bwd VARIANTS=default TEMPLATES=bwd_sm90 ONLY=powerlaw_short \
  SETTINGS='bwd_sm90:HELP=2;bwd_sm90:HELP=1' OURS_TIMEOUT=$(left 200) ANCHOR_TIMEOUT=$(left 200) \
  bash bench/attention/run.sh > $OUT/run.log 2>&1
echo "== run rc=$?" >> $OUT/ab.txt
grep -hE "OK |BAD" $R/ours.log | sed -E 's/BLOCK_M=(64|128) BLOCK_N=128 //; s/CSKIP=1 //; s/ORDER=1 //; s/STAGES=2 TMA=1//; s/ +rel_l2.*//' >> $OUT/ab.txt
tail -n 30 $OUT/run.log | grep -vE "^\s*$" | tail -n 24 >> $OUT/ab.txt
cp $R/ours.json $OUT/ours.json 2>/dev/null; cp $R/anchors.jsonl $OUT/anchors.jsonl 2>/dev/null
short() { grep -hE "OK |BAD" "$@" | sed -E 's/BLOCK_M=(64|128) BLOCK_N=128 //; s/CSKIP=1 //; s/ORDER=1 //; s/STAGES=2 TMA=1//; s/ +rel_l2.*//'; }
python3 bench/attention/lengths.py bench/shapes.json > /tmp/pub.json
l=$(left 150); if [ "$l" -gt 60 ]; then
  timeout $l $B/kforge-bench-attn --lengths /tmp/pub.json --only hstu_prod_causal,gdpa_dense,pffn_cross_d64 --op bwd \
    --variants default --templates bwd_sm90 --settings "bwd_sm90:HELP=1" > /tmp/pub.log 2>&1
  echo "== pub rc=$?" >> $OUT/ab.txt; short /tmp/pub.log >> $OUT/ab.txt
fi
l=$(left 100); [ "$l" -gt 50 ] && TLIM=$l bash kernels/dev/trace_help.sh
cat $OUT/ab.txt
