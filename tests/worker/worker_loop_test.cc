// The worker against an in-process WorkerService (fake_server.h): register as
// compile-only, lease COMPILE tasks, report compiled and compile_error
// results (real NVRTC, no GPU needed), send its session with every call,
// keep it through a server restart that keeps sessions and register again
// after one that lost them, heartbeat the task in progress and stop a task
// the server cancels. Waits on time (heartbeat intervals, backoffs, fault
// pauses) run on a ManualClock where a test is about them: time moves when
// the test says, so what may happen only after an interval provably does not
// before it.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <mutex>
#include <chrono>
#include <thread>

#include "core/clock.h"
#include "gpu/compile.h"
#include "gpu/compile_cache.h"
#include "tests/worker/fake_server.h"
#include "worker/rpc_client.h"
#include "worker/task_runner.h"
#include "worker/worker.h"

namespace kforge::worker {
namespace {

using testing::FakeServer;
using namespace std::chrono_literals;
namespace pb = ::kforge::v1;

constexpr char kToken[] = "test-token";

constexpr char kGoodSource[] = R"(#include "kforge/attn_params.h"
extern "C" __global__ void kf_attn_fwd(const __grid_constant__ KfAttnParams p) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.total_q) p.lse[i] = 0.0f;
}
)";

constexpr char kBrokenSource[] = R"(#include "kforge/attn_params.h"
extern "C" __global__ void kf_attn_fwd(const __grid_constant__ KfAttnParams p) {
  p.lse[0] = undefined_thing;
}
)";

pb::Task CompileTask(const std::string& id, const std::string& source,
                     const std::string& arch = "sm_90a") {
  pb::Task t;
  t.set_task_id(id);
  t.set_kind(pb::TASK_KIND_COMPILE);
  t.set_job_id("job1");
  pb::Shape* s = t.mutable_shape();
  s->set_op(pb::OP_FORWARD);
  s->set_dtype(pb::DTYPE_BF16);
  s->set_head_dim(128);
  s->set_heads(4);
  s->set_arch(arch);
  s->set_batch(2);
  s->set_max_len_q(64);
  s->set_total_q(100);
  t.mutable_variant()->set_variant_id("v-" + id);
  t.mutable_variant()->set_source(source);
  t.mutable_variant()->set_manifest_json(R"({"entry_point":"kf_attn_fwd","threads":128,"dynamic_smem_bytes":4096})");
  t.set_seed(7);
  return t;
}

// Waits for a condition on the worker's stats.
template <typename Pred>
bool Eventually(Pred pred, std::chrono::milliseconds timeout = 30s) {
  auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return pred();
}

// A compile-only worker (real NVRTC) on its own thread.
class WorkerHarness {
 public:
  // `clock`, when given, is what the worker waits on (it must outlive the
  // harness).
  explicit WorkerHarness(const std::string& address, std::string token = kToken,
                         TaskRunner* runner = nullptr,
                         std::vector<std::string> sanitizer_tools = {}, Clock* clock = nullptr,
                         int max_report_attempts = 8,
                         std::function<std::optional<gpu::GpuUsage>()> gpu_usage = {})
      : pool_(1, nullptr) {
    GrpcClientOptions co;
    co.target = address;
    co.token = std::move(token);
    co.max_reconnect_backoff = 300ms;
    client_ = MakeGrpcServerClient(co);
    RunnerOptions ro;
    ro.compile_only = true;
    ro.gpu.nvrtc_version = gpu::NvrtcVersion();
    runner_ = std::make_unique<LocalTaskRunner>(&pool_, nullptr, ro);
    WorkerOptions wo;
    wo.registration.worker_name = "test-worker";
    wo.registration.compile_only = true;
    wo.registration.gpu = ro.gpu;
    wo.registration.sanitizer_tools = std::move(sanitizer_tools);
    wo.lease_wait = 300ms;
    wo.backoff_initial = 50ms;
    wo.backoff_max = 300ms;
    wo.clock = clock;
    wo.max_report_attempts = max_report_attempts;
    wo.gpu_usage = std::move(gpu_usage);
    worker_ = std::make_unique<Worker>(client_.get(), runner ? runner : runner_.get(), wo);
    thread_ = std::thread([this] { worker_->Run(); });
  }
  ~WorkerHarness() {
    worker_->Stop();
    thread_.join();
  }
  Worker& worker() { return *worker_; }

