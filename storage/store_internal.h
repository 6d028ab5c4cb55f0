// Rules shared by every Store implementation, so that SqliteStore and
// MemoryStore cannot drift apart on validation, defaults or id formats.
// Internal to storage/: nothing outside this folder includes it.
//
// Thread-safe: pure functions (NowUnixMs reads the system clock).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/store.h"

namespace kforge::storage_internal {

inline constexpr int32_t kDefaultPageLimit = 50;
inline constexpr int32_t kMaxPageLimit = 1000;

int64_t NowUnixMs();

// Ids are a one-letter kind ('v', 'j', 't', 'w') and a positive number.
std::string FormatId(char prefix, int64_t n);
// nullopt when `id` is not a well-formed id of that kind (such an id can
// name nothing, so callers answer NOT_FOUND).
std::optional<int64_t> ParseId(char prefix, std::string_view id);
absl::Status NotFound(std::string_view what, std::string_view id);

// Paging: the token is the number of the last row returned, base 10; the
// next page starts after it. "" means the first page.
absl::StatusOr<int64_t> ParsePageToken(std::string_view token);
// Best rows page in (bucket, arch) order; their token is "bucket|arch" of
// the last row returned (neither a bucket id nor an arch contains '|').
std::string BestToken(const BestRecord& best);
absl::StatusOr<std::pair<std::string, std::string>> ParseBestToken(std::string_view token);
// Page sizes <= 0 mean the default; sizes above the maximum are capped.
int32_t PageLimit(const Page& page);

std::optional<JobState> ParseJobState(std::string_view name);
std::optional<TaskState> ParseTaskState(std::string_view name);

// Validates `v` and fills the store's defaults: the source hash (checked
// when given), the creation time. INVALID_ARGUMENT on a malformed record.
absl::Status PrepareVariant(VariantRecord& v, int64_t now_ms);
absl::Status PrepareJob(JobRecord& job, int64_t now_ms);
// Also resets the lease fields: a new task is always queued and unleased.
absl::Status PrepareTask(TaskRecord& task, int64_t now_ms);
absl::Status PrepareWorker(WorkerRecord& w, int64_t now_ms);
absl::Status PrepareModelCall(ModelCallRecord& call, int64_t now_ms);
// Whether a call counts for SumModelCalls(job_id, since).
bool CountsFor(const ModelCallRecord& call, const std::string& job_id, int64_t since_unix_ms);

// PutCubin's rule: INVALID_ARGUMENT unless `hash` is the SHA-256 hex of
// `bytes`.
absl::Status CheckCubinHash(const std::string& hash, const std::string& bytes);
// CompleteTask's rule for the reported cubin: with bytes, eval.cubin_hash
// becomes their SHA-256 (INVALID_ARGUMENT when a given hash differs).
absl::Status PrepareCubin(const std::string& bytes, EvaluationRecord& eval);

// CompleteTask's rules for what the worker reported: task, worker and job
// come from the lease; variant, bucket and arch default to the task's.
void PrepareEvaluation(const TaskRecord& task, const std::string& worker_id, int64_t now_ms,
                       EvaluationRecord& eval);
// The new best defaults to the evaluation just recorded (its id, variant,
// bucket, arch, timing and extent).
void PrepareBest(const EvaluationRecord& eval, int64_t now_ms, BestRecord& best);
// Follow-ups of a completion name the evaluation just recorded (and its
// worker) as their origin unless they name another.
void PrepareFollowUps(const EvaluationRecord& eval, std::vector<TaskRecord>& follow_ups);

}  // namespace kforge::storage_internal
