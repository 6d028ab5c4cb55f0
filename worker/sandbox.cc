#include "worker/sandbox.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <system_error>

#include <fmt/format.h>

extern char** environ;

namespace kforge::worker {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

std::string Seconds(std::chrono::milliseconds ms) {
  return fmt::format("{:.1f} s", static_cast<double>(ms.count()) / 1000.0);
}

// Closes an fd once.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// Removes the request directory however Run() ends.
class ScratchDir {
 public:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
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

// Runs in the forked child before exec: async-signal-safe calls only.
[[noreturn]] void ExecChild(const std::vector<char*>& argv, const std::vector<char*>& envp,
                            int result_w, int out_w, pid_t parent) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(126);  // the worker died before prctl took effect

  // Move the pipe ends above the target numbers first, so no dup2 below
  // overwrites one of them; dup2 onto 3/1/2 also clears close-on-exec.
  int r = fcntl(result_w, F_DUPFD, 10);
  int o = fcntl(out_w, F_DUPFD, 10);
  int devnull = open("/dev/null", O_RDONLY);
  if (r < 0 || o < 0 || devnull < 0) _exit(125);
  if (dup2(devnull, 0) < 0 || dup2(o, 1) < 0 || dup2(o, 2) < 0 ||
      dup2(r, kChildResultFd) < 0) {
    _exit(125);
  }
  // Nothing else of the worker's (gRPC sockets, other children's pipes)
  // reaches the candidate.
  close_range(kChildResultFd + 1, ~0U, 0);

  struct rlimit no_core = {0, 0};
  setrlimit(RLIMIT_CORE, &no_core);  // deliberate crashes leave no core files
  // The worker blocks its shutdown signals and ignores SIGPIPE; the child
  // starts with the defaults (both survive exec otherwise).
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  signal(SIGPIPE, SIG_DFL);

  execve(argv[0], argv.data(), envp.data());
  _exit(127);
}

}  // namespace

std::string SignalName(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGTRAP: return "SIGTRAP";
    case SIGPIPE: return "SIGPIPE";
    case SIGINT: return "SIGINT";
    default: {
      const char* d = strsignal(sig);
      return fmt::format("signal {} ({})", sig, d ? d : "?");
    }
  }
}

Sandbox::Sandbox(SandboxOptions options) : options_(std::move(options)) {}

