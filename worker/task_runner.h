// TaskRunner: turns one leased task into the result to report.
//
//   COMPILE  → compile (CompilePool) → kCompiled | kCompileError
//   EVALUATE → compile → sandboxed child verifies and times it
//              → kCompileError | kVerified | kWrong | kCrashed | kTimeout
//   CONFIRM  → compile → sanitizer gates → child verifies (promotion
//              strength: more checks and the bucket's corner) and times it
//   RETIME   → compile both → sanitizer gates on the candidate → one child
//              verifies both at promotion strength and times them
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
#include <mutex>
#include <set>
#include <optional>
#include <string>
#include <vector>

#include "worker/sandbox.h"
#include "worker/task.h"

namespace kforge::gpu {
class CompilePool;
struct CompileRequest;
}

namespace kforge::worker {

class TaskRunner {
 public:
  virtual ~TaskRunner() = default;
  // Runs `task` to its result; polls `cancel` while it runs.
  virtual std::optional<TaskResult> Run(const TaskSpec& task, const std::atomic<bool>& cancel) = 0;
  // Starts what of `task` can be done before its turn (its compiles), so
  // that Run() finds it done; the worker calls it for the task it leased
  // ahead while another runs. Never required: Run() does all of it anyway.
  virtual void Prepare(const TaskSpec& task) { (void)task; }
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
  // The sanitizer gates: a CONFIRM or RETIME candidate, i.e. one about to
  // become a bucket's best, first runs its checks (Evaluator::CheckOnly)
  // under compute-sanitizer at `sanitizer`, once per tool, all tools at
  // once; any finding stops it there. Empty `sanitizer_tools`: no gates.
  std::string sanitizer;
  std::vector<std::string> sanitizer_tools;
  SandboxOptions gate_sandbox;  // the gates' sandbox (the wrapper is set per run)
};

// The exit code the sanitizer gate asks compute-sanitizer to use for a finding.
inline constexpr int kSanitizerFindingExit = 86;

// The tools a gate may run, in the order their findings are reported.
inline constexpr const char* kSanitizerTools[] = {"memcheck", "synccheck", "racecheck", "initcheck"};

// The gate sandbox's wrapper: compute-sanitizer at `path` running `tool`,
// exiting with kSanitizerFindingExit on a finding, its report kept short
// (device backtraces only) so the finding fits in the result's message.
// With `entry_point` (an identifier), only kernels whose name holds it are
// instrumented, so the evaluator's own reference runs at full speed;
// initcheck instruments everything, since memory the evaluator's own
// kernels wrote must count as written.
std::vector<std::string> SanitizerGateWrapper(const std::string& path, const std::string& tool,
                                              const std::string& entry_point = "");

class LocalTaskRunner final : public TaskRunner {
 public:
  // `pool` must outlive the runner; `sandbox` too, and may be null when
  // options.compile_only.
  LocalTaskRunner(gpu::CompilePool* pool, Sandbox* sandbox, RunnerOptions options);

  std::optional<TaskResult> Run(const TaskSpec& task, const std::atomic<bool>& cancel) override;
  // Submits the variant's compile (and a re-timing's incumbent's) to the
  // pool, after the same static checks Run() makes; Run() then joins the
  // compile in flight or finds it in the pool's cache.
  void Prepare(const TaskSpec& task) override;

 private:
  // The NVRTC target for `task`: the GPU's own for work that runs, the
  // shape's for compile checks (sm_100a checks run everywhere).
  std::string TargetArch(const TaskSpec& task) const;
  // The pool request for `v` on `arch`: the operator's options, then the
  // variant's own.
  gpu::CompileRequest MakeCompileRequest(const VariantSpec& v, const std::string& arch) const;
  // Runs every sanitizer gate on `request`'s candidate; nullopt when all
  // passed (or there are none), else the result to report. Sets `cancelled`
  // when the task was cancelled meanwhile.
  std::optional<TaskResult> RunGates(const TaskSpec& task, const ChildRequest& request,
                                     const std::atomic<bool>& cancel, bool& cancelled);
  // Run() before the result is made fit to report (NaN metrics, log size,
  // timing sanity).
  std::optional<TaskResult> RunUnchecked(const TaskSpec& task, const std::atomic<bool>& cancel);

  gpu::CompilePool* const pool_;  // must outlive this
  Sandbox* const sandbox_;        // must outlive this; null when compile-only
  const RunnerOptions options_;
  // "cubin sha256|bucket|tools" of every image whose gates passed here.
  std::mutex gated_mu_;
  std::set<std::string> gated_;  // guarded by gated_mu_
};

// Whether `tool`'s gate runs the sampled checks (EvalOptions::sampled_checks):
// racecheck and synccheck, whose cost grows with every tile a launch runs.
bool SampledGate(std::string_view tool);

// Whether compute-sanitizer's output reports any error ("ERROR SUMMARY: N
// errors" with N > 0, a race or a barrier error), whatever its exit code.
bool SanitizerReportsErrors(std::string_view output);

// The gates' sandbox from the evaluation's: the sanitizers slow the kernels
// they instrument by 10-1000x but not the reference (only the candidate is
// instrumented), so the reference-relative budget would be far too short;
// and findings (racecheck reports races as warnings) must fit in the output
// kept.
SandboxOptions GateSandboxOptions(SandboxOptions evaluation);

// A check-only request for kforge's own default forward seed for `arch`
// (compiled here: it is no candidate), to calibrate the gates with; nullopt
// when no template serves the arch.
std::optional<ChildRequest> SeedCalibration(const std::string& arch, int gpu_ordinal,
                                            const std::string& compile_cache_dir);

// The tools of `wanted` (kSanitizerTools names) that work on GPU
// `gpu_ordinal` here, each tried in a sandbox like `base`: on `calibration`
// (a known-good kernel, which must pass) when given, else by setting the
// evaluator up. Some machines cannot run compute-sanitizer at all (under
// gVisor it refuses the device), and a tool that fails every candidate, or
// flags correct kernels, would stop every bucket from improving.
std::vector<std::string> ProbeSanitizerTools(const std::string& path,
                                             const std::vector<std::string>& wanted,
                                             const SandboxOptions& base, int gpu_ordinal,
                                             const std::string& compile_cache_dir,
                                             const std::optional<ChildRequest>& calibration);

// Splits NVRTC options at whitespace ("-O3  --use_fast_math" → two options).
std::vector<std::string> SplitOptions(std::string_view options);

}  // namespace kforge::worker
