#include "worker/task_runner.h"

#include <cctype>
#include <chrono>
#include <cmath>
#include <algorithm>
#include <future>
#include <mutex>
#include <span>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/redact.h"
#include "core/shape.h"
#include "core/hash.h"
#include "gpu/compile.h"
#include "gpu/compile_cache.h"
#include "kernels/catalog.h"
#include "kernels/check.h"
#include "worker/sandbox.h"

namespace kforge::worker {
namespace {

// The dynamic shared memory a manifest asks for; 0 when it does not say (or
// is not JSON: the evaluator, not the compile step, rejects bad manifests).
int ManifestDynamicSmem(const std::string& manifest_json) {
  nlohmann::json j = nlohmann::json::parse(manifest_json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return 0;
  auto it = j.find("dynamic_smem_bytes");
  if (it == j.end() || !it->is_number_integer()) return 0;
  return it->get<int>();
}

struct Compiled {
  bool ok = false;
  CompileStats stats;
  std::string error;  // why it did not compile (first line of the log or the status)
  bool worker_fault = false;  // NVRTC failed, not the source
};

std::string FirstErrorLine(const std::string& log) {
  size_t at = log.find("error");
  if (at == std::string::npos) return "";
  size_t begin = log.rfind('\n', at);
  begin = begin == std::string::npos ? 0 : begin + 1;
  size_t end = log.find('\n', at);
  std::string line = log.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  if (line.size() > 300) line.resize(300);
  return line;
}

// Compile logs can be huge (one warning per unrolled line) and a report must
// stay far below gRPC's 4 MB.
constexpr size_t kMaxLogBytes = 64 * 1024;
constexpr size_t kMaxMessageBytes = 4 * 1024;
constexpr size_t kMaxShortBytes = 256;

bool ValidTiming(const std::optional<Timing>& t) {
  return t && std::isfinite(t->median_us) && std::isfinite(t->min_us) &&
         std::isfinite(t->max_us) && t->median_us > 0 && t->min_us > 0 &&
         t->min_us <= t->median_us && t->median_us <= t->max_us && t->samples > 0 &&
         std::isfinite(t->p25_us) && std::isfinite(t->p75_us) &&
         (t->p75_us == 0 || (t->min_us <= t->p25_us && t->p25_us <= t->median_us &&
                             t->median_us <= t->p75_us && t->p75_us <= t->max_us)) &&
         (t->samples_us.empty() ||
          (t->samples_us.size() == size_t(t->samples) &&
           std::all_of(t->samples_us.begin(), t->samples_us.end(),
                       [](double s) { return std::isfinite(s) && s > 0; })));
}

// What the children and NVRTC reported, made fit to store. Every text that
// came from them is redacted (the worker's own tokens and anything shaped
// like a credential: a candidate may have made NVRTC print a file) and then
// capped; redaction comes first so a cut cannot leave half a secret. NaN
// error metrics (an output that is NaN somewhere) become +inf, since NaN
// never compares as bad; a "verified" without believable timing is not
// trusted.
void Sanitize(TaskKind kind, std::span<const std::string> secrets, TaskResult& r) {
  auto clean = [&](std::string& text, size_t cap) { text = ClipMiddle(Redact(text, secrets), cap); };
  clean(r.compile.log, kMaxLogBytes);
  clean(r.message, kMaxMessageBytes);
  clean(r.reference_version, kMaxShortBytes);
  if (r.errors) {
    clean(r.errors->detail, kMaxMessageBytes);
    clean(r.errors->worst_output, kMaxShortBytes);
    if (std::isnan(r.errors->max_abs_error)) r.errors->max_abs_error = HUGE_VAL;
    if (std::isnan(r.errors->rel_l2_error)) r.errors->rel_l2_error = HUGE_VAL;
  }
  if (r.outcome != Outcome::kVerified) {
    r.timing.reset();
    r.incumbent_timing.reset();
    return;
  }
  const bool incumbent_ok = ValidTiming(r.incumbent_timing) || r.incumbent_failed.has_value();
  if (!ValidTiming(r.timing) || (kind == TaskKind::kRetime && !incumbent_ok)) {
    r.outcome = Outcome::kCrashed;
    r.message = fmt::format("evaluator child reported verified without valid timing ({})",
                            r.message);
    r.timing.reset();
    r.incumbent_timing.reset();
  }
}

}  // namespace

std::vector<std::string> SplitOptions(std::string_view options) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < options.size()) {
    while (i < options.size() && std::isspace(static_cast<unsigned char>(options[i]))) ++i;
    size_t j = i;
    while (j < options.size() && !std::isspace(static_cast<unsigned char>(options[j]))) ++j;
    if (j > i) out.emplace_back(options.substr(i, j - i));
    i = j;
  }
  return out;
}

