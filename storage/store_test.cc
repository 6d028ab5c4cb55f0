// The Store contract, run against every implementation: MemoryStore and
// SqliteStore (on a real file). A behaviour that differs between the two is
// a bug in one of them.
#include "storage/store.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/hash.h"
#include "storage/test_util.h"

namespace kforge {
namespace {

using testing_util::TempDir;

struct MemoryStoreFactory {
  static absl::StatusOr<std::unique_ptr<Store>> Open(const TempDir&) { return NewMemoryStore(); }
};
struct SqliteStoreFactory {
  static absl::StatusOr<std::unique_ptr<Store>> Open(const TempDir& dir) {
    return OpenSqliteStore(dir.File("kforge.db"));
  }
};

template <typename Factory>
class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Store>> store = Factory::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  Store& store() { return *store_; }

  std::string NewVariant(const std::string& source) {
    VariantRecord v;
    v.source = source;
    v.origin = "template";
    v.template_name = "fa2";
    absl::StatusOr<std::string> id = store_->PutVariant(v);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or("");
  }

  std::string NewJob(const std::string& name, JobState state = JobState::kQueued) {
    JobRecord j;
    j.name = name;
    j.state = state;
    j.proposer = "builtin";
    absl::StatusOr<std::string> id = store_->CreateJob(j);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or("");
  }

  static TaskRecord Task(const std::string& job_id, const std::string& variant_id = "",
                         const std::string& arch = "sm_90a",
                         TaskKind kind = TaskKind::kEvaluate) {
    TaskRecord t;
    t.job_id = job_id;
    t.variant_id = variant_id;
    t.kind = kind;
    t.arch = arch;
    t.bucket = "fwd.bf16.d128.h4.kv4.causal.self.sm_90a.b128.mq4096.aq4096.mk4096.ak4096";
    t.shape_json = R"({"batch":128})";
    t.seed = 7;
    return t;
  }

  std::vector<std::string> Enqueue(std::vector<TaskRecord> tasks) {
    absl::StatusOr<std::vector<std::string>> ids = store_->EnqueueTasks(std::move(tasks));
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.value_or(std::vector<std::string>{});
  }

  // The id of the task `worker` leases now, or "" when none.
  std::string Lease(const std::string& worker, const std::string& arch = "sm_90a",
                    bool compile_only = false, int64_t now = 1000, int64_t ttl = 60000) {
    absl::StatusOr<std::optional<TaskRecord>> t =
        store_->LeaseTask(worker, arch, compile_only, now, ttl, PromotionLease::kAny);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok() || !t->has_value()) return "";
    return (*t)->id;
  }

  // Completes `task` as `worker` at `now` (inside the leases Lease() hands
  // out by default).
  absl::StatusOr<CompletedTask> Complete(const std::string& task, const std::string& worker,
                                         EvaluationRecord eval,
                                         std::optional<BestRecord> best = std::nullopt,
                                         std::string cubin = "",
                                         std::vector<TaskRecord> follow_ups = {},
                                         int64_t now = 2000) {
    TaskCompletion c;
    c.eval = std::move(eval);
    c.cubin = std::move(cubin);
    c.new_best = std::move(best);
    c.follow_ups = std::move(follow_ups);
    return store_->CompleteTask(task, worker, now, std::move(c));
  }

  static EvaluationRecord Verified(double median_us) {
    EvaluationRecord e;
    e.outcome = Outcome::kVerified;
    e.gpu_name = "NVIDIA H200";
    e.compute_capability = "9.0";
    e.timing = {median_us, median_us - 1, median_us + 1, 20, median_us - 0.25, median_us + 0.5};
    return e;
  }

  // A variant evaluated through a task of `job`, completed by `worker`.
  // Returns the variant id.
  std::string Evaluate(const std::string& job, const std::string& source, double median_us,
                       bool best, const std::string& bucket = "") {
    std::string v = NewVariant(source);
    TaskRecord t = Task(job, v);
    if (!bucket.empty()) t.bucket = bucket;
    std::string task = Enqueue({t})[0];
    EXPECT_EQ(Lease("w-eval"), task);
    std::optional<BestRecord> new_best;
    if (best) new_best = BestRecord{};
    EvaluationRecord e = Verified(median_us);
    e.verified = {.batch = 128, .max_len_q = 4096, .max_len_k = 4096, .total_q = 1 << 19,
                  .total_k = 1 << 19};
    absl::StatusOr<CompletedTask> done = Complete(task, "w-eval", e, new_best);
    EXPECT_TRUE(done.ok()) << done.status();
    return v;
  }

  TempDir dir_;
  std::unique_ptr<Store> store_;
};

using Implementations = ::testing::Types<MemoryStoreFactory, SqliteStoreFactory>;
class ImplementationNames {
 public:
  template <typename T>
  static std::string GetName(int) {
    return std::is_same_v<T, MemoryStoreFactory> ? "Memory" : "Sqlite";
  }
};
TYPED_TEST_SUITE(StoreTest, Implementations, ImplementationNames);

// ---------------------------------------------------------------- variants

TYPED_TEST(StoreTest, PutVariantDedupesBySourceHash) {
  VariantRecord v;
  v.source = "__global__ void k() {}";
  v.origin = "model";
  ASSERT_OK_AND_ASSIGN(std::string first, this->store().PutVariant(v));
  v.manifest_json = R"({"block":128})";  // same source, other metadata: still the same variant
  ASSERT_OK_AND_ASSIGN(std::string again, this->store().PutVariant(v));
  EXPECT_EQ(first, again);
  v.source += "\n";
  ASSERT_OK_AND_ASSIGN(std::string other, this->store().PutVariant(v));
  EXPECT_NE(first, other);
  EXPECT_EQ(first[0], 'v');
}

TYPED_TEST(StoreTest, VariantFieldsRoundTrip) {
  VariantRecord v;
  v.source = "src";
  v.manifest_json = "{}";
  v.origin = "model";
  v.template_name = "fa3";
  v.knobs_json = R"({"tile":64})";
  v.model = "qwen";
  v.prompt_hash = "ph";
  v.prompt = "write a kernel";
  v.answer = "```cuda src```";
  v.parent_id = "v1";
  v.job_id = "j1";
  v.created_unix_ms = 1234;
  v.kind = "repair";
  v.attempt = 2;
  v.normalized_hash = Sha256Hex("src");
  v.provenance_json = R"({"answer_form":"diff"})";
  ASSERT_OK_AND_ASSIGN(std::string id, this->store().PutVariant(v));
  ASSERT_OK_AND_ASSIGN(VariantRecord got, this->store().GetVariant(id));
  EXPECT_EQ(got.id, id);
  EXPECT_EQ(got.source_hash, Sha256Hex("src"));
  EXPECT_EQ(got.manifest_json, v.manifest_json);
  EXPECT_EQ(got.origin, v.origin);
  EXPECT_EQ(got.template_name, v.template_name);
  EXPECT_EQ(got.knobs_json, v.knobs_json);
  EXPECT_EQ(got.model, v.model);
  EXPECT_EQ(got.prompt_hash, v.prompt_hash);
  EXPECT_EQ(got.prompt, v.prompt);
  EXPECT_EQ(got.answer, v.answer);
  EXPECT_EQ(got.parent_id, v.parent_id);
  EXPECT_EQ(got.job_id, v.job_id);
  EXPECT_EQ(got.created_unix_ms, 1234);
  EXPECT_EQ(got.kind, "repair");
  EXPECT_EQ(got.attempt, 2);
  EXPECT_EQ(got.normalized_hash, v.normalized_hash);
  EXPECT_EQ(got.provenance_json, v.provenance_json);
}

