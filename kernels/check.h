// Static checks on a variant before anything is compiled or launched.
//
// CheckVariant rejects variants that cannot work on the target arch or shape
// with a reason naming the offending field, so a proposer gets feedback
// without spending GPU time. It is deliberately conservative: passing it
// does not mean the variant is correct, only that it is not impossible.
//
// Thread-safe: pure function.
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "core/shape.h"
#include "kernels/manifest.h"

namespace kforge {

// Largest variant source accepted (bytes).
inline constexpr size_t kMaxVariantSourceBytes = 256 * 1024;

// Checks, in order: source size; host-code markers in the source (main(,
// #include of anything but "kforge/attn_params.h", cudaMalloc, printf, asm
// trap / exit, __host__); the entry point is defined as extern "C"
// __global__; manifest threads (multiple of 32, 32..1024), shared memory
// against the arch limit, arch listed in manifest.archs, every feature
// available on the arch; shape: op listed, head dim listed, causal/noncausal
// and GQA supported, batch <= 65535 for the per_tile grid.
// Returns InvalidArgument with the reason, e.g.
//   "dynamic_smem_bytes: 180224 exceeds sm_80's limit of 166912".
absl::Status CheckVariant(std::string_view source, const Manifest& manifest,
                          std::string_view arch, const ShapeKey& shape);

}  // namespace kforge
