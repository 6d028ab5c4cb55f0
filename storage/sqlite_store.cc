// SqliteStore: the Store contract on one SQLite database file.
//
// Durability: WAL journal with synchronous=FULL, so a call that returned OK
// survives a crash of the process and a loss of power. Each logical change is
// one transaction (BEGIN IMMEDIATE, so a transaction that will write takes
// the write lock up front and never fails half-way on a lock upgrade).
//
// Concurrency: one connection, guarded by one mutex; see SqliteStore::mu_.
#include "storage/sqlite_store.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sqlite3.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "core/hash.h"
#include "storage/store_internal.h"

namespace kforge {
namespace {

using namespace storage_internal;  // NOLINT: this file is its implementation

// PRAGMA application_id of a kforge database ("kfdb"): tells it apart from
// another application's SQLite file. Databases from before it have 0 and
// are recognised by their schema_version table.
constexpr int64_t kApplicationId = 0x6b666462;

// Version 1: the initial schema. Ids are INTEGER rowids (shown to callers
// as "v12", "j3", ...). Foreign keys are INTEGER columns; references that
// are kept for the record only (a variant's parent and job, an evaluation's
// job, task and worker) are stored as the id text, without a constraint, so
// history survives whatever happens to what it mentions.
constexpr std::string_view kSchemaV1 = R"sql(
CREATE TABLE variants (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  source TEXT NOT NULL,
  source_hash TEXT NOT NULL UNIQUE,
  manifest TEXT NOT NULL,
  origin TEXT NOT NULL,
  template TEXT NOT NULL,
  knobs TEXT NOT NULL,
  model TEXT NOT NULL,
  prompt_hash TEXT NOT NULL,
  prompt TEXT NOT NULL,
  answer TEXT NOT NULL,
  parent TEXT NOT NULL,
  job TEXT NOT NULL,
  created INTEGER NOT NULL
);
CREATE TABLE cubins (
  hash TEXT PRIMARY KEY,
  bytes BLOB NOT NULL
);
CREATE TABLE evaluations (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  variant INTEGER NOT NULL REFERENCES variants(id),
  bucket TEXT NOT NULL,
  arch TEXT NOT NULL,
  job TEXT NOT NULL,
  task TEXT NOT NULL,
  worker TEXT NOT NULL,
  gpu_name TEXT NOT NULL,
  compute_capability TEXT NOT NULL,
  driver_version TEXT NOT NULL,
  nvrtc_version TEXT NOT NULL,
  compile_options TEXT NOT NULL,
  reference_version TEXT NOT NULL,
  outcome TEXT NOT NULL,
  message TEXT NOT NULL,
  compile_ms REAL NOT NULL,
  registers INTEGER NOT NULL,
  spill_bytes INTEGER NOT NULL,
  static_smem_bytes INTEGER NOT NULL,
  dynamic_smem_bytes INTEGER NOT NULL,
  max_abs_error REAL NOT NULL,
  rel_l2_error REAL NOT NULL,
  median_us REAL NOT NULL,
  min_us REAL NOT NULL,
  max_us REAL NOT NULL,
  samples INTEGER NOT NULL,
  cubin_hash TEXT NOT NULL,
  created INTEGER NOT NULL
);
CREATE INDEX evaluations_by_variant ON evaluations(variant);
CREATE INDEX evaluations_by_bucket ON evaluations(bucket, variant);
CREATE TABLE best (
  bucket TEXT NOT NULL,
  arch TEXT NOT NULL,
  variant INTEGER NOT NULL REFERENCES variants(id),
  evaluation INTEGER NOT NULL REFERENCES evaluations(id),
  median_us REAL NOT NULL,
  min_us REAL NOT NULL,
  max_us REAL NOT NULL,
  samples INTEGER NOT NULL,
  updated INTEGER NOT NULL,
  PRIMARY KEY (bucket, arch)
);
CREATE TABLE jobs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL,
  state TEXT NOT NULL
    CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
  proposer TEXT NOT NULL,
  spec TEXT NOT NULL,
  progress TEXT NOT NULL,
  tokens_used INTEGER NOT NULL,
  seed INTEGER NOT NULL,
  message TEXT NOT NULL,
  created INTEGER NOT NULL,
  updated INTEGER NOT NULL,
  -- Turn order for leasing: set from a counter each time one of the job's
  -- tasks is leased; the job with the smallest value goes next.
  lease_seq INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX jobs_by_state ON jobs(state);
CREATE INDEX jobs_by_lease_seq ON jobs(lease_seq);
CREATE TABLE tasks (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  job INTEGER NOT NULL REFERENCES jobs(id),
  kind TEXT NOT NULL CHECK (kind IN ('evaluate', 'retime', 'compile')),
  variant TEXT NOT NULL,
  incumbent TEXT NOT NULL,
  bucket TEXT NOT NULL,
  arch TEXT NOT NULL,
  shape TEXT NOT NULL,
  seed INTEGER NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('queued', 'leased', 'done', 'cancelled')),
  worker TEXT NOT NULL,
  lease_expires INTEGER NOT NULL,
  attempts INTEGER NOT NULL,
  created INTEGER NOT NULL
);
CREATE INDEX tasks_by_state ON tasks(state, arch);
CREATE INDEX tasks_by_job ON tasks(job);
CREATE TABLE workers (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL,
  arch TEXT NOT NULL,
  compile_only INTEGER NOT NULL,
  gpu TEXT NOT NULL,
  last_seen INTEGER NOT NULL
);
CREATE UNIQUE INDEX workers_by_name ON workers(name) WHERE name <> '';
)sql";

// Append new versions here; never edit a released one (databases in the
// field have already run it). Each runs inside a transaction with foreign
// keys enforced (the pragma cannot change inside one), so a migration that
// rebuilds a table must copy rows in an order that keeps references valid.
// v2: timing quartiles, for the re-timing rule's spread (interquartile
// range). Rows from v1 keep 0, which Timing::Spread reads as unknown.
constexpr std::string_view kSchemaV2 = R"sql(
ALTER TABLE evaluations ADD COLUMN p25_us REAL NOT NULL DEFAULT 0;
ALTER TABLE evaluations ADD COLUMN p75_us REAL NOT NULL DEFAULT 0;
ALTER TABLE best ADD COLUMN p25_us REAL NOT NULL DEFAULT 0;
ALTER TABLE best ADD COLUMN p75_us REAL NOT NULL DEFAULT 0;
)sql";

// v3: a worker's report is a claim checked against what the server knows.
//  - workers: the SHA-256 of the session secret issued at Register (rows
//    from before have none, so no call can act as them: such a worker
//    registers again) and the sanitizer tools it gates with. Names stop
//    being unique: a name is a label, a session is an identity.
//  - tasks: kind 'confirm' (SQLite cannot change a CHECK constraint, so the
//    table is rebuilt; no table references it, its ids and AUTOINCREMENT
//    counter are kept) and, for promotion tasks, the worker and evaluation
//    that made the candidate a contender.
//  - evaluations and best: the sizes a result was verified at; 0 on old
//    rows (see KernelCache for what an old best serves).
constexpr std::string_view kSchemaV3 = R"sql(
ALTER TABLE workers ADD COLUMN session_hash TEXT NOT NULL DEFAULT '';
ALTER TABLE workers ADD COLUMN sanitizer_tools TEXT NOT NULL DEFAULT '';
DROP INDEX workers_by_name;
CREATE INDEX workers_by_name ON workers(name);
CREATE UNIQUE INDEX workers_by_session ON workers(session_hash) WHERE session_hash <> '';

CREATE TABLE tasks_v3 (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  job INTEGER NOT NULL REFERENCES jobs(id),
  kind TEXT NOT NULL CHECK (kind IN ('evaluate', 'retime', 'compile', 'confirm')),
  variant TEXT NOT NULL,
  incumbent TEXT NOT NULL,
  bucket TEXT NOT NULL,
  arch TEXT NOT NULL,
  shape TEXT NOT NULL,
  seed INTEGER NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('queued', 'leased', 'done', 'cancelled')),
  worker TEXT NOT NULL,
  lease_expires INTEGER NOT NULL,
  attempts INTEGER NOT NULL,
  created INTEGER NOT NULL,
  origin_worker TEXT NOT NULL DEFAULT '',
  origin_evaluation INTEGER NOT NULL DEFAULT 0
);
INSERT INTO tasks_v3 (id, job, kind, variant, incumbent, bucket, arch, shape, seed, state, worker,
                      lease_expires, attempts, created)
  SELECT id, job, kind, variant, incumbent, bucket, arch, shape, seed, state, worker,
         lease_expires, attempts, created FROM tasks;
DELETE FROM sqlite_sequence WHERE name = 'tasks_v3';
INSERT INTO sqlite_sequence (name, seq) SELECT 'tasks_v3', seq FROM sqlite_sequence WHERE name = 'tasks';
DROP TABLE tasks;
ALTER TABLE tasks_v3 RENAME TO tasks;
CREATE INDEX tasks_by_state ON tasks(state, arch);
CREATE INDEX tasks_by_job ON tasks(job);

ALTER TABLE evaluations ADD COLUMN verified_batch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE evaluations ADD COLUMN verified_max_len_q INTEGER NOT NULL DEFAULT 0;
ALTER TABLE evaluations ADD COLUMN verified_max_len_k INTEGER NOT NULL DEFAULT 0;
ALTER TABLE evaluations ADD COLUMN verified_total_q INTEGER NOT NULL DEFAULT 0;
ALTER TABLE evaluations ADD COLUMN verified_total_k INTEGER NOT NULL DEFAULT 0;
ALTER TABLE best ADD COLUMN verified_batch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE best ADD COLUMN verified_max_len_q INTEGER NOT NULL DEFAULT 0;
ALTER TABLE best ADD COLUMN verified_max_len_k INTEGER NOT NULL DEFAULT 0;
ALTER TABLE best ADD COLUMN verified_total_q INTEGER NOT NULL DEFAULT 0;
ALTER TABLE best ADD COLUMN verified_total_k INTEGER NOT NULL DEFAULT 0;
)sql";

