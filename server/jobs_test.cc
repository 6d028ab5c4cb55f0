// The job engine without gRPC: rounds, budget, exhaustion, cancellation and
// the restart replay (Remember/Observe in original order), on the in-memory
// store with a recording proposer. The engine runs on a ManualClock: time
// budgets and proposer backoffs pass when a test advances it, and the tests
// wait for the engine's events (job updates, enqueued tasks), not for time.
#include "server/jobs.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace kforge::server {
namespace {

using namespace std::chrono_literals;

// Counts notifications, so a waiter misses none that came after it looked.
class Signal {
 public:
  void Notify() {
    {
      std::lock_guard lock(mu_);
      ++generation_;
    }
    cv_.notify_all();
  }
  uint64_t generation() {
    std::lock_guard lock(mu_);
    return generation_;
  }
  // Until a notification after `seen`; false after `timeout` (real time).
  bool WaitPast(uint64_t seen, std::chrono::milliseconds timeout = 10s) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return generation_ > seen; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;
};

// Waits, on the job's events, until `pred` holds for the job as stored;
// returns the last view seen.
JobView WaitForJob(JobEngine& e, const std::string& id, const std::function<bool(const JobView&)>& pred) {
  // Shared with the watch callback, which may still run after Unwatch.
  auto changed = std::make_shared<Signal>();
  const uint64_t watch = e.Watch(id, [changed](const JobEvent&) { changed->Notify(); });
  JobView v;
  for (;;) {
    const uint64_t seen = changed->generation();
    if (auto got = e.Get(id); got.ok()) {
      v = *got;
      if (pred(v)) break;
    }
    if (!changed->WaitPast(seen)) break;
  }
  e.Unwatch(watch);
  return v;
}

struct Log {
  std::mutex mu;
  std::vector<std::string> calls;
  void Add(std::string s) {
    std::lock_guard lock(mu);
    calls.push_back(std::move(s));
  }
  std::vector<std::string> Get() {
    std::lock_guard lock(mu);
    return calls;
  }
};

// Proposes "cand <k>" for k = 0.. up to `limit`, continuing after replay.
class Recording : public agent::Proposer {
 public:
  Recording(Log* log, int limit) : log_(log), limit_(limit) {}
  absl::StatusOr<std::vector<agent::Candidate>> Propose(const agent::ProposalContext&, int n) override {
    std::vector<agent::Candidate> out;
    while (n-- > 0 && next_ < limit_) {
      agent::Candidate c;
      c.source = fmt::format("cand {}", next_++);
      c.manifest_json = "{}";
      c.origin = "template";
      log_->Add("propose:" + c.source);
      out.push_back(c);
    }
    return out;
  }
  void Observe(const agent::Feedback& f) override { log_->Add("observe:" + f.candidate.source); }
  void Remember(const agent::Candidate& c) override {
    log_->Add("remember:" + c.source);
    ++next_;
  }
  std::string Name() const override { return "builtin"; }