 private:
  gpu::CompilePool pool_;
  std::unique_ptr<ServerClient> client_;
  std::unique_ptr<LocalTaskRunner> runner_;
  std::unique_ptr<Worker> worker_;
  std::thread thread_;
};


TEST(WorkerLoop, RegistersAsCompileOnlyWithNvrtcVersion) {
  FakeServer server(kToken);
  WorkerHarness h(server.address());
  ASSERT_TRUE(server.service().WaitFor([](auto& s) { return s.workers_locked() == 1; }));
  auto workers = server.service().workers();
  const pb::RegisterRequest& reg = workers.begin()->second;
  EXPECT_TRUE(reg.compile_only());
  EXPECT_EQ(reg.worker_name(), "test-worker");
  EXPECT_EQ(reg.gpu().nvrtc_version(), gpu::NvrtcVersion());
  EXPECT_TRUE(reg.gpu().name().empty());
  EXPECT_EQ(reg.sanitizer_tools_size(), 0);
}

// The server acts as the worker a call's session names: every call after
// Register carries it (the fake refuses one that does not).
TEST(WorkerLoop, SendsItsSessionWithEveryCallAndRegistersItsSanitizerTools) {
  FakeServer server(kToken);
  WorkerHarness h(server.address(), kToken, nullptr, {"memcheck", "racecheck"});
  server.service().Enqueue(CompileTask("t1", kGoodSource));
  ASSERT_TRUE(server.service().WaitFor([](auto& s) { return s.reports_locked() == 1; }));
  ASSERT_TRUE(server.service().WaitFor([](auto& s) { return s.heartbeats_locked() >= 2; }, 10s));
  auto workers = server.service().workers();
  ASSERT_EQ(workers.size(), 1u);
  const pb::RegisterRequest& reg = workers.begin()->second;
  EXPECT_EQ(std::vector<std::string>(reg.sanitizer_tools().begin(), reg.sanitizer_tools().end()),
            (std::vector<std::string>{"memcheck", "racecheck"}));
  EXPECT_TRUE(server.service().WaitFor([](auto& s) { return s.unauthenticated_calls_locked() == 0; }));
  EXPECT_EQ(h.worker().stats().registrations, 1);
  EXPECT_EQ(server.service().reports()[0].worker_id(), "w1");
}

// Sessions outlive a server restart: the worker waits out the outage on
// its session and goes on as the same worker, without registering again.
TEST(WorkerLoop, KeepsItsSessionThroughAServerRestart) {
  FakeServer server(kToken);
  WorkerHarness h(server.address());
  server.service().Enqueue(CompileTask("before", kGoodSource));
  ASSERT_TRUE(server.service().WaitFor([](auto& s) { return s.reports_locked() == 1; }));
  server.Restart(/*keep_sessions=*/true);
  ASSERT_TRUE(server.running());
  server.service().Enqueue(CompileTask("after", kGoodSource));
  ASSERT_TRUE(server.service().WaitFor([](auto& s) { return s.reports_locked() == 1; }))
      << "the worker did not come back after the restart";
  EXPECT_EQ(server.service().reports()[0].task_id(), "after");
  EXPECT_EQ(server.service().reports()[0].worker_id(), "w1");
  EXPECT_EQ(h.worker().stats().registrations, 1);
  EXPECT_TRUE(server.service().WaitFor([](auto& s) { return s.registrations_locked() == 0; }));
}

// A report the server refuses (its lease ended) stored nothing: the worker
// drops it, keeps its session and serves the next task.
TEST(WorkerLoop, ARefusedReportIsDroppedAndTheSessionKept) {
  FakeServer server(kToken);
  WorkerHarness h(server.address());
  server.service().RefuseReports(true);
  server.service().Enqueue(CompileTask("refused", kGoodSource));
  ASSERT_TRUE(Eventually([&] { return h.worker().stats().results_rejected == 1; }));
  server.service().RefuseReports(false);
  server.service().Enqueue(CompileTask("next", kGoodSource));
  ASSERT_TRUE(server.service().WaitFor([](auto& s) { return s.reports_locked() == 1; }));
  EXPECT_EQ(server.service().reports()[0].task_id(), "next");
  EXPECT_EQ(h.worker().stats().registrations, 1);
  EXPECT_EQ(h.worker().stats().results_dropped, 0);
}

