#include "worker/sandbox.h"

#include <sys/wait.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <system_error>

#include <fmt/format.h>

namespace kforge::worker {
namespace {

using Clock = ChildClock;

std::string Seconds(std::chrono::milliseconds ms) {
  return fmt::format("{:.1f} s", static_cast<double>(ms.count()) / 1000.0);
}

// Removes the request directory however Run() ends.
class ScratchDir {
 public:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The last non-empty line of `text`, at most 300 characters.
std::string LastLine(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.remove_suffix(1);
  size_t nl = text.rfind('\n');
  std::string_view line = nl == std::string_view::npos ? text : text.substr(nl + 1);
  if (line.size() > 300) line = line.substr(0, 300);
  return std::string(line);
}

// The evaluator child's side of the protocol as the parent reads it: JSON
// event lines on fd 3, and the watchdog limits they move.
class EvalWatcher final : public ChildWatcher {
 public:
  EvalWatcher(const SandboxOptions& options, Clock::time_point start)
      : options_(options),
        absolute_deadline_(start + options.absolute_limit),
        deadline_(std::min(start + options.setup_limit, absolute_deadline_)),
        limit_reason_(fmt::format("setup limit {}", Seconds(options.setup_limit))) {}

  void OnResult(std::string_view bytes) override {
    line_buf_.append(bytes);
    size_t nl;
    while ((nl = line_buf_.find('\n')) != std::string::npos) {
      HandleLine(std::string_view(line_buf_).substr(0, nl));
      line_buf_.erase(0, nl + 1);
    }
    if (line_buf_.size() > options_.max_event_bytes) {
      ProtocolError(fmt::format("an event line longer than {} bytes", options_.max_event_bytes));
      line_buf_.clear();
    }
  }
  void OnResultEnd() override {
    if (!line_buf_.empty()) HandleLine(line_buf_);  // a last line without its newline
    line_buf_.clear();
  }
  Clock::time_point Deadline() const override { return deadline_; }
  bool KillNow() const override { return !protocol_detail_.empty(); }

  const std::optional<ChildReport>& report() const { return report_; }
  const std::string& fault() const { return fault_; }
  const std::string& protocol_detail() const { return protocol_detail_; }
  const std::string& limit_reason() const { return limit_reason_; }
  double reference_ms() const { return reference_ms_; }
  int launches() const { return launches_; }

 private:
  void ProtocolError(std::string detail) {
    if (protocol_detail_.empty()) protocol_detail_ = std::move(detail);
  }

  void HandleLine(std::string_view line) {
    if (!protocol_detail_.empty() || line.empty()) return;
    if (report_) {
      ProtocolError("output after the result event");
      return;
    }
    absl::StatusOr<ChildEvent> event = ParseChildEvent(line);
    if (!event.ok()) {
      ProtocolError(std::string(event.status().message()));
      return;
    }
    switch (event->kind) {
      case ChildEvent::Kind::kReference:
        if (reference_ms_ >= 0) {
          ProtocolError("a second reference event");
          return;
        }
        StartRunLimit(event->reference_ms, event->launches);
        break;
      case ChildEvent::Kind::kFault:
        fault_ = event->message;
        break;
      case ChildEvent::Kind::kResult:
        report_ = event->report;
        deadline_ = Clock::now() + options_.exit_grace;
        break;
    }
  }

  // After the reference: the candidate's runs get a limit relative to it.
  void StartRunLimit(double reference_ms, int launches) {
    reference_ms_ = reference_ms;
    launches_ = launches;
    const double budget_ms =
        std::max(static_cast<double>(options_.min_run_limit.count()),
                 options_.reference_factor * reference_ms * launches);
    const auto budget = std::chrono::milliseconds(static_cast<int64_t>(std::min(budget_ms, 1e12)));
    deadline_ = std::min(Clock::now() + budget, absolute_deadline_);
    // The limit, not how it was derived: the launch count is part of the
    // drawn schedule, and the message is feedback to a proposer.
    limit_reason_ = fmt::format("run limit {} (at least {}, else {} x the reference's time per launch)",
                                Seconds(budget), Seconds(options_.min_run_limit),
                                options_.reference_factor);
    if (deadline_ == absolute_deadline_) {
      limit_reason_ = fmt::format("absolute limit {}", Seconds(options_.absolute_limit));
    }
  }

