// The names of the store's enums, as stored in SQLite and shown to operators.
// They are part of the on-disk format: never rename one.
#include "storage/store.h"

#include <array>
#include <utility>

#include "storage/store_internal.h"

namespace kforge {
namespace {

constexpr std::array<std::pair<JobState, std::string_view>, 5> kJobStates = {{
    {JobState::kQueued, "queued"},
    {JobState::kRunning, "running"},
    {JobState::kSucceeded, "succeeded"},
    {JobState::kFailed, "failed"},
    {JobState::kCancelled, "cancelled"},
}};
constexpr std::array<std::pair<TaskState, std::string_view>, 4> kTaskStates = {{
    {TaskState::kQueued, "queued"},
    {TaskState::kLeased, "leased"},
    {TaskState::kDone, "done"},
    {TaskState::kCancelled, "cancelled"},
}};
constexpr std::array<std::pair<TaskKind, std::string_view>, 3> kTaskKinds = {{
    {TaskKind::kEvaluate, "evaluate"},
    {TaskKind::kRetime, "retime"},
    {TaskKind::kCompile, "compile"},
}};

template <typename E, size_t N>
std::string_view NameOf(const std::array<std::pair<E, std::string_view>, N>& names, E e) {
  for (const auto& [v, n] : names)
    if (v == e) return n;
  return "unknown";
}

template <typename E, size_t N>
std::optional<E> Parse(const std::array<std::pair<E, std::string_view>, N>& names,
                       std::string_view name) {
  for (const auto& [v, n] : names)
    if (n == name) return v;
  return std::nullopt;
}

}  // namespace

std::string_view JobStateName(JobState s) { return NameOf(kJobStates, s); }
std::string_view TaskStateName(TaskState s) { return NameOf(kTaskStates, s); }
std::string_view TaskKindName(TaskKind k) { return NameOf(kTaskKinds, k); }

namespace storage_internal {
std::optional<JobState> ParseJobState(std::string_view name) { return Parse(kJobStates, name); }
std::optional<TaskState> ParseTaskState(std::string_view name) {
  return Parse(kTaskStates, name);
}
std::optional<TaskKind> ParseTaskKind(std::string_view name) { return Parse(kTaskKinds, name); }
}  // namespace storage_internal

}  // namespace kforge
