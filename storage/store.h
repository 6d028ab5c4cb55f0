// Store: everything kforge keeps. Kernel variants, their evaluations, the best
// verified variant per (bucket, arch), jobs, tasks with leases, and workers.
//
// Two implementations: SqliteStore (the product: WAL, foreign keys, schema
// migrations, one transaction per logical change) and MemoryStore (tests).
// One typed test suite (storage/store_test.cc) runs against both.
//
// Thread-safe: every method may be called from any thread.
// Errors: NOT_FOUND for unknown ids, INVALID_ARGUMENT for malformed records,
// INTERNAL/UNAVAILABLE for database failures (the message names the operation).
// A call that fails changes nothing.
//
// Ids are a kind letter and a number ("v12", "j3", "t40", "w2"); an id that
// is not well formed names nothing, so looking it up is NOT_FOUND too. A
// record's id is assigned when empty; a caller may choose one instead
// (ALREADY_EXISTS when taken). Timestamps are unix ms: a method that takes
// `now` uses it; otherwise a zero timestamp in a record is filled from the
// store's clock.
//
// Paging: up to `limit` items (<= 0: 50; at most 1000). Pass `next_token`
// back for the next page; it is "" on the last page (never an empty page
// after a full one). Tokens are opaque; a malformed one is INVALID_ARGUMENT.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/outcome.h"
#include "core/shape.h"
#include "core/task_kind.h"
#include "core/timing.h"

