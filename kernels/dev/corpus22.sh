#!/usr/bin/env bash
# The adversarial corpus through the gated worker (every gate, --report-api-errors no
# since d8c1427): each corpus kernel gets its promoted outcome. OUT must be set; LIM s (280).
set -u
export LD_LIBRARY_PATH=$PWD/.bundle/lib:/usr/local/cuda/lib64
timeout "${LIM:-280}" .bundle/bin/worker_gpu_test --gtest_filter='WorkerGpuGates.*:Corpus/WorkerGpuPromotion.*' > $OUT/corpus.log 2>&1
echo "rc=$?" > $OUT/corpus.txt
grep -E '^\[ +(OK|FAILED|  SKIPPED) +\]|gates that run|Failure' $OUT/corpus.log | cut -c1-140 >> $OUT/corpus.txt
cat $OUT/corpus.txt
