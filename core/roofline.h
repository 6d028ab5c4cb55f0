// Roofline floor: the least time any GPU of an architecture can take for an
// attention shape, so that a reported timing below it is known to be false.
//
// A worker's timing is a claim. No kernel can do the shape's arithmetic
// faster than the fastest GPU of its arch runs dense bf16 tensor-core math,
// nor move less memory than reading every input once and writing every
// output once at that GPU's HBM bandwidth. The floor is
//
//   floor_us = max(flops / peak_flops, min_bytes / peak_bandwidth)
//
// with peaks taken from the datasheet of the fastest GPU of the arch (the
// floor must hold for every GPU a worker of that arch could have, so it
// never uses the GPU name a worker reports), and
//   flops     = 4 * D * H * pairs forward, 2.5x that backward, where pairs
//               is the number of (query, key) scores the mask allows:
//               exact when the offsets are known, otherwise a true lower
//               bound from the statistics (self: sum L^2 >= T^2/B; causal:
//               (T^2/B + T)/2; cross: 0, as the statistics bound nothing);
//   min_bytes = forward: Q, K, V, O in bf16, LSE in fp32 and the offsets;
//               backward: Q, K, V, O, dO, LSE and the offsets in, dQ, dK, dV
//               out. Workspace and re-reads are excluded: a kernel may
//               avoid them.
// A real kernel runs at a fraction of both peaks, so honest timings sit
// well above the floor (bench/RESULTS.md: 0.5x of it at best); the floor
// only catches the impossible.
//
// Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/shape.h"

namespace kforge {

// The fastest GPU of an architecture, from its datasheet.
struct ArchPeak {
  std::string_view gpu;           // "H100/H200"
  double bf16_flops_per_s = 0;    // dense bf16 tensor-core math (no sparsity)
  double hbm_bytes_per_s = 0;
};

// The peaks for `arch` ("sm_90a" and "sm_90" share theirs). An arch this
// table does not know gets twice the largest peaks it does know: a newer
// GPU may be faster, and a floor must never be above the truth.
ArchPeak PeakOf(std::string_view arch);

// The least work a shape needs: see the header comment.
struct AttentionWork {
  double flops = 0;
  double min_bytes = 0;
};

// `cu_q`/`cu_k` are the exact offsets when known (B+1 prefix sums; cu_k
// empty for self-attention), else empty: the statistics of `key` are used.
AttentionWork MinimalWork(const ShapeKey& key, std::span<const int32_t> cu_q = {},
                          std::span<const int32_t> cu_k = {});

struct TimingFloor {
  double us = 0;
  AttentionWork work;
  ArchPeak peak;
  std::string arch;
  // "812.31 us (2.1e+12 flop at 989 TFLOP/s, 9.8e+07 bytes at 4.8 TB/s; sm_90a, H100/H200)"
  std::string Describe() const;
};

// The floor of `key` on `arch` (the arch the worker registered with).
TimingFloor FloorOf(const ShapeKey& key, std::string_view arch,
                    std::span<const int32_t> cu_q = {}, std::span<const int32_t> cu_k = {});

}  // namespace kforge
