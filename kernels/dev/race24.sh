#!/usr/bin/env bash
# One device call for notes/bwd.md v20 (one epilogue, the barrier for tiles without
# steps, the sampled gate problem on 2-3 CTAs). Two tracks at once:
#  A: the bwd_sm90 eval cases (correctness of the new epilogue; no timing);
#  B: the sanitizer gates: the new cross-attention gate test with the v19 kernel
#     (.bundle/bin/worker_gpu_test_v19, built from v19's template: should fail
#     racecheck, the race this fixes), then with v20, then the other bwd_sm90 gate tests.
# OUT must be set; BUDGET s (560). GATES overrides track B's list ("test:seconds ...").
set -u
DEFAULT_BUDGET=560 source kernels/dev/call_env.sh
{ nvidia-smi --query-gpu=name --format=csv,noheader; date -u +%FT%TZ; } > $OUT/race.txt
summ() { grep -E '^\[ +(OK|FAILED|  SKIPPED) +\]|Failure|gates that run|dropped|confirm|race|hazard' "$1" | cut -c1-140 | head -${2:-16}; }
( timeout "$(left ${EVAL_S:-400})" $B/eval_gpu_test --gtest_filter="${EVAL:-EvalGpu.BwdSm90*}" > $OUT/eval.log 2>&1
  echo "== eval rc=$?" > $OUT/eval.txt; summ $OUT/eval.log 24 >> $OUT/eval.txt ) &
for g in ${GATES:-v19:WorkerGpuSequence.BwdSm90CrossPassesEveryGate:120 \
                 v20:WorkerGpuSequence.BwdSm90CrossPassesEveryGate:150 \
                 v20:WorkerGpuGates.*:60 \
                 v20:WorkerGpuSequence.BwdSm90KvStorePassesEveryGate:90 \
                 v20:WorkerGpuSequence.BwdSm90PassesEveryGate:200}; do
  IFS=: read -r which filt secs <<< "$g"
  bin=$B/worker_gpu_test; [ "$which" = v19 ] && bin=$B/worker_gpu_test_v19
  log=$OUT/gate_${which}_$(echo "$filt" | tr -c 'A-Za-z0-9' _).log
  timeout "$(left $secs)" $bin --gtest_filter="$filt" > "$log" 2>&1
  echo "== $which $filt rc=$?" >> $OUT/race.txt; summ "$log" 14 >> $OUT/race.txt
done
wait
cat $OUT/eval.txt >> $OUT/race.txt
cat $OUT/race.txt
