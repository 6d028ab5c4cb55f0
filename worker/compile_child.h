// Compiling candidate source in a child process that holds nothing worth
// stealing: `kforge-worker --compile-child`.
//
// NVRTC opens whatever file a source names by an absolute path, and prints
// what it read into the compile log. The source check (kernels/
// source_check.h) stops every include it knows of; this is the layer under
// it. The worker process holds its tokens, so no candidate is compiled in
// it: each compile that misses the cache runs in a fresh child started by
// RunChild() (child_process.h): allowlisted environment, no inherited file
// descriptors, its own process group, working directory "/", and a watchdog
// at the request's time limit. Where the kernel has Landlock, the child
// first lets NVRTC load what it needs (an empty compile) and then gives up
// every filesystem access, so NVRTC can open no file the source names.
// Whatever the child's log says is then redacted with the worker's secrets
// and capped before anyone sees it. The cache stays in the parent
// (gpu::CompileCache, keyed as before).
//
// Protocol. The parent passes the request as one JSON object on the child's
// stdin (a memfd, so a large source never fills a pipe):
//   {"source": ..., "arch": "sm_90a", "extra_options": [...], "name": "v.cu"}
// The child answers on fd 3:
//   {"event":"compiling","sealed":true}      the request is read; NVRTC starts
//                                            (sealed: no file can be opened)
//   {"event":"result", <gpu::CompileResultToJson fields>, "cubin_bytes": N}
//   <N bytes of cubin>                        then exits 0
// or, when NVRTC itself fails (not the source), {"event":"error","message":...}.
//
// Who is charged (CompileChild::Compile):
//   - a result: that CompileResult;
//   - after "compiling", killed at the time limit: ok=false, "compile
//     exceeded N s"; killed by a signal (NVRTC crashed on the source) or
//     exited without a result: ok=false, saying how. All transient (never
//     cached). A result over max_result_bytes: ok=false.
//   - anything before "compiling" (the child could not start, or failed
//     reading its request), an error event, or a malformed answer: an
//     absl error, the worker's fault (TaskResult::worker_fault).
//
// Thread-safety: Compile() may be called from several threads at once.
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/compile.h"

namespace kforge::worker {

struct CompileChildOptions {
  // The program and arguments that select the compile child; the result fd
  // (--result-fd=3) is appended.
  std::string executable = "/proc/self/exe";
  std::vector<std::string> child_args = {"--compile-child"};
  // Environment names the child keeps beyond kChildEnvAllowlist.
  std::vector<std::string> child_env;
  // Replaced in every log (core/redact.h): the worker's tokens.
  std::vector<std::string> secrets;
  size_t max_log_bytes = 1 << 20;      // the log as kept (and cached), after redaction
  size_t max_result_bytes = 64 << 20;  // more on fd 3 is a compile error
  size_t output_tail_bytes = 4096;     // of the child's stderr, for crash messages
  // Landlock the child's filesystem away before the candidate's compile
  // (where the kernel has Landlock). Off only in tests of the other layers.
  bool seal_filesystem = true;
};

class CompileChild {
 public:
  explicit CompileChild(CompileChildOptions options);

  // Compiles `request` in a fresh child; see the header comment for what
  // comes back.
  absl::StatusOr<gpu::CompileResult> Compile(const gpu::CompileRequest& request) const;

  // Compile() as a gpu::Compiler for CompilePool; this object must outlive it.
  gpu::Compiler AsCompiler() const;

  const CompileChildOptions& options() const { return options_; }

  // Whether the last child that started compiling had sealed its
  // filesystem; nullopt before any did.
  std::optional<bool> sealed() const;

 private:
  const CompileChildOptions options_;
  mutable std::atomic<int> sealed_{-1};
};

// The child's side: reads the request from `request_fd`, compiles it with
// NVRTC on this thread (the parent keeps the time) and answers on
// `result_fd`; `seal`: give up filesystem access first. Returns the exit code.
int RunCompileChild(int request_fd, int result_fd, bool seal = true);

}  // namespace kforge::worker