namespace kforge {

struct VariantRecord {
  std::string id;             // assigned by the store ("v" + number) when empty
  std::string source;
  std::string source_hash;    // sha256 hex of source; computed by the store when empty
  std::string manifest_json;
  std::string origin;         // "template" | "model"
  std::string template_name;
  std::string knobs_json;
  std::string model;
  std::string prompt_hash;
  std::string prompt;         // model origin: the full prompt and answer
  std::string answer;
  std::string parent_id;
  std::string job_id;
  int64_t created_unix_ms = 0;
  // How a model-written variant came about (schema v6; "" / 0 on rows from
  // before and on template variants):
  //   kind             "fresh" (a new idea from a parent), "repair" (a fix
  //                    of parent_id, which failed), "sweep" (a knob setting
  //                    of a model-written kernel that declared knobs)
  //   attempt          repairs in its lineage before it (1: the first fix)
  //   normalized_hash  sha256 of the source without comments and runs of
  //                    whitespace (agent/normalize.h), for dedupe of
  //                    sources that differ only there
  //   provenance_json  the model call that wrote it: model, tokens, cost,
  //                    answer form (whole source or edits of a named
  //                    parent), inspirations shown (agent/model_proposer.h)
  std::string kind;
  int32_t attempt = 0;
  std::string normalized_hash;
  std::string provenance_json;
};

// One request to a model endpoint and what became of it (schema v6): the
// spend ledger (tokens, estimated cost) and the record of every attempt,
// refused ones included, with the source it started from.
struct ModelCallRecord {
  int64_t id = 0;             // assigned by the store
  std::string job_id;
  std::string bucket;
  std::string model;          // as the endpoint named it (or as configured)
  std::string purpose;        // "propose" | "repair"
  std::string parent_id;      // the source it was given: a variant id, "seed:<template>", or a draft handle
  int32_t attempt = 0;        // repairs in the lineage before this one
  std::string prompt_hash;
  std::string prompt;         // the messages sent (JSON)
  std::string answer;         // what came back ("" for an error)
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  double cost_usd = 0;        // estimated from the configured prices
  bool usage_estimated = false;  // no usage in the answer: ~4 bytes a token
  // "pending" (in flight: written when the request is sent, with the most
  // it may cost, so a crash cannot lose its spend), "candidate" (proposed),
  // "refused" (failed the checks before compiling), "duplicate" (a source
  // known already), "error" (no answer), "dropped" (answered after its
  // proposer closed), "lost" (pending when the server stopped: kept at its
  // reserved size)
  std::string outcome;
  std::string detail;         // why refused / the error
  int64_t created_unix_ms = 0;
};

// Sums over model calls (SumModelCalls).
struct ModelSpend {
  int64_t calls = 0;
  int64_t tokens = 0;         // prompt + completion, pending calls at their reserved size
  double cost_usd = 0;
  int64_t pending_tokens = 0;  // of `tokens`, those of calls still pending
};

struct EvaluationRecord {
  int64_t id = 0;  // assigned by the store
  std::string variant_id;
  std::string bucket;
  std::string arch;
  std::string job_id;
  std::string task_id;
  std::string worker_id;
  std::string gpu_name;
  std::string compute_capability;
  std::string driver_version;
  std::string nvrtc_version;
  std::string compile_options;
  std::string reference_version;
  Outcome outcome = Outcome::kCompiled;
  std::string message;        // compile log excerpt, crash reason, ...
  double compile_ms = 0;
  int32_t registers = 0;
  int32_t spill_bytes = 0;
  int32_t static_smem_bytes = 0;
  int32_t dynamic_smem_bytes = 0;
  double max_abs_error = 0;
  double rel_l2_error = 0;
  // Meaningful only when outcome == kVerified; samples_us kept from schema
  // v5 on (what the worker sent, in launch order).
  Timing timing;
  // RETIME: the incumbent's timing in the same run, its samples_us[i]
  // launched back to back with timing.samples_us[i]; the decision is
  // reproduced from the two (CompareTimings). Empty (samples 0) otherwise,
  // and on rows from before schema v5.
  Timing incumbent_timing;
  std::string cubin_hash;     // sha256 hex of the cubin, stored once (CompleteTask)
  int64_t created_unix_ms = 0;
  // The largest sizes the result was verified at (core/shape.h). Empty
  // (all 0) on rows stored before extents were (schema v3) and on results
  // that verified nothing.
  SizeExtent verified;
};

struct BestRecord {
  std::string bucket;
  std::string arch;
  std::string variant_id;
  // The evaluation that promoted it (a CONFIRM or RETIME report, or the
  // EVALUATE of a best from before CONFIRM existed): its cubin is what is
  // served.
  int64_t evaluation_id = 0;
  Timing timing;  // the promoting evaluation's (its samples are not copied here)
  // How `timing` was measured, as served (core/timing.h MeasuredAlone,
  // MeasuredAgainst): "retime: median of 24 paired ratios 1.074 (95% lower
  // bound 1.052) vs v3; median 1554.80 us", "confirm: median of 23
  // launches". "" on rows from before schema v5.
  std::string measured_by;
  int64_t updated_unix_ms = 0;
  // The sizes it may be served for; empty on rows from before schema v3.
  SizeExtent verified;
};

enum class JobState { kQueued, kRunning, kSucceeded, kFailed, kCancelled };

struct JobRecord {
  std::string id;             // assigned by the store ("j" + number) when empty
  std::string name;
  JobState state = JobState::kQueued;
  std::string proposer;       // "builtin" | "model"
  std::string spec_json;      // shapes and budget as submitted (JSON)
  std::string progress_json;  // per-shape progress and proposer state (JSON)
  int64_t tokens_used = 0;
  uint64_t seed = 0;
  std::string message;
  int64_t created_unix_ms = 0;
  int64_t updated_unix_ms = 0;
};

enum class TaskState { kQueued, kLeased, kDone, kCancelled };

// RETIME and CONFIRM decide which kernel a bucket serves ("promotion
// tasks"): they are leased before all others.
inline bool IsPromotion(TaskKind k) { return k == TaskKind::kRetime || k == TaskKind::kConfirm; }

// Which promotion tasks a LeaseTask may hand out: all; none of the leasing
// worker's own (its candidate is to be confirmed by another principal, see
// LeaseTask); or none at all (the worker cannot promote, and one that can is
// there).
enum class PromotionLease { kAny, kNotOwn, kNone };

struct TaskRecord {
  std::string id;             // assigned by the store ("t" + number) when empty
  std::string job_id;
  TaskKind kind = TaskKind::kEvaluate;
  std::string variant_id;
  std::string incumbent_variant_id;  // kRetime only
  std::string bucket;
  std::string arch;           // only workers compiling for this arch may lease it
  std::string shape_json;     // the concrete shape to evaluate on
  uint64_t seed = 0;
  TaskState state = TaskState::kQueued;
  std::string worker_id;
  int64_t lease_expires_unix_ms = 0;
  int32_t attempts = 0;       // leases handed out so far
  int64_t created_unix_ms = 0;
  // Promotion tasks: the EVALUATE evaluation that made the candidate a
  // contender and the worker that reported it. Leasing can keep the task
  // from that worker (LeaseTask), and the promotion compares cubins with it.
  std::string origin_worker_id;
  int64_t origin_evaluation_id = 0;
};

struct WorkerRecord {
  std::string id;             // assigned by the store ("w" + number) when empty
  std::string name;
  std::string arch;
  bool compile_only = false;
  std::string gpu_json;       // GPU name, cc, SMs, driver and NVRTC versions
  int64_t last_seen_unix_ms = 0;
  // SHA-256 hex of the session secret Register issued; "" for none (rows
  // from before sessions, which no call can act as). The secret itself is
  // never stored.
  std::string session_hash;
  // Who the worker is: the name of the worker credential that authenticated
  // it (server/auth.h), bound by the server, never declared by the worker.
  // Workers with one principal count as one worker where "another worker"
  // matters (PromotionLease::kNotOwn). "" for none: rows from before
  // principals (schema v4) until the server binds one, and workers of a
  // server without auth. At most 64 bytes of [A-Za-z0-9._-] (INVALID_ARGUMENT
  // otherwise): a name, never a secret.
  std::string principal;
  // The compute-sanitizer tools the worker gates promotion tasks with.
  std::vector<std::string> sanitizer_tools;
  // Archs beyond `arch` the worker compiles kCompile tasks for (what its
  // NVRTC supports): a CPU-only or GPU worker can screen candidates for an
  // arch it has no GPU of. Names as core/arch.h reads them (INVALID_ARGUMENT
  // otherwise); empty on rows from before schema v6.
  std::vector<std::string> compile_archs;
};

// What an accepted report changes, in one transaction (CompleteTask).
struct TaskCompletion {
  EvaluationRecord eval;
  // The compiled binary the worker reported; stored with the evaluation
  // under its SHA-256, which becomes eval.cubin_hash. Empty: none sent.
  std::string cubin;
  std::optional<BestRecord> new_best;
  // Tasks the result leads to (a CONFIRM or RETIME of its candidate),
  // enqueued with it so a crash cannot lose them.
  std::vector<TaskRecord> follow_ups;
};

struct CompletedTask {
  int64_t evaluation_id = 0;
  std::vector<std::string> follow_up_ids;  // in the order given
};

struct Page {
  int32_t limit = 50;
  std::string token;          // opaque; "" for the first page
};

template <typename T>
struct PageOf {
  std::vector<T> items;
  std::string next_token;     // "" when there are no more
};

class Store {
 public:
  virtual ~Store() = default;

