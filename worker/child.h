// The sandboxed evaluator child: `kforge-worker --eval-child`.
//
// It reads the request directory the parent wrote, evaluates the candidate
// (or retimes candidate and incumbent) on the GPU through worker/eval, and
// writes the events of child_protocol.h to `result_fd`. It never talks to the
// server. A CUDA fault ends it (after a "fault" event when it can still write
// one); the parent turns whatever happens into the task's outcome.
#pragma once

#include <functional>
#include <string>

#include "worker/child_protocol.h"

namespace kforge::worker {

// The child's whole life; returns its exit code (0 after a result event).
// `self_test` (test only, `--self-test=MODE`) overrides the request's
// self_test, so tests can drive the whole worker path without a GPU.
int RunEvalChild(const std::string& request_dir, int result_fd, const std::string& self_test = "");

// Called by the evaluator once the reference has run, before any candidate
// launch: `launches` is how many candidate launches are still to come.
using ReferenceCallback = std::function<void(double reference_ms, int launches)>;

// Evaluates `request` on the GPU in this process (child_eval.cc; a stub that
// reports a fault where worker/eval is not built). Returns the report to
// send, or an error for a fault that leaves nothing trustworthy to report
// (the child then writes a fault event and exits non-zero).
absl::StatusOr<ChildReport> EvaluateInChild(const ChildRequest& request,
                                            const ReferenceCallback& on_reference);

}  // namespace kforge::worker
