// What only the SQLite store has: a file that outlives the process, schema
// migrations, several connections on one file, and crash safety.
#include "storage/sqlite_store.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "core/hash.h"
#include "storage/test_util.h"

namespace kforge {
namespace {

using testing_util::TempDir;

// A raw connection, to look at (or forge) what the store cannot show.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    EXPECT_EQ(sqlite3_open(path.c_str(), &db_), SQLITE_OK);
  }
  ~RawDb() { sqlite3_close(db_); }
  RawDb(const RawDb&) = delete;
  RawDb& operator=(const RawDb&) = delete;

  void Exec(const std::string& sql) {
    char* err = nullptr;
    EXPECT_EQ(sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK)
        << sql << ": " << (err ? err : "");
    sqlite3_free(err);
  }

  // The first column of the first row as text; "" when there is no row.
  std::string One(const std::string& sql) {
    sqlite3_stmt* stmt = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK) << sql;
    std::string out;
    if (stmt != nullptr && sqlite3_step(stmt) == SQLITE_ROW) {
      const unsigned char* text = sqlite3_column_text(stmt, 0);
      if (text != nullptr) out = reinterpret_cast<const char*>(text);
    }
    sqlite3_finalize(stmt);
    return out;
  }

 private:
  sqlite3* db_ = nullptr;
};

// A variant as schemas before v7 hold it (this binary's PutVariant writes
// v7's columns); returns its id.
std::string OldVariant(const std::string& path, const std::string& source, std::string origin = "template",
                       std::string model = "", std::string prompt = "", std::string parent = "") {
  RawDb raw(path);
  raw.Exec(fmt::format(
      "INSERT INTO variants (source, source_hash, manifest, origin, template, knobs, model, "
      "prompt_hash, prompt, answer, parent, job, created) VALUES ('{}', '{}', '', '{}', '', '', "
      "'{}', '', '{}', '', '{}', '', 1)",
      source, Sha256Hex(source), origin, model, prompt, parent));
  return "v" + raw.One("SELECT max(id) FROM variants");
}

std::unique_ptr<Store> MustOpen(const std::string& path, const SqliteOptions& options = {}) {
  absl::StatusOr<std::unique_ptr<Store>> store = OpenSqliteStore(path, options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

VariantRecord Variant(const std::string& source) {
  VariantRecord v;
  v.source = source;
  v.origin = "template";
  return v;
}

TaskRecord Task(const std::string& job, const std::string& variant) {
  TaskRecord t;
  t.job_id = job;
  t.variant_id = variant;
  t.arch = "sm_90a";
  t.bucket = "fwd.bf16.d128.h4.kv4.causal.self.sm_90a.b128.mq4096.aq4096.mk4096.ak4096";
  return t;
}

EvaluationRecord Verified(double median_us) {
  EvaluationRecord e;
  e.outcome = Outcome::kVerified;
  e.timing = {median_us, median_us, median_us, 10};
  return e;
}

TaskCompletion Completion(EvaluationRecord eval, std::optional<BestRecord> best,
                          std::string cubin = "") {
  TaskCompletion c;
  c.eval = std::move(eval);
  c.new_best = std::move(best);
  c.cubin = std::move(cubin);
  return c;
}

TEST(SqliteStore, OpensInWalModeAtTheLatestVersion) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  ASSERT_NE(MustOpen(path), nullptr);
  RawDb raw(path);
  EXPECT_EQ(raw.One("PRAGMA journal_mode"), "wal");
  EXPECT_EQ(raw.One("SELECT version FROM schema_version"),
            std::to_string(SqliteMigrations().size()));
  EXPECT_EQ(raw.One("SELECT count(*) FROM schema_version"), "1");
}

TEST(SqliteStore, DatabaseBytesIsTheFileSizeAndGrowsWithData) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  std::unique_ptr<Store> store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(int64_t empty, store->DatabaseBytes());
  EXPECT_GT(empty, 0);
  for (int i = 0; i < 50; ++i)
    ASSERT_OK(store->PutVariant(Variant(fmt::format("{}{}", std::string(4000, 'x'), i))));
  ASSERT_OK_AND_ASSIGN(int64_t full, store->DatabaseBytes());
  EXPECT_GT(full, empty + 50 * 4000);
  EXPECT_EQ(full % 512, 0) << "whole pages";
}

TEST(SqliteStore, OpensAPrivateInMemoryDatabase) {
  std::unique_ptr<Store> store = MustOpen(":memory:");
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(std::string id, store->PutVariant(Variant("src")));
  EXPECT_OK(store->GetVariant(id));
  std::unique_ptr<Store> other = MustOpen(":memory:");
  ASSERT_NE(other, nullptr);
  EXPECT_CODE(other->GetVariant(id), kNotFound);
}