  // Variants. PutVariant dedupes by source hash: storing a source that is
  // already there returns the existing id. INVALID_ARGUMENT when the source is
  // empty or a given source_hash is not its sha256.
  virtual absl::StatusOr<std::string> PutVariant(VariantRecord v) = 0;
  virtual absl::StatusOr<VariantRecord> GetVariant(const std::string& id) = 0;
  // Variants evaluated on `bucket` (all when empty), newest first.
  virtual absl::StatusOr<PageOf<VariantRecord>> ListVariants(const std::string& bucket,
                                                             const Page& page) = 0;
  // Oldest first.
  virtual absl::StatusOr<std::vector<EvaluationRecord>> ListEvaluations(
      const std::string& variant_id) = 0;

  // Stores a compiled binary by content hash (idempotent). INVALID_ARGUMENT
  // when `hash` is not the SHA-256 hex of `bytes`: a hash names its bytes,
  // so what is served under it is what was checked.
  virtual absl::Status PutCubin(const std::string& hash, const std::string& bytes) = 0;
  // DATA_LOSS when the stored bytes no longer match their hash (the file
  // was changed under the store): they are never returned.
  virtual absl::StatusOr<std::string> GetCubin(const std::string& hash) = 0;

  // Best verified variant per (bucket, arch). ListBest pages in (bucket,
  // arch) order; an empty `arch` lists every arch.
  virtual absl::StatusOr<BestRecord> GetBest(const std::string& bucket,
                                             const std::string& arch) = 0;
  virtual absl::StatusOr<PageOf<BestRecord>> ListBest(const std::string& arch,
                                                      const Page& page) = 0;

