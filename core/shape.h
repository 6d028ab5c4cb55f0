// Shape keys and shape buckets: the one place that decides which requests
// share a tuned kernel.
//
// A ShapeKey is what a client describes: the operation, dtype, head layout,
// mask, target architecture and the statistics of its jagged batch. Requests
// whose keys fall into the same Bucket are served the same kernel, and tuning
// records its winners per (bucket, architecture). Exact fields (op, dtype,
// head dim, heads, mask, self/cross, arch) must match; length statistics are
// rounded up to powers of two, because kernel speed changes with the order of
// magnitude of the lengths, not with their last digit.
//
// Thread-safe: everything here is a pure function of its arguments.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kforge {

enum class Op { kForward, kBackward };
enum class DType { kBF16 };

std::string_view OpName(Op op);          // "fwd" | "bwd"
std::string_view DTypeName(DType dtype);  // "bf16"
std::optional<Op> ParseOp(std::string_view s);       // accepts fwd|forward, bwd|backward
std::optional<DType> ParseDType(std::string_view s);  // bf16

// Limits beyond which a request is rejected as absurd rather than attempted.
inline constexpr int kMaxHeadDim = 256;
inline constexpr int kMaxHeads = 256;
inline constexpr int64_t kMaxBatch = int64_t{1} << 24;
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 20;
inline constexpr int64_t kMaxTotalTokens = (int64_t{1} << 31) - 1;  // int32 offsets

struct ShapeKey {
  Op op = Op::kForward;
  DType dtype = DType::kBF16;
  int head_dim = 0;
  int heads = 0;      // query heads
  int kv_heads = 0;   // key/value heads; divides `heads` (grouped-query attention)
  bool causal = false;  // bottom-right aligned when query and key lengths differ
  bool cross = false;   // separate key offsets; false means keys = queries
  std::string arch;     // e.g. "sm_90a", "sm_100a", "sm_80"
  // Backward only: the kernel must write bitwise the same dQ, dK and dV in
  // every launch on the same inputs (manifest `deterministic`). A bucket of
  // its own, served and tuned over deterministic variants alone. The forward
  // is always deterministic, so a forward key with it set is invalid.
  bool deterministic = false;
  int64_t batch = 0;
  int64_t max_len_q = 0;
  int64_t total_q = 0;
  int64_t max_len_k = 0;  // self-attention: equal to the q fields
  int64_t total_k = 0;
};

// Checks every field; the message names the first offending field, e.g.
// "head_dim: 100 is not a multiple of 8".
absl::Status ValidateShapeKey(const ShapeKey& key);

// Fills the batch statistics of `key` from offsets arrays (B+1 prefix sums,
// starting at 0, non-decreasing). For self-attention pass cu_seqlens_k empty.
absl::Status FillLengthStats(std::span<const int32_t> cu_seqlens_q,
                             std::span<const int32_t> cu_seqlens_k, ShapeKey& key);

// OK when ParseArch (core/arch.h) reads `arch`: "sm_" + major*10+minor, with
// "a" for the architecture-specific targets (sm_90a, sm_100a).
absl::Status ValidateArch(std::string_view arch);

struct Bucket {
  Op op = Op::kForward;
  DType dtype = DType::kBF16;
  int head_dim = 0;
  int heads = 0;
  int kv_heads = 0;
  bool causal = false;
  bool cross = false;
  std::string arch;
  bool deterministic = false;  // backward only: see ShapeKey
  // Powers of two, rounded up from the batch statistics.
  int64_t batch = 0;
  int64_t max_q = 0;
  int64_t mean_q = 0;
  int64_t max_k = 0;
  int64_t mean_k = 0;

  // Canonical text form, stable across versions because it is stored:
  // "fwd.bf16.d128.h4.kv4.causal.self.sm_90a.b128.mq4096.aq4096.mk4096.ak4096";
  // a deterministic bucket appends ".det" (so every older id is unchanged):
  // "bwd.bf16.d128.h4.kv4.causal.self.sm_90a.b128.mq4096.aq4096.mk4096.ak4096.det"
  std::string Id() const;
  bool operator==(const Bucket&) const = default;
};

// The bucket a (valid) key falls into.
Bucket BucketOf(const ShapeKey& key);
absl::StatusOr<Bucket> ParseBucketId(std::string_view id);

// How far apart two buckets are, for serving the nearest tuned bucket when a
// request's own bucket has no winner yet: nullopt when a kernel of one cannot
// serve the other (different op, dtype, head layout, mask, arch or
// determinism: a deterministic request is never served a kernel without
// that promise, and a deterministic kernel, slower, is nobody's nearest
// choice for a request that did not ask); otherwise
// the summed log2 distance of the length statistics (0 = same bucket).
std::optional<int> BucketDistance(const Bucket& a, const Bucket& b);

// The sizes a kernel was verified at: for each statistic, the largest value
// among the batches its evaluation checked (not a tuple from one batch). A
// kernel is served only for requests inside the extent it was verified on:
// a kernel can be right at every size it was shown and wrong past them (int32
// element offsets past 2^31 elements, a size the author special-cased).
struct SizeExtent {
  int64_t batch = 0;
  int64_t max_len_q = 0;
  int64_t max_len_k = 0;
  int64_t total_q = 0;
  int64_t total_k = 0;

  bool empty() const { return batch == 0; }
  bool operator==(const SizeExtent&) const = default;
};

// True when every statistic of `key` is within `verified` (self-attention
// keys count as their queries).
bool ExtentCovers(const SizeExtent& verified, const ShapeKey& key);

// The largest sizes any key of the bucket can have: batch, the maximum
// lengths, and totals of batch * mean (which also bound batch * max).
SizeExtent BucketExtent(const Bucket& b);

// Smallest power of two >= v (v >= 1); 1 for v <= 1.
int64_t CeilPow2(int64_t v);

}  // namespace kforge