TEST(SqliteStore, ReopeningKeepsEverything) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  std::string variant, job, task, worker;
  {
    std::unique_ptr<Store> store = MustOpen(path);
    ASSERT_NE(store, nullptr);
    ASSERT_OK_AND_ASSIGN(variant, store->PutVariant(Variant("src")));
    JobRecord j;
    j.name = "hstu";
    j.state = JobState::kRunning;
    ASSERT_OK_AND_ASSIGN(job, store->CreateJob(j));
    ASSERT_OK_AND_ASSIGN(std::vector<std::string> ids,
                         store->EnqueueTasks({Task(job, variant), Task(job, variant)}));
    task = ids[0];
    ASSERT_OK_AND_ASSIGN(std::optional<TaskRecord> leased,
                         store->LeaseTask("w1", "sm_90a", false, 1000, 100, PromotionLease::kAny));
    ASSERT_TRUE(leased.has_value());
    EvaluationRecord e = Verified(4);
    e.verified = {.batch = 8, .max_len_q = 64, .max_len_k = 64, .total_q = 300, .total_k = 300};
    ASSERT_OK(store->CompleteTask(task, "w1", 1050, Completion(e, BestRecord{}, "bytes")));
    TaskRecord confirm = Task(job, variant);
    confirm.kind = TaskKind::kConfirm;
    confirm.origin_worker_id = "w1";
    confirm.origin_evaluation_id = 1;
    ASSERT_OK(store->EnqueueTasks({confirm}));
    WorkerRecord w;
    w.name = "gpu0";
    w.arch = "sm_90a";
    w.session_hash = std::string(64, 'a');
    w.sanitizer_tools = {"memcheck", "synccheck"};
    ASSERT_OK_AND_ASSIGN(worker, store->UpsertWorker(w));
  }
  std::unique_ptr<Store> store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(VariantRecord v, store->GetVariant(variant));
  EXPECT_EQ(v.source, "src");
  ASSERT_OK_AND_ASSIGN(JobRecord j, store->GetJob(job));
  EXPECT_EQ(j.state, JobState::kRunning);
  ASSERT_OK_AND_ASSIGN(std::vector<TaskRecord> tasks, store->ListTasks(job));
  ASSERT_EQ(tasks.size(), 3u);
  EXPECT_EQ(tasks[0].state, TaskState::kDone);
  EXPECT_EQ(tasks[1].state, TaskState::kQueued);
  EXPECT_EQ(tasks[2].kind, TaskKind::kConfirm);
  EXPECT_EQ(tasks[2].origin_worker_id, "w1");
  EXPECT_EQ(tasks[2].origin_evaluation_id, 1);
  ASSERT_OK_AND_ASSIGN(std::vector<EvaluationRecord> evals, store->ListEvaluations(variant));
  ASSERT_EQ(evals.size(), 1u);
  EXPECT_EQ(evals[0].verified.total_q, 300);
  ASSERT_OK_AND_ASSIGN(BestRecord best, store->GetBest(Task(job, "").bucket, "sm_90a"));
  EXPECT_EQ(best.variant_id, variant);
  EXPECT_EQ(best.verified, evals[0].verified);
  ASSERT_OK_AND_ASSIGN(std::string cubin, store->GetCubin(evals[0].cubin_hash));
  EXPECT_EQ(cubin, "bytes");
  ASSERT_OK_AND_ASSIGN(std::vector<WorkerRecord> workers, store->ListWorkers());
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].id, worker);
  EXPECT_EQ(workers[0].session_hash, std::string(64, 'a'));
  EXPECT_EQ(workers[0].sanitizer_tools, (std::vector<std::string>{"memcheck", "synccheck"}));
  // Numbering continues after the reopen rather than reusing ids.
  ASSERT_OK_AND_ASSIGN(std::string next, store->PutVariant(Variant("src2")));
  EXPECT_EQ(next, "v2");
}

constexpr std::string_view kAddTags =
    "CREATE TABLE tags (variant INTEGER NOT NULL REFERENCES variants(id), tag TEXT NOT NULL);";

// Version 2 added the timing quartiles; rows from before read 0 there, and
// their spread falls back to max - min.
TEST(SqliteStore, VersionTwoAddsTimingQuartiles) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  const std::vector<Migration> v1(SqliteMigrations().begin(), SqliteMigrations().begin() + 1);
  {
    SqliteOptions old;
    old.migrations = v1;
    ASSERT_NE(MustOpen(path, old), nullptr);
  }
  ASSERT_NE(MustOpen(path, SqliteOptions{}), nullptr);
  RawDb raw(path);
  for (const char* table : {"evaluations", "best"}) {
    EXPECT_EQ(raw.One(fmt::format("SELECT count(*) FROM pragma_table_info('{}') WHERE name IN "
                                  "('p25_us', 'p75_us')",
                                  table)),
              "2")
        << table;
  }
  Timing before{.median_us = 10, .min_us = 8, .max_us = 20, .samples = 5};
  EXPECT_DOUBLE_EQ(before.Spread(), 12.0);
  Timing after = before;
  after.p25_us = 9.5;
  after.p75_us = 10.5;
  EXPECT_DOUBLE_EQ(after.Spread(), 1.0);
}

