#include "server/export.h"

#include <optional>

#include <fmt/format.h>

namespace kforge::server {

absl::Status ExportKernels(const KernelCache& cache, const v1::ExportKernelsRequest& req,
                           const std::function<bool(const v1::ExportedKernel&)>& write) {
  if (!req.arch().empty()) {
    if (absl::Status s = ValidateArch(req.arch()); !s.ok()) return s;
  }
  std::optional<Op> op;
  switch (req.op()) {
    case v1::OP_UNSPECIFIED: break;
    case v1::OP_FORWARD: op = Op::kForward; break;
    case v1::OP_BACKWARD: op = Op::kBackward; break;
    default:
      return absl::InvalidArgumentError(
          fmt::format("op: {} is not OP_FORWARD, OP_BACKWARD or unspecified", int(req.op())));
  }
  for (const KernelCache::BestEntry& best : cache.Bests()) {
    if (!req.arch().empty() && best.bucket.arch != req.arch()) continue;
    if (op && best.bucket.op != *op) continue;
    v1::ExportedKernel out;
    out.set_bucket(best.bucket.Id());
    *out.mutable_kernel() = *best.kernel;
    out.mutable_kernel()->set_tuned(true);
    out.mutable_kernel()->set_requested_bucket(out.bucket());
    // A pack is served offline: the sizes the server itself would serve the
    // kernel for, not its whole bucket.
    const SizeExtent& e = best.verified;
    auto* x = out.mutable_extent();
    x->set_batch(e.batch);
    x->set_max_len_q(e.max_len_q);
    x->set_max_len_k(e.max_len_k);
    x->set_total_q(e.total_q);
    x->set_total_k(e.total_k);
    if (!write(out)) return absl::CancelledError("client went away");
  }
  return absl::OkStatus();
}

}  // namespace kforge::server