LocalTaskRunner::LocalTaskRunner(gpu::CompilePool* pool, Sandbox* sandbox, RunnerOptions options)
    : pool_(pool), sandbox_(sandbox), options_(std::move(options)) {}

std::string LocalTaskRunner::TargetArch(const TaskSpec& task) const {
  if (task.kind == TaskKind::kCompile && !task.shape.key.arch.empty()) return task.shape.key.arch;
  if (!options_.gpu.arch.empty()) return options_.gpu.arch;
  return task.shape.key.arch;
}

namespace {

// The static checks a variant passes before NVRTC sees it. The server checked
// the variant when it was proposed, but a worker does not take that on
// trust: a source or option that could make NVRTC read a file never reaches
// NVRTC.
absl::Status Refused(const VariantSpec& v) {
  if (v.source.size() > kMaxVariantSourceBytes) {
    return absl::InvalidArgumentError(fmt::format("source: {} bytes exceeds the limit of {}",
                                                  v.source.size(), kMaxVariantSourceBytes));
  }
  if (absl::Status s = CheckSource(v.source); !s.ok()) return s;
  return CheckCompileOptions(v.compile_options);
}

// A gate's finding: the tool said so in its output or by its finding exit
// code, whatever the child reported.
bool GateFinding(const SandboxRun& run) {
  return SanitizerReportsErrors(run.stderr_tail) || run.exit_code == kSanitizerFindingExit;
}

}  // namespace

void LocalTaskRunner::Prepare(const TaskSpec& task) {
  const std::string arch = TargetArch(task);
  if (arch.empty()) return;
  std::vector<const VariantSpec*> variants = {&task.variant};
  if (task.kind == TaskKind::kRetime && task.incumbent) variants.push_back(&*task.incumbent);
  for (const VariantSpec* v : variants) {
    if (!Refused(*v).ok()) return;  // Run() reports it; it never reaches NVRTC
  }
  // The futures are dropped: the pool finishes the compiles, and Run()'s
  // submissions of the same requests join them or hit the cache.
  for (const VariantSpec* v : variants) (void)pool_->Submit(MakeCompileRequest(*v, arch));
}

gpu::CompileRequest LocalTaskRunner::MakeCompileRequest(const VariantSpec& v,
                                                        const std::string& arch) const {
  gpu::CompileRequest req;
  req.source = v.source;
  req.arch = arch;
  req.extra_options = options_.extra_compile_options;
  for (std::string& o : SplitOptions(v.compile_options)) req.extra_options.push_back(std::move(o));
  req.name = v.variant_id + ".cu";
  return req;
}

std::optional<TaskResult> LocalTaskRunner::Run(const TaskSpec& task,
                                               const std::atomic<bool>& cancel) {
  std::optional<TaskResult> result = RunUnchecked(task, cancel);
  if (result) Sanitize(task.kind, options_.secrets, *result);
  return result;
}