// v4: a worker's principal, the name of the credential it authenticated
// with (store.h WorkerRecord::principal). Rows from before get '' (none):
// the server binds one at the worker's next authenticated call, and until
// then the worker is told apart by id only, as before.
constexpr std::string_view kSchemaV4 = R"sql(
ALTER TABLE workers ADD COLUMN principal TEXT NOT NULL DEFAULT '';
CREATE INDEX workers_by_principal ON workers(principal);
)sql";

// v5: every timed launch (core/timing.h EncodeSamples, launch order), the
// incumbent's timing of a RETIME (its samples paired with the candidate's),
// and how a best's figure was measured. Rows from before keep what they had
// and get '' / 0: no samples, so their comparisons use the unpaired rule.
constexpr std::string_view kSchemaV5 = R"sql(
ALTER TABLE evaluations ADD COLUMN samples_us TEXT NOT NULL DEFAULT '';
ALTER TABLE evaluations ADD COLUMN incumbent_median_us REAL NOT NULL DEFAULT 0;
ALTER TABLE evaluations ADD COLUMN incumbent_min_us REAL NOT NULL DEFAULT 0;
ALTER TABLE evaluations ADD COLUMN incumbent_max_us REAL NOT NULL DEFAULT 0;
ALTER TABLE evaluations ADD COLUMN incumbent_samples INTEGER NOT NULL DEFAULT 0;
ALTER TABLE evaluations ADD COLUMN incumbent_p25_us REAL NOT NULL DEFAULT 0;
ALTER TABLE evaluations ADD COLUMN incumbent_p75_us REAL NOT NULL DEFAULT 0;
ALTER TABLE evaluations ADD COLUMN incumbent_samples_us TEXT NOT NULL DEFAULT '';
ALTER TABLE best ADD COLUMN measured_by TEXT NOT NULL DEFAULT '';
)sql";

// v6: the archs a worker compiles compile-only tasks for beyond its own
// (store.h WorkerRecord::compile_archs), comma-separated. Rows from before
// get '' (none): such a worker takes its own arch's tasks, as before.
constexpr std::string_view kSchemaV6 = R"sql(
ALTER TABLE workers ADD COLUMN compile_archs TEXT NOT NULL DEFAULT '';
)sql";

// v7: the model loop's provenance and spend. Variants say how a model
// wrote them (a fresh idea, a repair of their parent, a knob setting of a
// model-written kernel), which repair attempt they are, their normalized
// source hash (comment/whitespace-only changes are duplicates) and the call
// that produced them. model_calls is the ledger of every request to a model,
// refused answers included: spend limits are summed from it, so they hold
// across restarts. Rows from before keep everything and read '' / 0.
constexpr std::string_view kSchemaV7 = R"sql(
ALTER TABLE variants ADD COLUMN kind TEXT NOT NULL DEFAULT '';
ALTER TABLE variants ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0;
ALTER TABLE variants ADD COLUMN normalized_hash TEXT NOT NULL DEFAULT '';
ALTER TABLE variants ADD COLUMN provenance TEXT NOT NULL DEFAULT '';
CREATE INDEX variants_by_normalized_hash ON variants(normalized_hash) WHERE normalized_hash <> '';
CREATE TABLE model_calls (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  job TEXT NOT NULL,
  bucket TEXT NOT NULL,
  model TEXT NOT NULL,
  purpose TEXT NOT NULL,
  parent TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  prompt_hash TEXT NOT NULL,
  prompt TEXT NOT NULL,
  answer TEXT NOT NULL,
  prompt_tokens INTEGER NOT NULL,
  completion_tokens INTEGER NOT NULL,
  cost_usd REAL NOT NULL,
  usage_estimated INTEGER NOT NULL,
  outcome TEXT NOT NULL,
  detail TEXT NOT NULL,
  created INTEGER NOT NULL
);
CREATE INDEX model_calls_by_job ON model_calls(job, created);
CREATE INDEX model_calls_by_created ON model_calls(created);
)sql";

constexpr Migration kMigrations[] = {
    {1, "initial schema", kSchemaV1},
    {2, "timing quartiles", kSchemaV2},
    {3, "worker sessions, CONFIRM tasks, verified extents", kSchemaV3},
    {4, "worker principals", kSchemaV4},
    {5, "timing samples, RETIME incumbent timings, how a best was measured", kSchemaV5},
    {6, "worker compile archs", kSchemaV6},
    {7, "model provenance of variants, model call ledger", kSchemaV7},
};

// ---------------------------------------------------------------------------
// A thin layer over the C API: errors as Status, statements as RAII handles.

absl::Status SqlError(sqlite3* db, int rc, std::string_view op) {
  std::string msg = fmt::format("{}: {} (sqlite {})", op,
                                db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc), rc);
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_FULL:
    case SQLITE_CANTOPEN:
      // Another process holds the lock, the disk is full, the file is not
      // reachable: worth retrying later, not a bug.
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// A value bound as SQL NULL when absent (lets AUTOINCREMENT pick the id).
using MaybeInt = std::optional<int64_t>;
struct Blob {
  std::string_view bytes;
};

// A prepared statement and whether a Stmt is using it: one statement cannot
// serve two uses at once (the second would rebind the first's parameters).
struct CachedStmt {
  sqlite3_stmt* stmt = nullptr;
  bool in_use = false;
};

// A cached prepared statement in use. Binds parameters 1..N in order;
// resets the statement when it goes out of scope, so the cache can hand it
// out again. Must not outlive the connection it came from.
class Stmt {
 public:
  Stmt(sqlite3* db, CachedStmt* cached, std::string_view op)
      : db_(db), cached_(cached), stmt_(cached->stmt), op_(op) {
    cached_->in_use = true;
  }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  Stmt(Stmt&& o) noexcept
      : db_(o.db_),
        cached_(std::exchange(o.cached_, nullptr)),
        stmt_(std::exchange(o.stmt_, nullptr)),
        op_(o.op_),
        status_(std::move(o.status_)),
        next_param_(o.next_param_) {}
  ~Stmt() {
    if (stmt_ != nullptr) {
      sqlite3_reset(stmt_);
      sqlite3_clear_bindings(stmt_);
      cached_->in_use = false;
    }
  }

  template <typename... Args>
  Stmt& Bind(const Args&... args) {
    (BindOne(args), ...);
    return *this;
  }

  // true: a row is ready to read; false: the statement has finished.
  absl::StatusOr<bool> Next() {
    if (!status_.ok()) return status_;
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqlError(db_, rc, op_);
  }

  // Runs a statement that returns no rows.
  absl::Status Run() {
    absl::StatusOr<bool> row = Next();
    if (!row.ok()) return row.status();
    return absl::OkStatus();
  }

