// The random jagged batches a candidate is checked and timed on.
//
// Check batches are small and hostile: every one holds a sequence of the
// shape's maximum length (capped at kCheckMaxLen), an empty one and a
// length-1 one, and lengths that are not multiples of any tile; cross shapes
// draw key lengths independently (Lq != Lk, Lk = 0 included). The timing
// batch follows the shape's statistics (B, max, mean) or the exact offsets a
// task carried. Everything derives from the task's seed, so a result can be
// replayed, and a fresh seed per task defeats hard-coding.
//
// Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "core/shape.h"
#include "worker/reference/jagged.h"

namespace kforge::eval {

inline constexpr int kCheckMaxLen = 4096;
// Largest timing problem evaluated: elements of Q (total_q * heads * head_dim).
// 2^30 keeps every element offset inside int32 arithmetic with room to spare
// and the host copies (inputs, reference, outputs) at ~12 GB; the public
// benchmark shapes reach 3.0e8 (gdpa_self).
inline constexpr int64_t kMaxEvalElements = int64_t{1} << 30;

// The head layout and mask of `key` with empty offsets.
reference::JaggedShape HeadLayout(const ShapeKey& key);

// Check batch `index` (0, 1, ...) for `key`.
reference::JaggedShape CheckBatch(const ShapeKey& key, uint64_t seed, int index);

// The timing batch: `cu_q`/`cu_k` when given (cu_k empty: self-attention),
// else lengths drawn to match key.batch, max_len_* and total_* (mean). The
// draw depends on the key alone, not on a task's seed: every evaluation of a
// shape is timed on the same lengths (with fresh values), so the times the
// search compares differ by the kernels, not by the batches.
absl::StatusOr<reference::JaggedShape> TimingBatch(const ShapeKey& key,
                                                   std::span<const int32_t> cu_q,
                                                   std::span<const int32_t> cu_k);

// Fresh N(0, 1) bf16 values.
std::vector<uint16_t> RandomBf16(size_t n, std::mt19937_64& rng);

}  // namespace kforge::eval
