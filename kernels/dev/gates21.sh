#!/usr/bin/env bash
# One device call: the sanitizer gates after --report-api-errors no (task_runner.cc):
# whether memcheck passes kforge's own seed kernel again (WorkerGpuGates), then the
# heavy-tailed class's HELP=2 settings and the seeds' defaults through all four
# gates, then the bwd_sm90 gate cases, time permitting. OUT must be set; BUDGET s (500).
set -u
DEFAULT_BUDGET=500 source kernels/dev/call_env.sh
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u +%FT%TZ
  /usr/local/cuda/bin/compute-sanitizer --version | tail -1
  /usr/local/cuda/bin/compute-sanitizer --help | grep -A3 -- '--report-api-errors'; } > $OUT/gates.txt 2>&1
run() {  # filter, seconds
  timeout "$(left $2)" $B/worker_gpu_test --gtest_filter="$1" > $OUT/$3.log 2>&1
  echo "== $1 rc=$?" >> $OUT/gates.txt
  grep -E '^\[ +(OK|FAILED|  SKIPPED) +\]|Failure|gates that run|dropped|confirm' $OUT/$3.log | cut -c1-120 | head -${4:-16} >> $OUT/gates.txt
}
run 'WorkerGpuGates.*:WorkerGpuSequence.BwdSm90Help2PassesEveryGate' 240 help 16
run 'WorkerGpuSequence.SeedDefaultsPassEveryGate' 150 seeds 10
run 'WorkerGpuSequence.BwdSm90PassesEveryGate' 200 bwd 16
cat $OUT/gates.txt