TEST(WorkerLoop, CompileTaskReportsCompiledWithCompileReport) {
  FakeServer server(kToken);
  WorkerHarness h(server.address());
  server.service().Enqueue(CompileTask("t1", kGoodSource));
  ASSERT_TRUE(server.service().WaitFor([](auto& s) { return s.reports_locked() == 1; }));
  pb::ReportResultRequest r = server.service().reports()[0];
  EXPECT_EQ(r.task_id(), "t1");
  EXPECT_EQ(r.result().outcome(), pb::EVAL_OUTCOME_COMPILED) << r.result().message();
  const pb::CompileReport& c = r.result().compile();
  EXPECT_GT(c.compile_ms(), 0);
  EXPECT_GT(c.registers(), 0);
  EXPECT_FALSE(c.cubin().empty());
  EXPECT_NE(c.options().find("-arch=sm_90a"), std::string::npos) << c.options();
  EXPECT_EQ(c.dynamic_smem_bytes(), 4096);
  EXPECT_EQ(r.result().gpu().nvrtc_version(), gpu::NvrtcVersion());
}

TEST(WorkerLoop, BrokenSourceReportsCompileErrorWithLog) {
  FakeServer server(kToken);
  WorkerHarness h(server.address());
  server.service().Enqueue(CompileTask("bad", kBrokenSource));
  server.service().Enqueue(CompileTask("good", kGoodSource));  // the worker goes on
  ASSERT_TRUE(server.service().WaitFor([](auto& s) { return s.reports_locked() == 2; }));
  auto reports = server.service().reports();
  EXPECT_EQ(reports[0].task_id(), "bad");
  EXPECT_EQ(reports[0].result().outcome(), pb::EVAL_OUTCOME_COMPILE_ERROR);
  EXPECT_NE(reports[0].result().compile().log().find("undefined_thing"), std::string::npos)
      << reports[0].result().compile().log();
  EXPECT_NE(reports[0].result().message().find("undefined_thing"), std::string::npos);
  EXPECT_TRUE(reports[0].result().compile().cubin().empty());
  EXPECT_EQ(reports[1].result().outcome(), pb::EVAL_OUTCOME_COMPILED);
}

TEST(WorkerLoop, CompilesForBlackwellWithoutAGpu) {
  FakeServer server(kToken);
  WorkerHarness h(server.address());
  server.service().Enqueue(CompileTask("b", kGoodSource, "sm_100a"));
  ASSERT_TRUE(server.service().WaitFor([](auto& s) { return s.reports_locked() == 1; }));
  auto r = server.service().reports()[0];
  EXPECT_EQ(r.result().outcome(), pb::EVAL_OUTCOME_COMPILED) << r.result().compile().log();
  EXPECT_NE(r.result().compile().options().find("sm_100a"), std::string::npos);
}

TEST(WorkerLoop, EvaluateOnACompileOnlyWorkerIsNotChargedToTheCandidate) {
  FakeServer server(kToken);
  WorkerHarness h(server.address());
  pb::Task t = CompileTask("e", kGoodSource);
  t.set_kind(pb::TASK_KIND_EVALUATE);
  server.service().Enqueue(t);
  ASSERT_TRUE(Eventually([&] { return h.worker().stats().worker_faults == 1; }, 10s));
  EXPECT_EQ(server.service().reports().size(), 0u);  // its lease expires; another worker runs it
}

