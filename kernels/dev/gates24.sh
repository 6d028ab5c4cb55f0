#!/usr/bin/env bash
# One device call after notes/bwd.md v20 (the sampled gate problem on 2-3 CTAs changes
# what racecheck and synccheck see for every persistent kernel): the other gate tests,
# three at a time (correctness only), then a results run with the anchors
# (kernels/dev/res22.sh) alone on the GPU. OUT must be set; BUDGET s (570).
set -u
DEFAULT_BUDGET=570 source kernels/dev/call_env.sh
summ() { grep -E '^\[ +(OK|FAILED|  SKIPPED) +\]|Failure|gates that run|dropped|confirm' "$1" | cut -c1-140 | head -${2:-16}; }
{ nvidia-smi --query-gpu=name --format=csv,noheader; date -u +%FT%TZ; } > $OUT/gates.txt
i=0
for filt in 'WorkerGpuSequence.SeedDefaultsPassEveryGate:WorkerGpuSequence.FwdStreamPassesEveryGate' \
            'WorkerGpuSequence.FwdSm90*:WorkerGpuSequence.BwdSm90Help2PassesEveryGate' \
            'Corpus/WorkerGpuPromotion.*'; do
  i=$((i + 1))
  ( timeout "$(left ${GATE_S:-200})" $B/worker_gpu_test --gtest_filter="$filt" > $OUT/gate$i.log 2>&1
    { echo "== $filt rc=$?"; summ $OUT/gate$i.log 20; } > $OUT/gate$i.txt ) &
done
wait
cat $OUT/gate[0-9].txt >> $OUT/gates.txt
echo "== results from $(date -u +%T), $(left 999) s left" >> $OUT/gates.txt
timeout "$(left 999)" bash kernels/dev/res22.sh > /dev/null 2>&1
echo "== res22 rc=$?" >> $OUT/gates.txt
cat $OUT/gates.txt; cat $OUT/res.txt 2>/dev/null; tail -14 /tmp/rr/table.md 2>/dev/null
