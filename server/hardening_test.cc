// What issue 14 found a client, a worker, a model or a hostile input could
// do to the server, each checked over real gRPC on loopback with a real
// SQLite file: a restart that waits for proposers, pagination that refuses
// its own tokens, errors that echo large inputs, invalid UTF-8.
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <functional>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "grpc/health/v1/health.grpc.pb.h"
#include "kforge/v1/kforge.grpc.pb.h"
#include "server/server.h"
#include "storage/store.h"
#include "tests/runtime/store_fixture.h"

namespace kforge::server {
namespace {

constexpr char kClient[] = "hardening-client-token-0123456789abcdef";
constexpr char kWorker[] = "hardening-worker-token-0123456789abcdef";

ProposerFactory NoProposers() {
  return [](const std::string& name, uint64_t) -> absl::StatusOr<std::unique_ptr<agent::Proposer>> {
    return absl::NotFoundError("no proposer " + name);
  };
}

// A model endpoint that hangs: Propose blocks until Release().
class Gate {
 public:
  void Wait() {
    std::unique_lock lock(mu_);
    waiting_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
  }
  bool AwaitWaiter(std::chrono::seconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return waiting_; });
  }
  void Release() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool waiting_ = false, open_ = false;
};

class HangingProposer : public agent::Proposer {
 public:
  explicit HangingProposer(std::shared_ptr<Gate> gate) : gate_(std::move(gate)) {}
  absl::StatusOr<std::vector<agent::Candidate>> Propose(const agent::ProposalContext&,
                                                        int) override {
    gate_->Wait();
    return std::vector<agent::Candidate>{};
  }
  void Observe(const agent::Feedback&) override {}
  void Remember(const agent::Candidate&) override {}
  std::string Name() const override { return "builtin"; }

 private:
  std::shared_ptr<Gate> gate_;  // shared: the engine thread may still be leaving Wait()
};

ShapeKey Key(int batch) {
  ShapeKey k;
  k.op = Op::kForward;
  k.dtype = DType::kBF16;
  k.head_dim = 128;
  k.heads = 4;
  k.kv_heads = 4;
  k.causal = true;
  k.arch = "sm_90a";
  k.batch = batch;
  k.max_len_q = k.max_len_k = 512;
  k.total_q = k.total_k = batch * 100;
  return k;
}

class HardeningTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = std::filesystem::temp_directory_path() /
          fmt::format("kforge_hardening_test_{}.db", getpid());
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db_.string() + suffix);
    auto store = OpenSqliteStore(db_.string());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }
  void TearDown() override {
    gate_->Release();  // a test that failed before releasing must not hang here
    server_.reset();
    store_.reset();
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db_.string() + suffix);
  }

  void Start(ServerOptions o = {}, ProposerFactory proposers = NoProposers()) {
    o.listen_address = "127.0.0.1:0";
    o.client_tokens = {kClient};
    o.worker_tokens = {kWorker};
    o.api.limits.head_dims = {64, 128};
    o.drain_timeout_ms = 1000;
    auto server = Server::Start(o, store_.get(), std::move(proposers), nullptr);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    kernels_ = v1::KernelService::NewStub(channel_);
    workers_ = v1::WorkerService::NewStub(channel_);
  }

  static std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata("authorization", "Bearer " + token);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return ctx;
  }

  std::filesystem::path db_;
  std::shared_ptr<Gate> gate_ = std::make_shared<Gate>();
  std::unique_ptr<Store> store_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KernelService::Stub> kernels_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
};

// 500 queued jobs, or one hanging model endpoint, kept a restart from
// listening: the replay now runs behind the listener.
TEST_F(HardeningTest, TheServerListensWhileAProposerHangsInTheReplay) {
  JobSpec spec;
  spec.shapes = {Key(8)};
  JobRecord rec;
  rec.state = JobState::kRunning;
  rec.proposer = "builtin";
  rec.spec_json = EncodeJobSpec(spec);
  ASSERT_TRUE(store_->CreateJob(rec).ok());
  ProposerFactory hanging = [gate = gate_](const std::string&, uint64_t)
      -> absl::StatusOr<std::unique_ptr<agent::Proposer>> {
    return std::make_unique<HangingProposer>(gate);
  };
  const auto started = std::chrono::steady_clock::now();
  Start({}, hanging);
  ASSERT_TRUE(gate_->AwaitWaiter(std::chrono::seconds(10))) << "the replay asks the proposer";
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(kernels_->ListJobs(Ctx(kClient).get(), v1::ListJobsRequest(), &jobs).ok());
  EXPECT_EQ(jobs.jobs_size(), 1);
  gate_->Release();
}

