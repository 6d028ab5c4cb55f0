// A child process the worker can kill: how both sandboxed children, the
// evaluator (sandbox.h) and the compiler (compile_child.h), are started, fed
// and watched.
//
// The child gets stdin from ChildCommand::stdin_fd (else /dev/null), stdout
// and stderr into one pipe of which the parent keeps the tail, file
// descriptor 3 as a pipe for its results (kChildResultFd), and no other file
// descriptor of the worker's (gRPC sockets, other children's pipes); its own
// process group, PR_SET_PDEATHSIG=SIGKILL, no core dumps, the default signal
// mask and SIGPIPE; and exactly the environment in ChildCommand::env, which
// ChildEnvironment() builds from an allowlist: a child never holds the
// worker's tokens, so nothing a candidate makes it print can carry them.
//
// RunChild() is the watchdog: it passes what the child writes on fd 3 to a
// ChildWatcher (the child's protocol), kills the child's process group when
// the watcher's deadline passes, the watcher asks for it, or the caller's
// cancel flag goes up, and returns how the child ended.
//
// Thread-safety: RunChild() may run on several threads at once (each call
// has its own child); ChildEnvironment() reads the environment, so nothing
// may change it meanwhile (the worker sets it up before starting threads).
#pragma once

#include <atomic>
#include <chrono>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kforge::worker {

using ChildClock = std::chrono::steady_clock;

// Names a child's environment keeps when the worker has them, and why:
//   PATH, LD_LIBRARY_PATH: the child (and a wrapper such as compute-sanitizer)
//     finds its programs and libnvrtc/libcuda as the worker did;
//   CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER: the child's GPU ordinals are the
//     worker's (--gpu N means the same device);
//   TMPDIR: where the CUDA driver and compute-sanitizer put temporary files.
// Everything else (tokens, cloud credentials, proxies) stays behind; an
// operator adds names with the worker's --child-env.
inline constexpr std::string_view kChildEnvAllowlist[] = {
    "PATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "TMPDIR"};

// "NAME=value" for every variable of this process's environment named in
// kChildEnvAllowlist or `extra_names`, in environment order.
std::vector<std::string> ChildEnvironment(std::span<const std::string> extra_names = {});

// An operator's extra name for ChildEnvironment: a plain variable name
// ([A-Za-z_][A-Za-z0-9_]*) that is not one of kforge's own credentials
// (KFORGE_*TOKEN*), which no child may hold.
absl::Status CheckChildEnvName(std::string_view name);

struct ChildCommand {
  std::vector<std::string> argv;  // argv[0] is executed as given (no PATH search)
  std::vector<std::string> env;   // NAME=value: the child's whole environment
  int stdin_fd = -1;              // becomes the child's fd 0; -1: /dev/null
  std::string working_dir;        // the child starts there; empty: the worker's
};

// A child's protocol, as the parent sees it.
class ChildWatcher {
 public:
  virtual ~ChildWatcher() = default;
  // Bytes the child wrote on fd 3, in order, as they arrive.
  virtual void OnResult(std::string_view bytes) = 0;
  // fd 3 is closed (every byte has been passed to OnResult).
  virtual void OnResultEnd() {}
  // When the child must be gone; read again after every OnResult.
  virtual ChildClock::time_point Deadline() const = 0;
  // True once the child broke its protocol and is to be killed now.
  virtual bool KillNow() const { return false; }
};

struct ChildExit {
  int wstatus = 0;               // as waitpid reported it
  bool killed = false;           // the parent killed it (any of the three below)
  bool deadline_passed = false;  // ... because the watcher's deadline passed
  bool protocol_kill = false;    // ... because the watcher asked
  bool cancelled = false;        // ... because the cancel flag went up
  // The program never ran: exec failed, or the steps before it (fd set-up,
  // the parent dying). `launch_error` says which, with errno's text.
  bool launch_failed = false;
  std::string launch_error;
  double wall_ms = 0;
  std::string output_tail;  // the last bytes the child wrote to stdout/stderr

  // Exited with status 0 by itself.
  bool Clean() const;
  // "killed by SIGSEGV" | "exited with code 3".
  std::string Ending() const;
};

// Runs `command` and watches it until it is gone and its pipes are drained
// (a grandchild holding a pipe open gets one second after the child exits).
// `cancel` (may be null) is polled every 20 ms. Errors only for what stops
// the worker from starting a child at all (pipe, fork); whatever the child
// does, a failed exec included, is a ChildExit.
absl::StatusOr<ChildExit> RunChild(const ChildCommand& command, ChildWatcher& watcher,
                                   size_t output_tail_bytes,
                                   const std::atomic<bool>* cancel = nullptr);

// Human-readable signal name: "SIGSEGV".
std::string SignalName(int sig);

}  // namespace kforge::worker
