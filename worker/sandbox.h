// Sandbox: runs one candidate evaluation in a child process the worker can
// kill, and turns whatever the child does into an outcome.
//
// Why a child: an illegal address or a trap leaves a CUDA context unusable
// for the rest of its process, and a kernel that never ends cannot be stopped
// from inside it. Each Run() starts a fresh child (a fresh context), so one
// candidate can neither poison the next evaluation nor the stored results:
// the child only computes and the parent decides what is reported.
//
// The child is this worker's own binary re-executed with a hidden subcommand
// (child_protocol.h has the protocol), started and watched by RunChild()
// (child_process.h: allowlisted environment, no inherited fds, own process
// group). The watchdog has three limits:
//   - setup_limit: from start until the child reports the reference's time;
//   - then max(min_run_limit, reference_factor * reference_ms * launches);
//   - absolute_limit over the whole run, whatever the child reports.
// Expiry → SIGKILL → kTimeout. A child killed by a signal, exiting non-zero,
// exiting without a result, or writing anything but well-formed events →
// kCrashed with the reason. A result followed by an unclean exit is not
// trusted: a "verified" becomes kCrashed. A failure before the child's
// reference event is flagged as the worker's own (infrastructure_failure).
//
// Thread-safety: Run() may be called from several threads at once (each call
// has its own child); the usual worker runs one at a time per GPU.
#pragma once

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/child_process.h"
#include "worker/child_protocol.h"

namespace kforge::worker {

struct SandboxOptions {
  // The program to run as the child and the arguments that select the child
  // mode; the sandbox appends --request-dir=DIR and --result-fd=3.
  std::string executable = "/proc/self/exe";
  std::vector<std::string> child_args = {"--eval-child"};
  // A program the child runs under, e.g. {"/usr/local/cuda/bin/compute-sanitizer",
  // "--tool", "memcheck", "--error-exitcode", "86"}: the sandbox executes
  // wrapper... executable child_args... (with /proc/self/exe resolved to the
  // worker's real path, which the wrapper could not see). The wrapper must
  // pass file descriptor 3 on to the child; its exit code becomes the run's.
  // It gets the same allowlisted environment as the child.
  std::vector<std::string> wrapper;
  // Environment variables the child keeps beyond kChildEnvAllowlist
  // (child_process.h); the worker's --child-env.
  std::vector<std::string> child_env;
  // Request directories are created (and removed) under this folder.
  std::filesystem::path scratch_dir = std::filesystem::temp_directory_path();

  std::chrono::milliseconds setup_limit{120000};
  std::chrono::milliseconds min_run_limit{5000};
  double reference_factor = 50;
  std::chrono::milliseconds absolute_limit{600000};
  // After the result event the child has this long to exit.
  std::chrono::milliseconds exit_grace{10000};
  size_t max_event_bytes = 1 << 20;  // a longer line is a protocol error
  size_t stderr_tail_bytes = 4096;   // kept for the crash message
};

struct SandboxRun {
  // The child's report when it made one and exited cleanly; otherwise one
  // the sandbox wrote: kTimeout or kCrashed with `message` saying why.
  ChildReport report;
  bool cancelled = false;      // Run()'s cancel flag was raised; report nothing
  bool protocol_error = false;  // the child wrote something that is not an event
  // The child failed before the reference event, i.e. before any candidate
  // code ran: the fault is the worker's (driver, GPU, evaluator), and
  // `report` must not be charged to the candidate.
  bool infrastructure_failure = false;
  double reference_ms = -1;     // as the child reported it; -1: never
  int launches = 0;
  double wall_ms = 0;
  std::string stderr_tail;  // last bytes the child wrote to stdout/stderr
  // The exit code when the child (or its wrapper) exited by itself; -1 when
  // it was killed, died of a signal or never ran.
  int exit_code = -1;
};

class Sandbox {
 public:
  explicit Sandbox(SandboxOptions options);

  // Runs `request` in a fresh child and waits for it (polling `cancel`, when
  // given, every 50 ms: a raised flag kills the child). Errors only for what
  // stops the sandbox itself from working (no scratch dir, fork failed);
  // everything the child does is a SandboxRun.
  absl::StatusOr<SandboxRun> Run(const ChildRequest& request,
                                 const std::atomic<bool>* cancel = nullptr);

  const SandboxOptions& options() const { return options_; }

 private:
  // wrapper..., the executable, child_args..., and the request arguments.
  absl::StatusOr<std::vector<std::string>> Argv(const std::string& request_dir) const;
  // Argv and the child's allowlisted environment.
  absl::StatusOr<ChildCommand> Command(const std::string& request_dir) const;

  const SandboxOptions options_;
};

}  // namespace kforge::worker
