// EvaluateInChild over worker/eval's Evaluator: runs inside the sandboxed
// child only (a faulting or hanging candidate takes this process with it).
#include <fmt/format.h>

#include "gpu/compile_cache.h"
#include "gpu/gpu.h"
#include "kernels/manifest.h"
#include "worker/child.h"
#include "worker/eval/eval.h"

namespace kforge::worker {
namespace {

ChildReport ToReport(const eval::EvalResult& r) {
  ChildReport out;
  out.outcome = r.outcome;
  out.message = r.message;
  out.reference_version = r.reference_version;
  if (r.outcome == Outcome::kVerified || r.outcome == Outcome::kWrong) {
    out.errors = ErrorStats{.max_abs_error = r.errors.max_abs,
                            .rel_l2_error = r.errors.rel_l2,
                            .worst_output = r.errors.worst_output,
                            .detail = r.errors.detail};
  }
  if (r.outcome == Outcome::kVerified) {
    out.timing = r.timing;
    out.verified = r.verified;
  }
  out.operator_note = r.operator_note;
  return out;
}

// A manifest that does not parse is the variant's fault: a static-check
// failure, reported like a compile error.
std::optional<ChildReport> BadManifest(const absl::StatusOr<Manifest>& m, std::string_view who) {
  if (m.ok()) return std::nullopt;
  ChildReport r;
  r.outcome = Outcome::kCompileError;
  r.message = fmt::format("{} manifest: {}", who, std::string(m.status().message()));
  return r;
}

}  // namespace

absl::StatusOr<ChildReport> EvaluateInChild(const ChildRequest& request,
                                            const ReferenceCallback& on_reference) {
  absl::StatusOr<std::unique_ptr<gpu::Driver>> driver = gpu::Driver::Load();
  if (!driver.ok()) return driver.status();
  std::optional<gpu::CompileCache> cache;
  if (!request.compile_cache_dir.empty()) cache.emplace(request.compile_cache_dir);
  absl::StatusOr<std::unique_ptr<eval::Evaluator>> evaluator =
      eval::Evaluator::Create(**driver, request.gpu_ordinal, cache ? &*cache : nullptr);
  if (!evaluator.ok()) return evaluator.status();
  if (request.mode == ChildRequest::Mode::kProbe) {
    ChildReport ready;
    ready.outcome = Outcome::kVerified;
    ready.message = fmt::format("evaluator ready on {} ({})", (*evaluator)->device().name,
                                (*evaluator)->device().arch);
    return ready;
  }

  absl::StatusOr<Manifest> manifest = ParseManifest(request.candidate.manifest_json);
  if (auto bad = BadManifest(manifest, "candidate")) return *bad;

  eval::EvalRequest req;
  req.shape = request.shape.key;
  req.cu_seqlens_q = request.shape.cu_seqlens_q;
  req.cu_seqlens_k = request.shape.cu_seqlens_k;
  req.seed = request.seed;
  req.candidate.cubin = request.candidate.cubin;
  req.candidate.manifest = *manifest;
  req.options.promotion = request.promotion;
  req.options.sampled_checks = request.sampled_checks;

  if (request.mode == ChildRequest::Mode::kCheck) {
    absl::StatusOr<eval::EvalResult> r = (*evaluator)->CheckOnly(req, on_reference);
    if (!r.ok()) return r.status();
    return ToReport(*r);
  }
  if (request.mode == ChildRequest::Mode::kEvaluate) {
    absl::StatusOr<eval::EvalResult> r = (*evaluator)->Evaluate(req, on_reference);
    if (!r.ok()) return r.status();
    return ToReport(*r);
  }

  if (!request.incumbent) return absl::InvalidArgumentError("retime request without an incumbent");
  absl::StatusOr<Manifest> incumbent_manifest = ParseManifest(request.incumbent->manifest_json);
  if (auto bad = BadManifest(incumbent_manifest, "incumbent")) return *bad;
  eval::Candidate incumbent;
  incumbent.cubin = request.incumbent->cubin;
  incumbent.manifest = *incumbent_manifest;
  absl::StatusOr<eval::RetimeResult> r = (*evaluator)->Retime(req, incumbent, on_reference);
  if (!r.ok()) return r.status();
  ChildReport out = ToReport(r->candidate);
  if (r->incumbent.outcome == Outcome::kVerified) {
    out.incumbent_timing = r->incumbent.timing;
  } else if (r->candidate.outcome == Outcome::kVerified &&
             (r->incumbent.outcome == Outcome::kWrong || r->incumbent.outcome == Outcome::kCrashed ||
              r->incumbent.outcome == Outcome::kTimeout)) {
    out.incumbent_failed = r->incumbent.outcome;
  }
  if (r->candidate.outcome == Outcome::kVerified) {
    out.message = r->incumbent.outcome != Outcome::kVerified
                      ? fmt::format("incumbent {} is {}: {}", request.incumbent->variant_id,
                                    OutcomeName(r->incumbent.outcome), r->incumbent.message)
                  : r->comparison.Describe();
  }
  return out;
}

}  // namespace kforge::worker
