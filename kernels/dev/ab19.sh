#!/usr/bin/env bash
# One device call for notes/bwd.md v18: HELP=2 with CSKIP=0 as the heavy-tailed
# class's default at head dim 128. Its gate test (CSKIP 0 and 1) and eval
# case first, then an A/B of the heavy-tailed batches (powerlaw_short at both
# head dims and causal, a lone long sequence beside 200 short ones) around the
# new defaults, then, time permitting, a results run of the public backward
# shapes with the anchors. Few files under $OUT. OUT must be set; BUDGET s (560);
# SETTINGS: the A/B's settings (the second part of v18, 09:07, ran
# 'bwd_sm90:SPLIT=0;bwd_sm90:SPLIT=0,KVFIRST=0;bwd_sm90:CSKIP=1;bwd_sm90:HELP=0;bwd_sm90:CSKIP=1,HELP=0').
set -u
DEFAULT_BUDGET=560 source kernels/dev/call_env.sh
short() { grep -hE "OK |BAD" "$@" | sed -E 's/BLOCK_M=(64|128) BLOCK_N=128 //; s/ORDER=1 //; s/STAGES=2 //; s/TMA=1//; s/ +rel_l2.*//'; }
{ nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader; date -u +%FT%TZ; } > $OUT/ab.txt
timeout "$(left 150)" $B/worker_gpu_test --gtest_filter='WorkerGpuSequence.BwdSm90Help2PassesEveryGate' > $OUT/gate.log 2>&1
echo "== gate rc=$?" >> $OUT/ab.txt
grep -E '^\[ +(OK|FAILED|  SKIPPED) +\]|Failure|gates that run|confirm' $OUT/gate.log | cut -c1-110 | head -14 >> $OUT/ab.txt
timeout "$(left 60)" $B/eval_gpu_test --gtest_filter='EvalGpu.BwdSm90HeavyTailedDefaultsVerify' > $OUT/eval.log 2>&1
echo "== eval rc=$?" >> $OUT/ab.txt
grep -E '^\[ +(OK|FAILED) +\]|Failure' $OUT/eval.log | head -6 >> $OUT/ab.txt
S=${SETTINGS:-'bwd_sm90:CSKIP=1,HELP=0;bwd_sm90:CSKIP=0,HELP=2;bwd_sm90:CSKIP=1,HELP=2;bwd_sm90:SPLIT=0;bwd_sm90:KVFIRST=0;bwd_sm90:SPLIT=0,KVFIRST=0;bwd_sm90:DQW=0,DQZ=1'}
timeout "$(left 100)" $B/kforge-bench-attn --lengths kernels/dev/ab19_shapes.json \
  --op bwd --variants default --templates bwd_sm90 --settings "$S" > /tmp/ab.log 2>&1
echo "== bench rc=$?" >> $OUT/ab.txt; short /tmp/ab.log >> $OUT/ab.txt
l=$(left 420); if [ "$l" -gt 250 ]; then
  R=/tmp/rr; rm -rf $R
  BUNDLE=.bundle OUT=$R OP=bwd VARIANTS=default TEMPLATES=bwd_sm90 OURS_TIMEOUT=$(( l / 3 )) \
    ANCHOR_TIMEOUT=$(( l * 2 / 3 - 10 )) bash bench/attention/run.sh > $OUT/run.log 2>&1
  echo "== results rc=$?" >> $OUT/ab.txt
  cp $R/ours.json $OUT/ours.json 2>/dev/null; cp $R/anchors.jsonl $OUT/anchors.jsonl 2>/dev/null
  cp $R/table.md $OUT/table.md 2>/dev/null
  short $R/ours.log >> $OUT/ab.txt
fi
cat $OUT/ab.txt; cat $OUT/table.md 2>/dev/null | tail -30
