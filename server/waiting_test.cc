// Long polls and watch streams hold no thread while they wait (issue 14
// measured about 1,018 threads for 1,000 of them when each held one), are
// capped, time out, and end promptly on cancellation and shutdown. Real
// gRPC on loopback, a real SQLite file; the clients use gRPC's callback API,
// so they hold no thread per call either and the process's thread count
// says what the server needs.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <filesystem>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "agent/scripted_proposer.h"
#include "kforge/v1/kforge.grpc.pb.h"
#include "server/server.h"

namespace kforge::server {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr char kClient[] = "waiting-client-token-0123456789abcdef";
constexpr char kWorker[] = "waiting-worker-token-0123456789abcdef";
constexpr char kManifest[] =
    R"({"entry_point":"kf_attn_fwd","threads":128,"tile_m":64,"tile_n":64,"archs":["sm_90a"],"head_dims":[64,128]})";

int Threads() {
  return static_cast<int>(std::distance(std::filesystem::directory_iterator("/proc/self/task"),
                                        std::filesystem::directory_iterator{}));
}

bool Eventually(const std::function<bool()>& pred, milliseconds timeout) {
  const auto end = steady_clock::now() + timeout;
  while (steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return pred();
}

// Something that ends with a status, waited for without a thread of its own.
class Ending {
 public:
  void End(const grpc::Status& s) {
    std::lock_guard lock(mu_);
    status_ = s;
    at_ = steady_clock::now();
    cv_.notify_all();
  }
  std::optional<grpc::Status> Wait(milliseconds timeout) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return status_.has_value(); });
    return status_;
  }
  bool ended() {
    std::lock_guard lock(mu_);
    return status_.has_value();
  }
  steady_clock::time_point at() {
    std::lock_guard lock(mu_);
    return at_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<grpc::Status> status_;
  steady_clock::time_point at_;
};

// A LeaseTask call in flight (callback API).
struct Poll {
  grpc::ClientContext ctx;
  v1::LeaseTaskRequest req;
  v1::LeaseTaskResponse resp;
  Ending end;
  steady_clock::time_point started;

  Poll(v1::WorkerService::Stub* stub, const std::string& session, int wait_ms) {
    ctx.AddMetadata("authorization", std::string("Bearer ") + kWorker);
    ctx.AddMetadata("x-kforge-session", session);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    req.set_wait_ms(wait_ms);
    started = steady_clock::now();
    stub->async()->LeaseTask(&ctx, &req, &resp, [this](grpc::Status s) { end.End(s); });
  }
};

