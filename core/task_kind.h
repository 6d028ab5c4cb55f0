// What a task asks a worker to do. The store keeps it by name, the worker
// runs it and the wire carries it as v1::TaskKind (converted in server/ and
// worker/rpc_client.cc).
#pragma once

#include <optional>
#include <string_view>

namespace kforge {

enum class TaskKind {
  kEvaluate,  // compile, verify, time one variant (sandboxed)
  kRetime,    // promotion: gates, then candidate and incumbent interleaved in one child
  kCompile,   // compile only
  kConfirm,   // promotion of a bucket's first best: gates, then verify and time it alone
};

std::string_view TaskKindName(TaskKind k);  // "evaluate" | "retime" | "compile" | "confirm"
std::optional<TaskKind> ParseTaskKind(std::string_view name);

}  // namespace kforge