TEST_F(HardeningTest, ShutdownAnswersUnavailableToNewWork) {
  ServerOptions o;
  o.shutdown_grace_ms = 1500;
  Start(o);
  std::thread stopper([&] { server_->Shutdown(); });
  auto health = grpc::health::v1::Health::NewStub(channel_);
  bool not_serving = false;
  for (int i = 0; i < 200 && !not_serving; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    grpc::health::v1::HealthCheckResponse resp;
    not_serving = health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp).ok() &&
                  resp.status() == grpc::health::v1::HealthCheckResponse::NOT_SERVING;
    if (!not_serving) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(not_serving);
  // In the grace period: new work is refused with the retryable code...
  v1::SubmitJobRequest submit;
  *submit.add_shapes() = v1::Shape();
  v1::Job job;
  grpc::Status s = kernels_->SubmitJob(Ctx(kClient).get(), submit, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_NE(s.error_message().find("shutting down"), std::string::npos) << s.error_message();
  v1::CancelJobRequest cancel;
  cancel.set_job_id("j1");
  EXPECT_EQ(kernels_->CancelJob(Ctx(kClient).get(), cancel, &job).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // ...and reads are still answered.
  v1::ListShapesResponse shapes;
  EXPECT_TRUE(kernels_->ListShapes(Ctx(kClient).get(), v1::ListShapesRequest(), &shapes).ok());
  stopper.join();
  // After it: nothing listens, which is UNAVAILABLE too.
  EXPECT_EQ(kernels_->ListShapes(Ctx(kClient).get(), v1::ListShapesRequest(), &shapes).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(HardeningTest, ListShapesAcceptsItsOwnNextPageToken) {
  Start();
  std::set<std::string> stored;
  for (int batch : {2, 8, 32, 128, 512})
    stored.insert(testing::PutBest(*store_, Key(batch), fmt::format("src {}", batch), "{}",
                                   "cubin-bytes-" + std::to_string(batch))
                      .bucket);
  ASSERT_EQ(stored.size(), 5u);
  std::set<std::string> listed;
  v1::ListShapesRequest req;
  req.set_page_size(2);
  for (int page = 0; page < 10; ++page) {
    v1::ListShapesResponse resp;
    grpc::Status s = kernels_->ListShapes(Ctx(kClient).get(), req, &resp);
    ASSERT_TRUE(s.ok()) << "page " << page << ": " << s.error_message();
    EXPECT_LE(resp.shapes_size(), 2);
    for (const auto& shape : resp.shapes()) EXPECT_TRUE(listed.insert(shape.bucket()).second);
    if (resp.next_page_token().empty()) break;
    req.set_page_token(resp.next_page_token());
  }
  EXPECT_EQ(listed, stored);
}

TEST_F(HardeningTest, ABadPageTokenIsNamedNotEchoed) {
  Start();
  const std::string forged = "fwd.bf16|" + std::string(400, 'z');
  for (const std::string& token : {std::string("no-bar"), forged, std::string(5 << 20, 'q')}) {
    v1::ListShapesRequest req;
    req.set_page_token(token);
    v1::ListShapesResponse resp;
    grpc::Status s = kernels_->ListShapes(Ctx(kClient).get(), req, &resp);
    if (token == forged) {
      EXPECT_TRUE(s.ok()) << "a well-formed token past every row is an empty page";
      continue;
    }
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << token.size();
    // A token no list makes is named; a 5 MiB one is refused by its size.
    EXPECT_NE(s.error_message().find(token.size() > 1000 ? "more than the 65536 this call accepts"
                                                         : "page_token"),
              std::string::npos)
        << s.error_message();
    EXPECT_LT(s.error_message().size(), 200u);
  }
}

v1::RegisterRequest GoodRegistration() {
  v1::RegisterRequest r;
  r.set_worker_name("gpu-host-0");
  r.mutable_gpu()->set_name("NVIDIA H200");
  r.mutable_gpu()->set_arch("sm_90a");
  r.mutable_gpu()->set_compute_capability("9.0");
  r.mutable_gpu()->set_sm_count(132);
  r.mutable_gpu()->set_memory_bytes(int64_t{141} << 30);
  r.mutable_gpu()->set_driver_version("580.65");
  r.mutable_gpu()->set_nvrtc_version("13.0");
  r.add_sanitizer_tools("memcheck");
  return r;
}

TEST_F(HardeningTest, RegisterValidatesEveryField) {
  Start();
  v1::RegisterResponse resp;
  ASSERT_TRUE(workers_->Register(Ctx(kWorker).get(), GoodRegistration(), &resp).ok());
  struct Case {
    std::string field;
    std::function<void(v1::RegisterRequest&)> spoil;
  };
  const std::vector<Case> cases = {
      {"worker_name", [](auto& r) { r.clear_worker_name(); }},
      {"worker_name", [](auto& r) { r.set_worker_name(std::string(500, 'n')); }},
      {"worker_name", [](auto& r) { r.set_worker_name("a\nb"); }},
      {"gpu.arch", [](auto& r) { r.mutable_gpu()->set_arch("sm_9000x"); }},
      {"gpu.name", [](auto& r) { r.mutable_gpu()->set_name(std::string(300, 'g')); }},
      {"gpu.compute_capability", [](auto& r) { r.mutable_gpu()->set_compute_capability("nine"); }},
      {"gpu.sm_count", [](auto& r) { r.mutable_gpu()->set_sm_count(-1); }},
      {"gpu.memory_bytes", [](auto& r) { r.mutable_gpu()->set_memory_bytes(-5); }},
      {"gpu.driver_version", [](auto& r) { r.mutable_gpu()->set_driver_version("5\t8\x01"); }},
      {"gpu.nvrtc_version", [](auto& r) { r.mutable_gpu()->set_nvrtc_version(std::string(65, '1')); }},
      {"sanitizer_tools[1]", [](auto& r) { r.add_sanitizer_tools("valgrind"); }},
      {"sanitizer_tools", [](auto& r) { for (int i = 0; i < 20; ++i) r.add_sanitizer_tools("memcheck"); }},
  };
  for (const Case& c : cases) {
    v1::RegisterRequest r = GoodRegistration();
    c.spoil(r);
    grpc::Status s = workers_->Register(Ctx(kWorker).get(), r, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_EQ(s.error_message().rfind(c.field + ":", 0), 0u) << c.field << ": " << s.error_message();
    EXPECT_LT(s.error_message().size(), 300u) << c.field;
  }
}

// A 10 MiB field came back as a 10 MiB error: now no message is large, and
// each still names the field.
TEST_F(HardeningTest, ErrorsNeverEchoALargeInput) {
  Start();
  v1::RegisterRequest r = GoodRegistration();
  r.mutable_gpu()->set_arch("sm_" + std::string(60 << 10, '9'));
  v1::RegisterResponse resp;
  grpc::Status s = workers_->Register(Ctx(kWorker).get(), r, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("gpu.arch:", 0), 0u) << s.error_message().substr(0, 200);
  EXPECT_LT(s.error_message().size(), 300u);
  EXPECT_NE(s.error_message().find("(61443 bytes)"), std::string::npos)
      << s.error_message().substr(0, 300);

  v1::SubmitJobRequest job;
  job.set_name(std::string(1 << 20, 'j'));
  job.set_proposer(std::string(1 << 20, 'p'));
  v1::Job out;
  s = kernels_->SubmitJob(Ctx(kClient).get(), job, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_LT(s.error_message().size(), 300u) << s.error_message().substr(0, 300);

  r = GoodRegistration();
  r.set_worker_name(std::string(10 << 20, 'w'));
  s = workers_->Register(Ctx(kWorker).get(), r, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_LT(s.error_message().size(), 300u);
  EXPECT_NE(s.error_message().find("RegisterRequest of 10485"), std::string::npos)
      << s.error_message();
}

// One 48 MB SubmitJob cost 12 s and 0.9 GiB: it is refused by its size now,
// before it is parsed.
TEST_F(HardeningTest, AnOversizedRequestIsRefusedBeforeItIsParsed) {
  Start();
  v1::SubmitJobRequest job;
  v1::Shape* shape = job.add_shapes();
  shape->set_arch("sm_90a");
  for (int i = 0; i < 12'000'000; ++i) shape->add_cu_seqlens_q(i);
  ASSERT_GT(job.ByteSizeLong(), 40u << 20);
  const auto t0 = std::chrono::steady_clock::now();
  v1::Job out;
  grpc::Status s = kernels_->SubmitJob(Ctx(kClient).get(), job, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("more than the 8388608 this call accepts"), std::string::npos)
      << s.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST_F(HardeningTest, InvalidUtf8IsInvalidArgumentNamingTheField) {
  Start();
  v1::RegisterRequest r = GoodRegistration();
  r.set_worker_name("gpu-\xff\xfe");
  v1::RegisterResponse resp;
  grpc::Status s = workers_->Register(Ctx(kWorker).get(), r, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "worker_name: is not valid UTF-8 (string fields carry text)");

  v1::SubmitJobRequest job;
  job.add_shapes()->set_arch("sm_90a");
  job.add_shapes()->set_arch("sm_90\xc3");
  v1::Job out;
  s = kernels_->SubmitJob(Ctx(kClient).get(), job, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("shapes[1].arch: is not valid UTF-8", 0), 0u)
      << s.error_message();

  v1::ReportResultRequest report;
  report.set_task_id("t1");
  report.mutable_result()->mutable_compile()->set_log("error at \xed\xa0\x80");
  ASSERT_TRUE(workers_->Register(Ctx(kWorker).get(), GoodRegistration(), &resp).ok());
  auto ctx = Ctx(kWorker);
  ctx->AddMetadata("x-kforge-session", resp.session_token());
  v1::ReportResultResponse rr;
  s = workers_->ReportResult(ctx.get(), report, &rr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("result.compile.log: is not valid UTF-8", 0), 0u)
      << s.error_message();

  v1::ListShapesRequest ls;
  ls.set_arch("\x80");
  v1::ListShapesResponse shapes;
  s = kernels_->ListShapes(Ctx(kClient).get(), ls, &shapes);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("arch: is not valid UTF-8", 0), 0u) << s.error_message();
}

}  // namespace
}  // namespace kforge::server