// A worker fault pauses the worker on the clock before it runs anything
// more: fault_pause_initial (5 s), doubling with each fault in a row.
TEST(WorkerLoop, AWorkerFaultPausesTheWorkerLongerEachTimeInARow) {
  FakeServer server(kToken, 0, /*heartbeat_ms=*/60000);
  for (const char* id : {"e1", "e2", "e3"}) {
    pb::Task t = CompileTask(id, kGoodSource);
    t.set_kind(pb::TASK_KIND_EVALUATE);  // a compile-only worker cannot: its own fault
    server.service().Enqueue(t);
  }
  ManualClock clock;
  WorkerHarness h(server.address(), kToken, nullptr, {}, &clock);
  auto faults = [&] { return h.worker().stats().worker_faults; };
  ASSERT_TRUE(Eventually([&] { return faults() == 1; }));
  ASSERT_TRUE(clock.AwaitWaiters(2));  // the pause and the heartbeat interval
  clock.Advance(4999ms);
  ASSERT_TRUE(clock.AwaitWaiters(2));
  EXPECT_EQ(faults(), 1) << "ran the next task within the first pause";
  clock.Advance(1ms);
  ASSERT_TRUE(Eventually([&] { return faults() == 2; }));
  ASSERT_TRUE(clock.AwaitWaiters(2));
  clock.Advance(5000ms);  // the first pause's length: not the second's
  ASSERT_TRUE(clock.AwaitWaiters(2));
  EXPECT_EQ(faults(), 2) << "the second pause in a row was not doubled";
  clock.Advance(5000ms);
  ASSERT_TRUE(Eventually([&] { return faults() == 3; }));
  EXPECT_EQ(server.service().reports().size(), 0u);
}

TEST(WorkerLoop, ReconnectsAndRegistersAgainAfterServerRestart) {
  FakeServer server(kToken);
  WorkerHarness h(server.address());
  server.service().Enqueue(CompileTask("before", kGoodSource));
  ASSERT_TRUE(server.service().WaitFor([](auto& s) { return s.reports_locked() == 1; }));

  server.Shutdown();
  // The worker sees the server gone (its long poll fails) before it comes back.
  ASSERT_TRUE(Eventually([&] { return h.worker().stats().connection_errors > 0; }));
  server.Start();  // same port, no memory of the worker
  ASSERT_TRUE(server.running());
  server.service().Enqueue(CompileTask("after", kGoodSource));
  ASSERT_TRUE(server.service().WaitFor([](auto& s) { return s.reports_locked() == 1; }))
      << "the worker did not come back after the restart";
  EXPECT_EQ(server.service().reports()[0].task_id(), "after");
  EXPECT_EQ(server.service().reports()[0].result().outcome(), pb::EVAL_OUTCOME_COMPILED);
  EXPECT_GE(h.worker().stats().registrations, 2);
  EXPECT_GT(h.worker().stats().connection_errors, 0);
}

// Real connections: a Register sent before anything listens waits for the
// server (gRPC's wait-for-ready) and goes through once it is up.
TEST(WorkerLoop, StartsBeforeTheServerAndKeepsTrying) {
  // Reserve a port, then free it so nothing listens there yet.
  int port;
  {
    FakeServer probe(kToken);
    port = probe.port();
  }
  WorkerHarness h("127.0.0.1:" + std::to_string(port));
  std::this_thread::sleep_for(600ms);
  EXPECT_EQ(h.worker().stats().registrations, 0);
  FakeServer server(kToken, port);
  ASSERT_TRUE(server.running());
  ASSERT_TRUE(server.service().WaitFor([](auto& s) { return s.workers_locked() == 1; }));
}

// A refused Register (here a wrong token) is not fatal: it is tried again
// after each backoff on the clock, never before it, the backoff doubling
// (jitter in [b/2, b]: 25-50 ms, then 50-100 ms).
TEST(WorkerLoop, ARefusedRegisterIsRetriedAfterEachBackoffAndNotBefore) {
  FakeServer server(kToken);
  ManualClock clock;
  WorkerHarness h(server.address(), "wrong-token", nullptr, {}, &clock);
  auto errors = [&] { return h.worker().stats().connection_errors; };
  ASSERT_TRUE(Eventually([&] { return errors() == 1; }));
  const std::pair<std::chrono::milliseconds, std::chrono::milliseconds> backoffs[] = {
      {24ms, 50ms}, {49ms, 100ms}};
  int64_t want = 1;
  for (const auto& [below, above] : backoffs) {
    ASSERT_TRUE(clock.AwaitWaiters(1));  // the backoff (no session: no heartbeat wait)
    clock.Advance(below);
    ASSERT_TRUE(clock.AwaitWaiters(1));
    EXPECT_EQ(errors(), want) << "retried before its backoff";
    clock.Advance(above - below);
    ++want;
    ASSERT_TRUE(Eventually([&] { return errors() == want; }));
  }
  EXPECT_EQ(h.worker().stats().registrations, 0);
  EXPECT_EQ(server.service().workers().size(), 0u);
}

