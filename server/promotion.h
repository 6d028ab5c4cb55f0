// Promotion: how a verified result may change which kernel a bucket serves.
//
// A worker's report is a claim; what it may change depends on the task:
//   EVALUATE  never promotes. With no best yet it asks for a CONFIRM of its
//             candidate; faster than the best, for a RETIME against it. The
//             API holds those requests until the bucket's round is in and
//             asks for one, for the round's fastest (ChooseHeldCandidate).
//   CONFIRM   the candidate verified and timed alone, after the sanitizer
//             gates, on the worker the lease rule chose (another than the
//             EVALUATE's when one is connected): promotes when the bucket
//             still has no best; if a best came meanwhile, a faster
//             candidate is re-timed against it.
//   RETIME    candidate and incumbent alternating launch by launch on one
//             batch in one process: promotes when the candidate wins by
//             core/timing.h's rule (CompareTimings on the evaluation's
//             timing and incumbent_timing: the sign-test lower bound on the
//             median of the paired ratios incumbent/candidate above 1.01 at
//             one of the pair schedule's looks, 95% overall; the medians
//             apart by more than the larger interquartile range for a report
//             without samples), or when the incumbent
//             failed the checks the candidate passed; against a best that
//             changed meanwhile, a new RETIME.
// A promotion says how the new best's figure was measured (measured_by),
// and the RETIME's samples are stored with its evaluation, so the decision
// can be recomputed from the store.
// A would-be promotion is refused, and recorded with the reason, when the
// reporting worker does not gate (no "memcheck" among its sanitizer tools,
// unless ungated promotion is allowed), when it sent no cubin (the served
// cubin is the promoting report's own), or when its cubin differs from the
// candidate's EVALUATE compile by a worker with the same NVRTC version and
// arch: the same source compiles to the same bytes, so one of the two is not
// what it claims. The versions compared are the ones the workers registered
// with, and the compile options a report claims do not excuse a difference
// (a worker build compiles a variant for an arch with the same options
// everywhere); claims made per report could be varied to dodge the check.
// In a deterministic bucket a candidate whose manifest is not deterministic
// changes nothing (no CONFIRM, no RETIME, no promotion), with the reason.
//
// Thread-safe: a pure function.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "storage/store.h"

namespace kforge::server {

struct PromotionInput {
  const TaskRecord* task = nullptr;       // the reported task
  // What is being recorded for it; a RETIME's incumbent_timing is the
  // incumbent's in the same run.
  const EvaluationRecord* eval = nullptr;
  WinRule rule;                           // how a RETIME is decided
  // RETIME: the incumbent failed the same promotion-strength checks the
  // candidate passed: it is not correct, and the candidate replaces it.
  bool incumbent_failed = false;
  std::optional<BestRecord> current;      // the bucket's best now
  // Promotion tasks: the candidate's EVALUATE, when still readable.
  std::optional<EvaluationRecord> origin;
  // The NVRTC versions the reporting worker and the EVALUATE's worker
  // registered with.
  std::string nvrtc_version;
  std::string origin_nvrtc_version;
  bool gated = false;  // the reporting worker gates, or ungated promotion is allowed
  // The bucket asks for a deterministic backward (Bucket::deterministic),
  // and whether the candidate's manifest says it is deterministic
  // (ManifestSaysDeterministic). A candidate that is not is never promoted
  // there, nor confirmed or re-timed toward it, whatever its timing.
  bool deterministic_bucket = false;
  bool candidate_deterministic = false;
};

struct PromotionDecision {
  bool promote = false;  // the evaluation being recorded becomes the best
  SizeExtent extent;     // promote: the sizes the new best may be served for
  std::string measured_by;  // promote: how the new best's figure was measured
  // A promotion task to enqueue for the candidate: kConfirm or kRetime
  // (against `incumbent_variant_id`).
  std::optional<TaskKind> follow_up;
  std::string incumbent_variant_id;
  // Why a verified result changed nothing, or a RETIME's verdict and the
  // rule it used, for the evaluation's message; empty when there is
  // nothing to say.
  std::string note;
};

PromotionDecision DecidePromotion(const PromotionInput& in);

// Whether a stored manifest (JSON) says `"deterministic": true`; false for
// anything else, a manifest that does not parse included. (A peek, not the
// kernels library's ParseManifest: kforge_server does not link kforge_kernels,
// and the workers that evaluate the variant parse and check it in full.)
bool ManifestSaysDeterministic(std::string_view manifest_json);

// One promotion at a time per bucket, for the best candidate of a round.
// Every promotion runs the sanitizer gates (seconds each), so asking one for
// every verified EVALUATE that beats the best, while its bucket's other
// evaluations are still running, spends the worker's time on candidates the
// next result may already beat. The API therefore holds an EVALUATE's
// follow-up while the bucket (of the same job) has evaluations or a
// promotion in flight, and when the last of them ends it asks for one
// promotion: the fastest verified EVALUATE of the bucket whose variant has
// had no promotion task yet, a CONFIRM when the bucket has no best after
// this report, else a RETIME against that best when faster.
struct HeldCandidate {
  std::string variant_id;
  std::string task_id;           // its EVALUATE task (seed and origin)
  const EvaluationRecord* eval;  // verified; id 0 when it is the report being recorded
  uint64_t seed = 0;
};
struct HeldChoice {
  TaskKind kind = TaskKind::kConfirm;
  const HeldCandidate* candidate = nullptr;
  std::string incumbent_variant_id;  // kRetime
};
// `best` is the bucket's best once the report being recorded is applied
// (empty: none). nullopt when no candidate qualifies.
std::optional<HeldChoice> ChooseHeldCandidate(const std::vector<HeldCandidate>& candidates,
                                              const std::optional<BestRecord>& best);

}  // namespace kforge::server