  const SandboxOptions& options_;
  const Clock::time_point absolute_deadline_;
  Clock::time_point deadline_;
  std::string limit_reason_;
  std::string line_buf_;
  std::string fault_;
  std::string protocol_detail_;
  std::optional<ChildReport> report_;
  double reference_ms_ = -1;
  int launches_ = 0;
};

// What the sandbox saw of the run, whatever the child reported.
SandboxRun RunFacts(const EvalWatcher& w, const ChildExit& exit) {
  SandboxRun run;
  run.reference_ms = w.reference_ms();
  run.launches = w.launches();
  run.wall_ms = exit.wall_ms;
  run.stderr_tail = exit.output_tail;
  if (!exit.killed && !exit.launch_failed && WIFEXITED(exit.wstatus))
    run.exit_code = WEXITSTATUS(exit.wstatus);
  return run;
}

// How the child ended, for messages ("killed by SIGSEGV", "exited with code 1 (...)").
std::string EndingOf(const ChildExit& exit) {
  std::string ending = exit.Ending();
  if (exit.launch_failed) ending += " (" + exit.launch_error + ")";
  return ending;
}

// The best explanation the child left: its fault event, else its output.
std::string WhyOf(const EvalWatcher& w, const ChildExit& exit) {
  return !w.fault().empty() ? w.fault() : LastLine(exit.output_tail);
}

// A report followed by an unclean exit (or no exit within the grace): a
// success is not trusted, a failure keeps its outcome and says how the
// child ended.
ChildReport DistrustedReport(const SandboxOptions& options, const EvalWatcher& w,
                             const ChildExit& exit) {
  ChildReport r = *w.report();
  const std::string why = WhyOf(w, exit);
  const std::string how = exit.deadline_passed
                              ? fmt::format("did not exit within {} after reporting",
                                            Seconds(options.exit_grace))
                              : EndingOf(exit) + " after reporting";
  if (r.outcome == Outcome::kVerified || r.outcome == Outcome::kCompiled) {
    r.outcome = Outcome::kCrashed;
    r.message = fmt::format("child reported {} but {}{}", OutcomeName(w.report()->outcome), how,
                            why.empty() ? "" : ": " + why);
  } else {
    r.message += fmt::format(" (child {})", how);
  }
  return r;
}

// No report: killed by the watchdog (kTimeout) or ended by itself (kCrashed).
ChildReport UnreportedRun(const EvalWatcher& w, const ChildExit& exit, const SandboxRun& run) {
  ChildReport r;
  if (exit.killed) {
    r.outcome = Outcome::kTimeout;
    r.message = fmt::format("killed after {:.1f} s: {}", run.wall_ms / 1000.0, w.limit_reason());
    if (run.reference_ms < 0) r.message += " (the reference never finished)";
    return r;
  }
  r.outcome = Outcome::kCrashed;
  r.message = exit.Clean() ? "child exited without a result" : "child " + EndingOf(exit);
  if (const std::string why = WhyOf(w, exit); !why.empty()) r.message += ": " + why;
  return r;
}

// What the run comes to: the child's report when it made one and exited
// cleanly, else the sandbox's own verdict.
SandboxRun Judge(const SandboxOptions& options, const EvalWatcher& w, const ChildExit& exit) {
  SandboxRun run = RunFacts(w, exit);
  ChildReport& r = run.report;
  if (exit.cancelled) {
    run.cancelled = true;
    r.outcome = Outcome::kCrashed;
    r.message = "cancelled";
  } else if (!w.protocol_detail().empty()) {
    run.protocol_error = true;
    r.outcome = Outcome::kCrashed;
    r.message = fmt::format("sandbox protocol error: the evaluator child wrote {}",
                            w.protocol_detail());
  } else if (w.report() && exit.Clean()) {
    r = *w.report();
  } else if (w.report()) {
    r = DistrustedReport(options, w, exit);
  } else {
    r = UnreportedRun(w, exit, run);
  }
  // No candidate code runs before the reference event (the evaluator calls
  // back before the first candidate launch, and loading a module runs no
  // device code): a child that died, hung or babbled before it failed on its
  // own (driver, context, memory, reference), not because of the candidate.
  run.infrastructure_failure = !exit.cancelled && !w.report() && run.reference_ms < 0;
  return run;
}

// A fresh request directory under `scratch_dir` holding `request`; it is
// removed when the returned ScratchDir goes.
absl::StatusOr<std::unique_ptr<ScratchDir>> WriteRequest(const std::filesystem::path& scratch_dir,
                                                         const ChildRequest& request) {
  std::error_code ec;
  std::filesystem::create_directories(scratch_dir, ec);
  std::string tmpl = (scratch_dir / "kforge-eval-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(
        fmt::format("sandbox: cannot create a request dir under {}: {}", scratch_dir.string(),
                    std::strerror(errno)));
  }
  auto dir = std::make_unique<ScratchDir>(tmpl);
  if (absl::Status s = WriteRequestDir(dir->path(), request); !s.ok()) {
    return absl::InternalError(fmt::format("sandbox: {}", std::string(s.message())));
  }
  return dir;
}

}  // namespace

Sandbox::Sandbox(SandboxOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::vector<std::string>> Sandbox::Argv(const std::string& request_dir) const {
  std::vector<std::string> args(options_.wrapper.begin(), options_.wrapper.end());
  std::string executable = options_.executable;
  if (!options_.wrapper.empty() && executable == "/proc/self/exe") {
    std::error_code ec;
    executable = std::filesystem::read_symlink(executable, ec).string();
    if (ec) return absl::InternalError(fmt::format("sandbox: /proc/self/exe: {}", ec.message()));
  }
  args.push_back(executable);
  args.insert(args.end(), options_.child_args.begin(), options_.child_args.end());
  args.push_back("--request-dir=" + request_dir);
  args.push_back(fmt::format("--result-fd={}", kChildResultFd));
  return args;
}

absl::StatusOr<ChildCommand> Sandbox::Command(const std::string& request_dir) const {
  absl::StatusOr<std::vector<std::string>> argv = Argv(request_dir);
  if (!argv.ok()) return argv.status();
  return ChildCommand{.argv = *std::move(argv), .env = ChildEnvironment(options_.child_env)};
}

absl::StatusOr<SandboxRun> Sandbox::Run(const ChildRequest& request,
                                        const std::atomic<bool>* cancel) {
  absl::StatusOr<std::unique_ptr<ScratchDir>> dir = WriteRequest(options_.scratch_dir, request);
  if (!dir.ok()) return dir.status();
  absl::StatusOr<ChildCommand> command = Command((*dir)->path());
  if (!command.ok()) return command.status();
  EvalWatcher watcher(options_, Clock::now());
  absl::StatusOr<ChildExit> exit = RunChild(*command, watcher, options_.stderr_tail_bytes, cancel);
  if (!exit.ok()) return absl::InternalError(fmt::format("sandbox: {}", std::string(exit.status().message())));
  return Judge(options_, watcher, *exit);
}

}  // namespace kforge::worker
