#include "worker/child.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>

#include <fmt/format.h>

namespace kforge::worker {
namespace {

// Writes all of `line` plus a newline; false when the parent is gone.
bool WriteLine(int fd, std::string line) {
  line.push_back('\n');
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return true;
}

[[noreturn]] void SleepForever() {
  while (true) std::this_thread::sleep_for(std::chrono::hours(1));
}

ChildReport FakeVerified() {
  ChildReport r;
  r.outcome = Outcome::kVerified;
  r.message = "self-test";
  r.reference_version = "self-test";
  r.errors = ErrorStats{.max_abs_error = 0.001, .rel_l2_error = 0.002, .worst_output = "O", .detail = ""};
  r.timing = Timing{.median_us = 10, .min_us = 9, .max_us = 12, .samples = 5};
  return r;
}

// Misbehaviours on request, to test the parent's handling without a GPU.
int RunSelfTest(const std::string& mode, int fd) {
  if (mode == "verified") {
    WriteLine(fd, ReferenceEventJson(1.0, 10));
    WriteLine(fd, ResultEventJson(FakeVerified()));
    return 0;
  }
  if (mode == "wrong") {
    ChildReport r;
    r.outcome = Outcome::kWrong;
    r.message = "O differs";
    r.errors = ErrorStats{.max_abs_error = 3.5,
                          .rel_l2_error = 0.9,
                          .worst_output = "O",
                          .detail = "batch 0 seq 1 head 0 row 2: NaN (unwritten)"};
    WriteLine(fd, ReferenceEventJson(1.0, 10));
    WriteLine(fd, ResultEventJson(r));
    return 0;
  }
  if (mode == "nan_metrics") {
    ChildReport r;
    r.outcome = Outcome::kWrong;
    r.message = "O is NaN";
    r.errors = ErrorStats{.max_abs_error = std::nan(""), .rel_l2_error = std::nan(""),
                          .worst_output = "O", .detail = "row 0: NaN"};
    WriteLine(fd, ReferenceEventJson(1.0, 10));
    WriteLine(fd, ResultEventJson(r));
    return 0;
  }
  if (mode == "verified_without_timing") {
    ChildReport r = FakeVerified();
    r.timing.reset();
    WriteLine(fd, ReferenceEventJson(1.0, 10));
    WriteLine(fd, ResultEventJson(r));
    return 0;
  }
  if (mode == "retime") {
    ChildReport r = FakeVerified();
    r.incumbent_timing = Timing{.median_us = 20, .min_us = 19, .max_us = 22, .samples = 5};
    WriteLine(fd, ReferenceEventJson(1.0, 20));
    WriteLine(fd, ResultEventJson(r));
    return 0;
  }
  if (mode == "report_env") {  // which credentials reached the child
    ChildReport r = FakeVerified();
    r.message = std::getenv("KFORGE_WORKER_TOKEN") != nullptr ? "token visible" : "no token";
    WriteLine(fd, ReferenceEventJson(1.0, 10));
    WriteLine(fd, ResultEventJson(r));
    return 0;
  }
  if (mode == "hang") SleepForever();
  if (mode == "hang_after_reference") {
    WriteLine(fd, ReferenceEventJson(0.001, 10));
    SleepForever();
  }
  if (mode == "segv") {
    WriteLine(fd, ReferenceEventJson(1.0, 10));
    raise(SIGSEGV);
  }
  if (mode == "abort") {
    WriteLine(fd, ReferenceEventJson(1.0, 10));
    std::abort();
  }
  if (mode == "garbage") {
    WriteLine(fd, "this is not json {{{");
    SleepForever();  // the parent must not wait for an exit
  }
  if (mode == "fault") {
    WriteLine(fd, ReferenceEventJson(1.0, 10));
    std::string msg =
        "cuStreamSynchronize: CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered)";
    fmt::print(stderr, "eval child: {}\n", msg);
    WriteLine(fd, FaultEventJson(msg));
    return 3;
  }
  if (mode == "exit_silently") return 0;
  if (mode == "spam_stderr") {
    std::string junk(1 << 16, 'x');
    junk.back() = '\n';
    for (int i = 0; i < 32; ++i) fmt::print(stderr, "{}", junk);  // 2 MB
    fmt::print(stderr, "last words\n");
    fflush(stderr);
    WriteLine(fd, ReferenceEventJson(1.0, 10));
    WriteLine(fd, ResultEventJson(FakeVerified()));
    return 0;
  }
  if (mode == "crash_after_result") {
    WriteLine(fd, ReferenceEventJson(1.0, 10));
    WriteLine(fd, ResultEventJson(FakeVerified()));
    raise(SIGSEGV);
  }
  WriteLine(fd, FaultEventJson(fmt::format("unknown self-test '{}'", mode)));
  return 2;
}

}  // namespace

int RunEvalChild(const std::string& request_dir, int result_fd, const std::string& self_test) {
  // A parent that went away must not leave this child blocked on a write.
  signal(SIGPIPE, SIG_DFL);
  absl::StatusOr<ChildRequest> request = ReadRequestDir(request_dir);
  if (!request.ok()) {
    std::string msg = fmt::format("eval child: bad request: {}", std::string(request.status().message()));
    fmt::print(stderr, "{}\n", msg);
    WriteLine(result_fd, FaultEventJson(msg));
    return 2;
  }
  if (!self_test.empty()) request->self_test = self_test;
  if (!request->self_test.empty()) return RunSelfTest(request->self_test, result_fd);

  // Load modules whole when they are loaded, not at their first launch: a
  // candidate's module globals are then in place before it runs (the
  // evaluator watches them), and no load lands inside a timed launch.
  setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  bool reference_sent = false;
  absl::StatusOr<ChildReport> report =
      EvaluateInChild(*request, [&](double reference_ms, int launches) {
        if (reference_sent) return;
        reference_sent = true;
        WriteLine(result_fd, ReferenceEventJson(reference_ms, launches));
      });
  if (!report.ok()) {
    std::string msg(std::string(report.status().message()));
    fmt::print(stderr, "eval child: {}\n", msg);
    WriteLine(result_fd, FaultEventJson(msg));
    return 3;
  }
  if (!WriteLine(result_fd, ResultEventJson(*report))) return 4;
  return 0;
}

}  // namespace kforge::worker
