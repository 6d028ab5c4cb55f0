#include "core/task_kind.h"

#include <array>
#include <utility>

namespace kforge {
namespace {
constexpr std::array<std::pair<TaskKind, std::string_view>, 4> kNames = {{
    {TaskKind::kEvaluate, "evaluate"},
    {TaskKind::kRetime, "retime"},
    {TaskKind::kCompile, "compile"},
    {TaskKind::kConfirm, "confirm"},
}};
}  // namespace

std::string_view TaskKindName(TaskKind k) {
  for (const auto& [v, n] : kNames)
    if (v == k) return n;
  return "unknown";
}

std::optional<TaskKind> ParseTaskKind(std::string_view name) {
  for (const auto& [v, n] : kNames)
    if (n == name) return v;
  return std::nullopt;
}

}  // namespace kforge