 private:
  Log* log_;
  int limit_;
  int next_ = 0;
};

ShapeKey Shape() {
  ShapeKey k;
  k.head_dim = 128;
  k.heads = 4;
  k.kv_heads = 4;
  k.arch = "sm_90a";
  k.batch = 8;
  k.max_len_q = 512;
  k.total_q = 4000;
  k.max_len_k = 512;
  k.total_k = 4000;
  return k;
}

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

class JobsTest : public ::testing::Test {
 protected:
  void SetUp() override { store_ = NewMemoryStore(); }
  JobEngineOptions Options(JobEngineOptions o = {}) {
    o.clock = &clock_;
    o.on_tasks_enqueued = [this] { enqueued_.Notify(); };
    return o;
  }
  std::unique_ptr<JobEngine> Engine(int limit, int per_round = 2, JobEngineOptions extra = {}) {
    JobEngineOptions o = Options(std::move(extra));
    o.candidates_per_round = per_round;
    auto e = std::make_unique<JobEngine>(
        store_.get(),
        [this, limit](const std::string& name, uint64_t)
            -> absl::StatusOr<std::unique_ptr<agent::Proposer>> {
          if (name != "builtin") return absl::NotFoundError("no such proposer");
          return std::make_unique<Recording>(&log_, limit);
        },
        o);
    EXPECT_TRUE(e->Start().ok());
    return e;
  }
  // Leases and completes one task as a worker would; false when none is queued.
  bool CompleteOne(JobEngine& engine, Outcome outcome, double us,
                   const std::string& message = "") {
    const std::string w = "w1";
    auto t = store_->LeaseTask(w, "sm_90a", false, Now(), 60000, PromotionLease::kAny);
    if (!t.ok() || !t->has_value()) return false;
    EvaluationRecord e;
    e.outcome = outcome;
    e.message = message;
    e.timing = {us, us, us, 3};
    TaskCompletion c;
    c.eval = e;
    auto ok = store_->CompleteTask((*t)->id, w, Now(), std::move(c));
    EXPECT_TRUE(ok.ok()) << ok.status();
    engine.OnTaskCompleted(**t, e);
    return true;
  }
  // CompleteOne once the engine has queued a task (waiting for it to).
  bool CompleteNext(JobEngine& engine, Outcome outcome, double us,
                    const std::string& message = "") {
    for (;;) {
      const uint64_t seen = enqueued_.generation();
      if (CompleteOne(engine, outcome, us, message)) return true;
      if (!enqueued_.WaitPast(seen)) return false;
    }
  }
  JobView WaitFor(JobEngine& e, const std::string& id, std::function<bool(const JobView&)> pred) {
    return WaitForJob(e, id, pred);
  }
  // Moves the engine's clock a tick at a time (after the engine is back in
  // its wait) until `pred` holds: for what the engine finds on its ticks.
  JobView AdvanceUntil(JobEngine& e, const std::string& id,
                       const std::function<bool(const JobView&)>& pred) {
    for (int i = 0; i < 2000; ++i) {
      if (auto v = e.Get(id); v.ok() && pred(*v)) return *v;
      EXPECT_TRUE(clock_.AwaitWaiters(1));
      clock_.Advance(std::chrono::milliseconds(250));
    }
    ADD_FAILURE() << "the job never got there";
    return {};
  }
  ManualClock clock_;  // outlives the engines the tests make
  Signal enqueued_;
  std::unique_ptr<Store> store_;
  Log log_;
};

TEST(JobSpecCodec, ExactOffsetsRoundTripAndAreOptional) {
  JobSpec spec;
  spec.name = "exact";
  ShapeKey k;
  k.head_dim = 64;
  k.heads = 2;
  k.kv_heads = 2;
  k.cross = true;
  k.arch = "sm_90a";
  k.batch = 2;
  k.max_len_q = 5;
  k.total_q = 8;
  k.max_len_k = 4;
  k.total_k = 7;
  spec.shapes = {k, k};
  spec.lengths = {ShapeLengths{{0, 3, 8}, {0, 4, 7}}, ShapeLengths{}};
  auto back = DecodeJobSpec(EncodeJobSpec(spec));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->lengths.size(), 2u);
  EXPECT_EQ(back->lengths[0].cu_q, (std::vector<int32_t>{0, 3, 8}));
  EXPECT_EQ(back->lengths[0].cu_k, (std::vector<int32_t>{0, 4, 7}));
  EXPECT_TRUE(back->lengths[1].empty());
  spec.lengths.clear();
  back = DecodeJobSpec(EncodeJobSpec(spec));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->lengths.empty());
  auto none = DecodeTaskShape(EncodeShapeKey(k));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->lengths.empty());
  EXPECT_EQ(none->key.total_k, 7);
}

TEST_F(JobsTest, RunsRoundsUntilTheBudgetIsSpent) {
  auto engine = Engine(/*limit=*/100, /*per_round=*/2);
  JobSpec spec;
  spec.shapes = {Shape(), Shape()};  // one bucket
  spec.max_variants = 5;
  auto job = engine->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->progress.size(), 1u);
  for (int done = 0; done < 5; ++done) {
    ASSERT_TRUE(CompleteNext(*engine, done % 2 ? Outcome::kWrong : Outcome::kVerified, 100.0 - done))
        << done;
  }
  JobView v = WaitFor(*engine, job->record.id, [](const JobView& v) { return IsFinal(v.record.state); });
  EXPECT_EQ(v.record.state, JobState::kSucceeded);
  ASSERT_EQ(v.progress.size(), 1u);
  EXPECT_EQ(v.progress[0].proposed, 5);
  EXPECT_EQ(v.progress[0].evaluated, 5);
  EXPECT_EQ(v.progress[0].verified, 3);
  EXPECT_EQ(v.progress[0].failed, 2);
  EXPECT_DOUBLE_EQ(v.progress[0].best_timing.median_us, 96.0);
}

