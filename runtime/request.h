// One attention call, checked: the C ABI's arguments turned into a shape key
// (the bucket's input), the offsets the host has, and the pointers.
//
// MakeRequest is where every argument error is found, so the messages name
// the C field ("args.kv_heads: 3 does not divide heads 8"). Degenerate
// batches (no query rows, or no key rows) are valid: `empty` says what the
// launcher must still write.
//
// Thread-safe: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "core/shape.h"
#include "kforge/runtime.h"

namespace kforge::runtime {

// An error with its C status, for the ABI layer to return as is.
struct Failure {
  kf_status code;
  std::string message;
};
absl::Status ToStatus(kf_status code, std::string message);  // carries the code
kf_status CodeOf(const absl::Status& s);                     // KF_ERR_INTERNAL if none carried

enum class Degenerate {
  kNone,
  kNoQueries,  // total_q == 0: forward writes nothing; backward zeroes dk, dv
  kNoKeys,     // total_k == 0: forward writes o = 0, lse = -inf; backward zeroes dq
};

struct Request {
  Op op = Op::kForward;
  ShapeKey key;  // validated (unless degenerate), arch set, kv_heads and self stats filled
  Degenerate degenerate = Degenerate::kNone;
  const kf_attention_args* args = nullptr;  // the caller's; outlives the call
  float scale = 0;
  // Host offsets when the caller gave them (cu_k empty for self-attention).
  std::span<const int32_t> cu_q_host;
  std::span<const int32_t> cu_k_host;
  bool has_host_offsets = false;

  int64_t q_elems() const { return key.total_q * key.heads * key.head_dim; }
  int64_t k_elems() const { return key.total_k * key.kv_heads * key.head_dim; }
};

// Where a tensor may start (kforge/runtime.h; kernels/CONTRACT.md "Parameters").
inline constexpr uintptr_t kTensorAlignment = 16;

// The smallest struct_size accepted: kf_attention_args as first released,
// up to `dv`. Fields added since (`deterministic`) read as 0 when a
// caller's struct_size ends before them.
inline constexpr size_t kArgsMinSize = offsetof(kf_attention_args, deterministic);
// args->deterministic where the caller's struct has it, else 0.
int ArgsDeterministic(const kf_attention_args& args);

// Checks `args` for `op` (and, unless `sizes_only`, its tensor pointers).
// `arch` is the NVRTC target kernels are resolved for.
absl::StatusOr<Request> MakeRequest(const kf_attention_args* args, Op op, std::string_view arch,
                                    bool sizes_only = false);

}  // namespace kforge::runtime