std::optional<TaskResult> LocalTaskRunner::RunUnchecked(const TaskSpec& task,
                                                        const std::atomic<bool>& cancel) {
  TaskResult result;
  result.gpu = options_.gpu;
  const std::string arch = TargetArch(task);

  // Starts a compile on the pool; the variant's own options follow ours.
  auto submit = [&](const VariantSpec& v) { return pool_->Submit(MakeCompileRequest(v, arch)); };
  // Waits for a compile, polling `cancel`; nullopt when cancelled.
  auto wait = [&](std::future<absl::StatusOr<gpu::CompileResult>>& f,
                  const VariantSpec& v) -> std::optional<Compiled> {
    while (f.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) {
      if (cancel.load()) return std::nullopt;
    }
    absl::StatusOr<gpu::CompileResult> r = f.get();
    Compiled c;
    c.stats.dynamic_smem_bytes = ManifestDynamicSmem(v.manifest_json);
    if (!r.ok()) {
      // NVRTC itself failed, not the source.
      c.error = fmt::format("worker compile failure: {}", std::string(r.status().message()));
      c.stats.log = c.error;
      c.worker_fault = true;
      return c;
    }
    c.ok = r->ok;
    c.stats.compile_ms = r->compile_ms;
    c.stats.registers = r->total.registers;
    c.stats.spill_stores_bytes = r->total.spill_stores_bytes;
    c.stats.spill_loads_bytes = r->total.spill_loads_bytes;
    c.stats.static_smem_bytes = r->total.static_smem_bytes;
    c.stats.local_bytes = r->total.stack_frame_bytes;
    c.stats.log = r->log;
    c.stats.options = r->options;
    if (r->ok) {
      c.stats.cubin = r->cubin;
    } else {
      c.error = FirstErrorLine(r->log);
      if (c.error.empty()) c.error = "NVRTC rejected the source";
    }
    return c;
  };

  if (arch.empty()) {
    result.outcome = Outcome::kCompileError;
    result.message = "no target architecture: the task's shape names none and this worker has no GPU";
    return result;
  }
  if (absl::Status s = Refused(task.variant); !s.ok()) {
    result.outcome = Outcome::kCompileError;
    result.message = std::string(s.message());
    result.compile.log = result.message;
    return result;
  }
  if (task.kind == TaskKind::kRetime && task.incumbent) {
    if (absl::Status s = Refused(*task.incumbent); !s.ok()) {
      result.outcome = Outcome::kCompileError;
      result.message =
          fmt::format("incumbent {} is refused: {}", task.incumbent->variant_id,
                      std::string(s.message()));
      return result;
    }
  }

  auto candidate_future = submit(task.variant);
  std::optional<std::future<absl::StatusOr<gpu::CompileResult>>> incumbent_future;
  if (task.kind == TaskKind::kRetime && task.incumbent) {
    incumbent_future = submit(*task.incumbent);
  }
  std::optional<Compiled> candidate = wait(candidate_future, task.variant);
  if (!candidate) return std::nullopt;
  result.compile = candidate->stats;
  if (!candidate->ok) {
    result.outcome = Outcome::kCompileError;
    result.message = candidate->error;
    result.worker_fault = candidate->worker_fault;
    return result;
  }
  if (task.kind == TaskKind::kCompile) {
    result.outcome = Outcome::kCompiled;
    result.message = fmt::format("compiled for {} in {:.0f} ms: {} registers, {} B spilled", arch,
                                 candidate->stats.compile_ms, candidate->stats.registers,
                                 candidate->stats.spill_stores_bytes);
    return result;
  }

  if (options_.compile_only || sandbox_ == nullptr) {
    // Not the candidate's fault, but the server asked for something this
    // worker cannot do; say so plainly.
    result.outcome = Outcome::kCrashed;
    result.message = fmt::format("worker has no GPU: cannot run a {} task (compiled fine)",
                                 TaskKindName(task.kind));
    result.worker_fault = true;
    return result;
  }

  ChildRequest request;
  request.mode =
      task.kind == TaskKind::kRetime ? ChildRequest::Mode::kRetime : ChildRequest::Mode::kEvaluate;
  request.promotion = task.kind == TaskKind::kConfirm || task.kind == TaskKind::kRetime;
  request.gpu_ordinal = options_.gpu_ordinal;
  request.shape = task.shape;
  request.seed = task.seed;
  request.compile_cache_dir = options_.compile_cache_dir;
  request.candidate = ChildKernel{.variant_id = task.variant.variant_id,
                                  .manifest_json = task.variant.manifest_json,
                                  .cubin = candidate->stats.cubin};
  if (task.kind == TaskKind::kRetime) {
    if (!incumbent_future) {
      result.outcome = Outcome::kCrashed;
      result.message = "RETIME task without an incumbent";
      return result;
    }
    std::optional<Compiled> incumbent = wait(*incumbent_future, *task.incumbent);
    if (!incumbent) return std::nullopt;
    if (!incumbent->ok) {
      result.worker_fault = incumbent->worker_fault;
      result.outcome = Outcome::kCompileError;
      result.message = fmt::format("incumbent {} does not compile: {}", task.incumbent->variant_id,
                                   incumbent->error);
      return result;
    }
    request.incumbent = ChildKernel{.variant_id = task.incumbent->variant_id,
                                    .manifest_json = task.incumbent->manifest_json,
                                    .cubin = incumbent->stats.cubin};
  }

  if (task.kind == TaskKind::kRetime || task.kind == TaskKind::kConfirm) {
    // A race or an out-of-bounds access can give right answers by luck; a
    // kernel that is about to be served gets the sanitizers' look first.
    bool cancelled = false;
    std::optional<TaskResult> gated = RunGates(task, request, cancel, cancelled);
    if (cancelled) return std::nullopt;
    if (gated) {
      gated->compile = result.compile;
      gated->gpu = result.gpu;
      return gated;
    }
  }

  absl::StatusOr<SandboxRun> run = sandbox_->Run(request, &cancel);
  if (!run.ok()) {
    result.outcome = Outcome::kCrashed;
    result.message = fmt::format("worker sandbox failure: {}", std::string(run.status().message()));
    result.worker_fault = true;
    return result;
  }
  if (run->cancelled) return std::nullopt;
  if (run->protocol_error || run->report.outcome == Outcome::kCrashed ||
      run->report.outcome == Outcome::kTimeout) {
    spdlog::info("task {}: {} after {:.0f} ms: {}", task.task_id, OutcomeName(run->report.outcome),
                 run->wall_ms,
                 Redact(run->report.message + (run->stderr_tail.empty()
                                                   ? ""
                                                   : "\n  child output tail: " + run->stderr_tail),
                        options_.secrets));
  }
  result.outcome = run->report.outcome;
  result.message = run->report.message;
  result.reference_version = run->report.reference_version;
  result.errors = run->report.errors;
  result.timing = run->report.timing;
  result.incumbent_timing = run->report.incumbent_timing;
  result.incumbent_failed = run->report.incumbent_failed;
  result.verified = run->report.verified;
  if (!run->report.operator_note.empty()) {
    spdlog::info("task {}: {}: {}", task.task_id, OutcomeName(run->report.outcome),
                 run->report.operator_note);
  }
  if (run->infrastructure_failure) {
    result.worker_fault = true;
    result.message = fmt::format("evaluator child failed before running the candidate: {}",
                                 run->report.message);
  }
  return result;
}