  // Records a worker's result for a task it holds a live lease on, in one
  // transaction: stores the cubin (when given), inserts the evaluation,
  // marks the task done, replaces the bucket's best when `new_best` is set
  // and enqueues the follow-ups. The lease is checked first (CheckLease) and
  // a report that fails it changes nothing: NOT_FOUND for an unknown task,
  // PERMISSION_DENIED when another worker holds it, FAILED_PRECONDITION when
  // it is not leased (queued, done, cancelled) or its lease ended before
  // `now_unix_ms`.
  //
  // The task is authoritative: eval's task, job and worker ids are set from
  // it; its variant, bucket and arch default to the task's. eval.cubin_hash
  // is the cubin's SHA-256 (INVALID_ARGUMENT when a given one differs);
  // without cubin bytes a given hash must name a stored cubin (NOT_FOUND).
  // Fields of `new_best` left empty default to the evaluation being
  // recorded (its id, variant, bucket, arch, timing, extent); a given
  // evaluation_id must be an evaluation of the best's variant
  // (INVALID_ARGUMENT otherwise). The replacement is unconditional: deciding
  // that it is faster is the caller's job (and two callers deciding at once
  // must serialise themselves). Follow-ups follow EnqueueTasks' rules; their
  // origin fields left empty default to the evaluation recorded and its
  // worker.
  virtual absl::StatusOr<CompletedTask> CompleteTask(const std::string& task_id,
                                                     const std::string& worker_id,
                                                     int64_t now_unix_ms,
                                                     TaskCompletion completion) = 0;

  // Jobs.
  virtual absl::StatusOr<std::string> CreateJob(JobRecord job) = 0;
  virtual absl::StatusOr<JobRecord> GetJob(const std::string& id) = 0;
  // Writes every field but id and created_unix_ms; updated_unix_ms is set
  // from the store's clock.
  virtual absl::Status UpdateJob(const JobRecord& job) = 0;
  virtual absl::StatusOr<PageOf<JobRecord>> ListJobs(const Page& page) = 0;  // newest first
  // Jobs in kQueued or kRunning, oldest first (for resuming after a restart).
  virtual absl::StatusOr<std::vector<JobRecord>> ListActiveJobs() = 0;

  // Tasks. EnqueueTasks stores all or none, returns the ids in order; each
  // task's job must exist (NOT_FOUND) and its arch be set (INVALID_ARGUMENT).
  // New tasks are queued: state and lease fields given are ignored.
  virtual absl::StatusOr<std::vector<std::string>> EnqueueTasks(
      std::vector<TaskRecord> tasks) = 0;
  virtual absl::StatusOr<TaskRecord> GetTask(const std::string& id) = 0;
  virtual absl::StatusOr<std::vector<TaskRecord>> ListTasks(
      const std::string& job_id) = 0;  // oldest first
  // Leases the oldest queued task this worker can run (arch match; a
  // compile-only worker only gets kCompile tasks; promotion tasks only as
  // `promotions` allows). Promotion tasks
  // (kRetime, kConfirm) go before all others: they decide which kernel a
  // bucket serves, and behind a long queue of evaluations they would wait
  // until the job's budget ran out. Otherwise jobs take turns: among jobs
  // with queued tasks, the one leased least recently goes first (a job
  // never leased from goes before all others). The lease ends at now + ttl;
  // attempts counts up. nullopt when nothing fits. INVALID_ARGUMENT for an
  // empty worker id or ttl <= 0.
  //
  // kNotOwn skips the promotion tasks whose origin_worker_id is `worker_id`
  // and, when the stored worker `worker_id` has a principal, those whose
  // origin worker (as stored now) has the same principal: a credential's
  // second registration is not another worker. An origin worker without a
  // principal, or one the store does not know, is told apart by id only.
  // Principals are read from the workers table at lease time (not copied
  // onto the task), so a principal bound later counts at once.
  virtual absl::StatusOr<std::optional<TaskRecord>> LeaseTask(const std::string& worker_id,
                                                              const std::string& arch,
                                                              bool compile_only,
                                                              int64_t now_unix_ms,
                                                              int64_t ttl_ms,
                                                              PromotionLease promotions) = 0;
  // Extends the leases of `task_ids` held by `worker_id` to now + ttl. Ids
  // not leased to that worker (unknown, requeued, cancelled, done) are
  // skipped: the worker learns of a lost lease from GetTask or CompleteTask.
  virtual absl::Status RenewLeases(const std::string& worker_id,
                                   const std::vector<std::string>& task_ids,
                                   int64_t now_unix_ms, int64_t ttl_ms) = 0;
  // Returns every leased task whose lease ended before `now` to the queue;
  // returns how many.
  virtual absl::StatusOr<int> RequeueExpired(int64_t now_unix_ms) = 0;
  // Cancels the queued and leased tasks of a job; returns the ids cancelled,
  // oldest first. The job's own state is the caller's to update.
  virtual absl::StatusOr<std::vector<std::string>> CancelTasks(const std::string& job_id) = 0;