// Version 5 adds the timing samples, a RETIME's incumbent timing and how a
// best was measured; evaluations and bests stored before keep every figure
// and read back with none of the new ones (their comparisons are unpaired).
TEST(SqliteStore, VersionFiveKeepsTimingsAndAddsSamples) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  const std::vector<Migration> v4(SqliteMigrations().begin(), SqliteMigrations().begin() + 4);
  std::string variant;
  {
    SqliteOptions old;
    old.migrations = v4;
    std::unique_ptr<Store> store = MustOpen(path, old);
    ASSERT_NE(store, nullptr);
  }
  variant = OldVariant(path, "__global__ void k() {}");
  RawDb(path).Exec(
      "INSERT INTO evaluations (variant, bucket, arch, job, task, worker, gpu_name, "
      "compute_capability, driver_version, nvrtc_version, compile_options, reference_version, "
      "outcome, message, compile_ms, registers, spill_bytes, static_smem_bytes, "
      "dynamic_smem_bytes, max_abs_error, rel_l2_error, median_us, min_us, max_us, samples, "
      "cubin_hash, created, p25_us, p75_us) VALUES (1, 'b', 'sm_90a', 'j1', 't1', 'w1', 'H200', "
      "'9.0', '', '', '', '', 'verified', 'ok', 1, 2, 0, 0, 0, 0, 0, 1700.7, 1500, 1900, 24, '', "
      "7, 1600, 1800);"
      "INSERT INTO best (bucket, arch, variant, evaluation, median_us, min_us, max_us, samples, "
      "updated, p25_us, p75_us) VALUES ('b', 'sm_90a', 1, 1, 1700.7, 1500, 1900, 24, 8, 1600, "
      "1800);");
  std::unique_ptr<Store> store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(RawDb(path).One("SELECT version FROM schema_version"),
            fmt::format("{}", SqliteMigrations().back().version));
  ASSERT_OK_AND_ASSIGN(std::vector<EvaluationRecord> evals, store->ListEvaluations(variant));
  ASSERT_EQ(evals.size(), 1u);
  EXPECT_DOUBLE_EQ(evals[0].timing.median_us, 1700.7);
  EXPECT_DOUBLE_EQ(evals[0].timing.p75_us, 1800);
  EXPECT_EQ(evals[0].timing.samples, 24);
  EXPECT_TRUE(evals[0].timing.samples_us.empty());
  EXPECT_EQ(evals[0].incumbent_timing.samples, 0);
  ASSERT_OK_AND_ASSIGN(BestRecord best, store->GetBest("b", "sm_90a"));
  EXPECT_DOUBLE_EQ(best.timing.median_us, 1700.7);
  EXPECT_DOUBLE_EQ(best.timing.p25_us, 1600);
  EXPECT_EQ(best.evaluation_id, 1);
  EXPECT_EQ(best.measured_by, "");
  ASSERT_OK_AND_ASSIGN(std::string check, store->IntegrityCheck());
  EXPECT_EQ(check, "ok");
}

// Version 6 adds the model provenance of variants and the model call
// ledger; variants stored before keep every field and read '' / 0 in the
// new ones.
TEST(SqliteStore, VersionSixKeepsVariantsAndAddsModelCalls) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  const std::vector<Migration> v5(SqliteMigrations().begin(), SqliteMigrations().begin() + 5);
  std::string variant;
  {
    SqliteOptions old;
    old.migrations = v5;
    std::unique_ptr<Store> store = MustOpen(path, old);
    ASSERT_NE(store, nullptr);
  }
  variant = OldVariant(path, "__global__ void k() {}", "model", "m", "p", "v0");
  EXPECT_EQ(RawDb(path).One("SELECT version FROM schema_version"), "5");
  std::unique_ptr<Store> store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(RawDb(path).One("SELECT version FROM schema_version"),
            fmt::format("{}", SqliteMigrations().back().version));
  ASSERT_OK_AND_ASSIGN(VariantRecord v, store->GetVariant(variant));
  EXPECT_EQ(v.source, "__global__ void k() {}");
  EXPECT_EQ(v.model, "m");
  EXPECT_EQ(v.prompt, "p");
  EXPECT_EQ(v.parent_id, "v0");
  EXPECT_EQ(v.kind, "");
  EXPECT_EQ(v.attempt, 0);
  EXPECT_EQ(v.normalized_hash, "");
  EXPECT_EQ(v.provenance_json, "");
  ModelCallRecord call;
  call.purpose = "propose";
  call.outcome = "candidate";
  call.prompt_tokens = 5;
  ASSERT_OK(store->AddModelCall(call));
  ASSERT_OK_AND_ASSIGN(ModelSpend spend, store->SumModelCalls("", 0));
  EXPECT_EQ(spend.tokens, 5);
  ASSERT_OK_AND_ASSIGN(std::string check, store->IntegrityCheck());
  EXPECT_EQ(check, "ok");
}