std::optional<TaskResult> LocalTaskRunner::RunGates(const TaskSpec& task,
                                                   const ChildRequest& request,
                                                   const std::atomic<bool>& cancel,
                                                   bool& cancelled) {
  if (options_.sanitizer_tools.empty()) return std::nullopt;
  // The same image on the same bucket passed these gates already (a CONFIRM
  // and the RETIME that follows it, a candidate re-timed against a new best).
  const std::string gated_key = fmt::format("{}|{}|{}", Sha256Hex(request.candidate.cubin),
                                            BucketOf(task.shape.key).Id(),
                                            fmt::join(options_.sanitizer_tools, ","));
  {
    std::lock_guard<std::mutex> lock(gated_mu_);
    if (gated_.count(gated_key)) {
      spdlog::info("task {}: sanitizer gates passed before for this image and bucket",
                   task.task_id);
      return std::nullopt;
    }
  }
  ChildRequest checks = request;
  checks.mode = ChildRequest::Mode::kCheck;
  checks.incumbent.reset();
  std::string entry_point;
  {
    nlohmann::json m = nlohmann::json::parse(request.candidate.manifest_json, nullptr, false);
    if (m.is_object() && m.contains("entry_point") && m["entry_point"].is_string())
      entry_point = m["entry_point"].get<std::string>();
  }
  // The tools run at once, each in its own child: none of them is timed,
  // and a promotion waits for the slowest instead of for all in a row.
  struct Gate {
    std::string tool;
    std::future<absl::StatusOr<SandboxRun>> run;
  };
  std::vector<Gate> gates;
  for (const std::string& tool : options_.sanitizer_tools) {
    SandboxOptions so = options_.gate_sandbox;
    so.wrapper = SanitizerGateWrapper(options_.sanitizer, tool, entry_point);
    ChildRequest r = checks;
    r.sampled_checks = SampledGate(tool);
    gates.push_back(Gate{tool, std::async(std::launch::async, [so, r, &cancel] {
                           return Sandbox(so).Run(r, &cancel);
                         })});
  }
  std::optional<TaskResult> failed;
  std::string passed;
  for (Gate& g : gates) {
    absl::StatusOr<SandboxRun> run = g.run.get();
    if (failed) continue;  // the first finding in kSanitizerTools order is reported
    if (!run.ok()) {
      failed = TaskResult{};
      failed->outcome = Outcome::kCrashed;
      failed->message = fmt::format("sanitizer gate failure ({}): {}", g.tool,
                                    std::string(run.status().message()));
      failed->worker_fault = true;
      continue;
    }
    if (run->cancelled) {
      cancelled = true;
      continue;
    }
    // A finding is a non-zero error summary even where the tool's exit code
    // did not say so (some report hazards as warnings).
    const bool finding_in_output = GateFinding(*run);
    if (run->report.outcome != Outcome::kVerified || finding_in_output) {
      failed = TaskResult{};
      // A finding is the verdict, whatever the outputs were under the tool
      // (a race often also makes them wrong there).
      failed->outcome = finding_in_output || run->report.outcome == Outcome::kVerified
                            ? Outcome::kCrashed
                            : run->report.outcome;
      failed->errors = run->report.errors;
      failed->worker_fault = run->infrastructure_failure;
      failed->message = fmt::format("compute-sanitizer {} gate: {}{}", g.tool, run->report.message,
                                    run->stderr_tail.empty() ? "" : "\n" + run->stderr_tail);
      spdlog::info("task {}: {}{}", task.task_id, Redact(failed->message, options_.secrets),
                   run->report.operator_note.empty() ? "" : " (" + run->report.operator_note + ")");
      continue;
    }
    passed += fmt::format("{}{} {:.1f} s", passed.empty() ? "" : ", ", g.tool, run->wall_ms / 1000.0);
    spdlog::debug("task {}: {} gate output: {}", task.task_id, g.tool, run->stderr_tail);
  }
  if (cancelled) return std::nullopt;
  if (!failed) {
    spdlog::info("task {}: sanitizer gates passed ({})", task.task_id, passed);
    std::lock_guard<std::mutex> lock(gated_mu_);
    gated_.insert(gated_key);
  }
  return failed;
}