TYPED_TEST(StoreTest, ModelCallsRoundTripAndSumPerJobAndSince) {
  ModelCallRecord c;
  c.job_id = "j1";
  c.bucket = "b";
  c.model = "mini";
  c.purpose = "repair";
  c.parent_id = "v3";
  c.attempt = 1;
  c.prompt_hash = "ph";
  c.prompt = "[]";
  c.answer = "```cuda x```";
  c.prompt_tokens = 100;
  c.completion_tokens = 20;
  c.cost_usd = 0.5;
  c.usage_estimated = true;
  c.outcome = "refused";
  c.detail = "source: empty";
  c.created_unix_ms = 1000;
  ASSERT_OK_AND_ASSIGN(int64_t first, this->store().AddModelCall(c));
  c.job_id = "j2";
  c.created_unix_ms = 2000;
  c.prompt_tokens = 7;
  c.completion_tokens = 3;
  c.cost_usd = 0.25;
  ASSERT_OK_AND_ASSIGN(int64_t second, this->store().AddModelCall(c));
  EXPECT_LT(first, second);

  ASSERT_OK_AND_ASSIGN(std::vector<ModelCallRecord> j1, this->store().ListModelCalls("j1"));
  ASSERT_EQ(j1.size(), 1u);
  EXPECT_EQ(j1[0].id, first);
  EXPECT_EQ(j1[0].bucket, "b");
  EXPECT_EQ(j1[0].model, "mini");
  EXPECT_EQ(j1[0].purpose, "repair");
  EXPECT_EQ(j1[0].parent_id, "v3");
  EXPECT_EQ(j1[0].attempt, 1);
  EXPECT_EQ(j1[0].prompt_hash, "ph");
  EXPECT_EQ(j1[0].prompt, "[]");
  EXPECT_EQ(j1[0].answer, "```cuda x```");
  EXPECT_EQ(j1[0].prompt_tokens, 100);
  EXPECT_EQ(j1[0].completion_tokens, 20);
  EXPECT_DOUBLE_EQ(j1[0].cost_usd, 0.5);
  EXPECT_TRUE(j1[0].usage_estimated);
  EXPECT_EQ(j1[0].outcome, "refused");
  EXPECT_EQ(j1[0].detail, "source: empty");
  EXPECT_EQ(j1[0].created_unix_ms, 1000);
  ASSERT_OK_AND_ASSIGN(std::vector<ModelCallRecord> all, this->store().ListModelCalls(""));
  EXPECT_EQ(all.size(), 2u);

  ASSERT_OK_AND_ASSIGN(ModelSpend job1, this->store().SumModelCalls("j1", 0));
  EXPECT_EQ(job1.calls, 1);
  EXPECT_EQ(job1.tokens, 120);
  EXPECT_DOUBLE_EQ(job1.cost_usd, 0.5);
  ASSERT_OK_AND_ASSIGN(ModelSpend every, this->store().SumModelCalls("", 0));
  EXPECT_EQ(every.calls, 2);
  EXPECT_EQ(every.tokens, 130);
  EXPECT_DOUBLE_EQ(every.cost_usd, 0.75);
  ASSERT_OK_AND_ASSIGN(ModelSpend recent, this->store().SumModelCalls("", 1500));
  EXPECT_EQ(recent.calls, 1);
  EXPECT_EQ(recent.tokens, 10);
  // A pending call rewritten with what it really cost.
  ModelCallRecord settled = j1[0];
  settled.outcome = "candidate";
  settled.completion_tokens = 5;
  settled.created_unix_ms = 99;  // ignored: a call keeps when it was made
  ASSERT_OK(this->store().UpdateModelCall(settled));
  ASSERT_OK_AND_ASSIGN(std::vector<ModelCallRecord> again, this->store().ListModelCalls("j1"));
  EXPECT_EQ(again[0].outcome, "candidate");
  EXPECT_EQ(again[0].completion_tokens, 5);
  EXPECT_EQ(again[0].created_unix_ms, 1000);
  settled.id = 12345;
  EXPECT_CODE(this->store().UpdateModelCall(settled), kNotFound);
  settled.id = first;
  settled.outcome = "";
  EXPECT_CODE(this->store().UpdateModelCall(settled), kInvalidArgument);
  ModelCallRecord pending = j1[0];
  pending.job_id = "j3";
  pending.outcome = "pending";
  ASSERT_OK(this->store().AddModelCall(pending));
  ASSERT_OK_AND_ASSIGN(ModelSpend j3, this->store().SumModelCalls("j3", 0));
  EXPECT_EQ(j3.pending_tokens, 120);
  EXPECT_EQ(j3.tokens, 120);
  ASSERT_OK_AND_ASSIGN(ModelSpend none, this->store().SumModelCalls("j9", 0));
  EXPECT_EQ(none.calls, 0);
  EXPECT_EQ(none.tokens, 0);
}

TYPED_TEST(StoreTest, MalformedModelCallsAreInvalidArgument) {
  ModelCallRecord c;
  c.purpose = "propose";
  c.outcome = "candidate";
  c.prompt_tokens = -1;
  EXPECT_CODE(this->store().AddModelCall(c), kInvalidArgument);
  c.prompt_tokens = 0;
  c.cost_usd = std::nan("");
  EXPECT_CODE(this->store().AddModelCall(c), kInvalidArgument);
  c.cost_usd = 0;
  c.outcome = "";
  EXPECT_CODE(this->store().AddModelCall(c), kInvalidArgument);
  ASSERT_OK_AND_ASSIGN(std::vector<ModelCallRecord> all, this->store().ListModelCalls(""));
  EXPECT_TRUE(all.empty());
}

TYPED_TEST(StoreTest, MalformedVariantsAreInvalidArgument) {
  VariantRecord empty;
  EXPECT_CODE(this->store().PutVariant(empty), kInvalidArgument);
  VariantRecord wrong_hash;
  wrong_hash.source = "src";
  wrong_hash.source_hash = Sha256Hex("other");
  EXPECT_CODE(this->store().PutVariant(wrong_hash), kInvalidArgument);
}

TYPED_TEST(StoreTest, UnknownIdsAreNotFound) {
  Store& s = this->store();
  for (std::string id : {"v999", "garbage", "", "v", "v0", "v-1", "j1"})
    EXPECT_CODE(s.GetVariant(id), kNotFound) << id;
  EXPECT_CODE(s.ListEvaluations("v5"), kNotFound);
  EXPECT_CODE(s.GetCubin("nohash"), kNotFound);
  EXPECT_CODE(s.GetBest("bucket", "sm_90a"), kNotFound);
  EXPECT_CODE(s.GetJob("j5"), kNotFound);
  JobRecord ghost;
  ghost.id = "j5";
  EXPECT_CODE(s.UpdateJob(ghost), kNotFound);
  EXPECT_CODE(s.GetTask("t5"), kNotFound);
  EXPECT_CODE(s.ListTasks("j5"), kNotFound);
  EXPECT_CODE(s.CancelTasks("j5"), kNotFound);
  EXPECT_CODE(s.EnqueueTasks({this->Task("j5")}), kNotFound);
  EXPECT_CODE(this->Complete("t5", "w", this->Verified(1)), kNotFound);
  WorkerRecord w;
  w.id = "w5";
  EXPECT_CODE(s.UpsertWorker(w), kNotFound);
}

TYPED_TEST(StoreTest, CubinsAreStoredOnceByHash) {
  const std::string bytes("\x7f" "ELF\0\0binary", 12);
  const std::string hash = Sha256Hex(bytes);
  ASSERT_OK(this->store().PutCubin(hash, bytes));
  ASSERT_OK(this->store().PutCubin(hash, bytes));
  ASSERT_OK_AND_ASSIGN(std::string got, this->store().GetCubin(hash));
  EXPECT_EQ(got, bytes);
  EXPECT_CODE(this->store().PutCubin("", bytes), kInvalidArgument);
}

