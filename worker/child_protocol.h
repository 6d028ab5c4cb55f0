// What the worker and its sandboxed evaluator child say to each other.
//
// The parent (Sandbox, sandbox.h) writes a request directory and starts
//   kforge-worker --eval-child --request-dir=DIR --result-fd=3
// DIR holds request.json (ChildRequest below) and the images it names
// (candidate.cubin, incumbent.cubin: raw bytes). The child answers on file
// descriptor 3 (a pipe; its stdout and stderr go to a second pipe the parent
// only keeps the tail of), one JSON object per line:
//
//   {"event":"reference","reference_ms":1.25,"launches":40}
//        first, once the reference has run: the parent sets its watchdog to
//        max(min_run_limit, factor * reference_ms * launches) from here
//   {"event":"fault","message":"cuLaunchKernel: CUDA_ERROR_ILLEGAL_ADDRESS ..."}
//        optional, just before the child gives up on a CUDA error
//   {"event":"result","outcome":"verified","message":"...",
//    "reference_version":"...","errors":{...},"timing":{...},
//    "incumbent_timing":{...}}
//        last; then the child exits 0
//
// The child only computes: it never talks to the server, and whatever it
// writes is parsed as untrusted input. Results reach the server only through
// the parent, which decides the outcome of a child that dies, hangs or
// writes garbage.
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "worker/task.h"

namespace kforge::worker {

inline constexpr int kChildProtocolVersion = 1;
inline constexpr int kChildResultFd = 3;

struct ChildKernel {
  std::string variant_id;
  std::string manifest_json;
  std::string cubin;  // raw image; travels as a file beside request.json
};

struct ChildRequest {
  // kCheck: the check batches only, no timing (the sanitizer gate).
  // kProbe: set up the evaluator (driver, context, reference, buffers) and
  // report; no candidate. The worker probes its sanitizer gate with it.
  enum class Mode { kEvaluate, kRetime, kCheck, kProbe };
  Mode mode = Mode::kEvaluate;
  int gpu_ordinal = 0;
  ShapeSpec shape;
  uint64_t seed = 0;
  ChildKernel candidate;
  std::optional<ChildKernel> incumbent;  // kRetime
  // kEvaluate for a CONFIRM task (kRetime always is one): the evaluation of
  // a kernel about to be served, with more checks and the bucket's corner.
  bool promotion = false;
  // kCheck under the sanitizers that cost most (racecheck, synccheck): one
  // check problem of sampled awkward lengths instead of every length (see
  // EvalOptions::sampled_checks).
  bool sampled_checks = false;
  // The worker's on-disk compile cache: the child compiles the reference
  // through it (once per worker, not once per child). Empty: no cache.
  std::string compile_cache_dir;
  // Test only: makes the child misbehave on purpose without a GPU
  // ("hang", "hang_after_reference", "segv", "abort", "garbage", "fault",
  // "exit_silently", "verified", "wrong", "retime", "nan_metrics",
  // "verified_without_timing", "spam_stderr", "crash_after_result").
  std::string self_test;
};

// What the child measured (its "result" event).
struct ChildReport {
  Outcome outcome = Outcome::kCrashed;
  std::string message;
  std::string reference_version;
  std::optional<ErrorStats> errors;
  std::optional<Timing> timing;
  std::optional<Timing> incumbent_timing;
  std::optional<SizeExtent> verified;  // kVerified: the sizes it was checked at
  std::optional<Outcome> incumbent_failed;  // kRetime: see TaskResult
  // Which problem and launch failed: the worker logs it, never reports it.
  std::string operator_note;
};

// One line from the child, parsed.
struct ChildEvent {
  enum class Kind { kReference, kFault, kResult };
  Kind kind = Kind::kResult;
  double reference_ms = 0;  // kReference
  int launches = 0;         // kReference: candidate launches still to come
  std::string message;      // kFault
  ChildReport report;       // kResult
};

// request.json <-> ChildRequest (without the cubins, which are files).
std::string RequestToJson(const ChildRequest& request);
absl::StatusOr<ChildRequest> RequestFromJson(std::string_view json);

// Writes request.json and the cubins into `dir` (which must exist), and
// reads them back.
absl::Status WriteRequestDir(const std::string& dir, const ChildRequest& request);
absl::StatusOr<ChildRequest> ReadRequestDir(const std::string& dir);

// Event lines (without the trailing newline).
std::string ReferenceEventJson(double reference_ms, int launches);
std::string FaultEventJson(std::string_view message);
std::string ResultEventJson(const ChildReport& report);

// Parses one line; InvalidArgument naming what was wrong for anything that
// is not a well-formed event (the parent calls that a protocol error).
absl::StatusOr<ChildEvent> ParseChildEvent(std::string_view line);

}  // namespace kforge::worker