bool SampledGate(std::string_view tool) { return tool == "racecheck" || tool == "synccheck"; }

bool SanitizerReportsErrors(std::string_view output) {
  constexpr std::string_view kSummary = "ERROR SUMMARY: ";
  for (size_t at = output.find(kSummary); at != std::string_view::npos;
       at = output.find(kSummary, at + 1)) {
    size_t i = at + kSummary.size();
    long long n = 0;
    bool digits = false;
    while (i < output.size() && std::isdigit(static_cast<unsigned char>(output[i]))) {
      n = n * 10 + (output[i++] - '0');
      digits = true;
    }
    if (digits && n > 0) return true;
  }
  // racecheck's summary counts its hazards as errors and warnings, and its
  // hazards name themselves.
  return output.find("Race reported") != std::string_view::npos ||
         output.find("Barrier error") != std::string_view::npos ||
         output.find("hazard detected") != std::string_view::npos;
}

std::vector<std::string> SanitizerGateWrapper(const std::string& path, const std::string& tool,
                                              const std::string& entry_point) {
  // (--report-api-errors no: a gate judges the candidate's device code, and
  // kforge's own host calls return errors on purpose: the driver's
  // cuFuncGetParamInfo answers INVALID_VALUE past a kernel's last parameter,
  // which is how the child counts them. Reported, those made memcheck fail
  // kforge's own seed kernel, so the worker dropped the gate.)
  std::vector<std::string> w = {path, "--tool", tool, "--error-exitcode",
                                std::to_string(kSanitizerFindingExit), "--print-limit", "20",
                                "--show-backtrace", "device", "--report-api-errors", "no"};
  // Every hazard, not only racecheck's own analysis of them.
  if (tool == "racecheck") w.insert(w.end(), {"--racecheck-report", "all"});
  const bool identifier =
      !entry_point.empty() && std::all_of(entry_point.begin(), entry_point.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
      });
  if (identifier && tool != "initcheck") {
    w.push_back("--kernel-name");
    w.push_back("kns=" + entry_point);
  }
  return w;
}

SandboxOptions GateSandboxOptions(SandboxOptions so) {
  so.setup_limit *= 10;
  so.min_run_limit = std::max(so.min_run_limit * 48, std::chrono::milliseconds(240000));
  so.reference_factor *= 100;
  // Findings (racecheck reports races as warnings) must fit in what is kept.
  so.stderr_tail_bytes = std::max<size_t>(so.stderr_tail_bytes, 64 * 1024);
  return so;
}