// A hash names its bytes: bytes stored under another hash could later be
// served as a kernel that was never checked.
TYPED_TEST(StoreTest, PutCubinRefusesBytesThatAreNotItsHash) {
  const std::string bytes("\x7f" "ELF forged", 10);
  EXPECT_CODE(this->store().PutCubin("h1", bytes), kInvalidArgument);
  EXPECT_CODE(this->store().PutCubin(Sha256Hex("the checked cubin"), bytes), kInvalidArgument);
  EXPECT_CODE(this->store().GetCubin(Sha256Hex("the checked cubin")), kNotFound);
  EXPECT_CODE(this->store().GetCubin("h1"), kNotFound);
}

// ------------------------------------------------------ evaluations, best

TYPED_TEST(StoreTest, CompleteTaskRecordsTheEvaluation) {
  std::string job = this->NewJob("tune");
  std::string v = this->NewVariant("src");
  std::string task = this->Enqueue({this->Task(job, v)})[0];
  ASSERT_EQ(this->Lease("w1"), task);
  EvaluationRecord e = this->Verified(12.5);
  e.registers = 96;
  e.message = "ok";
  e.verified = {.batch = 4, .max_len_q = 512, .max_len_k = 256, .total_q = 1000, .total_k = 700};
  ASSERT_OK_AND_ASSIGN(CompletedTask done, this->Complete(task, "w1", e, std::nullopt, "cub"));
  EXPECT_GT(done.evaluation_id, 0);

  ASSERT_OK_AND_ASSIGN(std::vector<EvaluationRecord> evals, this->store().ListEvaluations(v));
  ASSERT_EQ(evals.size(), 1u);
  const EvaluationRecord& got = evals[0];
  EXPECT_GT(got.id, 0);
  EXPECT_EQ(got.variant_id, v);  // filled from the task
  EXPECT_EQ(got.task_id, task);
  EXPECT_EQ(got.job_id, job);
  EXPECT_EQ(got.worker_id, "w1");
  EXPECT_EQ(got.arch, "sm_90a");
  EXPECT_EQ(got.bucket, this->Task(job).bucket);
  EXPECT_EQ(got.outcome, Outcome::kVerified);
  EXPECT_EQ(got.registers, 96);
  EXPECT_EQ(got.message, "ok");
  EXPECT_EQ(got.id, done.evaluation_id);
  EXPECT_EQ(got.cubin_hash, Sha256Hex("cub"));  // stored with the evaluation, under its hash
  ASSERT_OK_AND_ASSIGN(std::string cubin, this->store().GetCubin(got.cubin_hash));
  EXPECT_EQ(cubin, "cub");
  EXPECT_EQ(got.verified, e.verified);
  EXPECT_EQ(got.gpu_name, "NVIDIA H200");
  EXPECT_DOUBLE_EQ(got.timing.median_us, 12.5);
  EXPECT_EQ(got.timing.samples, 20);
  EXPECT_DOUBLE_EQ(got.timing.p25_us, 12.25);
  EXPECT_DOUBLE_EQ(got.timing.p75_us, 13.0);
  EXPECT_DOUBLE_EQ(got.timing.Spread(), 0.75);
  EXPECT_GT(got.created_unix_ms, 0);

  ASSERT_OK_AND_ASSIGN(TaskRecord t, this->store().GetTask(task));
  EXPECT_EQ(t.state, TaskState::kDone);
  // Completing again is refused: the task is no longer leased.
  absl::StatusOr<CompletedTask> twice = this->Complete(task, "w1", e);
  EXPECT_CODE(twice, kFailedPrecondition);
  EXPECT_NE(twice.status().message().find("done"), std::string_view::npos) << twice.status();
  ASSERT_OK_AND_ASSIGN(evals, this->store().ListEvaluations(v));
  EXPECT_EQ(evals.size(), 1u);
}

TYPED_TEST(StoreTest, CompleteTaskRefusesACubinThatIsNotItsHash) {
  std::string job = this->NewJob("tune");
  std::string v = this->NewVariant("src");
  std::string task = this->Enqueue({this->Task(job, v)})[0];
  ASSERT_EQ(this->Lease("w1"), task);
  EvaluationRecord e = this->Verified(5);
  e.cubin_hash = Sha256Hex("the cubin that was checked");
  EXPECT_CODE(this->Complete(task, "w1", e, BestRecord{}, "other bytes"), kInvalidArgument);
  // A hash without bytes must name a stored cubin.
  EXPECT_CODE(this->Complete(task, "w1", e, BestRecord{}), kNotFound);
  EXPECT_CODE(this->store().GetCubin(Sha256Hex("other bytes")), kNotFound);
  ASSERT_OK_AND_ASSIGN(std::vector<EvaluationRecord> evals, this->store().ListEvaluations(v));
  EXPECT_TRUE(evals.empty());
  ASSERT_OK_AND_ASSIGN(TaskRecord t, this->store().GetTask(task));
  EXPECT_EQ(t.state, TaskState::kLeased);
  EXPECT_CODE(this->store().GetBest(t.bucket, "sm_90a"), kNotFound);
}

// Follow-up tasks (a CONFIRM or RETIME) are enqueued in the transaction
// that records the result, so a crash cannot keep the evaluation and lose
// the promotion it asked for.
TYPED_TEST(StoreTest, CompleteTaskEnqueuesTheFollowUpsWithTheResult) {
  std::string job = this->NewJob("tune");
  std::string v = this->NewVariant("src");
  std::string task = this->Enqueue({this->Task(job, v)})[0];
  ASSERT_EQ(this->Lease("w1"), task);
  TaskRecord confirm = this->Task(job, v);
  confirm.kind = TaskKind::kConfirm;
  confirm.origin_worker_id = "w1";
  confirm.origin_evaluation_id = 41;
  TaskRecord orphan = confirm;
  orphan.job_id = "j999";
  EXPECT_CODE(this->Complete(task, "w1", this->Verified(5), std::nullopt, "", {confirm, orphan}),
              kNotFound);
  ASSERT_OK_AND_ASSIGN(std::vector<TaskRecord> tasks, this->store().ListTasks(job));
  EXPECT_EQ(tasks.size(), 1u) << "a failed completion enqueues nothing";

  TaskRecord retime = this->Task(job, v);  // no origin given: the recorded evaluation is
  retime.kind = TaskKind::kRetime;
  ASSERT_OK_AND_ASSIGN(CompletedTask done, this->Complete(task, "w1", this->Verified(5),
                                                          std::nullopt, "", {confirm, retime}));
  ASSERT_EQ(done.follow_up_ids.size(), 2u);
  ASSERT_OK_AND_ASSIGN(TaskRecord defaulted, this->store().GetTask(done.follow_up_ids[1]));
  EXPECT_EQ(defaulted.origin_worker_id, "w1");
  EXPECT_EQ(defaulted.origin_evaluation_id, done.evaluation_id);
  ASSERT_OK_AND_ASSIGN(TaskRecord got, this->store().GetTask(done.follow_up_ids[0]));
  EXPECT_EQ(got.kind, TaskKind::kConfirm);
  EXPECT_EQ(got.state, TaskState::kQueued);
  EXPECT_EQ(got.origin_worker_id, "w1");
  EXPECT_EQ(got.origin_evaluation_id, 41);
  EXPECT_EQ(got.variant_id, v);
}