absl::StatusOr<SandboxRun> Sandbox::Run(const ChildRequest& request,
                                        const std::atomic<bool>* cancel) {
  std::error_code ec;
  std::filesystem::create_directories(options_.scratch_dir, ec);
  std::string tmpl = (options_.scratch_dir / "kforge-eval-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(
        fmt::format("sandbox: cannot create a request dir under {}: {}",
                    options_.scratch_dir.string(), std::strerror(errno)));
  }
  ScratchDir dir(tmpl);
  if (absl::Status s = WriteRequestDir(dir.path(), request); !s.ok()) {
    return absl::InternalError(fmt::format("sandbox: {}", std::string(s.message())));
  }

  int result_fds[2], out_fds[2];
  if (pipe2(result_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(fmt::format("sandbox: pipe: {}", std::strerror(errno)));
  }
  Fd result_r(result_fds[0]), result_w(result_fds[1]);
  if (pipe2(out_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(fmt::format("sandbox: pipe: {}", std::strerror(errno)));
  }
  Fd out_r(out_fds[0]), out_w(out_fds[1]);

  // Everything the child needs is built before fork: after it, only
  // async-signal-safe calls.
  std::vector<std::string> args(options_.wrapper.begin(), options_.wrapper.end());
  std::string executable = options_.executable;
  if (!options_.wrapper.empty() && executable == "/proc/self/exe") {
    executable = std::filesystem::read_symlink(executable, ec).string();
    if (ec) return absl::InternalError(fmt::format("sandbox: /proc/self/exe: {}", ec.message()));
  }
  args.push_back(executable);
  args.insert(args.end(), options_.child_args.begin(), options_.child_args.end());
  args.push_back("--request-dir=" + dir.path());
  args.push_back(fmt::format("--result-fd={}", kChildResultFd));
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The child gets the worker's environment minus its credentials: it never
  // talks to the server.
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    if (entry.starts_with("KFORGE_WORKER_TOKEN=") || entry.starts_with("KFORGE_TOKEN=") ||
        entry.starts_with("KFORGE_CLIENT_TOKEN=")) {
      continue;
    }
    envp.push_back(*e);
  }
  envp.push_back(nullptr);

  const pid_t parent = getpid();
  const Clock::time_point start = Clock::now();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(fmt::format("sandbox: fork: {}", std::strerror(errno)));
  if (pid == 0) ExecChild(argv, envp, result_w.get(), out_w.get(), parent);

  result_w.Reset();
  out_w.Reset();
  fcntl(result_r.get(), F_SETFL, O_NONBLOCK);
  fcntl(out_r.get(), F_SETFL, O_NONBLOCK);

  SandboxRun run;
  const Clock::time_point absolute_deadline = start + options_.absolute_limit;
  Clock::time_point deadline = std::min(start + options_.setup_limit, absolute_deadline);
  std::string limit_reason = fmt::format("setup limit {}", Seconds(options_.setup_limit));

  std::string line_buf;
  std::string out_tail;
  std::string fault;
  std::string protocol_detail;
  std::optional<ChildReport> report;
  bool result_eof = false, out_eof = false;
  bool exited = false, killed = false, cancelled = false, killed_after_result = false;
  int wstatus = 0;
  std::optional<Clock::time_point> exited_at;

  auto kill_child = [&] {
    if (!exited && !killed) {
      ::kill(-pid, SIGKILL);  // its process group, should it have spawned any
      ::kill(pid, SIGKILL);
      killed = true;
    }
  };
  auto protocol_error = [&](std::string detail) {
    if (protocol_detail.empty()) protocol_detail = std::move(detail);
    kill_child();
  };
  auto handle_line = [&](std::string_view line) {
    if (!protocol_detail.empty()) return;
    if (line.empty()) return;
    if (report) {
      protocol_error("output after the result event");
      return;
    }
    absl::StatusOr<ChildEvent> event = ParseChildEvent(line);
    if (!event.ok()) {
      protocol_error(std::string(event.status().message()));
      return;
    }
    switch (event->kind) {
      case ChildEvent::Kind::kReference:
        if (run.reference_ms >= 0) {
          protocol_error("a second reference event");
          return;
        }
        run.reference_ms = event->reference_ms;
        run.launches = event->launches;
        {
          const double budget_ms =
              std::max(static_cast<double>(options_.min_run_limit.count()),
                       options_.reference_factor * event->reference_ms * event->launches);
          const auto budget =
              std::chrono::milliseconds(static_cast<int64_t>(std::min(budget_ms, 1e12)));
          deadline = std::min(Clock::now() + budget, absolute_deadline);
          limit_reason = fmt::format(
              "run limit {} (max of {} and {} x reference {:.3f} ms x {} launches)",
              Seconds(budget), Seconds(options_.min_run_limit), options_.reference_factor,
              event->reference_ms, event->launches);
          if (deadline == absolute_deadline) {
            limit_reason = fmt::format("absolute limit {}", Seconds(options_.absolute_limit));
          }
        }
        break;
      case ChildEvent::Kind::kFault:
        fault = event->message;
        break;
      case ChildEvent::Kind::kResult:
        report = event->report;
        deadline = Clock::now() + options_.exit_grace;
        break;
    }
  };

  char chunk[65536];
  while (true) {
    if (!exited) {
      pid_t w = waitpid(pid, &wstatus, WNOHANG);
      if (w == pid) {
        exited = true;
        exited_at = Clock::now();
      }
    }
    // Done when the child is gone and its pipes are drained; a grandchild
    // holding a pipe open gets one second before it is ignored.
    if (exited && ((result_eof && out_eof) || MsSince(*exited_at) > 1000)) break;

    if (!exited && cancel != nullptr && cancel->load() && !cancelled) {
      cancelled = true;
      kill_child();
    }
    if (!exited && !killed && Clock::now() >= deadline) {
      if (report) killed_after_result = true;
      kill_child();
    }

    pollfd fds[2];
    int n = 0;
    int result_idx = -1, out_idx = -1;
    if (!result_eof) {
      fds[n] = {result_r.get(), POLLIN, 0};
      result_idx = n++;
    }
    if (!out_eof) {
      fds[n] = {out_r.get(), POLLIN, 0};
      out_idx = n++;
    }
    if (n == 0) {
      // Pipes closed, child not reaped yet.
      usleep(5000);
      continue;
    }
    int ready = poll(fds, n, 20);
    if (ready < 0 && errno != EINTR) {
      kill_child();
      waitpid(pid, &wstatus, 0);
      return absl::InternalError(fmt::format("sandbox: poll: {}", std::strerror(errno)));
    }
    if (ready <= 0) continue;

    if (result_idx >= 0 && (fds[result_idx].revents & (POLLIN | POLLHUP | POLLERR))) {
      while (true) {
        ssize_t got = read(result_r.get(), chunk, sizeof chunk);
        if (got > 0) {
          line_buf.append(chunk, static_cast<size_t>(got));
          size_t nl;
          while ((nl = line_buf.find('\n')) != std::string::npos) {
            handle_line(std::string_view(line_buf).substr(0, nl));
            line_buf.erase(0, nl + 1);
          }
          if (line_buf.size() > options_.max_event_bytes) {
            protocol_error(fmt::format("an event line longer than {} bytes", options_.max_event_bytes));
            line_buf.clear();
          }
          continue;
        }
        if (got == 0) {
          result_eof = true;
          if (!line_buf.empty()) {
            handle_line(line_buf);  // a last line without its newline
            line_buf.clear();
          }
        } else if (errno != EAGAIN && errno != EINTR) {
          result_eof = true;
        }
        break;
      }
    }
    if (out_idx >= 0 && (fds[out_idx].revents & (POLLIN | POLLHUP | POLLERR))) {
      while (true) {
        ssize_t got = read(out_r.get(), chunk, sizeof chunk);
        if (got > 0) {
          out_tail.append(chunk, static_cast<size_t>(got));
          if (out_tail.size() > 2 * options_.stderr_tail_bytes) {
            out_tail.erase(0, out_tail.size() - options_.stderr_tail_bytes);
          }
          continue;
        }
        if (got == 0 || (errno != EAGAIN && errno != EINTR)) out_eof = true;
        break;
      }
    }
  }
  if (!exited) waitpid(pid, &wstatus, 0);

  run.wall_ms = MsSince(start);
  if (out_tail.size() > options_.stderr_tail_bytes) {
    out_tail.erase(0, out_tail.size() - options_.stderr_tail_bytes);
  }
  run.stderr_tail = out_tail;

  // How the child ended, in words.
  std::string ending;
  const bool clean_exit = !killed && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0;
  if (WIFSIGNALED(wstatus)) {
    ending = fmt::format("killed by {}", SignalName(WTERMSIG(wstatus)));
  } else if (WIFEXITED(wstatus)) {
    ending = fmt::format("exited with code {}", WEXITSTATUS(wstatus));
    if (WEXITSTATUS(wstatus) == 127) ending += fmt::format(" (could not exec {})", options_.executable);
  }
  // The best explanation the child left: its fault event, else its output.
  std::string why = !fault.empty() ? fault : LastLine(out_tail);

  ChildReport& r = run.report;
  if (cancelled) {
    run.cancelled = true;
    r.outcome = Outcome::kCrashed;
    r.message = "cancelled";
  } else if (!protocol_detail.empty()) {
    run.protocol_error = true;
    r.outcome = Outcome::kCrashed;
    r.message = fmt::format("sandbox protocol error: the evaluator child wrote {}", protocol_detail);
  } else if (report && clean_exit) {
    r = *report;
  } else if (report) {
    r = *report;
    const std::string how = killed_after_result
                                ? fmt::format("did not exit within {} after reporting",
                                              Seconds(options_.exit_grace))
                                : ending + " after reporting";
    if (r.outcome == Outcome::kVerified || r.outcome == Outcome::kCompiled) {
      r.outcome = Outcome::kCrashed;
      r.message = fmt::format("child reported {} but {}{}", OutcomeName(report->outcome), how,
                              why.empty() ? "" : ": " + why);
    } else {
      r.message += fmt::format(" (child {})", how);
    }
  } else if (killed) {
    r.outcome = Outcome::kTimeout;
    r.message = fmt::format("killed after {:.1f} s: {}", run.wall_ms / 1000.0, limit_reason);
    if (run.reference_ms < 0) r.message += " (the reference never finished)";
  } else {
    r.outcome = Outcome::kCrashed;
    if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) {
      r.message = "child exited without a result";
    } else {
      r.message = "child " + ending;
    }
    if (!why.empty()) r.message += ": " + why;
  }
  // No candidate code runs before the reference event (the evaluator calls
  // back before the first candidate launch, and loading a module runs no
  // device code): a child that died, hung or babbled before it failed on its
  // own (driver, context, memory, reference), not because of the candidate.
  run.infrastructure_failure = !cancelled && !report && run.reference_ms < 0;
  return run;
}

}  // namespace kforge::worker
