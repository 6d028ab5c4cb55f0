// TaskRunner: turns one leased task into the result to report.
//
//   COMPILE  → compile (CompilePool) → kCompiled | kCompileError
//   EVALUATE → compile → sandboxed child verifies and times it
//              → kCompileError | kVerified | kWrong | kCrashed | kTimeout
//   RETIME   → compile both → one child times candidate and incumbent
//              interleaved → the same outcomes, plus incumbent timing
//
// Every variant first passes the static source and option checks
// (kernels/check.h; a refusal is a kCompileError); the compiles themselves
// run on the pool, which the worker gives a compiler that works in a child
// (compile_child.h). Every failure of the candidate is a result. The runner returns nullopt
// only when the task was cancelled (the server no longer wants a result).
// Failures of the worker itself (NVRTC broken, the child failing before any
// candidate code ran, a compile-only worker asked to run a kernel) come back
// with TaskResult::worker_fault set: the worker does not report those, so
// no candidate is charged with them.
//
// Thread-safety: Run() may be called from several threads at once.
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "worker/task.h"

namespace kforge::gpu {
class CompilePool;
}

namespace kforge::worker {

class Sandbox;

class TaskRunner {
 public:
  virtual ~TaskRunner() = default;
  // Runs `task` to its result; polls `cancel` while it runs.
  virtual std::optional<TaskResult> Run(const TaskSpec& task, const std::atomic<bool>& cancel) = 0;
};

struct RunnerOptions {
  GpuDescription gpu;   // copied into every result; gpu.arch is the target
  bool compile_only = false;
  int gpu_ordinal = 0;  // passed to the child
  // NVRTC options added before each variant's own, from the operator
  // (--nvrtc-option): trusted, unlike a variant's own, which must pass
  // CheckCompileOptions (kernels/check.h).
  std::vector<std::string> extra_compile_options;
  // The worker's secrets (its tokens): redacted from every text a result
  // carries that came from a child or NVRTC, before anything is reported.
  std::vector<std::string> secrets;
  // Handed to the evaluator child for the reference's compile (see
  // ChildRequest::compile_cache_dir). Empty: none.
  std::string compile_cache_dir;
  // When set (must outlive the runner), a RETIME candidate, i.e. one about to
  // become a bucket's best, first runs its checks in this sandbox, whose
  // wrapper is compute-sanitizer memcheck; any finding stops it there.
  Sandbox* sanitizer_gate = nullptr;
};

// The exit code the sanitizer gate asks compute-sanitizer to use for a finding.
inline constexpr int kSanitizerFindingExit = 86;

// The gate sandbox's wrapper: compute-sanitizer at `path` running memcheck,
// exiting with kSanitizerFindingExit on a finding, its report kept short
// (device backtraces only) so the finding fits in the result's message.
std::vector<std::string> SanitizerGateWrapper(const std::string& path);

class LocalTaskRunner final : public TaskRunner {
 public:
  // `pool` must outlive the runner; `sandbox` too, and may be null when
  // options.compile_only.
  LocalTaskRunner(gpu::CompilePool* pool, Sandbox* sandbox, RunnerOptions options);

  std::optional<TaskResult> Run(const TaskSpec& task, const std::atomic<bool>& cancel) override;

 private:
  // The NVRTC target for `task`: the GPU's own for work that runs, the
  // shape's for compile checks (sm_100a checks run everywhere).
  std::string TargetArch(const TaskSpec& task) const;
  // Run() before the result is made fit to report (NaN metrics, log size,
  // timing sanity).
  std::optional<TaskResult> RunUnchecked(const TaskSpec& task, const std::atomic<bool>& cancel);

  gpu::CompilePool* const pool_;  // must outlive this
  Sandbox* const sandbox_;        // must outlive this; null when compile-only
  const RunnerOptions options_;
};

// Splits NVRTC options at whitespace ("-O3  --use_fast_math" → two options).
std::vector<std::string> SplitOptions(std::string_view options);

}  // namespace kforge::worker