TYPED_TEST(StoreTest, CompleteTaskReplacesTheBest) {
  std::string job = this->NewJob("tune");
  const std::string bucket = this->Task(job).bucket;
  std::string slow = this->Evaluate(job, "slow", 20.0, /*best=*/true);
  ASSERT_OK_AND_ASSIGN(BestRecord best, this->store().GetBest(bucket, "sm_90a"));
  EXPECT_EQ(best.variant_id, slow);
  EXPECT_DOUBLE_EQ(best.timing.median_us, 20.0);
  EXPECT_EQ(best.verified.max_len_q, 4096);  // the evaluation's extent
  EXPECT_EQ(best.verified.total_k, 1 << 19);
  ASSERT_OK_AND_ASSIGN(std::vector<EvaluationRecord> evals,
                       this->store().ListEvaluations(slow));
  EXPECT_EQ(best.evaluation_id, evals.at(0).id);

  std::string fast = this->Evaluate(job, "fast", 10.0, /*best=*/true);
  ASSERT_OK_AND_ASSIGN(best, this->store().GetBest(bucket, "sm_90a"));
  EXPECT_EQ(best.variant_id, fast);
  EXPECT_DOUBLE_EQ(best.timing.median_us, 10.0);
  EXPECT_DOUBLE_EQ(best.timing.p25_us, 9.75);
  EXPECT_DOUBLE_EQ(best.timing.p75_us, 10.5);

  this->Evaluate(job, "slower", 30.0, /*best=*/false);
  ASSERT_OK_AND_ASSIGN(best, this->store().GetBest(bucket, "sm_90a"));
  EXPECT_EQ(best.variant_id, fast);
  EXPECT_CODE(this->store().GetBest(bucket, "sm_100a"), kNotFound);
}

// A RETIME's samples, both kernels', come back exactly as reported, so the
// decision it led to can be recomputed from the store alone; the best says
// how its figure was measured.
TYPED_TEST(StoreTest, RetimeSamplesRoundTripAndReproduceTheDecision) {
  std::string job = this->NewJob("tune");
  const std::string bucket = this->Task(job).bucket;
  std::string v = this->NewVariant("retimed");
  TaskRecord t = this->Task(job, v);
  std::string task = this->Enqueue({t})[0];
  EXPECT_EQ(this->Lease("w-eval"), task);
  std::vector<double> cand, inc;
  for (int i = 0; i < 24; ++i) {
    const double clock = 1.0 + 0.15 * ((i * 7) % 11 - 5) / 5.0;  // moves +-15%
    cand.push_back(1554.8 * clock * (1 + 0.001 * (i % 3)));
    inc.push_back(1700.7 * clock * (1 + 0.001 * (i % 5)) + 0.1 / 3);
  }
  EvaluationRecord e = this->Verified(1);
  e.timing = Summarize(cand);
  e.incumbent_timing = Summarize(inc);
  const Comparison decided = CompareTimings(e.timing, e.incumbent_timing);
  ASSERT_TRUE(decided.candidate_wins) << decided.Describe();
  BestRecord best;
  best.measured_by = MeasuredAgainst(decided, "v0");
  ASSERT_OK(this->Complete(task, "w-eval", e, best).status());

  ASSERT_OK_AND_ASSIGN(std::vector<EvaluationRecord> evals, this->store().ListEvaluations(v));
  ASSERT_EQ(evals.size(), 1u);
  EXPECT_EQ(evals[0].timing.samples_us, cand);
  EXPECT_EQ(evals[0].incumbent_timing.samples_us, inc);
  EXPECT_EQ(evals[0].incumbent_timing.samples, 24);
  EXPECT_DOUBLE_EQ(evals[0].incumbent_timing.median_us, e.incumbent_timing.median_us);
  EXPECT_DOUBLE_EQ(evals[0].incumbent_timing.p75_us, e.incumbent_timing.p75_us);
  const Comparison again = CompareTimings(evals[0].timing, evals[0].incumbent_timing);
  EXPECT_EQ(again.candidate_wins, decided.candidate_wins);
  EXPECT_EQ(again.decision.ratios.lower_bound, decided.decision.ratios.lower_bound);
  EXPECT_EQ(again.decision.ratios.median, decided.decision.ratios.median);
  EXPECT_EQ(again.decision.look, decided.decision.look);
  EXPECT_EQ(MeasuredAgainst(again, "v0"), best.measured_by);

  ASSERT_OK_AND_ASSIGN(BestRecord got, this->store().GetBest(bucket, "sm_90a"));
  EXPECT_EQ(got.measured_by, best.measured_by);
  EXPECT_DOUBLE_EQ(got.timing.median_us, e.timing.median_us);
  EXPECT_TRUE(got.timing.samples_us.empty()) << "the samples stay with the evaluation";
}

TYPED_TEST(StoreTest, CompleteTaskWithABadBestChangesNothing) {
  std::string job = this->NewJob("tune");
  std::string first = this->Evaluate(job, "first", 20.0, /*best=*/true);
  std::string v = this->NewVariant("second");
  std::string task = this->Enqueue({this->Task(job, v)})[0];
  ASSERT_EQ(this->Lease("w1"), task);
  // Names the first variant's evaluation for the second variant.
  ASSERT_OK_AND_ASSIGN(std::vector<EvaluationRecord> evals,
                       this->store().ListEvaluations(first));
  BestRecord bad;
  bad.variant_id = v;
  bad.evaluation_id = evals.at(0).id;
  EXPECT_CODE(this->Complete(task, "w1", this->Verified(5), bad, "cubin"), kInvalidArgument);
  EXPECT_CODE(this->store().GetCubin(Sha256Hex("cubin")), kNotFound);

  ASSERT_OK_AND_ASSIGN(TaskRecord t, this->store().GetTask(task));
  EXPECT_EQ(t.state, TaskState::kLeased);
  ASSERT_OK_AND_ASSIGN(evals, this->store().ListEvaluations(v));
  EXPECT_TRUE(evals.empty());
  ASSERT_OK_AND_ASSIGN(BestRecord best, this->store().GetBest(t.bucket, "sm_90a"));
  EXPECT_EQ(best.variant_id, first);
}

TYPED_TEST(StoreTest, CompleteTaskForAnUnknownVariantIsNotFound) {
  std::string job = this->NewJob("tune");
  std::string task = this->Enqueue({this->Task(job, "v77")})[0];
  ASSERT_EQ(this->Lease("w1"), task);
  EXPECT_CODE(this->Complete(task, "w1", this->Verified(5)), kNotFound);
  ASSERT_OK_AND_ASSIGN(TaskRecord t, this->store().GetTask(task));
  EXPECT_EQ(t.state, TaskState::kLeased);
}

// ------------------------------------------------------------------ paging

TYPED_TEST(StoreTest, ListVariantsPagesNewestFirst) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(this->NewVariant(fmt::format("src{}", i)));
  Page page;
  page.limit = 2;
  std::vector<std::vector<std::string>> pages;
  for (int guard = 0; guard < 10; ++guard) {
    ASSERT_OK_AND_ASSIGN(PageOf<VariantRecord> got, this->store().ListVariants("", page));
    pages.emplace_back();
    for (const VariantRecord& v : got.items) pages.back().push_back(v.id);
    if (got.next_token.empty()) break;
    page.token = got.next_token;
  }
  std::vector<std::vector<std::string>> want = {{ids[4], ids[3]}, {ids[2], ids[1]}, {ids[0]}};
  EXPECT_EQ(pages, want);
}

TYPED_TEST(StoreTest, ExactPagesEndWithoutAnEmptyPage) {
  for (int i = 0; i < 4; ++i) this->NewVariant(fmt::format("src{}", i));
  Page page;
  page.limit = 2;
  ASSERT_OK_AND_ASSIGN(PageOf<VariantRecord> first, this->store().ListVariants("", page));
  ASSERT_FALSE(first.next_token.empty());
  page.token = first.next_token;
  ASSERT_OK_AND_ASSIGN(PageOf<VariantRecord> second, this->store().ListVariants("", page));
  EXPECT_EQ(second.items.size(), 2u);
  EXPECT_EQ(second.next_token, "");
}