// A WatchJob stream (callback API) that counts what it reads.
class Watch final : public grpc::ClientReadReactor<v1::JobEvent> {
 public:
  Watch(v1::KernelService::Stub* stub, const std::string& job_id) {
    ctx_.AddMetadata("authorization", std::string("Bearer ") + kClient);
    req_.set_job_id(job_id);
    started = steady_clock::now();
    stub->async()->WatchJob(&ctx_, &req_, this);
    StartRead(&ev_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    events.fetch_add(1);
    {
      std::lock_guard lock(mu_);
      last_ = ev_;
    }
    StartRead(&ev_);
  }
  void OnDone(const grpc::Status& s) override { end.End(s); }
  void Cancel() { ctx_.TryCancel(); }
  v1::JobEvent last() {
    std::lock_guard lock(mu_);
    return last_;
  }

  std::atomic<int> events{0};
  Ending end;
  steady_clock::time_point started;

 private:
  grpc::ClientContext ctx_;
  v1::WatchJobRequest req_;
  v1::JobEvent ev_;
  std::mutex mu_;
  v1::JobEvent last_;
};

class WaitingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = std::filesystem::temp_directory_path() /
          fmt::format("kforge_waiting_test_{}_{}.db", getpid(), counter_++);
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db_.string() + suffix);
    auto store = OpenSqliteStore(db_.string());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }
  void TearDown() override {
    server_.reset();
    store_.reset();
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db_.string() + suffix);
  }

  void Start(ServerOptions o) {
    o.listen_address = "127.0.0.1:0";
    o.client_tokens = {kClient};
    o.worker_tokens = {kWorker};
    o.api.limits.head_dims = {64, 128};
    o.drain_timeout_ms = 2000;
    auto server = Server::Start(
        o, store_.get(),
        [](const std::string&, uint64_t) -> absl::StatusOr<std::unique_ptr<agent::Proposer>> {
          return std::make_unique<agent::ScriptedProposer>(8, kManifest);
        },
        nullptr);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    kernels_ = v1::KernelService::NewStub(channel_);
    workers_ = v1::WorkerService::NewStub(channel_);
  }

  static std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token,
                                                  const std::string& session = "") {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata("authorization", "Bearer " + token);
    if (!session.empty()) ctx->AddMetadata("x-kforge-session", session);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return ctx;
  }

  // Registers a worker of `arch`; its session.
  std::string Register(const std::string& name, const std::string& arch) {
    v1::RegisterRequest req;
    req.set_worker_name(name);
    req.mutable_gpu()->set_arch(arch);
    req.mutable_gpu()->set_name("Fake GPU");
    req.mutable_gpu()->set_nvrtc_version("13.0");
    v1::RegisterResponse resp;
    grpc::Status s = workers_->Register(Ctx(kWorker).get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.session_token();
  }

  v1::Job Submit(int max_variants = 8) {
    v1::SubmitJobRequest req;
    v1::Shape* s = req.add_shapes();
    s->set_op(v1::OP_FORWARD);
    s->set_dtype(v1::DTYPE_BF16);
    s->set_head_dim(128);
    s->set_heads(8);
    s->set_causal(true);
    s->set_arch("sm_90a");
    s->set_batch(4);
    s->set_max_len_q(1024);
    s->set_total_q(4096);
    req.mutable_budget()->set_max_variants(max_variants);
    v1::Job job;
    grpc::Status st = kernels_->SubmitJob(Ctx(kClient).get(), req, &job);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return job;
  }

  // A synchronous LeaseTask: its status and the task, if any.
  std::pair<grpc::Status, std::optional<v1::Task>> Lease(const std::string& session,
                                                          int wait_ms) {
    v1::LeaseTaskRequest req;
    req.set_wait_ms(wait_ms);
    v1::LeaseTaskResponse resp;
    grpc::Status s = workers_->LeaseTask(Ctx(kWorker, session).get(), req, &resp);
    if (!resp.has_task()) return {s, std::nullopt};
    return {s, resp.task()};
  }

  bool ReportWrong(const std::string& session, const v1::Task& task) {
    v1::ReportResultRequest req;
    req.set_task_id(task.task_id());
    req.mutable_result()->set_outcome(v1::EVAL_OUTCOME_WRONG);
    req.mutable_result()->set_message("wrong on purpose");
    v1::ReportResultResponse resp;
    grpc::Status s = workers_->ReportResult(Ctx(kWorker, session).get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return s.ok() && resp.accepted();
  }

  static inline int counter_ = 0;
  std::filesystem::path db_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KernelService::Stub> kernels_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
};

// 1,000 watch streams and 1,000 long polls open at once: the server's
// threads stay bounded, the next of each is refused by its cap, a worker
// still leases and reports meanwhile (and every stream sees it), and
// cancelled polls and a shutdown end them promptly.
TEST_F(WaitingTest, AThousandStreamsAndAThousandLongPollsHoldNoThreadEach) {
  constexpr int kEach = 1000;
  ServerOptions o;
  o.max_open_lease_polls = kEach;
  o.max_open_watch_streams = kEach;
  o.api.max_lease_wait_ms = 60000;
  Start(o);
  const v1::Job job = Submit();
  // The flood's worker is of an arch no task needs: its polls wait.
  const std::string idle = Register("idle", "sm_100a");
  const std::string busy = Register("busy", "sm_90a");
  const int threads_at_start = Threads();

  std::vector<std::unique_ptr<Watch>> watches;
  std::vector<std::unique_ptr<Poll>> polls;
  // Whatever fails below, every call ends before its client object goes.
  struct EndAll {
    Server* server;
    std::vector<std::unique_ptr<Watch>>& watches;
    std::vector<std::unique_ptr<Poll>>& polls;
    ~EndAll() {
      server->Shutdown();
      for (auto& p : polls) p->end.Wait(milliseconds(10000));
      for (auto& w : watches) w->end.Wait(milliseconds(10000));
    }
  } end_all{server_.get(), watches, polls};
  for (int i = 0; i < kEach; ++i) {
    watches.push_back(std::make_unique<Watch>(kernels_.get(), job.id()));
    polls.push_back(std::make_unique<Poll>(workers_.get(), idle, 50000));
  }
  ASSERT_TRUE(Eventually(
      [&] {
        const Server::Waiting w = server_->waiting();
        return w.lease_polls == kEach && w.watch_streams == kEach;
      },
      milliseconds(30000)))
      << server_->waiting().lease_polls << " polls, " << server_->waiting().watch_streams
      << " streams open";
  ASSERT_TRUE(Eventually(
      [&] {
        for (auto& w : watches)
          if (w->events.load() < 1) return false;
        return true;
      },
      milliseconds(10000)))
      << "every stream gets the job's current state first";
  const int threads_open = Threads();
  std::printf("threads: %d before, %d with %d streams and %d long polls open\n",
              threads_at_start, threads_open, kEach, kEach);
  EXPECT_LT(threads_open, threads_at_start + 100)
      << threads_at_start << " threads before, " << threads_open << " with " << kEach
      << " streams and " << kEach << " long polls open";
  for (auto& p : polls) EXPECT_FALSE(p->end.ended()) << "a poll ended early";

  // The caps: the next of each is refused, saying which key limits it.
  {
    Watch extra(kernels_.get(), job.id());
    auto s = extra.end.Wait(milliseconds(10000));
    ASSERT_TRUE(s);
    EXPECT_EQ(s->error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s->error_message();
    EXPECT_NE(s->error_message().find("max_open_watch_streams"), std::string::npos)
        << s->error_message();
    auto [ls, task] = Lease(idle, 5000);
    EXPECT_EQ(ls.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << ls.error_message();
    EXPECT_NE(ls.error_message().find("max_open_lease_polls"), std::string::npos)
        << ls.error_message();
  }

  // A worker with work gets it at once, cap or not, and its reports reach
  // every stream. Half the job's budget: it keeps running.
  int reported = 0;
  for (int i = 0; i < 4; ++i) {
    auto [s, task] = Lease(busy, 5000);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_TRUE(task) << "the busy worker got no task while the flood waited";
    ASSERT_TRUE(ReportWrong(busy, *task));
    ++reported;
  }
  EXPECT_TRUE(Eventually(
      [&] {
        for (auto& w : watches) {
          int evaluated = 0;
          const v1::JobEvent last = w->last();
          for (const auto& p : last.job().progress()) evaluated += p.evaluated();
          if (evaluated < reported) return false;
        }
        return true;
      },
      milliseconds(20000)))
      << "a stream missed the reports";
  EXPECT_LT(Threads(), threads_at_start + 100);

  // Cancelled polls leave at once.
  const auto cancelled_at = steady_clock::now();
  for (auto& p : polls) p->ctx.TryCancel();
  EXPECT_TRUE(Eventually([&] { return server_->waiting().lease_polls == 0; }, milliseconds(5000)))
      << server_->waiting().lease_polls << " polls still open after the cancel";
  for (auto& p : polls) {
    auto s = p->end.Wait(milliseconds(5000));
    ASSERT_TRUE(s);
    EXPECT_EQ(s->error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_LT(steady_clock::now() - cancelled_at, milliseconds(5000));

  // Shutdown ends every stream of the running job with UNAVAILABLE ("watch
  // again") at once.
  EXPECT_EQ(watches.front()->last().job().state(), v1::JOB_STATE_RUNNING);
  const auto stop_at = steady_clock::now();
  server_->Shutdown();
  for (auto& w : watches) {
    auto s = w->end.Wait(milliseconds(10000));
    ASSERT_TRUE(s);
    EXPECT_EQ(s->error_code(), grpc::StatusCode::UNAVAILABLE) << s->error_message();
    EXPECT_LT(w->end.at() - stop_at, milliseconds(3000));
  }
}

// A long poll lasts at most max_lease_wait_ms and ends empty; one that
// waits is woken by a new task and leases it; a poll the client cancels
// leaves the server's count; shutdown ends waiting polls empty at once and
// answers new ones so.
TEST_F(WaitingTest, LongPollsAreBoundedWokenByNewTasksAndEndedByShutdown) {
  ServerOptions o;
  o.api.max_lease_wait_ms = 700;
  o.shutdown_grace_ms = 300;
  Start(o);
  const std::string w = Register("w", "sm_90a");

  // Bounded by max_lease_wait_ms whatever the request asks.
  {
    const auto t0 = steady_clock::now();
    auto [s, task] = Lease(w, 60000);
    const auto took = steady_clock::now() - t0;
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_FALSE(task);
    EXPECT_GE(took, milliseconds(650));
    EXPECT_LT(took, milliseconds(3000));
  }
  // Woken by the tasks of a job submitted while it waits.
  {
    ServerOptions longer = o;
    server_.reset();
    longer.api.max_lease_wait_ms = 20000;
    Start(longer);
    Poll poll(workers_.get(), w, 15000);
    ASSERT_TRUE(Eventually([&] { return server_->waiting().lease_polls == 1; }, milliseconds(5000)));
    const auto submitted = steady_clock::now();
    Submit();
    auto s = poll.end.Wait(milliseconds(10000));
    ASSERT_TRUE(s);
    ASSERT_TRUE(s->ok()) << s->error_message();
    EXPECT_TRUE(poll.resp.has_task()) << "the waiting poll was not given the new task";
    EXPECT_LT(poll.end.at() - submitted, milliseconds(3000));
    EXPECT_TRUE(Eventually([&] { return server_->waiting().lease_polls == 0; }, milliseconds(2000)));
  }
  // Drain the job's other tasks so that the next polls wait.
  while (Lease(w, 0).second) {
  }
  // Shutdown: waiting polls end empty (not after their 15 s), promptly.
  {
    Poll poll(workers_.get(), w, 15000);
    ASSERT_TRUE(Eventually([&] { return server_->waiting().lease_polls == 1; }, milliseconds(5000)));
    const auto stop_at = steady_clock::now();
    std::thread stopper([&] { server_->Shutdown(); });
    auto s = poll.end.Wait(milliseconds(5000));
    ASSERT_TRUE(s);
    EXPECT_TRUE(s->ok()) << s->error_message();
    EXPECT_FALSE(poll.resp.has_task());
    EXPECT_LT(poll.end.at() - stop_at, milliseconds(250)) << "ended before the grace, not after";
    // During the grace a new poll is answered at once, empty.
    Poll late(workers_.get(), w, 15000);
    auto ls = late.end.Wait(milliseconds(5000));
    ASSERT_TRUE(ls);
    if (ls->ok()) {
      EXPECT_FALSE(late.resp.has_task());
      EXPECT_LT(late.end.at() - late.started, milliseconds(250));
    } else {
      EXPECT_EQ(ls->error_code(), grpc::StatusCode::UNAVAILABLE) << "the listener had closed";
    }
    stopper.join();
  }
}

// A watch stream ends after max_watch_ms with UNAVAILABLE saying to watch
// again (and a new watch starts from the current state); a cancelled one
// leaves the server's count at once; one of a final job ends OK.
TEST_F(WaitingTest, WatchStreamsHaveALifetimeAndEndOnCancel) {
  ServerOptions o;
  o.max_watch_ms = 1000;
  Start(o);
  const v1::Job job = Submit();
  {
    Watch watch(kernels_.get(), job.id());
    auto s = watch.end.Wait(milliseconds(10000));
    ASSERT_TRUE(s);
    EXPECT_EQ(s->error_code(), grpc::StatusCode::UNAVAILABLE) << s->error_message();
    EXPECT_NE(s->error_message().find("watch again"), std::string::npos) << s->error_message();
    EXPECT_NE(s->error_message().find("max_watch_ms"), std::string::npos) << s->error_message();
    EXPECT_GE(watch.end.at() - watch.started, milliseconds(950));
    EXPECT_LT(watch.end.at() - watch.started, milliseconds(4000));
    EXPECT_GE(watch.events.load(), 1);
    EXPECT_EQ(watch.last().job().id(), job.id());
  }
  {
    Watch watch(kernels_.get(), job.id());
    ASSERT_TRUE(Eventually([&] { return watch.events.load() >= 1; }, milliseconds(5000)));
    EXPECT_EQ(server_->waiting().watch_streams, 1);
    watch.Cancel();
    auto s = watch.end.Wait(milliseconds(5000));
    ASSERT_TRUE(s);
    EXPECT_EQ(s->error_code(), grpc::StatusCode::CANCELLED);
    EXPECT_TRUE(Eventually([&] { return server_->waiting().watch_streams == 0; }, milliseconds(2000)));
  }
  {
    v1::CancelJobRequest c;
    c.set_job_id(job.id());
    v1::Job cancelled;
    ASSERT_TRUE(kernels_->CancelJob(Ctx(kClient).get(), c, &cancelled).ok());
    Watch watch(kernels_.get(), job.id());
    auto s = watch.end.Wait(milliseconds(5000));
    ASSERT_TRUE(s);
    EXPECT_TRUE(s->ok()) << s->error_message();
    EXPECT_EQ(watch.events.load(), 1);
    EXPECT_EQ(watch.last().job().state(), v1::JOB_STATE_CANCELLED);
  }
  {
    // Unknown jobs are NOT_FOUND, and take no place.
    Watch watch(kernels_.get(), "j424242");
    auto s = watch.end.Wait(milliseconds(5000));
    ASSERT_TRUE(s);
    EXPECT_EQ(s->error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_TRUE(Eventually([&] { return server_->waiting().watch_streams == 0; }, milliseconds(2000)));
  }
}

}  // namespace
}  // namespace kforge::server