std::optional<ChildRequest> SeedCalibration(const std::string& arch, int gpu_ordinal,
                                            const std::string& compile_cache_dir) {
  ShapeKey k;
  k.head_dim = 128;
  k.heads = 4;
  k.kv_heads = 2;
  k.causal = true;
  k.arch = arch;
  k.batch = 8;
  k.max_len_q = k.max_len_k = 700;
  k.total_q = k.total_k = 8 * 300;
  absl::StatusOr<Variant> seed = DefaultVariant(k);
  if (!seed.ok()) return std::nullopt;
  // kforge's own template, so it is compiled here rather than in a sandbox.
  gpu::CompileRequest req;
  req.source = seed->source;
  req.arch = arch;
  req.name = seed->template_name + ".cu";
  absl::StatusOr<gpu::CompileResult> compiled = gpu::Compile(req);
  if (!compiled.ok() || !compiled->ok) return std::nullopt;
  ChildRequest r;
  r.mode = ChildRequest::Mode::kCheck;
  r.gpu_ordinal = gpu_ordinal;
  r.shape.key = k;
  r.seed = 20261201;
  r.compile_cache_dir = compile_cache_dir;
  r.candidate = ChildKernel{.variant_id = "seed-" + seed->template_name,
                            .manifest_json = seed->manifest_json,
                            .cubin = compiled->cubin};
  return r;
}

std::vector<std::string> ProbeSanitizerTools(const std::string& path,
                                             const std::vector<std::string>& wanted,
                                             const SandboxOptions& base, int gpu_ordinal,
                                             const std::string& compile_cache_dir,
                                             const std::optional<ChildRequest>& calibration) {
  std::vector<std::string> working;
  std::string entry_point;
  if (calibration) {
    nlohmann::json m = nlohmann::json::parse(calibration->candidate.manifest_json, nullptr, false);
    if (m.is_object()) entry_point = m.value("entry_point", "");
  }
  // All tools at once, as the gates themselves run: a worker's start waits
  // for the slowest tool, not for the four in a row.
  struct Probe {
    std::string tool;
    std::future<absl::StatusOr<SandboxRun>> run;
  };
  std::vector<Probe> probes;
  for (const char* tool : kSanitizerTools) {
    if (std::find(wanted.begin(), wanted.end(), tool) == wanted.end()) continue;
    SandboxOptions so = base;
    so.wrapper = SanitizerGateWrapper(path, tool, entry_point);
    ChildRequest probe;
    if (calibration) {
      probe = *calibration;
      probe.sampled_checks = SampledGate(tool);
    } else {
      probe.mode = ChildRequest::Mode::kProbe;
      probe.gpu_ordinal = gpu_ordinal;
      probe.compile_cache_dir = compile_cache_dir;
    }
    probes.push_back(Probe{tool, std::async(std::launch::async, [so, probe] {
                             return Sandbox(so).Run(probe);
                           })});
  }
  for (Probe& p : probes) {
    const std::string& tool = p.tool;
    absl::StatusOr<SandboxRun> run = p.run.get();
    const bool finding = run.ok() && GateFinding(*run);
    if (!run.ok() || run->report.outcome != Outcome::kVerified || finding) {
      // A tool that cannot run here, or that flags kforge's own verified
      // seed, would stop every promotion: drop it, loudly.
      spdlog::error("sanitizer gate {} dropped: {}: {}{}", tool,
                    calibration ? "it does not pass kforge's own seed kernel here"
                                : "the evaluator does not run under it here",
                    run.ok() ? run->report.message : std::string(run.status().message()),
                    run.ok() && !run->stderr_tail.empty()
                        ? "\n" + run->stderr_tail.substr(run->stderr_tail.size() > 3000
                                                              ? run->stderr_tail.size() - 3000
                                                              : 0)
                        : "");
      continue;
    }
    spdlog::info("sanitizer gate {} ready ({:.1f} s{})", tool, run->wall_ms / 1000.0,
                 calibration ? ", seed " + calibration->candidate.variant_id + " passes" : "");
    working.push_back(tool);
  }
  return working;
}

}  // namespace kforge::worker