TYPED_TEST(StoreTest, ListVariantsFiltersByEvaluatedBucket) {
  std::string job = this->NewJob("tune");
  std::string a = this->Evaluate(job, "a", 10, false, "bucketA");
  this->Evaluate(job, "b", 10, false, "bucketB");
  std::string c = this->Evaluate(job, "c", 10, false, "bucketA");
  this->NewVariant("never evaluated");
  ASSERT_OK_AND_ASSIGN(PageOf<VariantRecord> got, this->store().ListVariants("bucketA", {}));
  ASSERT_EQ(got.items.size(), 2u);
  EXPECT_EQ(got.items[0].id, c);
  EXPECT_EQ(got.items[1].id, a);
  EXPECT_EQ(got.next_token, "");
  ASSERT_OK_AND_ASSIGN(got, this->store().ListVariants("", {}));
  EXPECT_EQ(got.items.size(), 4u);
}

TYPED_TEST(StoreTest, ListJobsPagesNewestFirst) {
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(this->NewJob(fmt::format("job{}", i)));
  Page page;
  page.limit = 1;
  std::vector<std::string> seen;
  for (int guard = 0; guard < 10; ++guard) {
    ASSERT_OK_AND_ASSIGN(PageOf<JobRecord> got, this->store().ListJobs(page));
    ASSERT_EQ(got.items.size(), 1u);
    seen.push_back(got.items[0].id);
    if (got.next_token.empty()) break;
    page.token = got.next_token;
  }
  EXPECT_EQ(seen, (std::vector<std::string>{ids[2], ids[1], ids[0]}));
}

TYPED_TEST(StoreTest, ListBestPagesByBucketAndFiltersByArch) {
  std::string job = this->NewJob("tune");
  this->Evaluate(job, "c", 10, true, "c-bucket");
  this->Evaluate(job, "a", 10, true, "a-bucket");
  this->Evaluate(job, "b", 10, true, "b-bucket");
  std::string v = this->NewVariant("blackwell");
  std::string task = this->Enqueue({this->Task(job, v, "sm_100a", TaskKind::kCompile)})[0];
  ASSERT_EQ(this->Lease("w2", "sm_100a"), task);
  ASSERT_OK(this->Complete(task, "w2", this->Verified(3), BestRecord{}));

  Page page;
  page.limit = 2;
  ASSERT_OK_AND_ASSIGN(PageOf<BestRecord> first, this->store().ListBest("sm_90a", page));
  ASSERT_EQ(first.items.size(), 2u);
  EXPECT_EQ(first.items[0].bucket, "a-bucket");
  EXPECT_EQ(first.items[1].bucket, "b-bucket");
  page.token = first.next_token;
  ASSERT_OK_AND_ASSIGN(PageOf<BestRecord> second, this->store().ListBest("sm_90a", page));
  ASSERT_EQ(second.items.size(), 1u);
  EXPECT_EQ(second.items[0].bucket, "c-bucket");
  EXPECT_EQ(second.next_token, "");

  ASSERT_OK_AND_ASSIGN(PageOf<BestRecord> all, this->store().ListBest("", Page{}));
  EXPECT_EQ(all.items.size(), 4u);
  ASSERT_OK_AND_ASSIGN(PageOf<BestRecord> blackwell, this->store().ListBest("sm_100a", Page{}));
  ASSERT_EQ(blackwell.items.size(), 1u);
  EXPECT_EQ(blackwell.items[0].variant_id, v);
}

TYPED_TEST(StoreTest, MalformedPageTokensAreInvalidArgument) {
  Page page;
  page.token = "not-a-token";
  EXPECT_CODE(this->store().ListVariants("", page), kInvalidArgument);
  EXPECT_CODE(this->store().ListJobs(page), kInvalidArgument);
  EXPECT_CODE(this->store().ListBest("", page), kInvalidArgument);
}

// ------------------------------------------------------------------- jobs

TYPED_TEST(StoreTest, JobsRoundTripAndUpdate) {
  JobRecord j;
  j.name = "hstu";
  j.proposer = "model";
  j.spec_json = R"({"shapes":[]})";
  j.seed = ~uint64_t{0};  // the full 64 bits survive
  j.created_unix_ms = 500;
  ASSERT_OK_AND_ASSIGN(std::string id, this->store().CreateJob(j));
  ASSERT_OK_AND_ASSIGN(JobRecord got, this->store().GetJob(id));
  EXPECT_EQ(got.name, "hstu");
  EXPECT_EQ(got.state, JobState::kQueued);
  EXPECT_EQ(got.seed, ~uint64_t{0});
  EXPECT_EQ(got.created_unix_ms, 500);

  got.state = JobState::kRunning;
  got.progress_json = R"({"done":1})";
  got.tokens_used = 4096;
  got.message = "halfway";
  got.created_unix_ms = 1;  // ignored: creation time is fixed
  ASSERT_OK(this->store().UpdateJob(got));
  ASSERT_OK_AND_ASSIGN(JobRecord after, this->store().GetJob(id));
  EXPECT_EQ(after.state, JobState::kRunning);
  EXPECT_EQ(after.progress_json, R"({"done":1})");
  EXPECT_EQ(after.tokens_used, 4096);
  EXPECT_EQ(after.message, "halfway");
  EXPECT_EQ(after.created_unix_ms, 500);
  EXPECT_GT(after.updated_unix_ms, 500);
}

TYPED_TEST(StoreTest, ListActiveJobsOldestFirst) {
  std::string queued = this->NewJob("a", JobState::kQueued);
  this->NewJob("b", JobState::kSucceeded);
  std::string running = this->NewJob("c", JobState::kRunning);
  this->NewJob("d", JobState::kFailed);
  std::string later = this->NewJob("e", JobState::kCancelled);
  ASSERT_OK_AND_ASSIGN(std::vector<JobRecord> active, this->store().ListActiveJobs());
  std::vector<std::string> ids;
  for (const JobRecord& j : active) ids.push_back(j.id);
  EXPECT_EQ(ids, (std::vector<std::string>{queued, running}));

  ASSERT_OK_AND_ASSIGN(JobRecord j, this->store().GetJob(later));
  j.state = JobState::kRunning;
  ASSERT_OK(this->store().UpdateJob(j));
  ASSERT_OK_AND_ASSIGN(active, this->store().ListActiveJobs());
  EXPECT_EQ(active.size(), 3u);
}

// ------------------------------------------------------------------ tasks

TYPED_TEST(StoreTest, EnqueuedTasksStartQueued) {
  std::string job = this->NewJob("tune");
  TaskRecord t = this->Task(job, "v1");
  t.state = TaskState::kDone;  // ignored: new tasks are always queued
  t.worker_id = "w9";
  t.attempts = 5;
  t.incumbent_variant_id = "v0";
  std::vector<std::string> ids = this->Enqueue({t, this->Task(job)});
  ASSERT_EQ(ids.size(), 2u);
  ASSERT_OK_AND_ASSIGN(std::vector<TaskRecord> tasks, this->store().ListTasks(job));
  ASSERT_EQ(tasks.size(), 2u);
  EXPECT_EQ(tasks[0].id, ids[0]);
  EXPECT_EQ(tasks[0].state, TaskState::kQueued);
  EXPECT_EQ(tasks[0].worker_id, "");
  EXPECT_EQ(tasks[0].attempts, 0);
  EXPECT_EQ(tasks[0].variant_id, "v1");
  EXPECT_EQ(tasks[0].incumbent_variant_id, "v0");
  EXPECT_EQ(tasks[0].shape_json, t.shape_json);
  EXPECT_EQ(tasks[0].seed, 7u);
  EXPECT_GT(tasks[0].created_unix_ms, 0);
}

