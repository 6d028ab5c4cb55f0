#include "server/promotion.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kforge::server {
namespace {

// Sizes both workers verified at: with a confirmation on another worker, no
// single worker's claim widens where a kernel is served.
SizeExtent Intersect(const SizeExtent& a, const SizeExtent& b) {
  return SizeExtent{.batch = std::min(a.batch, b.batch),
                    .max_len_q = std::min(a.max_len_q, b.max_len_q),
                    .max_len_k = std::min(a.max_len_k, b.max_len_k),
                    .total_q = std::min(a.total_q, b.total_q),
                    .total_k = std::min(a.total_k, b.total_k)};
}

// The checks every promotion passes; fills `d` either way.
void Promote(const PromotionInput& in, std::string measured_by, PromotionDecision& d) {
  const EvaluationRecord& e = *in.eval;
  if (!in.gated) {
    d.note = fmt::format(
        "not promoted: worker {} registered without the memcheck sanitizer gate (set "
        "allow_ungated_promotion to promote ungated results)",
        e.worker_id);
    return;
  }
  if (e.cubin_hash.empty()) {
    d.note = "not promoted: the report carries no cubin (a best serves the cubin its promoting "
             "worker compiled and gated)";
    return;
  }
  if (in.origin && !in.origin->cubin_hash.empty() && in.origin->cubin_hash != e.cubin_hash &&
      in.origin_nvrtc_version == in.nvrtc_version && in.origin->arch == e.arch) {
    d.note = fmt::format(
        "not promoted: cubin differs from worker {}'s compile of the same source (same NVRTC {} "
        "and arch {}{}): one of the two is not what it claims",
        in.origin->worker_id, in.nvrtc_version.empty() ? "version" : in.nvrtc_version, e.arch,
        in.origin->compile_options == e.compile_options ? ", same options" : ", options claimed "
                                                                             "to differ");
    return;
  }
  d.promote = true;
  d.measured_by = std::move(measured_by);
  d.extent = e.verified;
  if (in.origin && !in.origin->verified.empty()) d.extent = Intersect(d.extent, in.origin->verified);
}

void RetimeIfFaster(const PromotionInput& in, PromotionDecision& d) {
  if (in.eval->timing.median_us < in.current->timing.median_us) {
    d.follow_up = TaskKind::kRetime;
    d.incumbent_variant_id = in.current->variant_id;
  }
}

}  // namespace

PromotionDecision DecidePromotion(const PromotionInput& in) {
  PromotionDecision d;
  const TaskRecord& task = *in.task;
  if (in.eval->outcome != Outcome::kVerified || task.kind == TaskKind::kCompile) return d;
  // The incumbent itself, re-measured: nothing to change.
  if (in.current && in.current->variant_id == task.variant_id) return d;
  if (in.deterministic_bucket && !in.candidate_deterministic) {
    d.note = fmt::format(
        "not promoted: bucket {} asks for a deterministic backward and variant {}'s manifest "
        "does not say \"deterministic\": true",
        task.bucket, task.variant_id);
    return d;
  }
  switch (task.kind) {
    case TaskKind::kEvaluate:
      if (!in.current) {
        d.follow_up = TaskKind::kConfirm;
      } else {
        RetimeIfFaster(in, d);
      }
      return d;
    case TaskKind::kConfirm:
      if (in.current) {
        // Another candidate was promoted while this ran: compare fairly.
        RetimeIfFaster(in, d);
      } else {
        Promote(in, MeasuredAlone("confirm", in.eval->timing), d);
      }
      return d;
    case TaskKind::kRetime: {
      if (!in.current) {
        // A best that vanished: nothing to beat.
        Promote(in, MeasuredAlone("retime, no incumbent left", in.eval->timing), d);
      } else if (in.current->variant_id != task.incumbent_variant_id) {
        // The best changed while this ran: a fair comparison needs a new
        // interleaved run against the new incumbent.
        RetimeIfFaster(in, d);
      } else if (in.incumbent_failed) {
        // The served kernel failed what the candidate passed: correctness
        // first, whatever the timings.
        Promote(in,
                fmt::format("{} (incumbent {} failed the same checks)",
                            MeasuredAlone("retime", in.eval->timing), task.incumbent_variant_id),
                d);
      } else {
        const Comparison c = CompareTimings(in.eval->timing, in.eval->incumbent_timing, in.rule);
        if (c.candidate_wins) {
          Promote(in, MeasuredAgainst(c, task.incumbent_variant_id), d);
          // The verdict and the rule it used go into the stored evaluation;
          // a refusal (gates) says why instead and keeps the verdict after it.
          const std::string verdict = fmt::format("won against {}: {}", task.incumbent_variant_id,
                                                  c.Describe());
          d.note = d.note.empty() ? verdict : d.note + "; " + verdict;
        } else {
          d.note = fmt::format("kept incumbent {}: {}", task.incumbent_variant_id, c.Describe());
        }
      }
      return d;
    }
    case TaskKind::kCompile:
      return d;
  }
  return d;
}

bool ManifestSaysDeterministic(std::string_view manifest_json) {
  const nlohmann::json m = nlohmann::json::parse(manifest_json, nullptr, /*allow_exceptions=*/false);
  if (!m.is_object()) return false;
  auto it = m.find("deterministic");
  return it != m.end() && it->is_boolean() && it->get<bool>();
}

std::optional<HeldChoice> ChooseHeldCandidate(const std::vector<HeldCandidate>& candidates,
                                              const std::optional<BestRecord>& best) {
  const HeldCandidate* fastest = nullptr;
  for (const HeldCandidate& c : candidates) {
    if (c.eval == nullptr || c.eval->outcome != Outcome::kVerified) continue;
    if (best && c.variant_id == best->variant_id) continue;
    if (fastest == nullptr || c.eval->timing.median_us < fastest->eval->timing.median_us)
      fastest = &c;
  }
  if (fastest == nullptr) return std::nullopt;
  if (!best) return HeldChoice{.kind = TaskKind::kConfirm, .candidate = fastest};
  if (fastest->eval->timing.median_us >= best->timing.median_us) return std::nullopt;
  return HeldChoice{
      .kind = TaskKind::kRetime, .candidate = fastest, .incumbent_variant_id = best->variant_id};
}

}  // namespace kforge::server
