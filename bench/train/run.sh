#!/usr/bin/env bash
# Training-step benchmark (bench/train/train_step.py): forward + backward of
# one attention layer, kforge.jagged_attention against varlen_attn, on
# hstu_prod_causal and gdpa_dense (SHAPES=a,b for others). On the GPU machine,
# in a copy of this tree with a bundle made here by deploy/bundle.sh:
#   BUNDLE=.bundle OUT=/tmp/kt [PACK=kernels.kfpack] [SHAPES=...] bench/train/run.sh
# PACK: a pack from `kforge export` (the tuned kernels); without it kforge
# runs its seed kernels, compiled on the spot. Writes $OUT/train.md (the
# table, for bench/RESULTS.md), $OUT/train.json and $OUT/train.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=$(realpath "${BUNDLE:-.bundle}")
O=${OUT:-/tmp/kforge-train}
mkdir -p "$O"
export LD_LIBRARY_PATH="$B/lib:${CUDA_HOME:-/usr/local/cuda}/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KFORGE_RUNTIME_LIB="$B/lib/libkforge_runtime.so.1"
export KFORGE_CACHE_DIR="$O/cache" PYTHONUNBUFFERED=1
[ -n "${PACK:-}" ] && export KFORGE_PACKS="$(realpath "$PACK")"
python3 bench/train/train_step.py --shapes "${SHAPES:-hstu_prod_causal,gdpa_dense}" --out "$O" 2>&1 | tee "$O/train.log"