// 20 workers that lease and never answer left a job of given-up tasks that
// said SUCCEEDED. A job whose every result is a crash fails, saying why.
TEST_F(JobsTest, AJobWhoseEveryResultIsACrashFails) {
  auto engine = Engine(/*limit=*/100, /*per_round=*/2);
  JobSpec spec;
  spec.shapes = {Shape()};
  spec.max_variants = 4;
  auto job = engine->Submit(spec);
  ASSERT_TRUE(job.ok());
  const std::string given_up = std::string(kGivenUpPrefix) + " leased 5 times without a result";
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(CompleteNext(*engine, Outcome::kCrashed, 0, i < 3 ? given_up : "segfault"));
  JobView v = WaitFor(*engine, job->record.id, [](const JobView& v) { return IsFinal(v.record.state); });
  EXPECT_EQ(v.record.state, JobState::kFailed);
  EXPECT_NE(v.record.message.find("every one of its 4 result(s) was a crash (3 given up"),
            std::string::npos)
      << v.record.message;
}

TEST_F(JobsTest, AJobWithOneRealAnswerSucceedsAndCountsWhatWasGivenUp) {
  auto engine = Engine(/*limit=*/100, /*per_round=*/3);
  JobSpec spec;
  spec.shapes = {Shape()};
  spec.max_variants = 3;
  auto job = engine->Submit(spec);
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(CompleteNext(*engine, Outcome::kCrashed, 0, std::string(kGivenUpPrefix) + " x"));
  ASSERT_TRUE(CompleteNext(*engine, Outcome::kCrashed, 0, "segfault"));
  ASSERT_TRUE(CompleteNext(*engine, Outcome::kWrong, 0));
  JobView v = WaitFor(*engine, job->record.id, [](const JobView& v) { return IsFinal(v.record.state); });
  EXPECT_EQ(v.record.state, JobState::kSucceeded);
  EXPECT_NE(v.record.message.find("1 of 3 task(s) given up without an answer"), std::string::npos)
      << v.record.message;
}

TEST_F(JobsTest, AnExhaustedProposerEndsTheJob) {
  auto engine = Engine(/*limit=*/1);
  JobSpec spec;
  spec.shapes = {Shape()};
  spec.max_variants = 10;
  auto job = engine->Submit(spec);
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(CompleteNext(*engine, Outcome::kVerified, 5));
  JobView v = WaitFor(*engine, job->record.id, [](const JobView& v) { return IsFinal(v.record.state); });
  EXPECT_EQ(v.record.state, JobState::kSucceeded);
  EXPECT_EQ(v.progress[0].proposed, 1);
}

