#include "storage/store_internal.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>

#include "core/arch.h"
#include "core/hash.h"
#include "core/status.h"

namespace kforge::storage_internal {
namespace {

std::optional<int64_t> ParsePositive(std::string_view digits) {
  int64_t n = 0;
  const char* end = digits.data() + digits.size();
  auto [ptr, ec] = std::from_chars(digits.data(), end, n);
  if (digits.empty() || ec != std::errc() || ptr != end || n <= 0) return std::nullopt;
  // from_chars accepts a leading '-' only; a leading '+' or zero would give
  // two spellings of one id, so they are rejected too.
  if (digits[0] == '0') return std::nullopt;
  return n;
}

}  // namespace

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string FormatId(char prefix, int64_t n) { return fmt::format("{}{}", prefix, n); }

std::optional<int64_t> ParseId(char prefix, std::string_view id) {
  if (id.size() < 2 || id[0] != prefix) return std::nullopt;
  return ParsePositive(id.substr(1));
}

absl::Status NotFound(std::string_view what, std::string_view id) {
  return absl::NotFoundError(fmt::format("{} '{}' not found", what, id));
}

absl::StatusOr<int64_t> ParsePageToken(std::string_view token) {
  if (token.empty()) return 0;
  std::optional<int64_t> n = ParsePositive(token);
  if (!n)
    return absl::InvalidArgumentError(fmt::format("page token '{}' is malformed", Excerpt(token)));
  return *n;
}

std::string BestToken(const BestRecord& best) {
  return fmt::format("{}|{}", best.bucket, best.arch);
}

absl::StatusOr<std::pair<std::string, std::string>> ParseBestToken(std::string_view token) {
  if (token.empty()) return std::pair<std::string, std::string>();
  size_t bar = token.rfind('|');
  if (bar == std::string_view::npos || bar == 0 || bar + 1 == token.size())
    return absl::InvalidArgumentError(fmt::format("page token '{}' is malformed", Excerpt(token)));
  return std::pair<std::string, std::string>(token.substr(0, bar), token.substr(bar + 1));
}

int32_t PageLimit(const Page& page) {
  if (page.limit <= 0) return kDefaultPageLimit;
  return page.limit > kMaxPageLimit ? kMaxPageLimit : page.limit;
}

absl::Status PrepareVariant(VariantRecord& v, int64_t now_ms) {
  if (v.source.empty()) return absl::InvalidArgumentError("variant: source is empty");
  std::string hash = Sha256Hex(v.source);
  if (v.source_hash.empty()) {
    v.source_hash = std::move(hash);
  } else if (v.source_hash != hash) {
    // A wrong hash would defeat dedupe and let two rows claim one source.
    return absl::InvalidArgumentError(
        fmt::format("variant: source_hash {} is not the sha256 of the source", v.source_hash));
  }
  if (!v.id.empty() && !ParseId('v', v.id))
    return absl::InvalidArgumentError(fmt::format("variant: id '{}' is malformed", Excerpt(v.id)));
  if (v.created_unix_ms == 0) v.created_unix_ms = now_ms;
  return absl::OkStatus();
}

absl::Status PrepareJob(JobRecord& job, int64_t now_ms) {
  if (!job.id.empty() && !ParseId('j', job.id))
    return absl::InvalidArgumentError(fmt::format("job: id '{}' is malformed", Excerpt(job.id)));
  if (job.created_unix_ms == 0) job.created_unix_ms = now_ms;
  if (job.updated_unix_ms == 0) job.updated_unix_ms = job.created_unix_ms;
  return absl::OkStatus();
}

absl::Status PrepareTask(TaskRecord& task, int64_t now_ms) {
  if (!task.id.empty() && !ParseId('t', task.id))
    return absl::InvalidArgumentError(fmt::format("task: id '{}' is malformed", Excerpt(task.id)));
  if (task.job_id.empty()) return absl::InvalidArgumentError("task: job_id is empty");
  // Leasing matches the arch exactly; a task without one could never run.
  if (task.arch.empty()) return absl::InvalidArgumentError("task: arch is empty");
  task.state = TaskState::kQueued;
  task.worker_id.clear();
  task.lease_expires_unix_ms = 0;
  task.attempts = 0;
  if (task.created_unix_ms == 0) task.created_unix_ms = now_ms;
  return absl::OkStatus();
}

absl::Status PrepareWorker(WorkerRecord& w, int64_t now_ms) {
  const bool hex = std::all_of(w.session_hash.begin(), w.session_hash.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
  if (!w.session_hash.empty() && (w.session_hash.size() != 64 || !hex))
    return absl::InvalidArgumentError("worker: session_hash is not a SHA-256 hex digest");
  for (const std::string& tool : w.sanitizer_tools) {
    // Stored comma-separated: a tool name is a plain word.
    if (tool.empty() || tool.find_first_not_of("abcdefghijklmnopqrstuvwxyz") != std::string::npos)
      return absl::InvalidArgumentError(
          fmt::format("worker: sanitizer tool '{}' is not a lower-case word", tool));
  }
  const bool name_chars =
      std::all_of(w.principal.begin(), w.principal.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '.' || c == '_' || c == '-';
      });
  if (w.principal.size() > 64 || !name_chars)
    return absl::InvalidArgumentError(
        "worker: principal is not a name of at most 64 letters, digits, '.', '_' or '-'");
  for (const std::string& arch : w.compile_archs) {
    // Stored comma-separated, and compared whole with task archs.
    if (!ParseArch(arch).ok())
      return absl::InvalidArgumentError(
          fmt::format("worker: compile arch '{}' is not an arch name like sm_90a", arch.substr(0, 32)));
  }
  if (w.last_seen_unix_ms == 0) w.last_seen_unix_ms = now_ms;
  return absl::OkStatus();
}

absl::Status PrepareModelCall(ModelCallRecord& call, int64_t now_ms) {
  if (call.prompt_tokens < 0 || call.completion_tokens < 0)
    return absl::InvalidArgumentError("model call: token counts must not be negative");
  // NaN compares false both ways: refuse it explicitly, a ledger sum must be a number.
  if (!(call.cost_usd >= 0)) return absl::InvalidArgumentError("model call: cost must be >= 0");
  if (call.purpose.empty()) return absl::InvalidArgumentError("model call: purpose is empty");
  if (call.outcome.empty()) return absl::InvalidArgumentError("model call: outcome is empty");
  if (call.created_unix_ms == 0) call.created_unix_ms = now_ms;
  call.id = 0;
  return absl::OkStatus();
}

bool CountsFor(const ModelCallRecord& call, const std::string& job_id, int64_t since_unix_ms) {
  return (job_id.empty() || call.job_id == job_id) && call.created_unix_ms >= since_unix_ms;
}

absl::Status CheckCubinHash(const std::string& hash, const std::string& bytes) {
  if (hash.empty()) return absl::InvalidArgumentError("cubin: hash is empty");
  if (Sha256Hex(bytes) != hash)
    return absl::InvalidArgumentError(
        fmt::format("cubin: {} is not the sha256 of the {} bytes given", hash, bytes.size()));
  return absl::OkStatus();
}

absl::Status PrepareCubin(const std::string& bytes, EvaluationRecord& eval) {
  if (bytes.empty()) return absl::OkStatus();
  std::string hash = Sha256Hex(bytes);
  if (!eval.cubin_hash.empty() && eval.cubin_hash != hash)
    return absl::InvalidArgumentError(fmt::format(
        "evaluation: cubin_hash {} is not the sha256 of the cubin reported", eval.cubin_hash));
  eval.cubin_hash = std::move(hash);
  return absl::OkStatus();
}

void PrepareEvaluation(const TaskRecord& task, const std::string& worker_id, int64_t now_ms,
                       EvaluationRecord& eval) {
  eval.id = 0;
  eval.task_id = task.id;
  eval.job_id = task.job_id;
  eval.worker_id = worker_id;
  if (eval.variant_id.empty()) eval.variant_id = task.variant_id;
  if (eval.bucket.empty()) eval.bucket = task.bucket;
  if (eval.arch.empty()) eval.arch = task.arch;
  if (eval.created_unix_ms == 0) eval.created_unix_ms = now_ms;
}

void PrepareBest(const EvaluationRecord& eval, int64_t now_ms, BestRecord& best) {
  if (best.bucket.empty()) best.bucket = eval.bucket;
  if (best.arch.empty()) best.arch = eval.arch;
  if (best.variant_id.empty()) best.variant_id = eval.variant_id;
  if (best.evaluation_id == 0) best.evaluation_id = eval.id;
  if (best.timing.samples == 0 && best.timing.median_us == 0) best.timing = eval.timing;
  if (best.verified.empty()) best.verified = eval.verified;
  if (best.updated_unix_ms == 0) best.updated_unix_ms = now_ms;
  best.timing.samples_us.clear();  // they stay with the evaluation
}

void PrepareFollowUps(const EvaluationRecord& eval, std::vector<TaskRecord>& follow_ups) {
  for (TaskRecord& t : follow_ups) {
    if (t.origin_evaluation_id == 0) t.origin_evaluation_id = eval.id;
    if (t.origin_worker_id.empty()) t.origin_worker_id = eval.worker_id;
  }
}

}  // namespace kforge::storage_internal