// A runner that holds its task until released or cancelled.
class BlockingRunner final : public TaskRunner {
 public:
  std::optional<TaskResult> Run(const TaskSpec& task, const std::atomic<bool>& cancel) override {
    started_.store(true);
    while (!release_.load()) {
      if (cancel.load()) {
        saw_cancel_.store(true);
        return std::nullopt;
      }
      std::this_thread::sleep_for(10ms);
    }
    TaskResult r;
    r.outcome = Outcome::kCompiled;
    r.message = "released " + task.task_id;
    return r;
  }
  std::atomic<bool> started_{false}, release_{false}, saw_cancel_{false};
};

// One heartbeat per interval of the clock, naming the task in progress: a
// 30 s interval passes in no real time, and no heartbeat goes out before it.
TEST(WorkerLoop, HeartbeatsRenewTheLeaseOfTheTaskInProgressOncePerInterval) {
  FakeServer server(kToken, 0, /*heartbeat_ms=*/30000);
  ManualClock clock;
  BlockingRunner runner;
  WorkerHarness h(server.address(), kToken, &runner, {}, &clock);
  server.service().Enqueue(CompileTask("slow", kGoodSource));
  ASSERT_TRUE(Eventually([&] { return runner.started_.load(); }));
  for (int i = 1; i <= 3; ++i) {
    ASSERT_TRUE(clock.AwaitWaiters(1));  // the heartbeat thread, its interval running
    clock.Advance(29999ms);
    ASSERT_TRUE(clock.AwaitWaiters(1));
    EXPECT_EQ(h.worker().stats().heartbeats_ok, i - 1) << "a heartbeat before its interval";
    clock.Advance(1ms);
    ASSERT_TRUE(server.service().WaitFor([i](auto& s) { return s.renewals_locked("slow") == i; }))
        << "heartbeat " << i;
  }
  runner.release_.store(true);
  ASSERT_TRUE(server.service().WaitFor([](auto& s) { return s.reports_locked() == 1; }));
  EXPECT_EQ(server.service().reports()[0].result().message(), "released slow");
  EXPECT_TRUE(server.service().WaitFor([](auto& s) {
    return s.heartbeats_locked() == 3 && s.renewals_locked("slow") == 3;
  }));
}

TEST(WorkerLoop, HeartbeatsCarryTheGpuUsageWhenItIsKnown) {
  FakeServer server(kToken);
  std::atomic<int> samples{0};
  WorkerHarness h(server.address(), kToken, nullptr, {}, nullptr, 8, [&]() -> std::optional<gpu::GpuUsage> {
    if (samples++ == 0) return std::nullopt;  // unknown once: nothing is sent
    return gpu::GpuUsage{0.42, 3 << 20, 8 << 20};
  });
  ASSERT_TRUE(server.service().WaitFor([](auto& s) { return s.heartbeats_locked() >= 3; }, 10s));
  std::optional<pb::GpuUsage> u;
  ASSERT_TRUE(server.service().WaitFor(
      [&](auto& s) { return (u = s.last_gpu_usage_locked()).has_value(); }, 10s));
  EXPECT_DOUBLE_EQ(u->utilization(), 0.42);
  EXPECT_EQ(u->memory_used_bytes(), 3 << 20);
  EXPECT_EQ(u->memory_total_bytes(), 8 << 20);
}

TEST(WorkerLoop, CancelledTaskIsStoppedAndNotReported) {
  FakeServer server(kToken);
  BlockingRunner runner;
  WorkerHarness h(server.address(), kToken, &runner);
  server.service().Enqueue(CompileTask("doomed", kGoodSource));
  ASSERT_TRUE(Eventually([&] { return runner.started_.load(); }));
  server.service().Cancel("doomed");
  ASSERT_TRUE(Eventually([&] { return runner.saw_cancel_.load(); }, 10s));
  ASSERT_TRUE(Eventually([&] { return h.worker().stats().tasks_cancelled == 1; }, 5s));
  EXPECT_EQ(server.service().reports().size(), 0u);
}