// Version 3 rebuilds the tasks table (kind 'confirm', origin columns) and
// lets a name be registered twice; everything stored before stays, task ids
// included, and numbering goes on after the highest id ever used.
TEST(SqliteStore, VersionThreeKeepsTasksAndWorkersAndAddsConfirm) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  const std::vector<Migration> v2(SqliteMigrations().begin(), SqliteMigrations().begin() + 2);
  std::string job, variant;
  std::vector<std::string> old_tasks;
  {
    SqliteOptions old;
    old.migrations = v2;
    std::unique_ptr<Store> store = MustOpen(path, old);
    ASSERT_NE(store, nullptr);
    ASSERT_OK_AND_ASSIGN(job, store->CreateJob(JobRecord{}));
  }
  variant = OldVariant(path, "src");
  // Rows as v2 wrote them (this binary's store writes v3 columns).
  const std::string bucket = Task(job, "").bucket;
  RawDb(path).Exec(fmt::format(
      "INSERT INTO workers (name, arch, compile_only, gpu, last_seen) "
      "VALUES ('gpu0', 'sm_90a', 0, '{{}}', 5);"
      "INSERT INTO tasks (job, kind, variant, incumbent, bucket, arch, shape, seed, state, worker, "
      "lease_expires, attempts, created) VALUES "
      "(1, 'evaluate', '{0}', '', '{1}', 'sm_90a', '{{}}', 1, 'leased', 'w1', 99999, 1, 5), "
      "(1, 'retime', '{0}', 'v9', '{1}', 'sm_90a', '{{}}', 2, 'queued', '', 0, 0, 6);",
      variant, bucket));
  old_tasks = {"t1", "t2"};
  std::unique_ptr<Store> store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(std::vector<TaskRecord> tasks, store->ListTasks(job));
  ASSERT_EQ(tasks.size(), 2u);
  EXPECT_EQ(tasks[0].id, old_tasks[0]);
  EXPECT_EQ(tasks[0].state, TaskState::kLeased);
  EXPECT_EQ(tasks[0].worker_id, "w1");
  EXPECT_EQ(tasks[1].id, old_tasks[1]);
  EXPECT_EQ(tasks[1].kind, TaskKind::kRetime);
  EXPECT_EQ(tasks[1].incumbent_variant_id, "v9");
  EXPECT_TRUE(tasks[1].origin_worker_id.empty());
  TaskRecord confirm = Task(job, variant);
  confirm.kind = TaskKind::kConfirm;
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> next, store->EnqueueTasks({confirm}));
  EXPECT_EQ(next[0], "t3");
  ASSERT_OK(store->CompleteTask(old_tasks[0], "w1", 1000, Completion(Verified(3), BestRecord{})));
  ASSERT_OK_AND_ASSIGN(BestRecord best, store->GetBest(Task(job, "").bucket, "sm_90a"));
  EXPECT_TRUE(best.verified.empty());

  ASSERT_OK_AND_ASSIGN(std::vector<WorkerRecord> workers, store->ListWorkers());
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_TRUE(workers[0].session_hash.empty()) << "an old worker has no session to act with";
  WorkerRecord again;
  again.name = "gpu0";
  ASSERT_OK_AND_ASSIGN(std::string id, store->UpsertWorker(again));
  EXPECT_NE(id, workers[0].id);
  EXPECT_EQ(RawDb(path).One("PRAGMA foreign_key_check"), "");
  ASSERT_OK_AND_ASSIGN(std::string check, store->IntegrityCheck());
  EXPECT_EQ(check, "ok");
}

