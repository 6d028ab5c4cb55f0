// The GPU reference for jagged attention (forward and backward), compiled
// from the embedded reference_attn.cu with NVRTC for the GPU at hand.
//
// Parameter conventions (see reference_attn.cu): the reference takes the
// contract's KfAttnParams, but writes fp32 outputs (o in forward; dq, dk, dv
// in backward) and needs an fp32 `delta` scratch of heads * total_q floats in
// backward. Give it buffers of its own: it must never write memory a
// candidate can read.
//
// Thread-compatible: one instance per thread/context.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "gpu/compile_cache.h"
#include "gpu/gpu.h"

namespace kforge::reference {

// Recorded with every result: bump when the reference math or its tolerance
// policy (worker/eval/TOLERANCE.md) changes.
inline constexpr std::string_view kReferenceVersion = "kforge-ref-1";

std::string_view ReferenceSource();

class GpuReference {
 public:
  // Compiles for `arch` (e.g. "sm_90a"), through `cache` when given (it may
  // be null; it need not outlive the call), and loads into the calling
  // thread's current context. `driver` must outlive the object.
  static absl::StatusOr<std::unique_ptr<GpuReference>> Create(const gpu::Driver& driver,
                                                               std::string_view arch,
                                                               gpu::CompileCache* cache = nullptr);

  // O (fp32) and LSE from q, k, v. Asynchronous on `stream`.
  absl::Status Forward(const KfAttnParams& p, const gpu::Stream& stream) const;
  // delta, then dQ, dK, dV (fp32) from q, k, v, o, lse, dout. Asynchronous.
  absl::Status Backward(const KfAttnParams& p, const gpu::Stream& stream) const;

 private:
  GpuReference() = default;
  gpu::Module module_;
  gpu::Kernel fwd_, delta_, dq_, dkdv_;
};

}  // namespace kforge::reference