  // Workers. UpsertWorker updates the worker named by `w.id` (NOT_FOUND when
  // unknown) or, when the id is empty, inserts a new one. A name is a label,
  // not an identity: two registrations under one name are two workers (an
  // identity is its session, see server/README.md). Returns the id.
  // INVALID_ARGUMENT for a session_hash that is not 64 hex digits, or one
  // another worker has, or a malformed principal.
  virtual absl::StatusOr<std::string> UpsertWorker(WorkerRecord w) = 0;
  virtual absl::StatusOr<std::vector<WorkerRecord>> ListWorkers() = 0;  // by id

  // Model calls (the spend ledger). AddModelCall assigns the id and fills a
  // zero created_unix_ms; INVALID_ARGUMENT for negative token counts or
  // cost, or an empty purpose or outcome. UpdateModelCall rewrites every
  // field of the call `call.id` names but its id and created_unix_ms
  // (NOT_FOUND when there is none; the same validation). ListModelCalls is
  // oldest first (all jobs when `job_id` is empty). SumModelCalls adds up
  // the calls of `job_id` (all jobs when empty) created at or after
  // `since_unix_ms`.
  virtual absl::StatusOr<int64_t> AddModelCall(ModelCallRecord call) = 0;
  virtual absl::Status UpdateModelCall(const ModelCallRecord& call) = 0;
  virtual absl::StatusOr<std::vector<ModelCallRecord>> ListModelCalls(
      const std::string& job_id) = 0;
  virtual absl::StatusOr<ModelSpend> SumModelCalls(const std::string& job_id,
                                                   int64_t since_unix_ms) = 0;

  // The database's own consistency check ("ok" when healthy; otherwise the
  // problems found, one per line). Not pure so that test doubles of Store
  // need not implement it: a store without on-disk state is always "ok".
  virtual absl::StatusOr<std::string> IntegrityCheck() { return std::string("ok"); }
  // Bytes the database takes on disk (for operators' metrics); 0 for a store
  // without on-disk state. Not pure for the same reason as IntegrityCheck.
  virtual absl::StatusOr<int64_t> DatabaseBytes() { return int64_t{0}; }
};

// Opens (creating and migrating as needed) the SQLite database at `path`.
// A missing file is created mode 600. FAILED_PRECONDITION when the file's
// schema is newer than this binary's, when it is not SQLite, or when it is
// empty or another application's (SqliteOptions::init allows those two);
// DATA_LOSS when it fails its integrity check. ":memory:" gives a private
// in-memory database. More in sqlite_store.h.
absl::StatusOr<std::unique_ptr<Store>> OpenSqliteStore(const std::string& path);
std::unique_ptr<Store> NewMemoryStore();

std::string_view JobStateName(JobState s);   // "queued", "running", ...
std::string_view TaskStateName(TaskState s);

// CompleteTask's lease rule, for callers that want to refuse a report
// before doing any work for it: OK when `worker_id` holds a lease on `task`
// that has not ended at `now_unix_ms`; otherwise the error CompleteTask
// would return, naming the task and what is wrong.
absl::Status CheckLease(const TaskRecord& task, const std::string& worker_id,
                        int64_t now_unix_ms);

}  // namespace kforge