// Version 4 adds the worker's principal. Workers stored before keep every
// field and get none (''), which leasing reads as "told apart by id": an old
// worker's candidate can still be confirmed by any other worker, and the
// server binds a principal at the worker's next authenticated call.
TEST(SqliteStore, VersionFourKeepsWorkersAndAddsPrincipals) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  const std::vector<Migration> v3(SqliteMigrations().begin(), SqliteMigrations().begin() + 3);
  std::string job;
  {
    SqliteOptions old;
    old.migrations = v3;
    std::unique_ptr<Store> store = MustOpen(path, old);
    ASSERT_NE(store, nullptr);
    ASSERT_OK_AND_ASSIGN(job, store->CreateJob(JobRecord{}));
  }
  // Rows as v3 wrote them (this binary's store writes the principal).
  const std::string session = std::string(64, 'b');
  RawDb(path).Exec(fmt::format(
      "INSERT INTO workers (name, arch, compile_only, gpu, last_seen, session_hash, "
      "sanitizer_tools) VALUES ('gpu0', 'sm_90a', 0, '{{\"nvrtc_version\":\"12.8\"}}', 5, "
      "'{0}', 'memcheck,racecheck'), ('gpu1', 'sm_90a', 1, '{{}}', 6, '', '');",
      session));
  std::unique_ptr<Store> store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(RawDb(path).One("SELECT version FROM schema_version"),
            fmt::format("{}", SqliteMigrations().back().version));
  ASSERT_OK_AND_ASSIGN(std::vector<WorkerRecord> workers, store->ListWorkers());
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_EQ(workers[0].id, "w1");
  EXPECT_EQ(workers[0].name, "gpu0");
  EXPECT_EQ(workers[0].arch, "sm_90a");
  EXPECT_FALSE(workers[0].compile_only);
  EXPECT_EQ(workers[0].gpu_json, R"({"nvrtc_version":"12.8"})");
  EXPECT_EQ(workers[0].last_seen_unix_ms, 5);
  EXPECT_EQ(workers[0].session_hash, session) << "an old worker's session still works";
  EXPECT_EQ(workers[0].sanitizer_tools, (std::vector<std::string>{"memcheck", "racecheck"}));
  EXPECT_EQ(workers[0].principal, "") << "no principal until the server binds one";
  EXPECT_TRUE(workers[0].compile_archs.empty()) << "its own arch only, as before v6";
  EXPECT_EQ(workers[1].name, "gpu1");
  EXPECT_TRUE(workers[1].compile_only);
  EXPECT_EQ(workers[1].principal, "");

  // Old rows' candidates: told apart by id.
  WorkerRecord fresh;
  fresh.name = "gpu2";
  fresh.arch = "sm_90a";
  fresh.principal = "host-b";
  ASSERT_OK_AND_ASSIGN(std::string w3, store->UpsertWorker(fresh));
  TaskRecord confirm = Task(job, "v1");
  confirm.kind = TaskKind::kConfirm;
  confirm.origin_worker_id = "w1";
  ASSERT_OK(store->EnqueueTasks({confirm, confirm}));
  auto lease = [&](const std::string& w) -> std::string {
    absl::StatusOr<std::optional<TaskRecord>> t =
        store->LeaseTask(w, "sm_90a", false, 1000, 60000, PromotionLease::kNotOwn);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() && t->has_value() ? (*t)->id : "";
  };
  EXPECT_EQ(lease("w1"), "");
  EXPECT_EQ(lease(w3), "t1");
  // Bound later, the principal counts from then on.
  WorkerRecord bound = workers[0];
  bound.principal = "host-b";
  ASSERT_OK(store->UpsertWorker(bound));
  EXPECT_EQ(lease(w3), "") << "w1 is host-b now: not another worker";
  ASSERT_OK_AND_ASSIGN(std::vector<WorkerRecord> after, store->ListWorkers());
  EXPECT_EQ(after[0].principal, "host-b");
  EXPECT_EQ(after[0].session_hash, session);
  EXPECT_EQ(RawDb(path).One("PRAGMA foreign_key_check"), "");
  ASSERT_OK_AND_ASSIGN(std::string check, store->IntegrityCheck());
  EXPECT_EQ(check, "ok");
}

TEST(SqliteStore, MigratesAnOldVersionFile) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  const std::vector<Migration> v1(SqliteMigrations().begin(), SqliteMigrations().begin() + 1);
  std::string variant;
  {
    SqliteOptions old;
    old.migrations = v1;
    std::unique_ptr<Store> store = MustOpen(path, old);
    ASSERT_NE(store, nullptr);
  }
  variant = OldVariant(path, "src");
  EXPECT_EQ(RawDb(path).One("SELECT version FROM schema_version"), "1");

  std::vector<Migration> v2 = v1;
  v2.push_back({2, "variant tags", kAddTags});
  SqliteOptions next;
  next.migrations = v2;
  for (int open = 0; open < 2; ++open) {  // the second open has nothing to do
    std::unique_ptr<Store> store = MustOpen(path, next);
    ASSERT_NE(store, nullptr);
    // This history stops before v6, whose columns this binary reads: look
    // at the row itself.
    RawDb raw(path);
    EXPECT_EQ(raw.One("SELECT source FROM variants WHERE id = " + variant.substr(1)), "src");
    EXPECT_EQ(raw.One("SELECT version FROM schema_version"), "2");
    EXPECT_EQ(raw.One("SELECT count(*) FROM sqlite_master WHERE name = 'tags'"), "1");
  }
}

TEST(SqliteStore, MigratesAFileFromBeforeTheFirstMigration) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  RawDb(path).Exec(
      "CREATE TABLE schema_version (version INTEGER NOT NULL);"
      "INSERT INTO schema_version VALUES (0);");
  std::unique_ptr<Store> store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  EXPECT_OK(store->PutVariant(Variant("src")));
  EXPECT_EQ(RawDb(path).One("SELECT version FROM schema_version"),
            std::to_string(SqliteMigrations().size()));
}

