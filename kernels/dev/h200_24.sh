#!/usr/bin/env bash
# One device call (notes/bwd.md v20): the adversarial corpus through the gated worker
# alone on the GPU (kernels/dev/corpus22.sh; under three gate processes at once the
# good_persistent kernel's plain run hit its 5 s limit), then a results run of the
# shapes issue 10 names targets for (kernels/dev/res22.sh with ONLY). OUT must be set.
set -u
LIM=${LIM:-150} bash kernels/dev/corpus22.sh > /dev/null 2>&1
ONLY=${ONLY:-hstu_prod_causal,gdpa_dense,powerlaw_short} bash kernels/dev/res22.sh > /dev/null 2>&1
cat $OUT/corpus.txt $OUT/res.txt; tail -8 /tmp/rr/table.md