TEST_F(JobsTest, UnknownProposerIsRejectedAtSubmit) {
  auto engine = Engine(1);
  JobSpec spec;
  spec.shapes = {Shape()};
  spec.proposer = "model";
  auto job = engine->Submit(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(job.status().message().find("proposer"), absl::string_view::npos);
}

TEST_F(JobsTest, RestartReplaysHistoryAndContinuesWithoutRepeats) {
  std::string id;
  {
    auto engine = Engine(/*limit=*/100, /*per_round=*/2);
    JobSpec spec;
    spec.shapes = {Shape()};
    spec.max_variants = 6;
    spec.seed = 9;
    auto job = engine->Submit(spec);
    ASSERT_TRUE(job.ok());
    id = job->record.id;
    for (int done = 0; done < 3; ++done) ASSERT_TRUE(CompleteNext(*engine, Outcome::kVerified, 50.0 + done));
    WaitFor(*engine, id, [](const JobView& v) { return v.progress[0].proposed == 4; });
    engine->Stop();  // "crash": the engine's memory is gone, the store stays
  }
  const std::vector<std::string> before = log_.Get();
  log_.calls.clear();
  auto engine = Engine(100, 2);
  engine->WaitUntilResumed();
  const std::vector<std::string> replay = log_.Get();
  // Proposed cand 0..3; results for 0, 1, 2 (round 2 was proposed after
  // round 1's results): the replay follows that order.
  const std::vector<std::string> expected = {"remember:cand 0", "remember:cand 1",
                                             "observe:cand 0",  "observe:cand 1",
                                             "remember:cand 2", "remember:cand 3",
                                             "observe:cand 2"};
  ASSERT_GE(replay.size(), expected.size());
  EXPECT_EQ(std::vector<std::string>(replay.begin(), replay.begin() + expected.size()), expected);
  auto v = engine->Get(id);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->record.state, JobState::kRunning);
  for (int done = 0; done < 3; ++done) ASSERT_TRUE(CompleteNext(*engine, Outcome::kVerified, 40.0));
  JobView end = WaitFor(*engine, id, [](const JobView& v) { return IsFinal(v.record.state); });
  EXPECT_EQ(end.record.state, JobState::kSucceeded);
  EXPECT_EQ(end.progress[0].proposed, 6);
  EXPECT_EQ(end.progress[0].evaluated, 6);
  for (const auto& c : log_.Get())
    EXPECT_NE(c, "propose:cand 0") << "a replayed proposer proposed again";
}

// Fails with `codes` in turn, then proposes one candidate per call;
// `calls` counts every Propose.
class Flaky : public agent::Proposer {
 public:
  Flaky(std::vector<absl::StatusCode> codes, std::atomic<int>* calls)
      : codes_(std::move(codes)), calls_(calls) {}
  absl::StatusOr<std::vector<agent::Candidate>> Propose(const agent::ProposalContext&, int) override {
    const size_t call = size_t(calls_->fetch_add(1));
    if (call < codes_.size()) return absl::Status(codes_[call], "endpoint says no");
    agent::Candidate c;
    c.source = fmt::format("flaky {}", call);
    c.manifest_json = "{}";
    return std::vector<agent::Candidate>{c};
  }
  void Observe(const agent::Feedback&) override {}
  void Remember(const agent::Candidate&) override {}
  std::string Name() const override { return "builtin"; }

 private:
  std::vector<absl::StatusCode> codes_;
  std::atomic<int>* calls_;
};

class FlakyJobsTest : public JobsTest {
 protected:
  // Retries after 1 s, then 2 s; the third UNAVAILABLE fails the bucket.
  std::unique_ptr<JobEngine> FlakyEngine(std::vector<absl::StatusCode> codes) {
    JobEngineOptions o = Options();
    o.proposer_retry_base_ms = 1000;
    o.max_proposer_retries = 2;
    auto e = std::make_unique<JobEngine>(
        store_.get(),
        [this, codes](const std::string&, uint64_t) -> absl::StatusOr<std::unique_ptr<agent::Proposer>> {
          return std::make_unique<Flaky>(codes, &calls_);
        },
        o);
    EXPECT_TRUE(e->Start().ok());
    return e;
  }
  // Until the proposer has been asked `n` times (each ask is followed by a
  // job update).
  void WaitForCalls(JobEngine& e, const std::string& job, int n) {
    WaitFor(e, job, [&](const JobView&) { return calls_.load() >= n; });
    ASSERT_EQ(calls_.load(), n);
  }
  std::atomic<int> calls_{0};
};

// The engine checks due retries on its tick (250 ms of its clock): a retry
// comes at the first tick past its backoff, never before the backoff.
TEST_F(FlakyJobsTest, UnavailableProposerIsAskedAgainOnlyAfterEachBackoff) {
  auto engine = FlakyEngine({absl::StatusCode::kUnavailable, absl::StatusCode::kUnavailable});
  JobSpec spec;
  spec.shapes = {Shape()};
  spec.max_variants = 1;
  auto job = engine->Submit(spec);
  ASSERT_TRUE(job.ok());
  WaitForCalls(*engine, job->record.id, 1);
  int calls = 1;
  for (auto backoff : {1000ms, 2000ms}) {
    ASSERT_TRUE(clock_.AwaitWaiters(1));  // the engine, waiting for its next tick
    clock_.Advance(backoff - 1ms);
    ASSERT_TRUE(clock_.AwaitWaiters(1));
    EXPECT_EQ(calls_.load(), calls) << "asked again before the " << backoff.count() << " ms backoff";
    clock_.Advance(1ms + 250ms);
    WaitForCalls(*engine, job->record.id, ++calls);
  }
  JobView v = WaitFor(*engine, job->record.id, [](const JobView& v) { return v.progress[0].proposed == 1; });
  EXPECT_EQ(v.progress[0].proposed, 1) << "retried after two UNAVAILABLE answers";
  EXPECT_EQ(v.record.state, JobState::kRunning);
}