  int64_t Int(int col) { return sqlite3_column_int64(stmt_, col); }
  double Real(int col) { return sqlite3_column_double(stmt_, col); }
  std::string Text(int col) {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    if (p == nullptr) return {};
    return std::string(reinterpret_cast<const char*>(p),
                       static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
  }
  std::string BlobAt(int col) {
    const void* p = sqlite3_column_blob(stmt_, col);
    if (p == nullptr) return {};
    return std::string(static_cast<const char*>(p),
                       static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
  }

 private:
  void Check(int rc) {
    if (rc != SQLITE_OK && status_.ok()) status_ = SqlError(db_, rc, op_);
  }
  void BindOne(int64_t v) { Check(sqlite3_bind_int64(stmt_, next_param_++, v)); }
  void BindOne(int32_t v) { BindOne(static_cast<int64_t>(v)); }
  void BindOne(uint64_t v) { BindOne(static_cast<int64_t>(v)); }  // seeds: bits kept
  void BindOne(bool v) { BindOne(static_cast<int64_t>(v ? 1 : 0)); }
  void BindOne(double v) { Check(sqlite3_bind_double(stmt_, next_param_++, v)); }
  void BindOne(const MaybeInt& v) {
    if (v) {
      BindOne(*v);
    } else {
      Check(sqlite3_bind_null(stmt_, next_param_++));
    }
  }
  void BindOne(std::string_view v) {
    Check(sqlite3_bind_text64(stmt_, next_param_++, v.data(), v.size(), SQLITE_TRANSIENT,
                              SQLITE_UTF8));
  }
  void BindOne(const std::string& v) { BindOne(std::string_view(v)); }
  void BindOne(const char* v) { BindOne(std::string_view(v)); }
  void BindOne(const Blob& v) {
    Check(sqlite3_bind_blob64(stmt_, next_param_++, v.bytes.data(), v.bytes.size(),
                              SQLITE_TRANSIENT));
  }

  sqlite3* db_;
  CachedStmt* cached_;
  sqlite3_stmt* stmt_;
  std::string_view op_;
  absl::Status status_;
  int next_param_ = 1;
};

// Reads consecutive columns of the current row.
class Cols {
 public:
  explicit Cols(Stmt& s) : s_(s) {}
  int64_t Int() { return s_.Int(i_++); }
  int32_t Int32() { return static_cast<int32_t>(s_.Int(i_++)); }
  double Real() { return s_.Real(i_++); }
  std::string Text() { return s_.Text(i_++); }
  std::string Id(char prefix) { return FormatId(prefix, s_.Int(i_++)); }
  SizeExtent Extent() {
    SizeExtent e;
    e.batch = Int();
    e.max_len_q = Int();
    e.max_len_k = Int();
    e.total_q = Int();
    e.total_k = Int();
    return e;
  }

 private:
  Stmt& s_;
  int i_ = 0;
};

// ---------------------------------------------------------------------------
// Row mappings: the column lists and readers kept side by side.

constexpr std::string_view kVariantCols =
    "id, source, source_hash, manifest, origin, template, knobs, model, prompt_hash, prompt, "
    "answer, parent, job, created, kind, attempt, normalized_hash, provenance";

VariantRecord ReadVariant(Stmt& s) {
  Cols c(s);
  VariantRecord v;
  v.id = c.Id('v');
  v.source = c.Text();
  v.source_hash = c.Text();
  v.manifest_json = c.Text();
  v.origin = c.Text();
  v.template_name = c.Text();
  v.knobs_json = c.Text();
  v.model = c.Text();
  v.prompt_hash = c.Text();
  v.prompt = c.Text();
  v.answer = c.Text();
  v.parent_id = c.Text();
  v.job_id = c.Text();
  v.created_unix_ms = c.Int();
  v.kind = c.Text();
  v.attempt = c.Int32();
  v.normalized_hash = c.Text();
  v.provenance_json = c.Text();
  return v;
}

constexpr std::string_view kModelCallCols =
    "id, job, bucket, model, purpose, parent, attempt, prompt_hash, prompt, answer, "
    "prompt_tokens, completion_tokens, cost_usd, usage_estimated, outcome, detail, created";

ModelCallRecord ReadModelCall(Stmt& s) {
  Cols c(s);
  ModelCallRecord m;
  m.id = c.Int();
  m.job_id = c.Text();
  m.bucket = c.Text();
  m.model = c.Text();
  m.purpose = c.Text();
  m.parent_id = c.Text();
  m.attempt = c.Int32();
  m.prompt_hash = c.Text();
  m.prompt = c.Text();
  m.answer = c.Text();
  m.prompt_tokens = c.Int();
  m.completion_tokens = c.Int();
  m.cost_usd = c.Real();
  m.usage_estimated = c.Int() != 0;
  m.outcome = c.Text();
  m.detail = c.Text();
  m.created_unix_ms = c.Int();
  return m;
}

constexpr std::string_view kEvaluationCols =
    "id, variant, bucket, arch, job, task, worker, gpu_name, compute_capability, "
    "driver_version, nvrtc_version, compile_options, reference_version, outcome, message, "
    "compile_ms, registers, spill_bytes, static_smem_bytes, dynamic_smem_bytes, "
    "max_abs_error, rel_l2_error, median_us, min_us, max_us, samples, cubin_hash, created, "
    "p25_us, p75_us, verified_batch, verified_max_len_q, verified_max_len_k, verified_total_q, "
    "verified_total_k, samples_us, incumbent_median_us, incumbent_min_us, incumbent_max_us, "
    "incumbent_samples, incumbent_p25_us, incumbent_p75_us, incumbent_samples_us";

absl::StatusOr<EvaluationRecord> ReadEvaluation(Stmt& s) {
  Cols c(s);
  EvaluationRecord e;
  e.id = c.Int();
  e.variant_id = c.Id('v');
  e.bucket = c.Text();
  e.arch = c.Text();
  e.job_id = c.Text();
  e.task_id = c.Text();
  e.worker_id = c.Text();
  e.gpu_name = c.Text();
  e.compute_capability = c.Text();
  e.driver_version = c.Text();
  e.nvrtc_version = c.Text();
  e.compile_options = c.Text();
  e.reference_version = c.Text();
  std::string outcome = c.Text();
  std::optional<Outcome> parsed = ParseOutcome(outcome);
  if (!parsed)
    return absl::InternalError(fmt::format("evaluation {}: unknown outcome '{}'", e.id, outcome));
  e.outcome = *parsed;
  e.message = c.Text();
  e.compile_ms = c.Real();
  e.registers = c.Int32();
  e.spill_bytes = c.Int32();
  e.static_smem_bytes = c.Int32();
  e.dynamic_smem_bytes = c.Int32();
  e.max_abs_error = c.Real();
  e.rel_l2_error = c.Real();
  e.timing.median_us = c.Real();
  e.timing.min_us = c.Real();
  e.timing.max_us = c.Real();
  e.timing.samples = c.Int32();
  e.cubin_hash = c.Text();
  e.created_unix_ms = c.Int();
  e.timing.p25_us = c.Real();
  e.timing.p75_us = c.Real();
  e.verified = c.Extent();
  absl::StatusOr<std::vector<double>> samples = DecodeSamples(c.Text());
  if (!samples.ok())
    return absl::InternalError(fmt::format("evaluation {}: {}", e.id, std::string(samples.status().message())));
  e.timing.samples_us = *std::move(samples);
  e.incumbent_timing.median_us = c.Real();
  e.incumbent_timing.min_us = c.Real();
  e.incumbent_timing.max_us = c.Real();
  e.incumbent_timing.samples = c.Int32();
  e.incumbent_timing.p25_us = c.Real();
  e.incumbent_timing.p75_us = c.Real();
  samples = DecodeSamples(c.Text());
  if (!samples.ok())
    return absl::InternalError(fmt::format("evaluation {}: incumbent {}", e.id,
                                           std::string(samples.status().message())));
  e.incumbent_timing.samples_us = *std::move(samples);
  return e;
}

constexpr std::string_view kBestCols =
    "bucket, arch, variant, evaluation, median_us, min_us, max_us, samples, updated, p25_us, "
    "p75_us, verified_batch, verified_max_len_q, verified_max_len_k, verified_total_q, "
    "verified_total_k, measured_by";

BestRecord ReadBest(Stmt& s) {
  Cols c(s);
  BestRecord b;
  b.bucket = c.Text();
  b.arch = c.Text();
  b.variant_id = c.Id('v');
  b.evaluation_id = c.Int();
  b.timing.median_us = c.Real();
  b.timing.min_us = c.Real();
  b.timing.max_us = c.Real();
  b.timing.samples = c.Int32();
  b.updated_unix_ms = c.Int();
  b.timing.p25_us = c.Real();
  b.timing.p75_us = c.Real();
  b.verified = c.Extent();
  b.measured_by = c.Text();
  return b;
}

constexpr std::string_view kJobCols =
    "id, name, state, proposer, spec, progress, tokens_used, seed, message, created, updated";

absl::StatusOr<JobRecord> ReadJob(Stmt& s) {
  Cols c(s);
  JobRecord j;
  j.id = c.Id('j');
  j.name = c.Text();
  std::string state = c.Text();
  std::optional<JobState> parsed = ParseJobState(state);
  if (!parsed) return absl::InternalError(fmt::format("job {}: unknown state '{}'", j.id, state));
  j.state = *parsed;
  j.proposer = c.Text();
  j.spec_json = c.Text();
  j.progress_json = c.Text();
  j.tokens_used = c.Int();
  j.seed = static_cast<uint64_t>(c.Int());
  j.message = c.Text();
  j.created_unix_ms = c.Int();
  j.updated_unix_ms = c.Int();
  return j;
}

constexpr std::string_view kTaskCols =
    "id, job, kind, variant, incumbent, bucket, arch, shape, seed, state, worker, "
    "lease_expires, attempts, created, origin_worker, origin_evaluation";

absl::StatusOr<TaskRecord> ReadTask(Stmt& s) {
  Cols c(s);
  TaskRecord t;
  t.id = c.Id('t');
  t.job_id = c.Id('j');
  std::string kind = c.Text();
  std::optional<TaskKind> parsed_kind = ParseTaskKind(kind);
  if (!parsed_kind)
    return absl::InternalError(fmt::format("task {}: unknown kind '{}'", t.id, kind));
  t.kind = *parsed_kind;
  t.variant_id = c.Text();
  t.incumbent_variant_id = c.Text();
  t.bucket = c.Text();
  t.arch = c.Text();
  t.shape_json = c.Text();
  t.seed = static_cast<uint64_t>(c.Int());
  std::string state = c.Text();
  std::optional<TaskState> parsed_state = ParseTaskState(state);
  if (!parsed_state)
    return absl::InternalError(fmt::format("task {}: unknown state '{}'", t.id, state));
  t.state = *parsed_state;
  t.worker_id = c.Text();
  t.lease_expires_unix_ms = c.Int();
  t.attempts = c.Int32();
  t.created_unix_ms = c.Int();
  t.origin_worker_id = c.Text();
  t.origin_evaluation_id = c.Int();
  return t;
}

constexpr std::string_view kWorkerCols =
    "id, name, arch, compile_only, gpu, last_seen, session_hash, sanitizer_tools, principal, "
    "compile_archs";

// Sanitizer tools and compile archs are stored comma-separated
// (PrepareWorker allows only plain words and arch names).
std::vector<std::string> SplitList(const std::string& joined) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < joined.size()) {
    size_t comma = joined.find(',', start);
    if (comma == std::string::npos) comma = joined.size();
    if (comma > start) out.push_back(joined.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

WorkerRecord ReadWorker(Stmt& s) {
  Cols c(s);
  WorkerRecord w;
  w.id = c.Id('w');
  w.name = c.Text();
  w.arch = c.Text();
  w.compile_only = c.Int() != 0;
  w.gpu_json = c.Text();
  w.last_seen_unix_ms = c.Int();
  w.session_hash = c.Text();
  w.sanitizer_tools = SplitList(c.Text());
  w.principal = c.Text();
  w.compile_archs = SplitList(c.Text());
  return w;
}

// Reads every row of `s` with `read` (which returns T or StatusOr<T>).
template <typename T, typename ReadFn>
absl::StatusOr<std::vector<T>> ReadAll(Stmt& s, ReadFn read) {
  std::vector<T> out;
  while (true) {
    absl::StatusOr<bool> row = s.Next();
    if (!row.ok()) return row.status();
    if (!*row) return out;
    if constexpr (std::is_same_v<decltype(read(s)), T>) {
      out.push_back(read(s));
    } else {
      auto item = read(s);
      if (!item.ok()) return item.status();
      out.push_back(*std::move(item));
    }
  }
}

// Reads at most one row: nullopt when there is none.
template <typename T, typename ReadFn>
absl::StatusOr<std::optional<T>> ReadOne(Stmt& s, ReadFn read) {
  absl::StatusOr<std::vector<T>> rows = ReadAll<T>(s, read);
  if (!rows.ok()) return rows.status();
  if (rows->empty()) return std::optional<T>();
  return std::optional<T>(std::move(rows->front()));
}

// `rows` holds up to limit + 1 rows; the extra one only says there is more.
template <typename T, typename TokenFn>
PageOf<T> MakePage(std::vector<T> rows, int32_t limit, TokenFn token) {
  PageOf<T> page;
  const bool more = rows.size() > static_cast<size_t>(limit);
  if (more) rows.resize(static_cast<size_t>(limit));
  page.items = std::move(rows);
  if (more) page.next_token = token(page.items.back());
  return page;
}

// The bound for a newest-first page: rows numbered below it. A plain
// `id < ?` (rather than "no bound on the first page") lets SQLite seek
// straight to the page instead of scanning from the newest row.
int64_t RowsBefore(int64_t token) {
  return token == 0 ? std::numeric_limits<int64_t>::max() : token;
}

std::string NumberToken(char prefix, const std::string& id) {
  return fmt::format("{}", ParseId(prefix, id).value_or(0));
}

// ---------------------------------------------------------------------------

class SqliteStore final : public Store {
 public:
  // Takes ownership of `db`.
  explicit SqliteStore(sqlite3* db) : db_(db) {}
  ~SqliteStore() override {
    absl::MutexLock lock(&mu_);
    for (auto& [sql, cached] : cache_) sqlite3_finalize(cached.stmt);
    // Closing the last connection checkpoints the WAL into the main file.
    sqlite3_close(db_);
  }

  // `in_memory`: the database is ":memory:", which has no WAL to switch to.
  absl::Status Configure(int busy_timeout_ms, bool in_memory) ABSL_LOCKS_EXCLUDED(mu_);
  // Before anything writes to the file: its consistency check, then whether
  // it is a kforge database at all (see SqliteOptions::init). `any`: it may
  // be any SQLite database (in memory, or to be initialised).
  absl::Status Inspect(const std::string& path, bool any, SqliteOptions::Check check)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Marks the file as kforge's (PRAGMA application_id), once migrated.
  absl::Status Claim() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Migrate(std::span<const Migration> migrations) ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<std::string> PutVariant(VariantRecord v) override {
    if (absl::Status s = PrepareVariant(v, NowUnixMs()); !s.ok()) return s;
    std::string id;
    absl::Status s = Write("PutVariant", [&]() -> absl::Status {
      absl::StatusOr<std::optional<int64_t>> existing =
          QueryInt("PutVariant", "SELECT id FROM variants WHERE source_hash = ?", v.source_hash);
      if (!existing.ok()) return existing.status();
      if (*existing) {
        id = FormatId('v', **existing);
        return absl::OkStatus();
      }
      MaybeInt given;
      if (!v.id.empty()) {
        given = ParseId('v', v.id);
        if (absl::Status s = CheckFree("PutVariant", "variants", *given, v.id); !s.ok()) return s;
      }
      absl::StatusOr<Stmt> ins = Prepare("PutVariant", fmt::format(
          "INSERT INTO variants ({}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
          kVariantCols));
      if (!ins.ok()) return ins.status();
      ins->Bind(given, v.source, v.source_hash, v.manifest_json, v.origin, v.template_name,
                v.knobs_json, v.model, v.prompt_hash, v.prompt, v.answer, v.parent_id, v.job_id,
                v.created_unix_ms, v.kind, v.attempt, v.normalized_hash, v.provenance_json);
      if (absl::Status s = ins->Run(); !s.ok()) return s;
      id = FormatId('v', sqlite3_last_insert_rowid(db_));
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    return id;
  }

  absl::StatusOr<VariantRecord> GetVariant(const std::string& id) override {
    std::optional<int64_t> n = ParseId('v', id);
    if (!n) return NotFound("variant", id);
    absl::MutexLock lock(&mu_);
    absl::StatusOr<std::optional<VariantRecord>> row = GetVariantLocked(*n);
    if (!row.ok()) return row.status();
    if (!*row) return NotFound("variant", id);
    return **std::move(row);
  }

  absl::StatusOr<PageOf<VariantRecord>> ListVariants(const std::string& bucket,
                                                     const Page& page) override {
    absl::StatusOr<int64_t> after = ParsePageToken(page.token);
    if (!after.ok()) return after.status();
    const int32_t limit = PageLimit(page);
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Stmt> q = Prepare("ListVariants", fmt::format(
        "SELECT {} FROM variants v WHERE (?1 = '' OR EXISTS (SELECT 1 FROM evaluations e "
        "WHERE e.bucket = ?1 AND e.variant = v.id)) AND v.id < ?2 "
        "ORDER BY v.id DESC LIMIT ?3",
        kVariantCols));
    if (!q.ok()) return q.status();
    q->Bind(bucket, RowsBefore(*after), limit + 1);
    absl::StatusOr<std::vector<VariantRecord>> rows = ReadAll<VariantRecord>(*q, ReadVariant);
    if (!rows.ok()) return rows.status();
    return MakePage(*std::move(rows), limit,
                    [](const VariantRecord& v) { return NumberToken('v', v.id); });
  }

  absl::StatusOr<std::vector<EvaluationRecord>> ListEvaluations(
      const std::string& variant_id) override {
    std::optional<int64_t> n = ParseId('v', variant_id);
    if (!n) return NotFound("variant", variant_id);
    absl::MutexLock lock(&mu_);
    absl::StatusOr<bool> exists = Exists("ListEvaluations", "variants", *n);
    if (!exists.ok()) return exists.status();
    if (!*exists) return NotFound("variant", variant_id);
    absl::StatusOr<Stmt> q = Prepare("ListEvaluations", fmt::format(
        "SELECT {} FROM evaluations WHERE variant = ? ORDER BY id", kEvaluationCols));
    if (!q.ok()) return q.status();
    q->Bind(*n);
    return ReadAll<EvaluationRecord>(*q, ReadEvaluation);
  }

  absl::Status PutCubin(const std::string& hash, const std::string& bytes) override {
    if (absl::Status s = CheckCubinHash(hash, bytes); !s.ok()) return s;
    return Write("PutCubin", [&]() -> absl::Status { return InsertCubin(hash, bytes); });
  }

  absl::StatusOr<std::string> GetCubin(const std::string& hash) override {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Stmt> q = Prepare("GetCubin", "SELECT bytes FROM cubins WHERE hash = ?");
    if (!q.ok()) return q.status();
    q->Bind(hash);
    absl::StatusOr<std::optional<std::string>> row =
        ReadOne<std::string>(*q, [](Stmt& s) { return s.BlobAt(0); });
    if (!row.ok()) return row.status();
    if (!*row) return NotFound("cubin", hash);
    // PutCubin checked the bytes against their hash; a file changed since
    // (a bad disk, a hand edit) must not hand out other bytes under it.
    if (Sha256Hex(**row) != hash)
      return absl::DataLossError(fmt::format(
          "cubin {}: the stored bytes ({} of them) no longer match their hash", hash,
          (*row)->size()));
    return **std::move(row);
  }

  absl::StatusOr<BestRecord> GetBest(const std::string& bucket,
                                     const std::string& arch) override {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Stmt> q = Prepare("GetBest", fmt::format(
        "SELECT {} FROM best WHERE bucket = ? AND arch = ?", kBestCols));
    if (!q.ok()) return q.status();
    q->Bind(bucket, arch);
    absl::StatusOr<std::optional<BestRecord>> row = ReadOne<BestRecord>(*q, ReadBest);
    if (!row.ok()) return row.status();
    if (!*row) return NotFound("best", fmt::format("{} {}", bucket, arch));
    return **std::move(row);
  }

  absl::StatusOr<PageOf<BestRecord>> ListBest(const std::string& arch,
                                              const Page& page) override {
    absl::StatusOr<std::pair<std::string, std::string>> after = ParseBestToken(page.token);
    if (!after.ok()) return after.status();
    const int32_t limit = PageLimit(page);
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Stmt> q = Prepare("ListBest", fmt::format(
        "SELECT {} FROM best WHERE (?1 = '' OR arch = ?1) "
        "AND (?2 = 0 OR (bucket, arch) > (?3, ?4)) ORDER BY bucket, arch LIMIT ?5",
        kBestCols));
    if (!q.ok()) return q.status();
    q->Bind(arch, !page.token.empty(), after->first, after->second, limit + 1);
    absl::StatusOr<std::vector<BestRecord>> rows = ReadAll<BestRecord>(*q, ReadBest);
    if (!rows.ok()) return rows.status();
    return MakePage(*std::move(rows), limit, &BestToken);
  }

  absl::StatusOr<CompletedTask> CompleteTask(const std::string& task_id,
                                             const std::string& worker_id, int64_t now,
                                             TaskCompletion c) override {
    std::optional<int64_t> task_n = ParseId('t', task_id);
    if (!task_n) return NotFound("task", task_id);
    for (TaskRecord& t : c.follow_ups)
      if (absl::Status s = PrepareTask(t, now); !s.ok()) return s;
    EvaluationRecord& eval = c.eval;
    if (absl::Status s = PrepareCubin(c.cubin, eval); !s.ok()) return s;
    CompletedTask done;
    absl::Status s = Write("CompleteTask", [&]() -> absl::Status {
      done.follow_up_ids.clear();
      // The lease first: a report that does not hold one writes nothing.
      absl::StatusOr<std::optional<TaskRecord>> task = GetTaskLocked(*task_n);
      if (!task.ok()) return task.status();
      if (!*task) return NotFound("task", task_id);
      if (absl::Status s = CheckLease(**task, worker_id, now); !s.ok()) return s;
      PrepareEvaluation(**task, worker_id, now, eval);
      if (eval.variant_id.empty())
        return absl::InvalidArgumentError("evaluation: variant_id is empty");
      std::optional<int64_t> variant = ParseId('v', eval.variant_id);
      absl::StatusOr<bool> exists =
          variant ? Exists("CompleteTask", "variants", *variant) : false;
      if (!exists.ok()) return exists.status();
      if (!*exists) return NotFound("variant", eval.variant_id);
      if (!c.cubin.empty()) {
        if (absl::Status s = InsertCubin(eval.cubin_hash, c.cubin); !s.ok()) return s;
      } else if (!eval.cubin_hash.empty()) {
        absl::StatusOr<std::optional<int64_t>> stored =
            QueryInt("CompleteTask", "SELECT 1 FROM cubins WHERE hash = ?", eval.cubin_hash);
        if (!stored.ok()) return stored.status();
        if (!*stored) return NotFound("cubin", eval.cubin_hash);
      }
      if (absl::Status s = InsertEvaluation(*variant, eval); !s.ok()) return s;
      done.evaluation_id = eval.id;
      if (c.new_best) {
        PrepareBest(eval, now, *c.new_best);
        if (absl::Status s = ReplaceBest(*c.new_best); !s.ok()) return s;
      }
      absl::StatusOr<Stmt> finish =
          Prepare("CompleteTask", "UPDATE tasks SET state = 'done' WHERE id = ?");
      if (!finish.ok()) return finish.status();
      if (absl::Status s = finish->Bind(*task_n).Run(); !s.ok()) return s;
      PrepareFollowUps(eval, c.follow_ups);
      for (const TaskRecord& t : c.follow_ups) {
        absl::StatusOr<std::string> id = InsertTask("CompleteTask", t);
        if (!id.ok()) return id.status();
        done.follow_up_ids.push_back(*std::move(id));
      }
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    return done;
  }

  absl::StatusOr<std::string> CreateJob(JobRecord job) override {
    if (absl::Status s = PrepareJob(job, NowUnixMs()); !s.ok()) return s;
    std::string id;
    absl::Status s = Write("CreateJob", [&]() -> absl::Status {
      MaybeInt given;
      if (!job.id.empty()) {
        given = ParseId('j', job.id);
        if (absl::Status s = CheckFree("CreateJob", "jobs", *given, job.id); !s.ok()) return s;
      }
      absl::StatusOr<Stmt> ins = Prepare("CreateJob", fmt::format(
          "INSERT INTO jobs ({}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", kJobCols));
      if (!ins.ok()) return ins.status();
      ins->Bind(given, job.name, JobStateName(job.state), job.proposer, job.spec_json,
                job.progress_json, job.tokens_used, job.seed, job.message, job.created_unix_ms,
                job.updated_unix_ms);
      if (absl::Status s = ins->Run(); !s.ok()) return s;
      id = FormatId('j', sqlite3_last_insert_rowid(db_));
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    return id;
  }

  absl::StatusOr<JobRecord> GetJob(const std::string& id) override {
    std::optional<int64_t> n = ParseId('j', id);
    if (!n) return NotFound("job", id);
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Stmt> q =
        Prepare("GetJob", fmt::format("SELECT {} FROM jobs WHERE id = ?", kJobCols));
    if (!q.ok()) return q.status();
    q->Bind(*n);
    absl::StatusOr<std::optional<JobRecord>> row = ReadOne<JobRecord>(*q, ReadJob);
    if (!row.ok()) return row.status();
    if (!*row) return NotFound("job", id);
    return **std::move(row);
  }

  absl::Status UpdateJob(const JobRecord& job) override {
    std::optional<int64_t> n = ParseId('j', job.id);
    if (!n) return NotFound("job", job.id);
    const int64_t now = NowUnixMs();
    return Write("UpdateJob", [&]() -> absl::Status {
      absl::StatusOr<Stmt> upd = Prepare(
          "UpdateJob",
          "UPDATE jobs SET name = ?, state = ?, proposer = ?, spec = ?, progress = ?, "
          "tokens_used = ?, seed = ?, message = ?, updated = ? WHERE id = ?");
      if (!upd.ok()) return upd.status();
      upd->Bind(job.name, JobStateName(job.state), job.proposer, job.spec_json,
                job.progress_json, job.tokens_used, job.seed, job.message, now, *n);
      if (absl::Status s = upd->Run(); !s.ok()) return s;
      if (sqlite3_changes(db_) == 0) return NotFound("job", job.id);
      return absl::OkStatus();
    });
  }

  absl::StatusOr<PageOf<JobRecord>> ListJobs(const Page& page) override {
    absl::StatusOr<int64_t> after = ParsePageToken(page.token);
    if (!after.ok()) return after.status();
    const int32_t limit = PageLimit(page);
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Stmt> q = Prepare("ListJobs", fmt::format(
        "SELECT {} FROM jobs WHERE id < ?1 ORDER BY id DESC LIMIT ?2", kJobCols));
    if (!q.ok()) return q.status();
    q->Bind(RowsBefore(*after), limit + 1);
    absl::StatusOr<std::vector<JobRecord>> rows = ReadAll<JobRecord>(*q, ReadJob);
    if (!rows.ok()) return rows.status();
    return MakePage(*std::move(rows), limit,
                    [](const JobRecord& j) { return NumberToken('j', j.id); });
  }

  absl::StatusOr<std::vector<JobRecord>> ListActiveJobs() override {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Stmt> q = Prepare("ListActiveJobs", fmt::format(
        "SELECT {} FROM jobs WHERE state IN ('queued', 'running') ORDER BY id", kJobCols));
    if (!q.ok()) return q.status();
    return ReadAll<JobRecord>(*q, ReadJob);
  }

  absl::StatusOr<std::vector<std::string>> EnqueueTasks(
      std::vector<TaskRecord> tasks) override {
    const int64_t now = NowUnixMs();
    for (TaskRecord& t : tasks)
      if (absl::Status s = PrepareTask(t, now); !s.ok()) return s;
    std::vector<std::string> ids;
    absl::Status s = Write("EnqueueTasks", [&]() -> absl::Status {
      ids.clear();
      for (const TaskRecord& t : tasks) {
        absl::StatusOr<std::string> id = InsertTask("EnqueueTasks", t);
        if (!id.ok()) return id.status();
        ids.push_back(*std::move(id));
      }
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    return ids;
  }

  absl::StatusOr<TaskRecord> GetTask(const std::string& id) override {
    std::optional<int64_t> n = ParseId('t', id);
    if (!n) return NotFound("task", id);
    absl::MutexLock lock(&mu_);
    absl::StatusOr<std::optional<TaskRecord>> row = GetTaskLocked(*n);
    if (!row.ok()) return row.status();
    if (!*row) return NotFound("task", id);
    return **std::move(row);
  }

  absl::StatusOr<std::vector<TaskRecord>> ListTasks(const std::string& job_id) override {
    std::optional<int64_t> n = ParseId('j', job_id);
    if (!n) return NotFound("job", job_id);
    absl::MutexLock lock(&mu_);
    absl::StatusOr<bool> exists = Exists("ListTasks", "jobs", *n);
    if (!exists.ok()) return exists.status();
    if (!*exists) return NotFound("job", job_id);
    absl::StatusOr<Stmt> q = Prepare("ListTasks", fmt::format(
        "SELECT {} FROM tasks WHERE job = ? ORDER BY id", kTaskCols));
    if (!q.ok()) return q.status();
    q->Bind(*n);
    return ReadAll<TaskRecord>(*q, ReadTask);
  }

  absl::StatusOr<std::optional<TaskRecord>> LeaseTask(const std::string& worker_id,
                                                      const std::string& arch,
                                                      bool compile_only, int64_t now_unix_ms,
                                                      int64_t ttl_ms,
                                                      PromotionLease promotions) override {
    if (worker_id.empty()) return absl::InvalidArgumentError("lease: worker_id is empty");
    if (ttl_ms <= 0) return absl::InvalidArgumentError("lease: ttl_ms must be positive");
    std::optional<TaskRecord> leased;
    absl::Status s = Write("LeaseTask", [&]() -> absl::Status {
      leased.reset();
      // Promotion tasks first: they decide which kernel is served and take
      // seconds. Then the job's turn and the task's age: the oldest eligible
      // task of the job that has waited longest.
      absl::StatusOr<Stmt> pick = Prepare(
          "LeaseTask",
          "SELECT t.id, t.job FROM tasks t JOIN jobs j ON j.id = t.job "
          "WHERE t.state = 'queued' AND t.arch = ?1 AND (?2 = 0 OR t.kind = 'compile') "
          "AND (?3 = 0 OR t.kind NOT IN ('retime', 'confirm') "
          "     OR (?3 = 1 AND t.origin_worker <> ?4 AND NOT EXISTS ("
          "         SELECT 1 FROM workers o WHERE ?5 <> '' AND o.principal = ?5 "
          "         AND 'w' || o.id = t.origin_worker))) "
          "ORDER BY t.kind IN ('retime', 'confirm') DESC, j.lease_seq, t.id LIMIT 1");
      if (!pick.ok()) return pick.status();
      // ?3: 0 any promotion task, 1 not the worker's own (by id or by
      // principal ?5, "" for none), 2 none.
      const int64_t filter = promotions == PromotionLease::kAny      ? 0
                             : promotions == PromotionLease::kNotOwn ? 1
                                                                     : 2;
      std::string principal;
      if (promotions == PromotionLease::kNotOwn) {
        if (std::optional<int64_t> me = ParseId('w', worker_id)) {
          absl::StatusOr<Stmt> q =
              Prepare("LeaseTask", "SELECT principal FROM workers WHERE id = ?");
          if (!q.ok()) return q.status();
          q->Bind(*me);
          absl::StatusOr<std::optional<std::string>> p =
              ReadOne<std::string>(*q, [](Stmt& s) { return s.Text(0); });
          if (!p.ok()) return p.status();
          if (*p) principal = **p;
        }
      }
      pick->Bind(arch, compile_only, filter, worker_id, principal);
      absl::StatusOr<std::optional<std::pair<int64_t, int64_t>>> row =
          ReadOne<std::pair<int64_t, int64_t>>(
              *pick, [](Stmt& s) { return std::make_pair(s.Int(0), s.Int(1)); });
      if (!row.ok()) return row.status();
      if (!*row) return absl::OkStatus();
      const auto [task, job] = **row;
      absl::StatusOr<Stmt> lease = Prepare(
          "LeaseTask",
          "UPDATE tasks SET state = 'leased', worker = ?, lease_expires = ?, "
          "attempts = attempts + 1 WHERE id = ?");
      if (!lease.ok()) return lease.status();
      if (absl::Status s = lease->Bind(worker_id, now_unix_ms + ttl_ms, task).Run(); !s.ok())
        return s;
      absl::StatusOr<Stmt> turn = Prepare(
          "LeaseTask",
          "UPDATE jobs SET lease_seq = (SELECT MAX(lease_seq) FROM jobs) + 1 WHERE id = ?");
      if (!turn.ok()) return turn.status();
      if (absl::Status s = turn->Bind(job).Run(); !s.ok()) return s;
      absl::StatusOr<std::optional<TaskRecord>> record = GetTaskLocked(task);
      if (!record.ok()) return record.status();
      leased = **std::move(record);
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    return leased;
  }

  absl::Status RenewLeases(const std::string& worker_id, const std::vector<std::string>& task_ids,
                           int64_t now_unix_ms, int64_t ttl_ms) override {
    if (ttl_ms <= 0) return absl::InvalidArgumentError("renew: ttl_ms must be positive");
    return Write("RenewLeases", [&]() -> absl::Status {
      for (const std::string& id : task_ids) {
        std::optional<int64_t> n = ParseId('t', id);
        if (!n) continue;
        absl::StatusOr<Stmt> upd = Prepare(
            "RenewLeases",
            "UPDATE tasks SET lease_expires = ? WHERE id = ? AND state = 'leased' AND worker = ?");
        if (!upd.ok()) return upd.status();
        if (absl::Status s = upd->Bind(now_unix_ms + ttl_ms, *n, worker_id).Run(); !s.ok())
          return s;
      }
      return absl::OkStatus();
    });
  }

  absl::StatusOr<int> RequeueExpired(int64_t now_unix_ms) override {
    int count = 0;
    absl::Status s = Write("RequeueExpired", [&]() -> absl::Status {
      absl::StatusOr<Stmt> upd = Prepare(
          "RequeueExpired",
          "UPDATE tasks SET state = 'queued', worker = '', lease_expires = 0 "
          "WHERE state = 'leased' AND lease_expires < ?");
      if (!upd.ok()) return upd.status();
      if (absl::Status s = upd->Bind(now_unix_ms).Run(); !s.ok()) return s;
      count = sqlite3_changes(db_);
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    return count;
  }

  absl::StatusOr<std::vector<std::string>> CancelTasks(const std::string& job_id) override {
    std::optional<int64_t> n = ParseId('j', job_id);
    if (!n) return NotFound("job", job_id);
    std::vector<std::string> ids;
    absl::Status s = Write("CancelTasks", [&]() -> absl::Status {
      absl::StatusOr<bool> exists = Exists("CancelTasks", "jobs", *n);
      if (!exists.ok()) return exists.status();
      if (!*exists) return NotFound("job", job_id);
      absl::StatusOr<Stmt> q = Prepare(
          "CancelTasks",
          "SELECT id FROM tasks WHERE job = ? AND state IN ('queued', 'leased') ORDER BY id");
      if (!q.ok()) return q.status();
      q->Bind(*n);
      absl::StatusOr<std::vector<std::string>> rows =
          ReadAll<std::string>(*q, [](Stmt& s) { return FormatId('t', s.Int(0)); });
      if (!rows.ok()) return rows.status();
      ids = *std::move(rows);
      absl::StatusOr<Stmt> upd = Prepare(
          "CancelTasks",
          "UPDATE tasks SET state = 'cancelled' WHERE job = ? AND state IN ('queued', 'leased')");
      if (!upd.ok()) return upd.status();
      return upd->Bind(*n).Run();
    });
    if (!s.ok()) return s;
    return ids;
  }

  absl::StatusOr<std::string> UpsertWorker(WorkerRecord w) override {
    if (absl::Status s = PrepareWorker(w, NowUnixMs()); !s.ok()) return s;
    std::string id;
    const std::string tools = fmt::format("{}", fmt::join(w.sanitizer_tools, ","));
    const std::string compile_archs = fmt::format("{}", fmt::join(w.compile_archs, ","));
    absl::Status s = Write("UpsertWorker", [&]() -> absl::Status {
      std::optional<int64_t> n;
      if (!w.id.empty()) {
        n = ParseId('w', w.id);
        absl::StatusOr<bool> exists = n ? Exists("UpsertWorker", "workers", *n) : false;
        if (!exists.ok()) return exists.status();
        if (!*exists) return NotFound("worker", w.id);
      }
      if (!w.session_hash.empty()) {
        absl::StatusOr<std::optional<int64_t>> holder = QueryInt(
            "UpsertWorker", "SELECT id FROM workers WHERE session_hash = ?", w.session_hash);
        if (!holder.ok()) return holder.status();
        if (*holder && (!n || **holder != *n))
          return absl::InvalidArgumentError("worker: session_hash belongs to another worker");
      }
      absl::StatusOr<Stmt> up = Prepare("UpsertWorker", fmt::format(
          "INSERT INTO workers ({}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE "
          "SET name = excluded.name, arch = excluded.arch, compile_only = excluded.compile_only, "
          "gpu = excluded.gpu, last_seen = excluded.last_seen, "
          "session_hash = excluded.session_hash, sanitizer_tools = excluded.sanitizer_tools, "
          "principal = excluded.principal, compile_archs = excluded.compile_archs",
          kWorkerCols));
      if (!up.ok()) return up.status();
      up->Bind(MaybeInt(n), w.name, w.arch, w.compile_only, w.gpu_json, w.last_seen_unix_ms,
               w.session_hash, tools, w.principal, compile_archs);
      if (absl::Status s = up->Run(); !s.ok()) return s;
      id = FormatId('w', n ? *n : sqlite3_last_insert_rowid(db_));
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    return id;
  }

  absl::StatusOr<std::vector<WorkerRecord>> ListWorkers() override {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Stmt> q =
        Prepare("ListWorkers", fmt::format("SELECT {} FROM workers ORDER BY id", kWorkerCols));
    if (!q.ok()) return q.status();
    return ReadAll<WorkerRecord>(*q, ReadWorker);
  }

  absl::StatusOr<int64_t> AddModelCall(ModelCallRecord m) override {
    if (absl::Status s = PrepareModelCall(m, NowUnixMs()); !s.ok()) return s;
    int64_t id = 0;
    absl::Status s = Write("AddModelCall", [&]() -> absl::Status {
      absl::StatusOr<Stmt> ins = Prepare("AddModelCall", fmt::format(
          "INSERT INTO model_calls ({}) VALUES (NULL, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
          kModelCallCols));
      if (!ins.ok()) return ins.status();
      ins->Bind(m.job_id, m.bucket, m.model, m.purpose, m.parent_id, m.attempt, m.prompt_hash,
                m.prompt, m.answer, m.prompt_tokens, m.completion_tokens, m.cost_usd,
                m.usage_estimated, m.outcome, m.detail, m.created_unix_ms);
      if (absl::Status s = ins->Run(); !s.ok()) return s;
      id = sqlite3_last_insert_rowid(db_);
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    return id;
  }

  absl::Status UpdateModelCall(const ModelCallRecord& call) override {
    ModelCallRecord m = call;
    if (absl::Status s = PrepareModelCall(m, NowUnixMs()); !s.ok()) return s;
    return Write("UpdateModelCall", [&]() -> absl::Status {
      absl::StatusOr<Stmt> up = Prepare("UpdateModelCall",
          "UPDATE model_calls SET job = ?, bucket = ?, model = ?, purpose = ?, parent = ?, attempt = ?, "
          "prompt_hash = ?, prompt = ?, answer = ?, prompt_tokens = ?, completion_tokens = ?, cost_usd = ?, "
          "usage_estimated = ?, outcome = ?, detail = ? WHERE id = ?");
      if (!up.ok()) return up.status();
      up->Bind(m.job_id, m.bucket, m.model, m.purpose, m.parent_id, m.attempt, m.prompt_hash, m.prompt, m.answer,
               m.prompt_tokens, m.completion_tokens, m.cost_usd, m.usage_estimated, m.outcome, m.detail, call.id);
      if (absl::Status s = up->Run(); !s.ok()) return s;
      if (sqlite3_changes(db_) == 0) return NotFound("model call", fmt::format("{}", call.id));
      return absl::OkStatus();
    });
  }

  absl::StatusOr<std::vector<ModelCallRecord>> ListModelCalls(const std::string& job_id) override {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Stmt> q = Prepare("ListModelCalls", fmt::format(
        "SELECT {} FROM model_calls WHERE ?1 = '' OR job = ?1 ORDER BY id", kModelCallCols));
    if (!q.ok()) return q.status();
    q->Bind(job_id);
    return ReadAll<ModelCallRecord>(*q, ReadModelCall);
  }

  absl::StatusOr<ModelSpend> SumModelCalls(const std::string& job_id,
                                           int64_t since_unix_ms) override {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Stmt> q = Prepare("SumModelCalls",
        "SELECT count(*), coalesce(sum(prompt_tokens + completion_tokens), 0), coalesce(sum(cost_usd), 0), "
        "coalesce(sum(CASE WHEN outcome = 'pending' THEN prompt_tokens + completion_tokens END), 0) "
        "FROM model_calls WHERE (?1 = '' OR job = ?1) AND created >= ?2");
    if (!q.ok()) return q.status();
    q->Bind(job_id, since_unix_ms);
    absl::StatusOr<bool> row = q->Next();
    if (!row.ok()) return row.status();
    ModelSpend sum;
    if (*row) {
      sum.calls = q->Int(0);
      sum.tokens = q->Int(1);
      sum.cost_usd = q->Real(2);
      sum.pending_tokens = q->Int(3);
    }
    return sum;
  }

  absl::StatusOr<std::string> IntegrityCheck() override {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Stmt> q = Prepare("IntegrityCheck", "PRAGMA integrity_check");
    if (!q.ok()) return q.status();
    absl::StatusOr<std::vector<std::string>> lines =
        ReadAll<std::string>(*q, [](Stmt& s) { return s.Text(0); });
    if (!lines.ok()) return lines.status();
    return fmt::format("{}", fmt::join(*lines, "\n"));
  }

  absl::StatusOr<int64_t> DatabaseBytes() override {
    absl::MutexLock lock(&mu_);
    // The main file as SQLite lays it out (pages in use and free); the WAL
    // beside it is transient and folded in at checkpoints.
    absl::StatusOr<std::optional<int64_t>> pages =
        QueryInt("DatabaseBytes", "PRAGMA page_count");
    if (!pages.ok()) return pages.status();
    absl::StatusOr<std::optional<int64_t>> size = QueryInt("DatabaseBytes", "PRAGMA page_size");
    if (!size.ok()) return size.status();
    return pages->value_or(0) * size->value_or(0);
  }

 private:
  // A statement from the cache (prepared on first use).
  absl::StatusOr<Stmt> Prepare(std::string_view op, std::string_view sql)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = cache_.find(sql);
    if (it == cache_.end()) {
      sqlite3_stmt* stmt = nullptr;
      int rc = sqlite3_prepare_v3(db_, sql.data(), static_cast<int>(sql.size()),
                                  SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
      if (rc != SQLITE_OK) return SqlError(db_, rc, op);
      it = cache_.emplace(std::string(sql), CachedStmt{stmt, false}).first;
    }
    if (it->second.in_use)
      return absl::InternalError(fmt::format("{}: statement already in use: {}", op, sql));
    return Stmt(db_, &it->second, op);
  }

  // Runs `body` in one write transaction: committed when it returns OK,
  // rolled back (leaving no trace) otherwise.
  absl::Status Write(std::string_view op, absl::FunctionRef<absl::Status()> body)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return WriteLocked(op, body);
  }

  absl::Status WriteLocked(std::string_view op, absl::FunctionRef<absl::Status()> body)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int rc = sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
    if (rc != SQLITE_OK) return SqlError(db_, rc, fmt::format("{}: begin", op));
    absl::Status s = body();
    if (s.ok()) {
      rc = sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
      if (rc == SQLITE_OK) return absl::OkStatus();
      s = SqlError(db_, rc, fmt::format("{}: commit", op));
    }
    // A failed statement may already have ended the transaction; a failed
    // rollback then changes nothing and is not worth reporting over `s`.
    if (!sqlite3_get_autocommit(db_)) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    return s;
  }

  // The first column of the first row, if there is a row.
  template <typename... Args>
  absl::StatusOr<std::optional<int64_t>> QueryInt(std::string_view op, std::string_view sql,
                                                  const Args&... args)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<Stmt> q = Prepare(op, sql);
    if (!q.ok()) return q.status();
    q->Bind(args...);
    return ReadOne<int64_t>(*q, [](Stmt& s) { return s.Int(0); });
  }

  // `table` is one of this file's literals, never caller input.
  absl::StatusOr<bool> Exists(std::string_view op, std::string_view table, int64_t id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<std::optional<int64_t>> row =
        QueryInt(op, fmt::format("SELECT 1 FROM {} WHERE id = ?", table), id);
    if (!row.ok()) return row.status();
    return row->has_value();
  }

  // ALREADY_EXISTS when a caller-chosen id is taken.
  absl::Status CheckFree(std::string_view op, std::string_view table, int64_t n,
                         const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<bool> exists = Exists(op, table, n);
    if (!exists.ok()) return exists.status();
    if (*exists) return absl::AlreadyExistsError(fmt::format("'{}' already exists", id));
    return absl::OkStatus();
  }

  absl::StatusOr<std::optional<VariantRecord>> GetVariantLocked(int64_t n)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<Stmt> q =
        Prepare("GetVariant", fmt::format("SELECT {} FROM variants WHERE id = ?", kVariantCols));
    if (!q.ok()) return q.status();
    q->Bind(n);
    return ReadOne<VariantRecord>(*q, ReadVariant);
  }

  absl::StatusOr<std::optional<TaskRecord>> GetTaskLocked(int64_t n)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<Stmt> q =
        Prepare("GetTask", fmt::format("SELECT {} FROM tasks WHERE id = ?", kTaskCols));
    if (!q.ok()) return q.status();
    q->Bind(n);
    return ReadOne<TaskRecord>(*q, ReadTask);
  }

  absl::Status InsertCubin(const std::string& hash, const std::string& bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<Stmt> ins = Prepare(
        "PutCubin", "INSERT INTO cubins (hash, bytes) VALUES (?, ?) ON CONFLICT (hash) DO NOTHING");
    if (!ins.ok()) return ins.status();
    return ins->Bind(hash, Blob{bytes}).Run();
  }

  // Inserts a prepared task (PrepareTask); returns its id.
  absl::StatusOr<std::string> InsertTask(std::string_view op, const TaskRecord& t)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::optional<int64_t> job = ParseId('j', t.job_id);
    absl::StatusOr<bool> exists = job ? Exists(op, "jobs", *job) : false;
    if (!exists.ok()) return exists.status();
    if (!*exists) return NotFound("job", t.job_id);
    MaybeInt given;
    if (!t.id.empty()) {
      given = ParseId('t', t.id);
      if (absl::Status s = CheckFree(op, "tasks", *given, t.id); !s.ok()) return s;
    }
    absl::StatusOr<Stmt> ins = Prepare(op, fmt::format(
        "INSERT INTO tasks ({}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        kTaskCols));
    if (!ins.ok()) return ins.status();
    ins->Bind(given, *job, TaskKindName(t.kind), t.variant_id, t.incumbent_variant_id, t.bucket,
              t.arch, t.shape_json, t.seed, TaskStateName(t.state), t.worker_id,
              t.lease_expires_unix_ms, t.attempts, t.created_unix_ms, t.origin_worker_id,
              t.origin_evaluation_id);
    if (absl::Status s = ins->Run(); !s.ok()) return s;
    return FormatId('t', sqlite3_last_insert_rowid(db_));
  }

  // Inserts `eval` and sets its id.
  absl::Status InsertEvaluation(int64_t variant, EvaluationRecord& eval)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<Stmt> ins = Prepare("CompleteTask", fmt::format(
        "INSERT INTO evaluations ({}) VALUES (NULL, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
        "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        kEvaluationCols));
    if (!ins.ok()) return ins.status();
    ins->Bind(variant, eval.bucket, eval.arch, eval.job_id, eval.task_id, eval.worker_id,
              eval.gpu_name, eval.compute_capability, eval.driver_version, eval.nvrtc_version,
              eval.compile_options, eval.reference_version, OutcomeName(eval.outcome),
              eval.message, eval.compile_ms, eval.registers, eval.spill_bytes,
              eval.static_smem_bytes, eval.dynamic_smem_bytes, eval.max_abs_error,
              eval.rel_l2_error, eval.timing.median_us, eval.timing.min_us, eval.timing.max_us,
              eval.timing.samples, eval.cubin_hash, eval.created_unix_ms, eval.timing.p25_us,
              eval.timing.p75_us, eval.verified.batch, eval.verified.max_len_q,
              eval.verified.max_len_k, eval.verified.total_q, eval.verified.total_k,
              EncodeSamples(eval.timing.samples_us), eval.incumbent_timing.median_us,
              eval.incumbent_timing.min_us, eval.incumbent_timing.max_us,
              eval.incumbent_timing.samples, eval.incumbent_timing.p25_us,
              eval.incumbent_timing.p75_us, EncodeSamples(eval.incumbent_timing.samples_us));
    if (absl::Status s = ins->Run(); !s.ok()) return s;
    eval.id = sqlite3_last_insert_rowid(db_);
    return absl::OkStatus();
  }

  absl::Status ReplaceBest(const BestRecord& best) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (best.bucket.empty() || best.arch.empty())
      return absl::InvalidArgumentError("best: bucket and arch must be set");
    // The evaluation must exist and be of the best's variant; checked here
    // rather than left to the foreign keys so the error says which.
    absl::StatusOr<std::optional<int64_t>> eval_variant = QueryInt(
        "CompleteTask", "SELECT variant FROM evaluations WHERE id = ?", best.evaluation_id);
    if (!eval_variant.ok()) return eval_variant.status();
    if (!*eval_variant) return NotFound("evaluation", fmt::format("{}", best.evaluation_id));
    if (FormatId('v', **eval_variant) != best.variant_id)
      return absl::InvalidArgumentError("best: evaluation is of another variant");
    absl::StatusOr<Stmt> up = Prepare("CompleteTask", fmt::format(
        "INSERT INTO best ({}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (bucket, arch) DO UPDATE SET variant = excluded.variant, "
        "evaluation = excluded.evaluation, median_us = excluded.median_us, "
        "min_us = excluded.min_us, max_us = excluded.max_us, samples = excluded.samples, "
        "updated = excluded.updated, p25_us = excluded.p25_us, p75_us = excluded.p75_us, "
        "verified_batch = excluded.verified_batch, "
        "verified_max_len_q = excluded.verified_max_len_q, "
        "verified_max_len_k = excluded.verified_max_len_k, "
        "verified_total_q = excluded.verified_total_q, "
        "verified_total_k = excluded.verified_total_k, measured_by = excluded.measured_by",
        kBestCols));
    if (!up.ok()) return up.status();
    return up->Bind(best.bucket, best.arch, **eval_variant, best.evaluation_id,
                    best.timing.median_us, best.timing.min_us, best.timing.max_us,
                    best.timing.samples, best.updated_unix_ms, best.timing.p25_us,
                    best.timing.p75_us, best.verified.batch, best.verified.max_len_q,
                    best.verified.max_len_k, best.verified.total_q, best.verified.total_k,
                    best.measured_by)
        .Run();
  }

  // One connection, one mutex around it. A connection must not run two
  // statements from two threads at once, and a transaction here spans
  // several statements that must not interleave with another call's.
  // SQLite allows one writer at a time anyway, so serialising calls costs
  // little; WAL still lets other processes (the CLI, a backup) read while
  // this one writes. Simple and correct beats a connection pool here.
  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  // Prepared statements by SQL text, finalized with the connection.
  std::map<std::string, CachedStmt, std::less<>> cache_ ABSL_GUARDED_BY(mu_);
};

absl::Status SqliteStore::Configure(int busy_timeout_ms, bool in_memory) {
  absl::MutexLock lock(&mu_);
  int rc = sqlite3_busy_timeout(db_, busy_timeout_ms);
  if (rc != SQLITE_OK) return SqlError(db_, rc, "open: busy_timeout");
  // Each pragma returns the value now in force; read it back, because a
  // pragma SQLite cannot honour is ignored without an error.
  struct Setting {
    std::string_view sql;
    std::string_view want;
  };
  const Setting settings[] = {
      {"PRAGMA journal_mode = WAL", in_memory ? "memory" : "wal"},
      {"PRAGMA synchronous = FULL", ""},
      {"PRAGMA synchronous", "2"},
      {"PRAGMA foreign_keys = ON", ""},
      {"PRAGMA foreign_keys", "1"},
  };
  for (const Setting& setting : settings) {
    absl::StatusOr<Stmt> q = Prepare("open", setting.sql);
    if (!q.ok()) return q.status();
    absl::StatusOr<std::vector<std::string>> rows =
        ReadAll<std::string>(*q, [](Stmt& s) { return s.Text(0); });
    if (!rows.ok()) return rows.status();
    if (!setting.want.empty() && (rows->empty() || rows->front() != setting.want)) {
      return absl::FailedPreconditionError(
          fmt::format("open: '{}' gave '{}', want '{}'", setting.sql,
                      rows->empty() ? "" : rows->front(), setting.want));
    }
  }
  return absl::OkStatus();
}

absl::Status SqliteStore::Inspect(const std::string& path, bool any,
                                  SqliteOptions::Check check) {
  absl::MutexLock lock(&mu_);
  auto rows = [&](std::string_view sql) -> absl::StatusOr<std::vector<std::string>> {
    absl::StatusOr<Stmt> q = Prepare("open", sql);
    if (!q.ok()) return q.status();
    return ReadAll<std::string>(*q, [](Stmt& st) { return st.Text(0); });
  };
  if (check != SqliteOptions::Check::kOff) {
    absl::StatusOr<std::vector<std::string>> problems =
        rows(check == SqliteOptions::Check::kFull ? "PRAGMA integrity_check"
                                                  : "PRAGMA quick_check");
    // A lock held by another process is no damage; SQLITE_CORRUPT and
    // SQLITE_NOTADB (INTERNAL here) are.
    if (!problems.ok() && problems.status().code() != absl::StatusCode::kInternal)
      return problems.status();
    if (!problems.ok() || problems->empty() || problems->front() != "ok") {
      std::string found = problems.ok() ? fmt::format("{}", fmt::join(*problems, "; "))
                                        : std::string(problems.status().message());
      if (found.size() > 600) found = found.substr(0, 600) + "...";
      return absl::DataLossError(fmt::format(
          "database {} fails its integrity check ({}): {}. Restore it from a backup, or move it "
          "aside and start with a new one; the server will not serve from a damaged file",
          path, check == SqliteOptions::Check::kFull ? "integrity_check" : "quick_check",
          found));
    }
  }
  absl::StatusOr<std::vector<std::string>> tables =
      rows("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
           "ORDER BY name");
  if (!tables.ok()) return tables.status();
  absl::StatusOr<std::vector<std::string>> app = rows("PRAGMA application_id");
  if (!app.ok()) return app.status();
  const int64_t application_id = app->empty() ? 0 : std::stoll(app->front());
  if (any) return absl::OkStatus();
  // Ours: a new file (CreateFile marked it) or one that was migrated.
  if (application_id == kApplicationId) return absl::OkStatus();
  const bool kforge_tables =
      std::find(tables->begin(), tables->end(), "schema_version") != tables->end();
  if (tables->empty())
    return absl::FailedPreconditionError(fmt::format(
        "database {} is an SQLite file without tables, not a kforge database: a wrong path or "
        "a failed restore? Pass --init to start a new kforge database in it",
        path));
  if (!kforge_tables || application_id != 0) {
    std::string names = fmt::format("{}", fmt::join(*tables, ", "));
    if (names.size() > 200) names = names.substr(0, 200) + "...";
    return absl::FailedPreconditionError(fmt::format(
        "database {} is not a kforge database (tables: {}; application_id {}): a wrong path? "
        "Pass --init to add kforge's tables to it anyway",
        path, names, application_id));
  }
  return absl::OkStatus();
}

absl::Status SqliteStore::Claim() {
  absl::MutexLock lock(&mu_);
  const std::string sql = fmt::format("PRAGMA application_id = {}", kApplicationId);
  int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return SqlError(db_, rc, "open: application_id");
  return absl::OkStatus();
}

absl::Status SqliteStore::Migrate(std::span<const Migration> migrations) {
  for (size_t i = 0; i < migrations.size(); ++i) {
    if (migrations[i].version != static_cast<int>(i) + 1)
      return absl::InvalidArgumentError(fmt::format(
          "migrations: entry {} has version {}, want {}", i, migrations[i].version, i + 1));
  }
  const int latest = static_cast<int>(migrations.size());
  absl::MutexLock lock(&mu_);
  // The version table itself is created outside any migration, so that a
  // new, empty file and a file from before the first migration look alike
  // (version 0).
  absl::Status s = WriteLocked("migrate", [&]() -> absl::Status {
    int rc = sqlite3_exec(db_,
                          "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);"
                          "INSERT INTO schema_version (version) SELECT 0 "
                          "WHERE NOT EXISTS (SELECT 1 FROM schema_version);",
                          nullptr, nullptr, nullptr);
    if (rc != SQLITE_OK) return SqlError(db_, rc, "migrate: schema_version");
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  // One transaction per migration, each re-reading the version inside it:
  // another process opening the same file at the same time may have
  // migrated already, and a failed migration leaves the previous version
  // intact.
  for (const Migration& m : migrations) {
    s = WriteLocked("migrate", [&]() -> absl::Status {
      absl::StatusOr<std::optional<int64_t>> version =
          QueryInt("migrate", "SELECT version FROM schema_version");
      if (!version.ok()) return version.status();
      const int64_t current = version->value_or(0);
      if (current >= m.version) return absl::OkStatus();
      int rc = sqlite3_exec(db_, std::string(m.sql).c_str(), nullptr, nullptr, nullptr);
      if (rc != SQLITE_OK)
        return SqlError(db_, rc, fmt::format("migrate to version {} ({})", m.version, m.what));
      absl::StatusOr<Stmt> bump = Prepare("migrate", "UPDATE schema_version SET version = ?");
      if (!bump.ok()) return bump.status();
      return bump->Bind(static_cast<int64_t>(m.version)).Run();
    });
    if (!s.ok()) return s;
  }
  absl::StatusOr<std::optional<int64_t>> version =
      QueryInt("migrate", "SELECT version FROM schema_version");
  if (!version.ok()) return version.status();
  if (version->value_or(0) > latest) {
    return absl::FailedPreconditionError(fmt::format(
        "database schema version {} is newer than this binary's {}; upgrade kforge",
        version->value_or(0), latest));
  }
  return absl::OkStatus();
}

}  // namespace

std::span<const Migration> SqliteMigrations() { return kMigrations; }

namespace {

// A new database file at `path`: made aside (mode 600, so the database
// and the -wal/-shm files SQLite gives the same mode are private), marked
// as kforge's, and linked into place in one step, so another process
// opening the same path never sees it empty. OK when another process won
// the race: its file is there.
absl::Status CreateFile(const std::string& path) {
  std::string temp = path + ".new-XXXXXX";
  const int fd = ::mkstemp(temp.data());
  if (fd < 0)
    return absl::UnavailableError(
        fmt::format("database {}: cannot create it: {}", path, std::strerror(errno)));
  ::close(fd);
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(temp.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nullptr);
  const std::string sql = fmt::format("PRAGMA application_id = {}", kApplicationId);
  if (rc == SQLITE_OK) rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
  absl::Status s = rc == SQLITE_OK ? absl::OkStatus()
                                   : SqlError(db, rc, fmt::format("create {}", path));
  sqlite3_close(db);
  if (s.ok() && ::link(temp.c_str(), path.c_str()) != 0 && errno != EEXIST)
    s = absl::UnavailableError(
        fmt::format("database {}: cannot create it: {}", path, std::strerror(errno)));
  ::unlink(temp.c_str());
  return s;
}

// What the file is before the store opens it. Refuses what is not SQLite
// at all, --init or not (its bytes are someone else's), and an empty file
// unless `init`.
absl::Status PrepareFile(const std::string& path, bool init) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT)
      return absl::UnavailableError(
          fmt::format("database {}: cannot stat it: {}", path, std::strerror(errno)));
    if (absl::Status s = CreateFile(path); !s.ok()) return s;
    if (::stat(path.c_str(), &st) != 0)
      return absl::UnavailableError(fmt::format("database {}: {}", path, std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode))
    return absl::FailedPreconditionError(fmt::format("database {} is not a regular file", path));
  if (st.st_size == 0) {
    if (init) return absl::OkStatus();
    return absl::FailedPreconditionError(fmt::format(
        "database {} is empty (0 bytes): a kforge database never is, so this is a wrong path, "
        "a truncated copy or a failed restore. Restore the file, or pass --init to start a new "
        "database in it",
        path));
  }
  char header[16] = {};
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return absl::UnavailableError(
        fmt::format("database {}: cannot open it: {}", path, std::strerror(errno)));
  const ssize_t n = ::read(fd, header, sizeof header);
  ::close(fd);
  if (n != static_cast<ssize_t>(sizeof header) ||
      std::memcmp(header, "SQLite format 3", sizeof header) != 0)
    return absl::FailedPreconditionError(fmt::format(
        "database {} is not an SQLite database (its first bytes are not SQLite's header); "
        "kforge will not write over it, --init or not",
        path));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> OpenSqliteStore(const std::string& path,
                                                       const SqliteOptions& options) {
  const bool in_memory = path == ":memory:" || path.empty();
  if (!in_memory) {
    if (absl::Status s = PrepareFile(path, options.init); !s.ok()) return s;
  }
  sqlite3* db = nullptr;
  // NOMUTEX: SqliteStore serialises every use of the connection itself.
  int rc = sqlite3_open_v2(path.c_str(), &db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) {
    absl::Status s = SqlError(db, rc, fmt::format("open {}", path));
    sqlite3_close(db);  // a handle is returned even on failure
    return s;
  }
  auto store = std::make_unique<SqliteStore>(db);
  // Before Inspect reads: another process may be migrating the same file.
  sqlite3_busy_timeout(db, options.busy_timeout_ms);
  if (absl::Status s = store->Inspect(path, in_memory || options.init, options.check); !s.ok())
    return s;
  if (absl::Status s = store->Configure(options.busy_timeout_ms, in_memory); !s.ok())
    return s;
  if (absl::Status s = store->Migrate(options.migrations); !s.ok()) return s;
  if (absl::Status s = store->Claim(); !s.ok()) return s;
  return store;
}

absl::StatusOr<std::unique_ptr<Store>> OpenSqliteStore(const std::string& path) {
  return OpenSqliteStore(path, SqliteOptions{});
}

}  // namespace kforge