TEST(SqliteStore, RefusesASchemaNewerThanItKnows) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  ASSERT_NE(MustOpen(path), nullptr);
  RawDb(path).Exec("UPDATE schema_version SET version = 99");
  EXPECT_CODE(OpenSqliteStore(path), kFailedPrecondition);
}

TEST(SqliteStore, AFailedMigrationLeavesThePreviousVersion) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  std::vector<Migration> broken(SqliteMigrations().begin(), SqliteMigrations().end());
  const int next = static_cast<int>(broken.size()) + 1;
  broken.push_back({next, "half done", "CREATE TABLE half (x); CREATE TABLE broken (;"});
  SqliteOptions options;
  options.migrations = broken;
  EXPECT_CODE(OpenSqliteStore(path, options), kInternal);
  RawDb raw(path);
  EXPECT_EQ(raw.One("SELECT version FROM schema_version"), std::to_string(next - 1));
  EXPECT_EQ(raw.One("SELECT count(*) FROM sqlite_master WHERE name = 'half'"), "0");
  EXPECT_NE(MustOpen(path), nullptr);  // the good history still opens it
}

TEST(SqliteStore, RejectsAHistoryWithGaps) {
  TempDir dir;
  std::vector<Migration> gapped(SqliteMigrations().begin(), SqliteMigrations().end());
  gapped.push_back({static_cast<int>(gapped.size()) + 2, "skips one", kAddTags});
  SqliteOptions options;
  options.migrations = gapped;
  EXPECT_CODE(OpenSqliteStore(dir.File("k.db"), options), kInvalidArgument);
}

TEST(SqliteStore, ConnectionsOpeningANewFileAtOnceMigrateItOnce) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  std::vector<absl::Status> results(4);
  std::vector<std::thread> openers;
  for (size_t i = 0; i < results.size(); ++i) {
    openers.emplace_back([&, i] {
      absl::StatusOr<std::unique_ptr<Store>> store = OpenSqliteStore(path);
      results[i] = store.ok() ? (*store)->PutVariant(Variant(fmt::format("s{}", i))).status()
                              : store.status();
    });
  }
  for (std::thread& t : openers) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  RawDb raw(path);
  EXPECT_EQ(raw.One("SELECT version FROM schema_version"),
            std::to_string(SqliteMigrations().size()));
  EXPECT_EQ(raw.One("SELECT count(*) FROM variants"), "4");
}

TEST(SqliteStore, TwoConnectionsOnOneFileNeverLeaseATaskTwice) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  std::unique_ptr<Store> a = MustOpen(path);
  std::unique_ptr<Store> b = MustOpen(path);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_OK_AND_ASSIGN(std::string job, a->CreateJob(JobRecord{}));
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> ids,
                       a->EnqueueTasks(std::vector<TaskRecord>(30, Task(job, ""))));
  std::vector<std::string> got_a, got_b;
  auto drain = [](Store* store, std::string worker, std::vector<std::string>* got) {
    while (true) {
      absl::StatusOr<std::optional<TaskRecord>> t =
          store->LeaseTask(worker, "sm_90a", false, 1000, 60000, PromotionLease::kAny);
      ASSERT_TRUE(t.ok()) << t.status();
      if (!t->has_value()) return;
      got->push_back((*t)->id);
    }
  };
  std::thread ta(drain, a.get(), "wa", &got_a);
  std::thread tb(drain, b.get(), "wb", &got_b);
  ta.join();
  tb.join();
  std::multiset<std::string> all(got_a.begin(), got_a.end());
  all.insert(got_b.begin(), got_b.end());
  EXPECT_EQ(all, std::multiset<std::string>(ids.begin(), ids.end()));
}

// The child's side of the crash test: writes in a loop and, after each
// write is acknowledged, reports its ids on `fd`. Never returns.
[[noreturn]] void WriteUntilKilled(const std::string& path, const std::string& job, int fd) {
  auto fail = [fd](const absl::Status& s) {
    std::string line = fmt::format("error {}\n", s.ToString());
    (void)!write(fd, line.data(), line.size());
    _exit(2);
  };
  absl::StatusOr<std::unique_ptr<Store>> opened = OpenSqliteStore(path);
  if (!opened.ok()) fail(opened.status());
  Store& store = **opened;
  for (int i = 0; i < 1000000; ++i) {
    absl::StatusOr<std::string> variant = store.PutVariant(Variant(fmt::format("src {}", i)));
    if (!variant.ok()) fail(variant.status());
    absl::StatusOr<std::vector<std::string>> tasks = store.EnqueueTasks({Task(job, *variant)});
    if (!tasks.ok()) fail(tasks.status());
    absl::StatusOr<std::optional<TaskRecord>> leased =
        store.LeaseTask("child", "sm_90a", false, 1000, 600000, PromotionLease::kAny);
    if (!leased.ok()) fail(leased.status());
    if (!leased->has_value() || (*leased)->id != tasks->front())
      fail(absl::InternalError("leased the wrong task"));
    absl::StatusOr<CompletedTask> done = store.CompleteTask(
        tasks->front(), "child", 2000,
        Completion(Verified(100.0 - i * 1e-3), BestRecord{}, fmt::format("cubin {}", i)));
    if (!done.ok()) fail(done.status());
    // One write() of less than PIPE_BUF bytes: the line arrives whole or not at all.
    std::string line = fmt::format("{} {}\n", *variant, tasks->front());
    if (write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) _exit(3);
  }
  _exit(0);
}

