// Runtime: the object behind the C ABI's kf_runtime. Wires the parts built
// once per runtime (packs read, server channel, NVRTC, the CUDA driver) and
// runs calls through them: MakeRequest (checks) -> Resolver (which kernel)
// -> Launcher (on the caller's stream).
//
// Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "gpu/gpu.h"
#include "kforge/runtime.h"
#include "runtime/launcher.h"
#include "runtime/resolver.h"
#include "runtime/server_client.h"

namespace kforge::runtime {

class Runtime {
 public:
  using ServerFactory = std::function<std::unique_ptr<KernelServer>(ServerOptions)>;

  // Reads every pack (KF_ERR_PACK when one is missing or damaged), opens the
  // server channel with `make_server` (MakeGrpcKernelServer; lazily
  // connected) and loads the CUDA driver when there is one.
  static absl::StatusOr<std::unique_ptr<Runtime>> Create(const kf_runtime_options& options,
                                                         const ServerFactory& make_server);
  ~Runtime();

  absl::Status Forward(const kf_attention_args* args);
  absl::Status Backward(const kf_attention_args* args);
  absl::Status Prepare(const kf_attention_args* args, Op op, kf_kernel_info* info);
  absl::Status Supported(const kf_attention_args* args, Op op);
  void Stats(kf_runtime_stats* out) const;

 private:
  Runtime() = default;
  absl::Status Run(const kf_attention_args* args, Op op);
  // The NVRTC target of the call's device (or the options' override).
  absl::StatusOr<std::string> ArchFor(int device);

  Counters counters_;
  std::string arch_override_;
  std::unique_ptr<gpu::Driver> driver_;  // null without a CUDA driver
  std::string no_driver_;                // why, when driver_ is null
  std::unique_ptr<Resolver> resolver_;
  std::unique_ptr<Launcher> launcher_;   // null without a driver
  std::mutex arch_mu_;
  std::map<int, std::string> arch_by_device_;  // guarded by arch_mu_
};

}  // namespace kforge::runtime