TEST_F(FlakyJobsTest, ProposerThatStaysDownFailsTheJob) {
  auto engine = FlakyEngine(std::vector<absl::StatusCode>(5, absl::StatusCode::kUnavailable));
  JobSpec spec;
  spec.shapes = {Shape()};
  auto job = engine->Submit(spec);
  ASSERT_TRUE(job.ok());
  for (int n = 1; n <= 2; ++n) {
    WaitForCalls(*engine, job->record.id, n);
    ASSERT_TRUE(clock_.AwaitWaiters(1));
    clock_.Advance(10s);
  }
  JobView v = WaitFor(*engine, job->record.id, [](const JobView& v) { return IsFinal(v.record.state); });
  EXPECT_EQ(v.record.state, JobState::kFailed);
  EXPECT_EQ(calls_.load(), 3);
  EXPECT_NE(v.record.message.find("endpoint says no"), std::string::npos) << v.record.message;
}

TEST_F(FlakyJobsTest, SpentProposerBudgetEndsTheBucketNormally) {
  auto engine = FlakyEngine({absl::StatusCode::kResourceExhausted});
  JobSpec spec;
  spec.shapes = {Shape()};
  auto job = engine->Submit(spec);
  ASSERT_TRUE(job.ok());
  JobView v = WaitFor(*engine, job->record.id, [](const JobView& v) { return IsFinal(v.record.state); });
  EXPECT_EQ(v.record.state, JobState::kSucceeded);
}

// A time budget ends the job when the engine's clock passes it, tasks
// outstanding or not, and cancels those tasks.
TEST_F(JobsTest, TheTimeBudgetEndsTheJobWhenTheClockPassesIt) {
  auto engine = Engine(/*limit=*/100);
  JobSpec spec;
  spec.shapes = {Shape()};
  spec.max_seconds = 60;
  auto job = engine->Submit(spec);
  ASSERT_TRUE(job.ok());
  WaitFor(*engine, job->record.id, [](const JobView& v) { return v.progress[0].proposed > 0; });
  ASSERT_TRUE(clock_.AwaitWaiters(1));
  clock_.Advance(59s);
  ASSERT_TRUE(clock_.AwaitWaiters(1));
  EXPECT_EQ(engine->Get(job->record.id)->record.state, JobState::kRunning) << "ended early";
  clock_.Advance(1s);
  JobView v = WaitFor(*engine, job->record.id, [](const JobView& v) { return IsFinal(v.record.state); });
  EXPECT_EQ(v.record.state, JobState::kSucceeded);
  EXPECT_NE(v.record.message.find("time budget of 60 s reached"), std::string::npos) << v.record.message;
  EXPECT_FALSE(CompleteOne(*engine, Outcome::kVerified, 1.0)) << "its tasks were cancelled";
}

TEST_F(JobsTest, CancelStopsTheJobAndItsTasks) {
  auto engine = Engine(100);
  JobSpec spec;
  spec.shapes = {Shape()};
  auto job = engine->Submit(spec);
  ASSERT_TRUE(job.ok());
  WaitFor(*engine, job->record.id, [](const JobView& v) { return v.progress[0].proposed > 0; });
  auto c = engine->Cancel(job->record.id, "test");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->record.state, JobState::kCancelled);
  EXPECT_FALSE(CompleteOne(*engine, Outcome::kVerified, 1.0));
  EXPECT_EQ(engine->Cancel("j999999", "x").status().code(), absl::StatusCode::kNotFound);
}