TEST(SqliteStoreCrash, AcknowledgedWritesSurviveSigkill) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  std::string job;
  {
    std::unique_ptr<Store> store = MustOpen(path);
    ASSERT_NE(store, nullptr);
    ASSERT_OK_AND_ASSIGN(job, store->CreateJob(JobRecord{}));
  }
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(fds[0]);
    WriteUntilKilled(path, job, fds[1]);
  }
  close(fds[1]);

  // Let the child get well into its loop, then kill it wherever it is.
  constexpr int kAcksBeforeKill = 40;
  std::string received;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  auto lines = [&] { return std::count(received.begin(), received.end(), '\n'); };
  while (lines() < kAcksBeforeKill && std::chrono::steady_clock::now() < deadline &&
         received.find("error") == std::string::npos) {
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    received.append(buf, static_cast<size_t>(n));
  }
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  // Whatever the child wrote before it died was acknowledged too.
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) received.append(buf, n);
  close(fds[0]);
  ASSERT_EQ(received.find("error"), std::string::npos) << received;
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child ended on its own: " << received;
  ASSERT_GE(lines(), kAcksBeforeKill) << "the child was too slow";

  std::unique_ptr<Store> store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  ASSERT_OK_AND_ASSIGN(std::string check, store->IntegrityCheck());
  EXPECT_EQ(check, "ok");
  std::istringstream acks(received);
  std::string variant, task;
  int checked = 0;
  while (acks >> variant >> task) {
    ASSERT_OK(store->GetVariant(variant));
    ASSERT_OK_AND_ASSIGN(TaskRecord t, store->GetTask(task));
    EXPECT_EQ(t.state, TaskState::kDone) << task;
    ASSERT_OK_AND_ASSIGN(std::vector<EvaluationRecord> evals, store->ListEvaluations(variant));
    ASSERT_EQ(evals.size(), 1u) << variant;
    EXPECT_EQ(evals[0].task_id, task);
    ++checked;
  }
  EXPECT_EQ(checked, lines());
  // CompleteTask is all or nothing even when killed inside it: a task is
  // done exactly when its evaluation is there.
  ASSERT_OK_AND_ASSIGN(std::vector<TaskRecord> tasks, store->ListTasks(job));
  for (const TaskRecord& t : tasks) {
    ASSERT_OK_AND_ASSIGN(std::vector<EvaluationRecord> evals,
                         store->ListEvaluations(t.variant_id));
    EXPECT_EQ(evals.size(), t.state == TaskState::kDone ? 1u : 0u) << t.id;
  }
  EXPECT_OK(store->GetBest(Task(job, "").bucket, "sm_90a"));
}

// --- What the file is at open: private when new, refused when it holds no
// kforge database (unless init) or is damaged (always). ---

int ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return static_cast<int>(st.st_mode & 0777);
}

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(SqliteStoreOpen, ANewFileIsPrivateAndMarkedAsKforges) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  const mode_t old = umask(022);  // as a login shell has it: 0644 files
  std::unique_ptr<Store> store = MustOpen(path);
  umask(old);
  ASSERT_NE(store, nullptr);
  EXPECT_OK(store->PutVariant(Variant("src")));
  EXPECT_EQ(ModeOf(path), 0600);
  EXPECT_EQ(ModeOf(path + "-wal"), 0600) << "SQLite gives its WAL the database's mode";
  EXPECT_EQ(RawDb(path).One("PRAGMA application_id"), std::to_string(0x6b666462));
  store.reset();
  EXPECT_NE(MustOpen(path), nullptr) << "reopened without init";
}

TEST(SqliteStoreOpen, AnEmptyFileIsRefusedUnlessInit) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  std::ofstream(path).close();
  absl::StatusOr<std::unique_ptr<Store>> refused = OpenSqliteStore(path);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("is empty (0 bytes)"), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("--init"), std::string::npos) << refused.status();
  EXPECT_EQ(FileBytes(path), "") << "refusing writes nothing";
  std::unique_ptr<Store> store = MustOpen(path, SqliteOptions{.init = true});
  ASSERT_NE(store, nullptr);
  EXPECT_OK(store->PutVariant(Variant("src")));
  store.reset();
  EXPECT_NE(MustOpen(path), nullptr) << "initialised once, it is a kforge database";
}