// Holds each task until released; records the tasks it was asked to
// prepare and the order it ran them in.
class AheadRunner final : public TaskRunner {
 public:
  std::optional<TaskResult> Run(const TaskSpec& task, const std::atomic<bool>& cancel) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      ran.push_back(task.task_id);
    }
    while (!release.load()) {
      if (cancel.load()) return std::nullopt;
      std::this_thread::sleep_for(10ms);
    }
    TaskResult r;
    r.outcome = Outcome::kCompiled;
    return r;
  }
  void Prepare(const TaskSpec& task) override {
    std::lock_guard<std::mutex> lock(mu);
    prepared.push_back(task.task_id);
  }
  std::vector<std::string> Ran() {
    std::lock_guard<std::mutex> lock(mu);
    return ran;
  }
  std::vector<std::string> Prepared() {
    std::lock_guard<std::mutex> lock(mu);
    return prepared;
  }
  std::mutex mu;
  std::vector<std::string> ran, prepared;
  std::atomic<bool> release{false};
};

// While one task runs the next is leased, prepared (its compile started)
// and kept leased by the heartbeats; it runs next.
TEST(WorkerLoop, LeasesTheNextTaskAheadAndPreparesIt) {
  FakeServer server(kToken);
  AheadRunner runner;
  WorkerHarness h(server.address(), kToken, &runner);
  server.service().Enqueue(CompileTask("first", kGoodSource));
  ASSERT_TRUE(Eventually([&] { return runner.Ran().size() == 1; }));
  server.service().Enqueue(CompileTask("second", kGoodSource));
  // The first task started before the second existed: the ahead lease of
  // the next task comes when a task starts, so only the third is ahead.
  server.service().Enqueue(CompileTask("third", kGoodSource));
  runner.release.store(true);
  ASSERT_TRUE(server.service().WaitFor([](auto& s) { return s.reports_locked() == 3; }, 20s));
  EXPECT_EQ(runner.Ran(), (std::vector<std::string>{"first", "second", "third"}));
  EXPECT_EQ(runner.Prepared(), (std::vector<std::string>{"third"}));
  EXPECT_EQ(h.worker().stats().tasks_leased, 3);
  EXPECT_EQ(h.worker().stats().tasks_leased_ahead, 1);
}

TEST(WorkerLoop, TheTaskLeasedAheadIsHeartbeatedAndDroppedWhenCancelled) {
  FakeServer server(kToken);
  AheadRunner runner;
  server.service().Enqueue(CompileTask("running", kGoodSource));
  server.service().Enqueue(CompileTask("ahead", kGoodSource));
  WorkerHarness h(server.address(), kToken, &runner);
  ASSERT_TRUE(Eventually([&] { return runner.Prepared().size() == 1; }));
  EXPECT_EQ(runner.Prepared()[0], "ahead");
  ASSERT_TRUE(server.service().WaitFor([](auto& s) { return s.renewals_locked("ahead") >= 2; }, 10s));
  server.service().Cancel("ahead");
  ASSERT_TRUE(Eventually([&] { return h.worker().stats().heartbeats_ok >= 6; }, 10s));
  runner.release.store(true);
  ASSERT_TRUE(server.service().WaitFor([](auto& s) { return s.reports_locked() == 1; }, 10s));
  ASSERT_TRUE(Eventually([&] { return h.worker().stats().tasks_cancelled == 1; }, 5s));
  EXPECT_EQ(runner.Ran(), (std::vector<std::string>{"running"}));
}

// Records the task it was given and answers with a fixed result.
class RecordingRunner final : public TaskRunner {
 public:
  std::optional<TaskResult> Run(const TaskSpec& task, const std::atomic<bool>&) override {
    std::lock_guard<std::mutex> lock(mu);
    seen = task;
    TaskResult r;
    r.outcome = Outcome::kVerified;
    r.timing = Timing{.median_us = 5, .min_us = 4, .max_us = 6, .samples = 10};
    r.incumbent_timing = Timing{.median_us = 7, .min_us = 6, .max_us = 8, .samples = 10};
    r.verified = SizeExtent{.batch = 3, .max_len_q = 64, .max_len_k = 80, .total_q = 100,
                            .total_k = 150};
    r.errors = ErrorStats{.max_abs_error = HUGE_VAL, .rel_l2_error = 0.001, .worst_output = "LSE",
                          .detail = "d"};
    r.compile.registers = 99;
    r.compile.cubin = std::string("\0cubin\xff", 7);
    r.gpu.name = "G";
    r.reference_version = "ref";
    r.message = "m";
    return r;
  }
  std::mutex mu;
  std::optional<TaskSpec> seen;
};