TYPED_TEST(StoreTest, EnqueueTasksIsAllOrNothing) {
  std::string job = this->NewJob("tune");
  EXPECT_CODE(this->store().EnqueueTasks({this->Task(job), this->Task("j404")}), kNotFound);
  TaskRecord no_arch = this->Task(job);
  no_arch.arch = "";
  EXPECT_CODE(this->store().EnqueueTasks({this->Task(job), no_arch}), kInvalidArgument);
  ASSERT_OK_AND_ASSIGN(std::vector<TaskRecord> tasks, this->store().ListTasks(job));
  EXPECT_TRUE(tasks.empty());
}

TYPED_TEST(StoreTest, LeaseSetsTheLeaseFields) {
  std::string job = this->NewJob("tune");
  std::string task = this->Enqueue({this->Task(job)})[0];
  ASSERT_OK_AND_ASSIGN(std::optional<TaskRecord> leased,
                       this->store().LeaseTask("w1", "sm_90a", false, 1000, 500,
                                               PromotionLease::kAny));
  ASSERT_TRUE(leased.has_value());
  EXPECT_EQ(leased->id, task);
  EXPECT_EQ(leased->state, TaskState::kLeased);
  EXPECT_EQ(leased->worker_id, "w1");
  EXPECT_EQ(leased->lease_expires_unix_ms, 1500);
  EXPECT_EQ(leased->attempts, 1);
  ASSERT_OK_AND_ASSIGN(TaskRecord stored, this->store().GetTask(task));
  EXPECT_EQ(stored.state, TaskState::kLeased);
  EXPECT_EQ(stored.lease_expires_unix_ms, 1500);
  EXPECT_CODE(this->store().LeaseTask("", "sm_90a", false, 1000, 500, PromotionLease::kAny),
              kInvalidArgument);
  EXPECT_CODE(this->store().LeaseTask("w1", "sm_90a", false, 1000, 0, PromotionLease::kAny),
              kInvalidArgument);
}

TYPED_TEST(StoreTest, LeasesOldestTaskFirst) {
  std::string job = this->NewJob("tune");
  std::vector<std::string> ids = this->Enqueue({this->Task(job), this->Task(job)});
  std::vector<std::string> more = this->Enqueue({this->Task(job)});
  EXPECT_EQ(this->Lease("w1"), ids[0]);
  EXPECT_EQ(this->Lease("w1"), ids[1]);
  EXPECT_EQ(this->Lease("w2"), more[0]);
  EXPECT_EQ(this->Lease("w2"), "");
}

TYPED_TEST(StoreTest, JobsTakeTurnsLeastRecentlyLeasedFirst) {
  std::string a = this->NewJob("a");
  std::string b = this->NewJob("b");
  std::vector<std::string> ta = this->Enqueue({this->Task(a), this->Task(a), this->Task(a)});
  std::vector<std::string> tb = this->Enqueue({this->Task(b), this->Task(b)});
  EXPECT_EQ(this->Lease("w"), ta[0]);
  EXPECT_EQ(this->Lease("w"), tb[0]);
  // A job that has never had a lease goes before both.
  std::string c = this->NewJob("c");
  std::vector<std::string> tc = this->Enqueue({this->Task(c)});
  EXPECT_EQ(this->Lease("w"), tc[0]);
  EXPECT_EQ(this->Lease("w"), ta[1]);
  EXPECT_EQ(this->Lease("w"), tb[1]);
  EXPECT_EQ(this->Lease("w"), ta[2]);
  EXPECT_EQ(this->Lease("w"), "");
}

TYPED_TEST(StoreTest, PromotionTasksAreLeasedBeforeEvaluations) {
  std::string a = this->NewJob("a");
  std::string b = this->NewJob("b");
  std::vector<std::string> ta = this->Enqueue({this->Task(a), this->Task(a)});
  TaskRecord retime = this->Task(b);
  retime.kind = TaskKind::kRetime;
  retime.incumbent_variant_id = "v0";
  TaskRecord confirm = this->Task(b);
  confirm.kind = TaskKind::kConfirm;
  std::vector<std::string> tb = this->Enqueue({retime, confirm});
  EXPECT_EQ(this->Lease("w"), tb[0]);
  EXPECT_EQ(this->Lease("w"), tb[1]);
  EXPECT_EQ(this->Lease("w"), ta[0]);
}

// A candidate's promotion can be kept from the worker whose evaluation made
// it a contender, or promotions from a worker at all; the API decides when
// (another worker is there that can promote them).
TYPED_TEST(StoreTest, PromotionLeaseFiltersLeaveThemToOtherWorkers) {
  std::string job = this->NewJob("tune");
  TaskRecord confirm = this->Task(job);
  confirm.kind = TaskKind::kConfirm;
  confirm.origin_worker_id = "w1";
  TaskRecord retime = confirm;
  retime.kind = TaskKind::kRetime;
  std::vector<std::string> ids = this->Enqueue({confirm, retime, this->Task(job)});
  auto lease = [&](const std::string& worker, PromotionLease p) -> std::string {
    absl::StatusOr<std::optional<TaskRecord>> t =
        this->store().LeaseTask(worker, "sm_90a", false, 1000, 60000, p);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() && t->has_value() ? (*t)->id : "";
  };
  EXPECT_EQ(lease("w1", PromotionLease::kNotOwn), ids[2])
      << "w1's own promotions are skipped, the rest is not";
  EXPECT_EQ(lease("w1", PromotionLease::kNotOwn), "");
  EXPECT_EQ(lease("w3", PromotionLease::kNone), "") << "no promotion at all";
  EXPECT_EQ(lease("w2", PromotionLease::kNotOwn), ids[0]) << "another worker gets them";
  EXPECT_EQ(lease("w1", PromotionLease::kAny), ids[1]) << "unfiltered, the origin may run it";
}

// "Another worker" is another principal: a second registration of the same
// credential does not confirm the first one's candidate. Workers without a
// principal (rows from before principals) are told apart by id, as before.
TYPED_TEST(StoreTest, NotOwnSkipsPromotionsOfTheSamePrincipal) {
  auto worker = [&](const std::string& name, const std::string& principal) {
    WorkerRecord w;
    w.name = name;
    w.arch = "sm_90a";
    w.principal = principal;
    absl::StatusOr<std::string> id = this->store().UpsertWorker(w);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : "";
  };
  const std::string a1 = worker("a1", "host-a");
  const std::string a2 = worker("a2", "host-a");
  const std::string b = worker("b", "host-b");
  const std::string old1 = worker("old1", "");
  const std::string old2 = worker("old2", "");
  std::string job = this->NewJob("tune");
  auto confirm_of = [&](const std::string& origin) {
    TaskRecord t = this->Task(job);
    t.kind = TaskKind::kConfirm;
    t.origin_worker_id = origin;
    return t;
  };
  auto lease = [&](const std::string& w) -> std::string {
    absl::StatusOr<std::optional<TaskRecord>> t =
        this->store().LeaseTask(w, "sm_90a", false, 1000, 60000, PromotionLease::kNotOwn);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() && t->has_value() ? (*t)->id : "";
  };
  std::vector<std::string> ids = this->Enqueue({confirm_of(a1), confirm_of(old1)});
  EXPECT_EQ(lease(a2), ids[1]) << "a1's candidate is host-a's own; old1's is not";
  EXPECT_EQ(lease(a2), "");
  EXPECT_EQ(lease(b), ids[0]) << "host-b is another principal";

  ids = this->Enqueue({confirm_of(old1)});
  EXPECT_EQ(lease(old1), "") << "without a principal, by id";
  EXPECT_EQ(lease(old2), ids[0]) << "two workers without principals are two workers";

  // A principal bound later (the server fills it for an old row) counts at
  // once: it is read from the workers table, not copied onto the task.
  ids = this->Enqueue({confirm_of(old1)});
  ASSERT_OK_AND_ASSIGN(std::vector<WorkerRecord> all, this->store().ListWorkers());
  for (WorkerRecord w : all) {
    if (w.id != old1) continue;
    w.principal = "host-a";
    ASSERT_OK(this->store().UpsertWorker(w));
  }
  EXPECT_EQ(lease(a1), "");
  EXPECT_EQ(lease(b), ids[0]);
}

