// Launcher: runs a resolved kernel on the caller's device and stream, the way
// the evaluator ran it when it was verified (worker/eval/eval.cc): the same
// launch plan (kernels/schedule.h), dynamic shared memory opted in, CTAs per
// SM from the occupancy calculator, and the scratch the contract says the
// host zeroes (tile counter, workspace, backward's delta and dq_accum)
// zeroed on the stream before every launch.
//
// Per device it keeps the primary context (the one the CUDA runtime and
// PyTorch use; made current for a call, and the caller's current context put
// back after it), each kernel's module loaded once, the plans of batches seen
// (PlanCache) and per-stream scratch (ScratchArenas). Everything is enqueued
// on the caller's stream; nothing waits for the device.
//
// Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include "absl/status/statusor.h"
#include "gpu/gpu.h"
#include "runtime/plan_cache.h"
#include "runtime/request.h"
#include "runtime/resolver.h"
#include "runtime/scratch.h"

namespace kforge::runtime {

class Launcher {
 public:
  // `driver` and `counters` must outlive the launcher.
  Launcher(const gpu::Driver* driver, Counters* counters);
  ~Launcher();

  // The device's properties (opens its context on first use).
  absl::StatusOr<gpu::DeviceInfo> Info(int ordinal);
  // Loads the kernel into the device's context (once).
  absl::Status Load(int ordinal, const ResolvedKernel& kernel);
  // Enqueues `kernel` for `req` (not degenerate) on req.args->stream.
  absl::Status Run(const Request& req, const ResolvedKernel& kernel);
  // Writes what a batch without query or key rows produces (zeros, -inf).
  absl::Status RunDegenerate(const Request& req);

 private:
  struct Loaded;
  struct Device;
  absl::StatusOr<Device*> DeviceFor(int ordinal);
  absl::StatusOr<const Loaded*> LoadOn(Device& d, const ResolvedKernel& kernel);

  const gpu::Driver* driver_;
  Counters* counters_;
  std::mutex mu_;
  std::map<int, std::unique_ptr<Device>> devices_;  // guarded by mu_
};

}  // namespace kforge::runtime