TEST(WaitingMessage, NamesEachArchOnceAndWhetherAGpuIsNeeded) {
  EXPECT_EQ(WaitingMessage({}), "");
  EXPECT_EQ(WaitingMessage({{"sm_100a", false}}), "waiting for a worker of arch sm_100a");
  EXPECT_EQ(WaitingMessage({{"sm_90a", true}, {"sm_90a", true}, {"sm_100a", false}, {"sm_80", true}}),
            "waiting for a GPU worker of arch sm_90a, a worker of arch sm_100a and a GPU worker "
            "of arch sm_80");
}

TEST_F(JobsTest, AJobNoConnectedWorkerCanRunSaysWhatItWaitsForUntilOneComes) {
  std::atomic<bool> available{false};
  std::vector<WorkerNeed> asked;
  std::vector<std::string> events;  // before the engine: its watcher writes here
  std::mutex mu;
  JobEngineOptions o;
  o.worker_available = [&](const WorkerNeed& n) {
    std::lock_guard lock(mu);
    asked.push_back(n);
    return available.load();
  };
  auto engine = Engine(100, 2, o);
  JobSpec spec;
  spec.shapes = {Shape()};
  spec.compile_only = true;
  auto job = engine->Submit(spec);
  ASSERT_TRUE(job.ok());
  engine->Watch(job->record.id, [&](const JobEvent& ev) {
    std::lock_guard lock(mu);
    events.push_back(ev.message + "|" + ev.job.waiting_for);
  });
  JobView v = AdvanceUntil(*engine, job->record.id, [](const JobView& v) { return !v.waiting_for.empty(); });
  EXPECT_EQ(v.waiting_for, "waiting for a worker of arch sm_90a");
  EXPECT_EQ(engine->WaitingFor(job->record.id), v.waiting_for);
  {
    std::lock_guard lock(mu);
    ASSERT_FALSE(asked.empty());
    EXPECT_EQ(asked[0].arch, "sm_90a");
    EXPECT_FALSE(asked[0].gpu) << "a compile-only job needs a compiler, not a GPU";
  }
  available = true;
  v = AdvanceUntil(*engine, job->record.id, [](const JobView& v) { return v.waiting_for.empty(); });
  EXPECT_EQ(v.waiting_for, "");
  EXPECT_EQ(v.record.state, JobState::kRunning);
  engine->Stop();
  std::lock_guard lock(mu);
  EXPECT_NE(std::find(events.begin(), events.end(),
                      "waiting for a worker of arch sm_90a|waiting for a worker of arch sm_90a"),
            events.end());
  EXPECT_NE(std::find(events.begin(), events.end(), "a connected worker can run its tasks|"),
            events.end());
}

TEST_F(JobsTest, AStuckJobFailsAfterTheTimeoutSayingWhatItWaitedFor) {
  JobEngineOptions o;
  o.worker_available = [](const WorkerNeed&) { return false; };
  o.stuck_timeout_ms = 60000;
  auto engine = Engine(100, 2, o);
  JobSpec spec;
  spec.shapes = {Shape()};
  auto job = engine->Submit(spec);
  ASSERT_TRUE(job.ok());
  JobView v = AdvanceUntil(*engine, job->record.id, [](const JobView& v) { return !v.waiting_for.empty(); });
  EXPECT_EQ(v.waiting_for, "waiting for a GPU worker of arch sm_90a");
  ASSERT_TRUE(clock_.AwaitWaiters(1));
  clock_.Advance(std::chrono::seconds(30));
  ASSERT_TRUE(clock_.AwaitWaiters(1));  // the tick at +30 s has run
  ASSERT_TRUE(engine->Get(job->record.id).ok());
  EXPECT_FALSE(IsFinal(engine->Get(job->record.id)->record.state)) << "not before the timeout";
  clock_.Advance(std::chrono::seconds(31));
  v = AdvanceUntil(*engine, job->record.id, [](const JobView& v) { return IsFinal(v.record.state); });
  EXPECT_EQ(v.record.state, JobState::kFailed);
  EXPECT_EQ(v.record.message,
            "waiting for a GPU worker of arch sm_90a for 60 s: no connected worker can run its tasks");
  EXPECT_EQ(v.waiting_for, "");
  EXPECT_FALSE(CompleteOne(*engine, Outcome::kVerified, 1.0)) << "its tasks were cancelled";
}