TEST(WorkerLoop, TasksAndResultsCrossTheWireIntact) {
  FakeServer server(kToken);
  RecordingRunner runner;
  WorkerHarness h(server.address(), kToken, &runner);
  pb::Task t = CompileTask("rt", kGoodSource);
  t.set_kind(pb::TASK_KIND_RETIME);
  t.set_seed(0xfedcba9876543210ULL);
  t.set_lease_expires_unix_ms(123456789);
  pb::Shape* s = t.mutable_shape();
  s->set_kv_heads(0);  // 0: equal to heads
  s->set_causal(true);
  s->set_cross(true);
  s->set_max_len_k(80);
  s->set_total_k(150);
  s->add_cu_seqlens_q(0);
  s->add_cu_seqlens_q(36);
  s->add_cu_seqlens_q(100);
  s->add_cu_seqlens_k(0);
  s->add_cu_seqlens_k(80);
  s->add_cu_seqlens_k(150);
  t.mutable_variant()->set_compile_options("-DA=1");
  t.mutable_incumbent()->set_variant_id("inc");
  t.mutable_incumbent()->set_source("incumbent source");
  t.mutable_incumbent()->set_manifest_json("{}");
  server.service().Enqueue(t);
  ASSERT_TRUE(server.service().WaitFor([](auto& sv) { return sv.reports_locked() == 1; }));

  std::lock_guard<std::mutex> lock(runner.mu);
  ASSERT_TRUE(runner.seen.has_value());
  const TaskSpec& got = *runner.seen;
  EXPECT_EQ(got.task_id, "rt");
  EXPECT_EQ(got.kind, TaskKind::kRetime);
  EXPECT_EQ(got.job_id, "job1");
  EXPECT_EQ(got.seed, 0xfedcba9876543210ULL);
  EXPECT_EQ(got.lease_expires_unix_ms, 123456789);
  EXPECT_EQ(got.shape.key.heads, 4);
  EXPECT_EQ(got.shape.key.kv_heads, 4);
  EXPECT_EQ(got.shape.key.head_dim, 128);
  EXPECT_TRUE(got.shape.key.causal);
  EXPECT_TRUE(got.shape.key.cross);
  EXPECT_EQ(got.shape.key.arch, "sm_90a");
  EXPECT_EQ(got.shape.key.total_k, 150);
  EXPECT_EQ(got.shape.cu_seqlens_q, (std::vector<int32_t>{0, 36, 100}));
  EXPECT_EQ(got.shape.cu_seqlens_k, (std::vector<int32_t>{0, 80, 150}));
  EXPECT_EQ(got.variant.compile_options, "-DA=1");
  ASSERT_TRUE(got.incumbent.has_value());
  EXPECT_EQ(got.incumbent->variant_id, "inc");
  EXPECT_EQ(got.incumbent->source, "incumbent source");

  const pb::EvalResult r = server.service().reports()[0].result();
  EXPECT_EQ(r.outcome(), pb::EVAL_OUTCOME_VERIFIED);
  EXPECT_EQ(r.timing().median_us(), 5);
  EXPECT_EQ(r.timing().samples(), 10);
  EXPECT_EQ(r.incumbent_timing().median_us(), 7);
  EXPECT_TRUE(std::isinf(r.errors().max_abs_error()));
  EXPECT_EQ(r.errors().worst_output(), "LSE");
  EXPECT_EQ(r.compile().registers(), 99);
  EXPECT_EQ(r.compile().cubin(), std::string("\0cubin\xff", 7));
  EXPECT_EQ(r.gpu().name(), "G");
  EXPECT_EQ(r.reference_version(), "ref");
  EXPECT_EQ(r.message(), "m");
  EXPECT_EQ(r.verified().batch(), 3);
  EXPECT_EQ(r.verified().max_len_q(), 64);
  EXPECT_EQ(r.verified().max_len_k(), 80);
  EXPECT_EQ(r.verified().total_q(), 100);
  EXPECT_EQ(r.verified().total_k(), 150);
}

