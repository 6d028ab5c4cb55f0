// For the host tests of the Hopper parts (bwd_tiles_test.cc,
// packed_rows_test.cc): the tile parts compiled as plain C++ (they are CUDA
// device code, but these functions only do arithmetic on ints), and the
// batches of mostly short sequences both tests draw.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kforge/attn_params.h"

#define __device__
#define __forceinline__ inline
#include "kernels/templates/sm90/packed_rows.cuh"
#include "kernels/templates/sm90/bwd_tiles.cuh"
#undef __device__
#undef __forceinline__

namespace kforge::testing {

struct Batch {
  std::vector<int32_t> cu_q = {0}, cu_k = {0};
};

// n sequences, mostly short (0-40 queries, one in 20 of 129-300); cross
// attention draws the keys the same way, self attention has Lk = Lq.
inline Batch DrawShortBatch(std::mt19937& rng, int n, bool cross) {
  Batch b;
  std::uniform_int_distribution<int> small(0, 40), pick(0, 19), big(129, 300);
  for (int i = 0; i < n; ++i) {
    const int q = pick(rng) == 0 ? big(rng) : small(rng);
    const int k = cross ? (pick(rng) == 0 ? big(rng) : small(rng)) : q;
    b.cu_q.push_back(b.cu_q.back() + q);
    b.cu_k.push_back(b.cu_k.back() + k);
  }
  return b;
}

}  // namespace kforge::testing