TEST_F(JobsTest, CompileOnlyProgressCountsTheCompiledResults) {
  auto engine = Engine(/*limit=*/3, /*per_round=*/3);
  JobSpec spec;
  spec.shapes = {Shape()};
  spec.compile_only = true;
  spec.max_variants = 3;
  auto job = engine->Submit(spec);
  ASSERT_TRUE(job.ok());
  int done = 0;
  for (int i = 0; i < 200 && done < 3; ++i) {
    if (CompleteOne(*engine, done == 1 ? Outcome::kCompileError : Outcome::kCompiled, 0)) ++done;
    else std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  JobView v = WaitFor(*engine, job->record.id, [](const JobView& v) { return IsFinal(v.record.state); });
  ASSERT_EQ(v.progress.size(), 1u);
  EXPECT_EQ(v.progress[0].evaluated, 3);
  EXPECT_EQ(v.progress[0].compiled, 2);
  EXPECT_EQ(v.progress[0].failed, 1);
  EXPECT_EQ(v.progress[0].verified, 0);
  // Kept in the stored progress too (a restart recomputes it from the tasks).
  auto rec = store_->GetJob(job->record.id);
  ASSERT_TRUE(rec.ok());
  ASSERT_TRUE(DecodeJob(*rec).ok());
  EXPECT_EQ(DecodeJob(*rec)->progress[0].compiled, 2);
}

// An asynchronous proposer: candidates arrive when the test says, from
// another thread, as a model's answers would; the engine must not wait for
// them in lockstep rounds, and must come back when woken.
class Background : public agent::Proposer {
 public:
  struct Shared {
    std::mutex mu;
    std::deque<agent::Candidate> ready;
    int pending = 0;
    std::function<void()> wake;
    std::vector<agent::ProposalContext> contexts;
    std::vector<agent::Feedback> seen;
  };
  explicit Background(std::shared_ptr<Shared> s) : s_(std::move(s)) {}
  absl::StatusOr<std::vector<agent::Candidate>> Propose(const agent::ProposalContext& ctx, int n) override {
    std::lock_guard lock(s_->mu);
    s_->contexts.push_back(ctx);
    std::vector<agent::Candidate> out;
    while (n-- > 0 && !s_->ready.empty()) {
      out.push_back(s_->ready.front());
      s_->ready.pop_front();
    }
    return out;
  }
  void Observe(const agent::Feedback& f) override {
    std::lock_guard lock(s_->mu);
    s_->seen.push_back(f);
  }
  void Remember(const agent::Candidate&) override {}
  std::string Name() const override { return "model"; }
  bool SetWake(std::function<void()> wake) override {
    std::lock_guard lock(s_->mu);
    s_->wake = std::move(wake);
    return true;
  }
  bool Busy() const override {
    std::lock_guard lock(s_->mu);
    return s_->pending > 0 || !s_->ready.empty();
  }

 private:
  std::shared_ptr<Shared> s_;
};

// The answer to one of the requests "in flight", then the wake.
void Arrive(Background::Shared& s, int k) {
  std::function<void()> wake;
  {
    std::lock_guard lock(s.mu);
    agent::Candidate c;
    c.source = fmt::format("answer {}", k);
    c.manifest_json = "{}";
    c.origin = "model";
    c.kind = k % 2 ? "repair" : "fresh";
    c.attempt = k % 2;
    c.normalized_hash = fmt::format("n{}", k);
    c.provenance_json = fmt::format(R"({{"call_id":{}}})", k);
    s.ready.push_back(c);
    --s.pending;
    wake = s.wake;
  }
  if (wake) wake();
}

TEST_F(JobsTest, AnAsynchronousProposerIsAskedWheneverThereIsRoomAndWhenItWakes) {
  auto shared = std::make_shared<Background::Shared>();
  shared->pending = 5;
  JobEngineOptions o;
  o.candidates_per_round = 3;
  JobEngine engine(
      store_.get(),
      [shared](const std::string&, uint64_t) -> absl::StatusOr<std::unique_ptr<agent::Proposer>> {
        return std::make_unique<Background>(shared);
      },
      o);
  ASSERT_TRUE(engine.Start().ok());
  JobSpec spec;
  spec.shapes = {Shape()};
  spec.proposer = "model";
  spec.max_variants = 5;
  spec.max_tokens = 1234;
  spec.max_cost_usd = 2.5;
  auto job = engine.Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->record.id;
  // Nothing ready: the bucket waits (not exhausted), and no task exists.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(engine.Get(id).ok());
  EXPECT_EQ(engine.Get(id)->record.state, JobState::kRunning);
  // Two answers come, one at a time: each becomes a task at once.
  Arrive(*shared, 0);
  WaitFor(engine, id, [](const JobView& v) { return v.progress[0].proposed == 1; });
  Arrive(*shared, 1);
  JobView v = WaitFor(engine, id, [](const JobView& v) { return v.progress[0].proposed == 2; });
  EXPECT_EQ(v.progress[0].proposed, 2);
  // A result frees room; the next answers fill it while others are evaluated.
  ASSERT_TRUE(CompleteOne(engine, Outcome::kCompileError, 0));
  for (int k = 2; k < 5; ++k) Arrive(*shared, k);
  v = WaitFor(engine, id, [](const JobView& v) { return v.progress[0].proposed == 4; });
  EXPECT_EQ(v.progress[0].proposed, 4);
  // Three outstanding is the bucket's pipeline: the fifth answer waits for room.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(engine.Get(id)->progress[0].proposed, 4);
  ASSERT_TRUE(CompleteOne(engine, Outcome::kVerified, 12));
  v = WaitFor(engine, id, [](const JobView& v) { return v.progress[0].proposed == 5; });
  EXPECT_EQ(v.progress[0].proposed, 5);
  for (int i = 0; i < 400; ++i) {
    if (!CompleteOne(engine, Outcome::kVerified, 10)) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (IsFinal(engine.Get(id)->record.state)) break;
  }
  v = WaitFor(engine, id, [](const JobView& v) { return IsFinal(v.record.state); });
  EXPECT_EQ(v.record.state, JobState::kSucceeded) << v.record.message;
  {
    std::lock_guard lock(shared->mu);
    ASSERT_FALSE(shared->contexts.empty());
    const agent::ProposalContext& ctx = shared->contexts.front();
    EXPECT_EQ(ctx.job_id, id);
    EXPECT_EQ(ctx.max_tokens, 1234);
    EXPECT_DOUBLE_EQ(ctx.max_cost_usd, 2.5);
    EXPECT_EQ(ctx.variants_left, 5);
    for (const agent::ProposalContext& c : shared->contexts) EXPECT_GE(c.variants_left, 1);
    ASSERT_EQ(shared->seen.size(), 5u);
    EXPECT_EQ(shared->seen[0].bucket, BucketOf(Shape()).Id());
  }
  // The model's provenance is stored with each variant.
  auto tasks = store_->ListTasks(id);
  ASSERT_TRUE(tasks.ok());
  ASSERT_EQ(tasks->size(), 5u);
  auto second = store_->GetVariant((*tasks)[1].variant_id);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->kind, "repair");
  EXPECT_EQ(second->attempt, 1);
  EXPECT_EQ(second->normalized_hash, "n1");
  EXPECT_EQ(second->provenance_json, R"({"call_id":1})");
}

TEST_F(JobsTest, AJobsTokensIncludeModelCallsThatMadeNoCandidate) {
  auto engine = Engine(/*limit=*/1);
  JobSpec spec;
  spec.shapes = {Shape()};
  auto job = engine->Submit(spec);
  ASSERT_TRUE(job.ok());
  ModelCallRecord refused;
  refused.job_id = job->record.id;
  refused.purpose = "propose";
  refused.outcome = "refused";
  refused.prompt_tokens = 700;
  refused.completion_tokens = 77;
  ASSERT_TRUE(store_->AddModelCall(refused).ok());
  for (int i = 0; i < 100 && !CompleteOne(*engine, Outcome::kVerified, 5); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  JobView v = WaitFor(*engine, job->record.id, [](const JobView& v) { return IsFinal(v.record.state); });
  EXPECT_EQ(v.record.tokens_used, 777);
}

}  // namespace
}  // namespace kforge::server
