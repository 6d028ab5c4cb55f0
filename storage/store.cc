// The names of the store's enums, as stored in SQLite and shown to operators.
// They are part of the on-disk format: never rename one.
#include "storage/store.h"

#include <array>
#include <utility>

#include <fmt/format.h>

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

absl::Status CheckLease(const TaskRecord& task, const std::string& worker_id,
                        int64_t now_unix_ms) {
  switch (task.state) {
    case TaskState::kLeased:
      break;
    case TaskState::kQueued:
      return absl::FailedPreconditionError(fmt::format(
          "task {} is not leased (queued: a lease that ended goes back to the queue); a result "
          "is accepted only from the worker holding a live lease",
          task.id));
    case TaskState::kDone:
      return absl::FailedPreconditionError(
          fmt::format("task {} is done: its result is already recorded", task.id));
    case TaskState::kCancelled:
      return absl::FailedPreconditionError(
          fmt::format("task {} was cancelled (its job was); the result is not wanted", task.id));
  }
  if (task.worker_id != worker_id)
    return absl::PermissionDeniedError(fmt::format(
        "task {} is leased to worker {}, not to {}: a worker reports only its own leases",
        task.id, task.worker_id, worker_id));
  if (task.lease_expires_unix_ms < now_unix_ms)
    return absl::FailedPreconditionError(fmt::format(
        "the lease of task {} ended {} ms ago; a result is accepted only under a live lease",
        task.id, now_unix_ms - task.lease_expires_unix_ms));
  return absl::OkStatus();
}

namespace storage_internal {
std::optional<JobState> ParseJobState(std::string_view name) { return Parse(kJobStates, name); }
std::optional<TaskState> ParseTaskState(std::string_view name) {
  return Parse(kTaskStates, name);
}
}  // namespace storage_internal

}  // namespace kforge
