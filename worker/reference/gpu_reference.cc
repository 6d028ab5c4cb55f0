#include "worker/reference/gpu_reference.h"

#include "fmt/format.h"
#include "gpu/compile.h"

namespace kforge::embedded {
extern const char kReferenceAttnSource[];
}  // namespace kforge::embedded

namespace kforge::reference {
namespace {

constexpr int kWarpsPerBlock = 4;  // KF_WARPS_PER_BLOCK in reference_attn.cu

gpu::Dim3 RowGrid(int rows, int heads) {
  return {static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock),
          static_cast<unsigned>(heads), 1};
}

}  // namespace

std::string_view ReferenceSource() { return embedded::kReferenceAttnSource; }

absl::StatusOr<std::unique_ptr<GpuReference>> GpuReference::Create(const gpu::Driver& driver,
                                                                   std::string_view arch,
                                                                   gpu::CompileCache* cache) {
  gpu::CompileRequest req;
  req.source = std::string(ReferenceSource());
  req.arch = std::string(arch);
  req.name = "reference_attn.cu";
  absl::StatusOr<gpu::CompileResult> compiled =
      cache != nullptr ? cache->GetOrCompile(req) : gpu::Compile(req);
  if (!compiled.ok()) return compiled.status();
  if (!compiled->ok) {
    return absl::InternalError(fmt::format("the reference does not compile for {}:\n{}", arch,
                                           compiled->log));
  }
  auto ref = std::unique_ptr<GpuReference>(new GpuReference());
  absl::StatusOr<gpu::Module> module = gpu::Module::Load(driver, compiled->cubin);
  if (!module.ok()) return module.status();
  ref->module_ = *std::move(module);
  for (auto [kernel, name] : {std::pair{&ref->fwd_, "kf_ref_fwd"},
                              std::pair{&ref->delta_, "kf_ref_bwd_delta"},
                              std::pair{&ref->dq_, "kf_ref_bwd_dq"},
                              std::pair{&ref->dkdv_, "kf_ref_bwd_dkdv"}}) {
    absl::StatusOr<gpu::Kernel> k = ref->module_.GetKernel(name);
    if (!k.ok()) return k.status();
    *kernel = *std::move(k);
  }
  return ref;
}

absl::Status GpuReference::Forward(const KfAttnParams& p, const gpu::Stream& stream) const {
  if (p.total_q == 0) return absl::OkStatus();
  return fwd_.Launch(p, RowGrid(p.total_q, p.heads), {32 * kWarpsPerBlock}, 0, stream);
}

absl::Status GpuReference::Backward(const KfAttnParams& p, const gpu::Stream& stream) const {
  const gpu::Dim3 block{32 * kWarpsPerBlock};
  if (p.total_q > 0) {
    if (absl::Status s = delta_.Launch(p, RowGrid(p.total_q, p.heads), block, 0, stream); !s.ok()) {
      return s;
    }
    if (absl::Status s = dq_.Launch(p, RowGrid(p.total_q, p.heads), block, 0, stream); !s.ok()) {
      return s;
    }
  }
  if (p.total_k == 0) return absl::OkStatus();
  return dkdv_.Launch(p, RowGrid(p.total_k, p.kv_heads), block, 0, stream);
}

}  // namespace kforge::reference
