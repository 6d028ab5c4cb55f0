// The evaluator's device-side helpers (eval_kernels.cu): input generation,
// fp32 -> bf16 conversion, comparison tallies and fingerprints, so that large
// batches never travel through host memory. Each mirrors a host function that
// stays the definition (RandomBf16, FloatToBf16, TallyBf16, TallyLse).
//
// Thread-compatible: one instance per thread/context, like GpuReference.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/compile_cache.h"
#include "gpu/gpu.h"
#include "worker/eval/compare.h"

namespace kforge::eval {

// The embedded eval_kernels.cu.
std::string_view EvalKernelsSource();

class DeviceTools {
 public:
  // Compiles for `arch` (through `cache` when not null) and loads into the
  // calling thread's current context. `driver` must outlive the object.
  static absl::StatusOr<std::unique_ptr<DeviceTools>> Create(const gpu::Driver& driver,
                                                             std::string_view arch,
                                                             gpu::CompileCache* cache = nullptr);

  // `n` bf16 values into `out`, bit-identical to RandomBf16 after its
  // generator handed it `state0`. Asynchronous.
  absl::Status FillRandomBf16(const gpu::DeviceBuffer& out, size_t n, uint64_t state0,
                              const gpu::Stream& stream) const;
  // StyleBf16 of n values of `buf` in place. Asynchronous.
  absl::Status StyleBf16(const gpu::DeviceBuffer& buf, size_t n, float scale, uint64_t seed,
                         uint32_t period, float magnitude, const gpu::Stream& stream) const;
  // out[i] = FloatToBf16(in[i]) for n elements. Asynchronous.
  absl::Status ToBf16(const gpu::DeviceBuffer& out, const gpu::DeviceBuffer& in, size_t n,
                      const gpu::Stream& stream) const;
  // TallyBf16 / TallyLse of n elements on the device (synchronises).
  absl::StatusOr<Tally> TallyBf16(const gpu::DeviceBuffer& got, const gpu::DeviceBuffer& ref,
                                  size_t n, const gpu::Stream& stream) const;
  absl::StatusOr<Tally> TallyLse(const gpu::DeviceBuffer& got, const gpu::DeviceBuffer& ref,
                                 size_t n, const gpu::Stream& stream) const;
  // A 64-bit digest of the buffer's contents (synchronises); equal contents
  // give equal digests.
  absl::StatusOr<uint64_t> Fingerprint(const gpu::DeviceBuffer& buf,
                                       const gpu::Stream& stream) const;
  // Fingerprint of each buffer (empty ones digest to 0), with one
  // synchronisation for all of them.
  absl::StatusOr<std::vector<uint64_t>> Fingerprints(std::span<const gpu::DeviceBuffer* const> bufs,
                                                     const gpu::Stream& stream) const;
  // The same for memory someone else owns (a module's globals).
  absl::StatusOr<std::vector<uint64_t>> Fingerprints(std::span<const gpu::DeviceRegion> regions,
                                                     const gpu::Stream& stream) const;
  // How many of the region's 32-bit words are not zero (synchronises): a
  // variant that restores dq_accum (manifest restores_dq_accum) must leave 0.
  absl::StatusOr<uint64_t> CountNonZero32(gpu::DeviceRegion region,
                                          const gpu::Stream& stream) const;

 private:
  DeviceTools() = default;
  absl::StatusOr<Tally> RunTally(const gpu::Kernel& kernel, const gpu::DeviceBuffer& got,
                                 const gpu::DeviceBuffer& ref, size_t n,
                                 const gpu::Stream& stream) const;

  const gpu::Driver* driver_ = nullptr;
  gpu::Module module_;
  gpu::Kernel fill_, style_, to_bf16_, tally_bf16_, tally_lse_, fingerprint_,
      count_nonzero_;
  // kMaxBlocks tallies, or the fingerprint's sum; scratch, so const methods may use it.
  mutable gpu::DeviceBuffer partials_;
};

}  // namespace kforge::eval
