#include "worker/child_process.h"

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
#include <functional>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "worker/child_protocol.h"

extern char** environ;

namespace kforge::worker {
namespace {

double MsSince(ChildClock::time_point t) {
  return std::chrono::duration<double, std::milli>(ChildClock::now() - t).count();
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

// The file descriptor on which a child that cannot run its program says why
// (close-on-exec, so a successful exec closes it and the parent reads EOF).
constexpr int kLaunchErrorFd = kChildResultFd + 1;

// Where the launch failed, written on kLaunchErrorFd.
struct LaunchError {
  int stage;  // 1: fd set-up, 2: parent gone, 3: working directory, 4: exec
  int err;    // errno
};

// Runs in the forked child before exec: async-signal-safe calls only.
[[noreturn]] void ExecChild(char* const* argv, char* const* envp, int stdin_fd, int result_w,
                            int out_w, int error_w, const char* working_dir, pid_t parent) {
  auto fail = [&error_w](int stage) {
    LaunchError e{stage, errno};
    (void)!write(error_w, &e, sizeof e);
    _exit(127);
  };
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) fail(2);  // the worker died before prctl took effect

  // Move every fd above the target numbers first, so no dup2 below
  // overwrites one of them; dup2 onto 0-3 also clears close-on-exec.
  const int r = fcntl(result_w, F_DUPFD, 10);
  const int o = fcntl(out_w, F_DUPFD, 10);
  const int e = fcntl(error_w, F_DUPFD_CLOEXEC, 10);
  const int in = stdin_fd >= 0 ? fcntl(stdin_fd, F_DUPFD, 10) : open("/dev/null", O_RDONLY);
  if (e >= 0) error_w = e;
  if (r < 0 || o < 0 || e < 0 || in < 0) fail(1);
  if (dup2(in, 0) < 0 || dup2(o, 1) < 0 || dup2(o, 2) < 0 || dup2(r, kChildResultFd) < 0 ||
      dup3(e, kLaunchErrorFd, O_CLOEXEC) < 0) {
    fail(1);
  }
  error_w = kLaunchErrorFd;
  // Nothing else of the worker's (gRPC sockets, other children's pipes)
  // reaches the child.
  close_range(kLaunchErrorFd + 1, ~0U, 0);

  struct rlimit no_core = {0, 0};
  setrlimit(RLIMIT_CORE, &no_core);  // deliberate crashes leave no core files
  // The worker blocks its shutdown signals and ignores SIGPIPE; the child
  // starts with the defaults (both survive exec otherwise).
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  signal(SIGPIPE, SIG_DFL);
  if (working_dir != nullptr && chdir(working_dir) != 0) fail(3);

  execve(argv[0], argv, envp);
  fail(4);
  _exit(127);  // not reached: fail() exits
}

std::string DescribeLaunchError(const LaunchError& e, const std::string& program) {
  if (e.stage == 4) return fmt::format("could not exec {}: {}", program, std::strerror(e.err));
  const char* stage = e.stage == 1   ? "setting up its file descriptors"
                      : e.stage == 2 ? "starting (the worker was gone)"
                                     : "entering its working directory";
  return fmt::format("could not start {}: {} failed: {}", program, stage, std::strerror(e.err));
}

// Reads what is there without blocking; false at end of file or error.
bool Drain(int fd, char* buf, size_t size, const std::function<void(std::string_view)>& sink) {
  while (true) {
    ssize_t got = read(fd, buf, size);
    if (got > 0) {
      sink(std::string_view(buf, static_cast<size_t>(got)));
      continue;
    }
    if (got == 0) return false;
    return errno == EAGAIN || errno == EINTR;
  }
}

}  // namespace

std::vector<std::string> ChildEnvironment(std::span<const std::string> extra_names) {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const size_t eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view name = entry.substr(0, eq);
    const bool allowed =
        std::find(std::begin(kChildEnvAllowlist), std::end(kChildEnvAllowlist), name) !=
            std::end(kChildEnvAllowlist) ||
        std::find(extra_names.begin(), extra_names.end(), name) != extra_names.end();
    if (allowed) out.emplace_back(entry);
  }
  return out;
}