TEST(WorkerLoop, AConfirmTaskReachesTheRunnerAsConfirm) {
  FakeServer server(kToken);
  RecordingRunner runner;
  WorkerHarness h(server.address(), kToken, &runner);
  pb::Task t = CompileTask("c", kGoodSource);
  t.set_kind(pb::TASK_KIND_CONFIRM);
  server.service().Enqueue(t);
  ASSERT_TRUE(server.service().WaitFor([](auto& sv) { return sv.reports_locked() == 1; }));
  std::lock_guard<std::mutex> lock(runner.mu);
  ASSERT_TRUE(runner.seen.has_value());
  EXPECT_EQ(runner.seen->kind, TaskKind::kConfirm);
  EXPECT_FALSE(runner.seen->incumbent.has_value());
}

// A report the server did not get (UNAVAILABLE) is sent again once the
// backoff has passed on the clock, until the server takes it.
TEST(WorkerLoop, AReportThatFailsIsSentAgainAfterEachBackoff) {
  FakeServer server(kToken, 0, /*heartbeat_ms=*/60000);
  ManualClock clock;
  RecordingRunner runner;
  WorkerHarness h(server.address(), kToken, &runner, {}, &clock);
  server.service().FailReports(2);
  server.service().Enqueue(CompileTask("r", kGoodSource));
  // The backoff doubles from 50 ms, drawn in [b/2, b].
  const std::pair<std::chrono::milliseconds, std::chrono::milliseconds> backoffs[] = {
      {24ms, 50ms}, {49ms, 100ms}};
  int attempt = 1;
  for (const auto& [below, above] : backoffs) {
    ASSERT_TRUE(server.service().WaitFor(
        [attempt](auto& s) { return s.report_attempts_locked() == attempt; }));
    ASSERT_TRUE(clock.AwaitWaiters(2));  // the backoff and the heartbeat interval
    clock.Advance(below);
    ASSERT_TRUE(clock.AwaitWaiters(2));
    EXPECT_EQ(server.service().report_attempts(), attempt) << "sent again before its backoff";
    clock.Advance(above - below);
    ++attempt;
  }
  ASSERT_TRUE(server.service().WaitFor([](auto& s) { return s.reports_locked() == 1; }));
  EXPECT_EQ(server.service().reports()[0].task_id(), "r");
  ASSERT_TRUE(Eventually([&] { return h.worker().stats().results_accepted == 1; }));
  EXPECT_EQ(h.worker().stats().connection_errors, 2);
  EXPECT_EQ(h.worker().stats().results_dropped, 0);
}

// After max_report_attempts the result is dropped (the lease expires on the
// server and the task is handed out again) and the worker serves on.
TEST(WorkerLoop, AReportThatKeepsFailingIsDroppedAfterItsAttempts) {
  FakeServer server(kToken, 0, /*heartbeat_ms=*/60000);
  ManualClock clock;
  RecordingRunner runner;
  WorkerHarness h(server.address(), kToken, &runner, {}, &clock, /*max_report_attempts=*/3);
  server.service().FailReports(1000);
  server.service().Enqueue(CompileTask("lost", kGoodSource));
  for (int attempt = 1; attempt <= 3; ++attempt) {
    ASSERT_TRUE(server.service().WaitFor(
        [attempt](auto& s) { return s.report_attempts_locked() == attempt; }));
    EXPECT_EQ(h.worker().stats().results_dropped, 0);
    ASSERT_TRUE(clock.AwaitWaiters(2));
    clock.Advance(300ms);
  }
  ASSERT_TRUE(Eventually([&] { return h.worker().stats().results_dropped == 1; }));
  EXPECT_EQ(server.service().report_attempts(), 3);
  EXPECT_EQ(h.worker().stats().results_accepted, 0);
  // The worker goes on serving.
  server.service().FailReports(0);
  server.service().Enqueue(CompileTask("next", kGoodSource));
  ASSERT_TRUE(server.service().WaitFor([](auto& s) { return s.reports_locked() == 1; }));
}

}  // namespace
}  // namespace kforge::worker