TEST(SqliteStoreOpen, AFileThatIsNotSqliteIsRefusedEvenWithInit) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  const std::string text = "not a database, but somebody's notes\n" + std::string(5000, 'x');
  std::ofstream(path) << text;
  for (bool init : {false, true}) {
    absl::StatusOr<std::unique_ptr<Store>> refused =
        OpenSqliteStore(path, SqliteOptions{.init = init});
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(refused.status().message().find("is not an SQLite database"), std::string::npos)
        << refused.status();
  }
  EXPECT_EQ(FileBytes(path), text);
}

TEST(SqliteStoreOpen, AnotherApplicationsDatabaseIsRefusedUnlessInit) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  RawDb(path).Exec("CREATE TABLE users (name TEXT); INSERT INTO users VALUES ('ada');");
  const std::string before = FileBytes(path);
  absl::StatusOr<std::unique_ptr<Store>> refused = OpenSqliteStore(path);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("is not a kforge database (tables: users"),
            std::string::npos)
      << refused.status();
  EXPECT_EQ(FileBytes(path), before) << "not even switched to WAL";
  std::unique_ptr<Store> store = MustOpen(path, SqliteOptions{.init = true});
  ASSERT_NE(store, nullptr);
  EXPECT_OK(store->PutVariant(Variant("src")));
  EXPECT_EQ(RawDb(path).One("SELECT name FROM users"), "ada") << "its tables are kept";

  // An SQLite file marked as another application's, even with our tables.
  const std::string other = dir.File("other.db");
  { MustOpen(other); }
  RawDb(other).Exec("PRAGMA application_id = 42");
  absl::StatusOr<std::unique_ptr<Store>> marked = OpenSqliteStore(other);
  EXPECT_EQ(marked.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(marked.status().message().find("application_id 42"), std::string::npos)
      << marked.status();
}

TEST(SqliteStoreOpen, AnSqliteFileWithoutTablesIsRefusedUnlessInit) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  RawDb(path).Exec("PRAGMA user_version = 7");
  absl::StatusOr<std::unique_ptr<Store>> refused = OpenSqliteStore(path);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("without tables"), std::string::npos)
      << refused.status();
  EXPECT_NE(MustOpen(path, SqliteOptions{.init = true}), nullptr);
}

TEST(SqliteStoreOpen, AKforgeDatabaseFromBeforeTheMarkOpensAndIsMarked) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  { MustOpen(path); }
  RawDb(path).Exec("PRAGMA application_id = 0");
  EXPECT_NE(MustOpen(path), nullptr);
  EXPECT_EQ(RawDb(path).One("PRAGMA application_id"), std::to_string(0x6b666462));
}

TEST(SqliteStoreOpen, ADamagedFileIsRefusedAsDataLoss) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  {
    std::unique_ptr<Store> store = MustOpen(path);
    ASSERT_NE(store, nullptr);
    for (int i = 0; i < 200; ++i)
      ASSERT_OK(store->PutVariant(Variant(fmt::format("source {} {}", i, std::string(900, 'k')))));
  }  // closing checkpoints the WAL into the file
  ASSERT_EQ(::access((path + "-wal").c_str(), F_OK), -1) << "the WAL was checkpointed";
  std::string bytes = FileBytes(path);
  ASSERT_GT(bytes.size(), 16u * 4096);
  // Page 1 (header and schema) stays; every other page becomes garbage.
  for (size_t i = 4096; i < bytes.size(); ++i) bytes[i] = static_cast<char>(0xA5 ^ (i * 31));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  absl::StatusOr<std::unique_ptr<Store>> refused = OpenSqliteStore(path);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss) << refused.status();
  EXPECT_NE(refused.status().message().find("fails its integrity check"), std::string::npos)
      << refused.status();
  EXPECT_LT(refused.status().message().size(), 1200u) << "the problems are summarised";
  EXPECT_EQ(OpenSqliteStore(path, SqliteOptions{.init = true}).status().code(),
            absl::StatusCode::kDataLoss)
      << "init does not excuse damage";
}

TEST(SqliteStoreOpen, ACubinChangedInTheFileIsNeverReturned) {
  TempDir dir;
  const std::string path = dir.File("k.db");
  std::unique_ptr<Store> store = MustOpen(path);
  ASSERT_NE(store, nullptr);
  const std::string bytes(4096, 'c');
  const std::string hash = Sha256Hex(bytes);
  ASSERT_OK(store->PutCubin(hash, bytes));
  RawDb(path).Exec("UPDATE cubins SET bytes = zeroblob(4096)");
  absl::StatusOr<std::string> got = store->GetCubin(hash);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  EXPECT_NE(got.status().message().find("no longer match their hash"), std::string::npos);
}

}  // namespace
}  // namespace kforge