TYPED_TEST(StoreTest, LeaseMatchesArchAndCompileOnlyWorkersGetCompileTasks) {
  std::string job = this->NewJob("tune");
  std::vector<std::string> ids = this->Enqueue({
      this->Task(job, "", "sm_100a", TaskKind::kEvaluate),
      this->Task(job, "", "sm_100a", TaskKind::kCompile),
      this->Task(job, "", "sm_90a", TaskKind::kRetime),
  });
  EXPECT_EQ(this->Lease("w80", "sm_80"), "");
  EXPECT_EQ(this->Lease("cc", "sm_100a", /*compile_only=*/true), ids[1]);
  EXPECT_EQ(this->Lease("cc", "sm_100a", /*compile_only=*/true), "");
  EXPECT_EQ(this->Lease("cc", "sm_90a", /*compile_only=*/true), "");
  EXPECT_EQ(this->Lease("b200", "sm_100a"), ids[0]);
  EXPECT_EQ(this->Lease("h200", "sm_90a"), ids[2]);
}

TYPED_TEST(StoreTest, GpuWorkersAlsoRunCompileTasks) {
  std::string job = this->NewJob("tune");
  std::string task = this->Enqueue({this->Task(job, "", "sm_90a", TaskKind::kCompile)})[0];
  EXPECT_EQ(this->Lease("h200", "sm_90a"), task);
}

TYPED_TEST(StoreTest, RenewLeasesExtendsOnlyTheWorkersOwnLeases) {
  std::string job = this->NewJob("tune");
  std::vector<std::string> ids = this->Enqueue({this->Task(job), this->Task(job)});
  ASSERT_EQ(this->Lease("w1", "sm_90a", false, 1000, 100), ids[0]);
  ASSERT_EQ(this->Lease("w2", "sm_90a", false, 1000, 100), ids[1]);
  ASSERT_OK(this->store().RenewLeases("w1", {ids[0], ids[1], "t999", "junk"}, 2000, 500));
  ASSERT_OK_AND_ASSIGN(TaskRecord mine, this->store().GetTask(ids[0]));
  ASSERT_OK_AND_ASSIGN(TaskRecord theirs, this->store().GetTask(ids[1]));
  EXPECT_EQ(mine.lease_expires_unix_ms, 2500);
  EXPECT_EQ(theirs.lease_expires_unix_ms, 1100);
  // A renewed lease outlives the original expiry.
  ASSERT_OK_AND_ASSIGN(int requeued, this->store().RequeueExpired(2000));
  EXPECT_EQ(requeued, 1);
  ASSERT_OK_AND_ASSIGN(mine, this->store().GetTask(ids[0]));
  EXPECT_EQ(mine.state, TaskState::kLeased);
}

TYPED_TEST(StoreTest, RequeueExpiredReturnsExpiredLeasesToTheQueue) {
  std::string job = this->NewJob("tune");
  std::string task = this->Enqueue({this->Task(job)})[0];
  ASSERT_EQ(this->Lease("w1", "sm_90a", false, 1000, 100), task);
  ASSERT_OK_AND_ASSIGN(int n, this->store().RequeueExpired(1100));  // ends at 1100: not before
  EXPECT_EQ(n, 0);
  ASSERT_OK_AND_ASSIGN(n, this->store().RequeueExpired(1101));
  EXPECT_EQ(n, 1);
  ASSERT_OK_AND_ASSIGN(TaskRecord t, this->store().GetTask(task));
  EXPECT_EQ(t.state, TaskState::kQueued);
  EXPECT_EQ(t.worker_id, "");
  ASSERT_OK_AND_ASSIGN(std::optional<TaskRecord> again,
                       this->store().LeaseTask("w2", "sm_90a", false, 2000, 100,
                                               PromotionLease::kAny));
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->id, task);
  EXPECT_EQ(again->attempts, 2);
}

TYPED_TEST(StoreTest, CompleteTaskRefusesAStaleLease) {
  std::string job = this->NewJob("tune");
  std::string v = this->NewVariant("src");
  std::string task = this->Enqueue({this->Task(job, v)})[0];
  ASSERT_EQ(this->Lease("w1", "sm_90a", false, 1000, 100), task);
  // Ended but not yet reaped: the lease is still not live.
  absl::StatusOr<CompletedTask> late =
      this->Complete(task, "w1", this->Verified(1), BestRecord{}, "cubin", {}, /*now=*/1101);
  EXPECT_CODE(late, kFailedPrecondition);
  EXPECT_NE(late.status().message().find("ended"), std::string_view::npos) << late.status();
  ASSERT_OK(this->store().RequeueExpired(5000));
  // Expired and back in the queue: the old holder cannot complete it.
  EXPECT_CODE(this->Complete(task, "w1", this->Verified(1), BestRecord{}, "cubin", {}, 5000),
              kFailedPrecondition);
  ASSERT_EQ(this->Lease("w2", "sm_90a", false, 5000, 100), task);
  // Leased to another worker now: refused as not its lease.
  absl::StatusOr<CompletedTask> foreign =
      this->Complete(task, "w1", this->Verified(1), BestRecord{}, "cubin", {}, 5050);
  EXPECT_CODE(foreign, kPermissionDenied);
  EXPECT_NE(foreign.status().message().find("w2"), std::string_view::npos) << foreign.status();
  // Nothing of the refused reports was stored, the cubin included.
  ASSERT_OK_AND_ASSIGN(std::vector<EvaluationRecord> evals, this->store().ListEvaluations(v));
  EXPECT_TRUE(evals.empty());
  EXPECT_CODE(this->store().GetCubin(Sha256Hex("cubin")), kNotFound);
  EXPECT_CODE(this->store().GetBest(this->Task(job).bucket, "sm_90a"), kNotFound);
  ASSERT_OK_AND_ASSIGN(TaskRecord t, this->store().GetTask(task));
  EXPECT_EQ(t.state, TaskState::kLeased);
  EXPECT_EQ(t.worker_id, "w2");
  // The current holder can.
  EXPECT_OK(this->Complete(task, "w2", this->Verified(1), std::nullopt, "", {}, 5050));
}

TYPED_TEST(StoreTest, CancelTasksCancelsQueuedAndLeasedOnly) {
  std::string job = this->NewJob("tune");
  std::string other = this->NewJob("other");
  std::string v = this->NewVariant("src");
  std::vector<std::string> ids =
      this->Enqueue({this->Task(job, v), this->Task(job, v), this->Task(job, v)});
  std::string untouched = this->Enqueue({this->Task(other, v)})[0];
  ASSERT_EQ(this->Lease("w1"), ids[0]);
  ASSERT_OK(this->Complete(ids[0], "w1", this->Verified(1)));
  ASSERT_EQ(this->Lease("w1"), untouched);  // `other` never had a turn: it goes first
  ASSERT_EQ(this->Lease("w1"), ids[1]);

  ASSERT_OK_AND_ASSIGN(std::vector<std::string> cancelled, this->store().CancelTasks(job));
  EXPECT_EQ(cancelled, (std::vector<std::string>{ids[1], ids[2]}));
  ASSERT_OK_AND_ASSIGN(TaskRecord t0, this->store().GetTask(ids[0]));
  EXPECT_EQ(t0.state, TaskState::kDone);
  ASSERT_OK_AND_ASSIGN(TaskRecord t2, this->store().GetTask(ids[2]));
  EXPECT_EQ(t2.state, TaskState::kCancelled);
  ASSERT_OK_AND_ASSIGN(TaskRecord u, this->store().GetTask(untouched));
  EXPECT_EQ(u.state, TaskState::kLeased);

  // The cancelled lease cannot be completed, and nothing is left to lease.
  EXPECT_CODE(this->Complete(ids[1], "w1", this->Verified(1)), kFailedPrecondition);
  EXPECT_EQ(this->Lease("w1"), "");
  ASSERT_OK_AND_ASSIGN(cancelled, this->store().CancelTasks(job));
  EXPECT_TRUE(cancelled.empty());
}