absl::Status CheckChildEnvName(std::string_view name) {
  auto start = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; };
  auto rest = [&](char c) { return start(c) || (c >= '0' && c <= '9'); };
  if (name.empty() || !start(name[0]) || !std::all_of(name.begin(), name.end(), rest)) {
    return absl::InvalidArgumentError(
        fmt::format("--child-env {}: not an environment variable name", name));
  }
  if (name.starts_with("KFORGE_") && name.find("TOKEN") != std::string_view::npos) {
    return absl::InvalidArgumentError(fmt::format(
        "--child-env {}: kforge's credentials never reach a child (it runs candidate code)", name));
  }
  return absl::OkStatus();
}

bool ChildExit::Clean() const {
  return !killed && !launch_failed && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0;
}

std::string ChildExit::Ending() const {
  if (WIFSIGNALED(wstatus)) return fmt::format("killed by {}", SignalName(WTERMSIG(wstatus)));
  if (WIFEXITED(wstatus)) return fmt::format("exited with code {}", WEXITSTATUS(wstatus));
  return fmt::format("ended with wait status {}", wstatus);
}

namespace {

// A started child and the parent's ends of its pipes.
struct Started {
  pid_t pid = -1;
  std::unique_ptr<Fd> result_r, out_r;
  ChildClock::time_point start;
  bool launch_failed = false;
  std::string launch_error;
};

// Step 1: pipes, fork, exec; then waits until the exec happened or the
// child said why it could not get there.
absl::StatusOr<Started> Start(const ChildCommand& command) {
  int fds[2];
  auto make_pipe = [&](const char* what) -> absl::Status {
    if (pipe2(fds, O_CLOEXEC) == 0) return absl::OkStatus();
    return absl::InternalError(fmt::format("child: {} pipe: {}", what, std::strerror(errno)));
  };
  Started s;
  if (absl::Status st = make_pipe("result"); !st.ok()) return st;
  s.result_r = std::make_unique<Fd>(fds[0]);
  Fd result_w(fds[1]);
  if (absl::Status st = make_pipe("output"); !st.ok()) return st;
  s.out_r = std::make_unique<Fd>(fds[0]);
  Fd out_w(fds[1]);
  if (absl::Status st = make_pipe("launch"); !st.ok()) return st;
  Fd error_r(fds[0]), error_w(fds[1]);

  // Everything the child needs is built before fork: after it, only
  // async-signal-safe calls.
  std::vector<std::string> args = command.argv;
  std::vector<std::string> env = command.env;
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const char* working_dir = command.working_dir.empty() ? nullptr : command.working_dir.c_str();

  const pid_t parent = getpid();
  s.start = ChildClock::now();
  s.pid = fork();
  if (s.pid < 0) return absl::InternalError(fmt::format("child: fork: {}", std::strerror(errno)));
  if (s.pid == 0) {
    ExecChild(argv.data(), envp.data(), command.stdin_fd, result_w.get(), out_w.get(),
              error_w.get(), working_dir, parent);
  }
  error_w.Reset();  // the child's copy is closed by its exec
  LaunchError launch{};
  ssize_t got;
  do {
    got = read(error_r.get(), &launch, sizeof launch);
  } while (got < 0 && errno == EINTR);
  if (got == static_cast<ssize_t>(sizeof launch)) {
    s.launch_failed = true;
    s.launch_error = DescribeLaunchError(launch, command.argv[0]);
  }
  return s;
}

// Step 2: the watchdog. Feeds the watcher, keeps the output's tail, kills
// the child's process group when cancelled, asked to or past the deadline,
// and returns once the child is reaped and its pipes are drained.
absl::StatusOr<ChildExit> Watch(Started& s, ChildWatcher& watcher, size_t output_tail_bytes,
                                const std::atomic<bool>* cancel) {
  ChildExit exit;
  exit.launch_failed = s.launch_failed;
  exit.launch_error = s.launch_error;
  const int result_fd = s.result_r->get(), out_fd = s.out_r->get();
  fcntl(result_fd, F_SETFL, O_NONBLOCK);
  fcntl(out_fd, F_SETFL, O_NONBLOCK);
  bool result_eof = false, out_eof = false, exited = false;
  std::optional<ChildClock::time_point> exited_at;
  std::string tail;
  auto kill_child = [&] {
    if (!exited && !exit.killed) {
      ::kill(-s.pid, SIGKILL);  // its process group, should it have spawned any
      ::kill(s.pid, SIGKILL);
      exit.killed = true;
    }
  };
  auto keep_tail = [&](std::string_view bytes) {
    tail.append(bytes);
    if (tail.size() > 2 * output_tail_bytes) tail.erase(0, tail.size() - output_tail_bytes);
  };
  auto to_watcher = [&](std::string_view bytes) { watcher.OnResult(bytes); };

  char chunk[65536];
  while (true) {
    if (!exited && waitpid(s.pid, &exit.wstatus, WNOHANG) == s.pid) {
      exited = true;
      exited_at = ChildClock::now();
    }
    // A grandchild holding a pipe open gets one second after the child exits.
    if (exited && ((result_eof && out_eof) || MsSince(*exited_at) > 1000)) break;
    if (!exited && !exit.killed) {
      if (cancel != nullptr && cancel->load()) {
        exit.cancelled = true;
        kill_child();
      } else if (watcher.KillNow()) {
        exit.protocol_kill = true;
        kill_child();
      } else if (ChildClock::now() >= watcher.Deadline()) {
        exit.deadline_passed = true;
        kill_child();
      }
    }

    pollfd fds[2];
    int n = 0, result_idx = -1, out_idx = -1;
    if (!result_eof) {
      fds[n] = {result_fd, POLLIN, 0};
      result_idx = n++;
    }
    if (!out_eof) {
      fds[n] = {out_fd, POLLIN, 0};
      out_idx = n++;
    }
    if (n == 0) {  // pipes closed, child not reaped yet
      usleep(2000);
      continue;
    }
    const int ready = poll(fds, n, 20);
    if (ready < 0 && errno != EINTR) {
      const int err = errno;
      kill_child();
      waitpid(s.pid, &exit.wstatus, 0);
      return absl::InternalError(fmt::format("child: poll: {}", std::strerror(err)));
    }
    if (ready <= 0) continue;
    constexpr short kReadable = POLLIN | POLLHUP | POLLERR;
    if (result_idx >= 0 && (fds[result_idx].revents & kReadable) &&
        !Drain(result_fd, chunk, sizeof chunk, to_watcher)) {
      result_eof = true;
      watcher.OnResultEnd();
    }
    if (out_idx >= 0 && (fds[out_idx].revents & kReadable) &&
        !Drain(out_fd, chunk, sizeof chunk, keep_tail)) {
      out_eof = true;
    }
  }
  if (!exited) waitpid(s.pid, &exit.wstatus, 0);
  exit.wall_ms = MsSince(s.start);
  if (tail.size() > output_tail_bytes) tail.erase(0, tail.size() - output_tail_bytes);
  exit.output_tail = std::move(tail);
  return exit;
}

}  // namespace

absl::StatusOr<ChildExit> RunChild(const ChildCommand& command, ChildWatcher& watcher,
                                   size_t output_tail_bytes, const std::atomic<bool>* cancel) {
  if (command.argv.empty()) return absl::InvalidArgumentError("child: no program");
  absl::StatusOr<Started> started = Start(command);
  if (!started.ok()) return started.status();
  return Watch(*started, watcher, output_tail_bytes, cancel);
}

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

}  // namespace kforge::worker