TYPED_TEST(StoreTest, ConcurrentLeasesHandOutEachTaskOnce) {
  std::string job = this->NewJob("tune");
  std::vector<TaskRecord> batch(40, this->Task(job));
  std::vector<std::string> ids = this->Enqueue(batch);
  std::vector<std::vector<std::string>> got(4);
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&, w] {
      const std::string name = fmt::format("w{}", w);
      while (true) {
        absl::StatusOr<std::optional<TaskRecord>> t =
            this->store().LeaseTask(name, "sm_90a", false, 1000, 60000, PromotionLease::kAny);
        if (!t.ok() || !t->has_value()) return;
        got[w].push_back((*t)->id);
      }
    });
  }
  for (std::thread& t : workers) t.join();
  std::multiset<std::string> all;
  for (const auto& g : got) all.insert(g.begin(), g.end());
  EXPECT_EQ(all, std::multiset<std::string>(ids.begin(), ids.end()));
}

// ---------------------------------------------------------------- workers

TYPED_TEST(StoreTest, UpsertWorkerInsertsWithoutAnIdAndUpdatesByIt) {
  WorkerRecord w;
  w.name = "host-a/gpu0";
  w.arch = "sm_90a";
  w.gpu_json = R"({"name":"H200"})";
  w.last_seen_unix_ms = 100;
  w.session_hash = Sha256Hex("session of w");
  w.principal = "host-a";
  w.sanitizer_tools = {"memcheck", "racecheck"};
  w.compile_archs = {"sm_80", "sm_100a"};
  ASSERT_OK_AND_ASSIGN(std::string id, this->store().UpsertWorker(w));
  EXPECT_EQ(id[0], 'w');
  w.id = id;
  w.last_seen_unix_ms = 200;
  w.compile_only = true;
  ASSERT_OK_AND_ASSIGN(std::string again, this->store().UpsertWorker(w));
  EXPECT_EQ(again, id);

  // A name is a label: registering under it again is another worker, which
  // gets none of the first one's identity.
  WorkerRecord same_name;
  same_name.name = w.name;
  same_name.arch = "sm_100a";
  ASSERT_OK_AND_ASSIGN(std::string other_id, this->store().UpsertWorker(same_name));
  EXPECT_NE(other_id, id);

  ASSERT_OK_AND_ASSIGN(std::vector<WorkerRecord> all, this->store().ListWorkers());
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].id, id);
  EXPECT_EQ(all[0].last_seen_unix_ms, 200);
  EXPECT_TRUE(all[0].compile_only);
  EXPECT_EQ(all[0].gpu_json, w.gpu_json);
  EXPECT_EQ(all[0].session_hash, w.session_hash);
  EXPECT_EQ(all[0].sanitizer_tools, w.sanitizer_tools);
  EXPECT_EQ(all[0].principal, w.principal);
  EXPECT_EQ(all[0].compile_archs, w.compile_archs);
  EXPECT_EQ(all[1].id, other_id);
  EXPECT_EQ(all[1].name, w.name);
  EXPECT_EQ(all[1].arch, "sm_100a");
  EXPECT_TRUE(all[1].session_hash.empty());
  EXPECT_TRUE(all[1].sanitizer_tools.empty());
  EXPECT_TRUE(all[1].principal.empty());
  EXPECT_TRUE(all[1].compile_archs.empty());
  EXPECT_GT(all[1].last_seen_unix_ms, 0);  // the store's clock when not given
}

TYPED_TEST(StoreTest, UpsertWorkerRefusesACompileArchThatIsNoArchName) {
  for (const char* bad : {"", "sm_9x", "compute_90", "sm_90a,sm_80"}) {
    WorkerRecord w;
    w.name = "w";
    w.arch = "sm_90a";
    w.compile_archs = {"sm_80", bad};
    absl::StatusOr<std::string> id = this->store().UpsertWorker(w);
    EXPECT_CODE(id, kInvalidArgument) << bad;
    if (!id.ok()) EXPECT_NE(id.status().message().find("compile arch"), std::string::npos);
  }
  ASSERT_OK_AND_ASSIGN(std::vector<WorkerRecord> all, this->store().ListWorkers());
  EXPECT_TRUE(all.empty());
}

TYPED_TEST(StoreTest, ASessionHashBelongsToOneWorker) {
  WorkerRecord a;
  a.name = "a";
  a.session_hash = Sha256Hex("s");
  ASSERT_OK(this->store().UpsertWorker(a));
  WorkerRecord b;
  b.name = "b";
  b.session_hash = a.session_hash;
  EXPECT_CODE(this->store().UpsertWorker(b), kInvalidArgument);
  b.session_hash = "not-a-digest";
  EXPECT_CODE(this->store().UpsertWorker(b), kInvalidArgument);
  b.session_hash.clear();
  b.sanitizer_tools = {"memcheck,racecheck"};
  EXPECT_CODE(this->store().UpsertWorker(b), kInvalidArgument);
  b.sanitizer_tools.clear();
  for (const char* bad : {"has space", "tok:en", "x/y"}) {
    b.principal = bad;
    EXPECT_CODE(this->store().UpsertWorker(b), kInvalidArgument) << bad;
  }
  b.principal = std::string(65, 'p');
  EXPECT_CODE(this->store().UpsertWorker(b), kInvalidArgument);
  ASSERT_OK_AND_ASSIGN(std::vector<WorkerRecord> all, this->store().ListWorkers());
  EXPECT_EQ(all.size(), 1u);
}

TYPED_TEST(StoreTest, IntegrityCheckIsOk) {
  this->NewVariant("src");
  ASSERT_OK_AND_ASSIGN(std::string check, this->store().IntegrityCheck());
  EXPECT_EQ(check, "ok");
}

TEST(StoreNames, EnumNames) {
  EXPECT_EQ(JobStateName(JobState::kQueued), "queued");
  EXPECT_EQ(JobStateName(JobState::kRunning), "running");
  EXPECT_EQ(JobStateName(JobState::kSucceeded), "succeeded");
  EXPECT_EQ(JobStateName(JobState::kFailed), "failed");
  EXPECT_EQ(JobStateName(JobState::kCancelled), "cancelled");
  EXPECT_EQ(TaskStateName(TaskState::kQueued), "queued");
  EXPECT_EQ(TaskStateName(TaskState::kLeased), "leased");
  EXPECT_EQ(TaskStateName(TaskState::kDone), "done");
  EXPECT_EQ(TaskStateName(TaskState::kCancelled), "cancelled");
  EXPECT_EQ(TaskKindName(TaskKind::kEvaluate), "evaluate");
  EXPECT_EQ(TaskKindName(TaskKind::kRetime), "retime");
  EXPECT_EQ(TaskKindName(TaskKind::kCompile), "compile");
  EXPECT_EQ(TaskKindName(TaskKind::kConfirm), "confirm");
}

}  // namespace
}  // namespace kforge
