// The server end to end over real gRPC on loopback with a real SQLite file:
// auth, validation, unknown ids, garbage inputs, GetKernel (tuned, nearest,
// seed), the worker flow with the re-timing rule, lease expiry, WatchJob,
// CancelJob and health during shutdown. The proposer is scripted and the
// seed provider fake, so no GPU or NVRTC is needed.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <gtest/gtest.h>

#include <sqlite3.h>

#include "agent/scripted_proposer.h"
#include "core/hash.h"
#include "core/roofline.h"
#include "core/timing.h"
#include "kforge/v1/kforge.grpc.pb.h"
#include "server/auth.h"
#include "server/server.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace kforge::server {
namespace {

constexpr char kClient[] = "client-token-0123456789abcdef0123456";
constexpr char kWorker[] = "worker-token-0123456789abcdef0123456";
// Per-host worker credentials (ServerOptions::worker_tokens "name:token").
constexpr char kHostAToken[] = "host-a-token-0123456789abcdef0123456";
constexpr char kHostBToken[] = "host-b-token-0123456789abcdef0123456";
const std::vector<std::string> kHostTokens = {std::string("host-a:") + kHostAToken,
                                              std::string("host-b:") + kHostBToken};
constexpr char kManifest[] =
    R"({"entry_point":"kf_attn_fwd","threads":128,"tile_m":64,"tile_n":64,"archs":["sm_90a"],"head_dims":[64,128]})";

// Proposes `limit` distinct candidates in total, then nothing.
ProposerFactory Scripted(int limit) {
  return [limit](const std::string& name,
                 uint64_t) -> absl::StatusOr<std::unique_ptr<agent::Proposer>> {
    if (name != "builtin") return absl::NotFoundError("unknown proposer");
    return std::make_unique<agent::ScriptedProposer>(limit, kManifest);
  };
}

SeedProvider FakeSeeds() {
  return [](const ShapeKey& key) -> absl::StatusOr<SeedKernel> {
    SeedKernel s;
    s.source = "// seed\n";
    s.manifest_json = kManifest;
    s.template_name = "fwd_mma";
    s.knobs_json = "{}";
    s.cubin = "CUBIN-" + key.arch;
    return s;
  };
}

v1::Shape MakeShape(int64_t batch = 4, int64_t max_len = 1024, int64_t total = 4096) {
  v1::Shape s;
  s.set_op(v1::OP_FORWARD);
  s.set_dtype(v1::DTYPE_BF16);
  s.set_head_dim(128);
  s.set_heads(8);
  s.set_causal(true);
  s.set_arch("sm_90a");
  s.set_batch(batch);
  s.set_max_len_q(max_len);
  s.set_total_q(total);
  return s;
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = std::filesystem::temp_directory_path() /
          fmt::format("kforge_server_test_{}_{}.db", getpid(), counter_++);
    std::filesystem::remove(db_);
  }
  void TearDown() override {
    server_.reset();
    store_.reset();
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db_.string() + suffix);
  }

  void Start(ServerOptions o = {}, int proposals = 2, ProposerFactory factory = nullptr) {
    if (!store_) {
      auto store = OpenSqliteStore(db_.string());
      ASSERT_TRUE(store.ok()) << store.status();
      store_ = *std::move(store);
    }
    o.listen_address = "127.0.0.1:0";
    o.client_tokens = {kClient};
    if (o.worker_tokens.empty()) o.worker_tokens = {kWorker};
    o.api.limits.head_dims = {64, 128};
    if (o.reaper_interval_ms == 1000) o.reaper_interval_ms = 50;
    o.drain_timeout_ms = 2000;
    auto server = Server::Start(o, store_.get(), factory ? factory : Scripted(proposals), FakeSeeds());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    kernels_ = v1::KernelService::NewStub(channel_);
    workers_ = v1::WorkerService::NewStub(channel_);
  }

  static std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token, int timeout_s = 10) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s));
    return ctx;
  }

  // A worker call's context: the worker's token and its session.
  std::unique_ptr<grpc::ClientContext> WCtx(const std::string& worker, int timeout_s = 10) {
    auto token = tokens_.find(worker);
    auto ctx = Ctx(token != tokens_.end() ? token->second : kWorker, timeout_s);
    if (auto it = sessions_.find(worker); it != sessions_.end())
      ctx->AddMetadata("x-kforge-session", it->second);
    return ctx;
  }

  // Registers a worker (gated with memcheck unless `tools` says otherwise)
  // and keeps its session for WCtx.
  std::string RegisterWorker(const std::string& name = "w-test",
                             std::vector<std::string> tools = {"memcheck"},
                             const std::string& resume_session = "",
                             const std::string& nvrtc_version = "13.0",
                             const std::string& token = kWorker) {
    v1::RegisterRequest req;
    req.set_worker_name(name);
    req.mutable_gpu()->set_arch("sm_90a");
    req.mutable_gpu()->set_name("Fake H200");
    req.mutable_gpu()->set_nvrtc_version(nvrtc_version);
    for (const auto& t : tools) req.add_sanitizer_tools(t);
    v1::RegisterResponse resp;
    auto ctx = Ctx(token);
    if (!resume_session.empty()) ctx->AddMetadata("x-kforge-session", resume_session);
    grpc::Status s = workers_->Register(ctx.get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.session_token().size(), 68u) << "kfs_ and 64 hex digits";
    sessions_[resp.worker_id()] = resp.session_token();
    tokens_[resp.worker_id()] = token;
    return resp.worker_id();
  }
  // A gated worker registered with `token`.
  std::string RegisterWith(const std::string& token, const std::string& name) {
    return RegisterWorker(name, {"memcheck"}, "", "13.0", token);
  }

  std::optional<v1::Task> Lease(const std::string& worker, int wait_ms = 2000) {
    v1::LeaseTaskRequest req;
    req.set_worker_id(worker);
    req.set_wait_ms(wait_ms);
    v1::LeaseTaskResponse resp;
    grpc::Status s = workers_->LeaseTask(WCtx(worker).get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (!resp.has_task()) return std::nullopt;
    return resp.task();
  }

  // A verified result (or `outcome`) for `task`, with the variant's cubin.
  static v1::ReportResultRequest Result(const std::string& worker, const v1::Task& task,
                                        double median_us, double spread_us = 1.0,
                                        double incumbent_us = 0,
                                        v1::EvalOutcome outcome = v1::EVAL_OUTCOME_VERIFIED,
                                        double iqr_us = 0) {
    v1::ReportResultRequest req;
    req.set_worker_id(worker);
    req.set_task_id(task.task_id());
    auto* r = req.mutable_result();
    r->set_outcome(outcome);
    if (outcome == v1::EVAL_OUTCOME_VERIFIED) {
      r->mutable_timing()->set_median_us(median_us);
      r->mutable_timing()->set_min_us(median_us - spread_us / 2);
      r->mutable_timing()->set_max_us(median_us + spread_us / 2);
      r->mutable_timing()->set_samples(10);
      if (iqr_us > 0) {
        r->mutable_timing()->set_p25_us(median_us - iqr_us / 2);
        r->mutable_timing()->set_p75_us(median_us + iqr_us / 2);
      }
      if (task.kind() == v1::TASK_KIND_RETIME) {
        r->mutable_incumbent_timing()->set_median_us(incumbent_us);
        r->mutable_incumbent_timing()->set_min_us(incumbent_us - spread_us / 2);
        r->mutable_incumbent_timing()->set_max_us(incumbent_us + spread_us / 2);
        r->mutable_incumbent_timing()->set_samples(10);
        if (iqr_us > 0) {
          r->mutable_incumbent_timing()->set_p25_us(incumbent_us - iqr_us / 2);
          r->mutable_incumbent_timing()->set_p75_us(incumbent_us + iqr_us / 2);
        }
      }
    }
    r->mutable_compile()->set_cubin("CUBIN-of-" + task.variant().variant_id());
    r->mutable_gpu()->set_name("Fake H200");
    return req;
  }

  grpc::Status Send(const std::string& worker, const v1::ReportResultRequest& req) {
    v1::ReportResultResponse resp;
    grpc::Status s = workers_->ReportResult(WCtx(worker).get(), req, &resp);
    EXPECT_TRUE(!s.ok() || resp.accepted());
    return s;
  }

  bool Report(const std::string& worker, const v1::Task& task, double median_us,
              double spread_us = 1.0, double incumbent_us = 0,
              v1::EvalOutcome outcome = v1::EVAL_OUTCOME_VERIFIED, double iqr_us = 0) {
    grpc::Status s =
        Send(worker, Result(worker, task, median_us, spread_us, incumbent_us, outcome, iqr_us));
    EXPECT_TRUE(s.ok()) << s.error_message();
    return s.ok();
  }

  // Reports a verified EVALUATE, then leases the CONFIRM it asks for as
  // `confirmer` (default: the same worker) and reports that too.
  std::optional<v1::Task> ReportAndConfirm(const std::string& worker, const v1::Task& task,
                                           double us, std::string confirmer = "") {
    if (confirmer.empty()) confirmer = worker;
    if (!Report(worker, task, us)) return std::nullopt;
    auto confirm = Lease(confirmer);
    EXPECT_TRUE(confirm && confirm->kind() == v1::TASK_KIND_CONFIRM);
    if (!confirm || confirm->kind() != v1::TASK_KIND_CONFIRM) return std::nullopt;
    EXPECT_EQ(confirm->variant().variant_id(), task.variant().variant_id());
    if (!Report(confirmer, *confirm, us)) return std::nullopt;
    return confirm;
  }

  v1::Job SubmitJob(int max_variants = 2, const v1::Shape& shape = MakeShape()) {
    v1::SubmitJobRequest req;
    req.set_name("test");
    *req.add_shapes() = shape;
    req.mutable_budget()->set_max_variants(max_variants);
    req.set_seed(7);
    v1::Job job;
    grpc::Status s = kernels_->SubmitJob(Ctx(kClient).get(), req, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job;
  }

  // A bucket's incumbent at 100 us, then a challenger from another job at
  // 95 us, and the RETIME task that follows (not reported yet).
  struct RetimeSetup {
    std::string worker, incumbent, challenger;
    v1::Task retime;
  };
  std::optional<RetimeSetup> SetUpRetime() {
    Start({}, 1);
    SubmitJob(1);
    RetimeSetup r;
    r.worker = RegisterWorker();
    auto t1 = Lease(r.worker);
    if (!t1 || !ReportAndConfirm(r.worker, *t1, 100.0)) return std::nullopt;
    // Same shape, another job: the challenger is verified at the sizes the
    // incumbent serves.
    SubmitJob(1);
    auto t2 = Lease(r.worker);
    if (!t2 || !Report(r.worker, *t2, 95.0)) return std::nullopt;
    auto retime = Lease(r.worker);
    EXPECT_TRUE(retime && retime->kind() == v1::TASK_KIND_RETIME);
    if (!retime || retime->kind() != v1::TASK_KIND_RETIME) return std::nullopt;
    r.incumbent = t1->variant().variant_id();
    r.challenger = t2->variant().variant_id();
    r.retime = *retime;
    return r;
  }

  v1::Job GetJob(const std::string& id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::Job job;
    grpc::Status s = kernels_->GetJob(Ctx(kClient).get(), req, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job;
  }

  v1::Job WaitForState(const std::string& id, v1::JobState state) {
    v1::Job job;
    for (int i = 0; i < 200; ++i) {
      job = GetJob(id);
      if (job.state() == state) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return job;
  }

  grpc::Status GetKernel(const v1::Shape& shape, v1::GetKernelResponse* resp,
                         bool tune = false, const std::string& if_none_match = "") {
    v1::GetKernelRequest req;
    *req.mutable_shape() = shape;
    req.set_tune_if_untuned(tune);
    req.set_if_none_match(if_none_match);
    return kernels_->GetKernel(Ctx(kClient).get(), req, resp);
  }

  static inline int counter_ = 0;
  std::filesystem::path db_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KernelService::Stub> kernels_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
  std::map<std::string, std::string> sessions_;  // worker id -> session token
  std::map<std::string, std::string> tokens_;    // worker id -> its worker token
};

TEST_F(ServerTest, RefusesToStartWithoutTokensUnlessInsecure) {
  ServerOptions o;
  o.listen_address = "127.0.0.1:0";
  auto store = OpenSqliteStore(db_.string());
  ASSERT_TRUE(store.ok());
  auto s = Server::Start(o, store->get(), Scripted(1), nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--insecure-no-auth"), absl::string_view::npos);
  o.insecure_no_auth = true;
  auto t = Server::Start(o, store->get(), Scripted(1), nullptr);
  EXPECT_TRUE(t.ok()) << t.status();
}

TEST_F(ServerTest, KernelServiceNeedsAClientToken) {
  Start();
  v1::GetJobRequest req;
  req.set_job_id("j12345");
  v1::Job job;
  grpc::Status missing = kernels_->GetJob(Ctx("").get(), req, &job);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(missing.error_message().find("missing"), std::string::npos) << missing.error_message();
  grpc::Status wrong = kernels_->GetJob(Ctx("nope").get(), req, &job);
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  grpc::Status worker = kernels_->GetJob(Ctx(kWorker).get(), req, &job);
  EXPECT_EQ(worker.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(worker.error_message().find("worker token"), std::string::npos);
  grpc::Status right = kernels_->GetJob(Ctx(kClient).get(), req, &job);
  EXPECT_EQ(right.error_code(), grpc::StatusCode::NOT_FOUND) << right.error_message();
}

TEST_F(ServerTest, WorkerServiceNeedsAWorkerToken) {
  Start();
  v1::RegisterRequest req;
  req.set_worker_name("w");
  req.mutable_gpu()->set_arch("sm_90a");
  v1::RegisterResponse resp;
  EXPECT_EQ(workers_->Register(Ctx("").get(), req, &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(workers_->Register(Ctx("bad").get(), req, &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  grpc::Status client = workers_->Register(Ctx(kClient).get(), req, &resp);
  EXPECT_EQ(client.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(client.error_message().find("WorkerService needs a worker token"), std::string::npos);
  EXPECT_TRUE(workers_->Register(Ctx(kWorker).get(), req, &resp).ok());
}

TEST_F(ServerTest, HealthIsOpenAndServing) {
  Start();
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(health->Check(Ctx("").get(), req, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  req.set_service("kforge.v1.KernelService");
  ASSERT_TRUE(health->Check(Ctx("").get(), req, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

void ExpectInvalid(const grpc::Status& s, const std::string& field) {
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message().rfind(field, 0), 0u)
      << "message '" << s.error_message() << "' should start with '" << field << "'";
}

TEST_F(ServerTest, BadShapesAreInvalidArgumentNamingTheField) {
  Start();
  v1::GetKernelResponse resp;
  auto with = [](auto edit) {
    v1::Shape s = MakeShape();
    edit(s);
    return s;
  };
  ExpectInvalid(GetKernel(with([](v1::Shape& s) { s.set_head_dim(100); }), &resp),
                "shape.head_dim: 100 is not a multiple of 8");
  ExpectInvalid(GetKernel(with([](v1::Shape& s) { s.set_head_dim(96); }), &resp),
                "shape.head_dim: 96 is not supported");
  ExpectInvalid(GetKernel(with([](v1::Shape& s) { s.set_head_dim(-8); }), &resp),
                "shape.head_dim");
  ExpectInvalid(GetKernel(with([](v1::Shape& s) { s.set_heads(0); }), &resp), "shape.heads");
  ExpectInvalid(GetKernel(with([](v1::Shape& s) { s.set_kv_heads(3); }), &resp),
                "shape.kv_heads");
  ExpectInvalid(GetKernel(with([](v1::Shape& s) { s.set_batch(-1); }), &resp), "shape.batch");
  ExpectInvalid(GetKernel(with([](v1::Shape& s) { s.set_total_q(1LL << 40); }), &resp),
                "shape.total_q");
  ExpectInvalid(GetKernel(with([](v1::Shape& s) { s.set_op(static_cast<v1::Op>(42)); }), &resp),
                "shape.op");
  ExpectInvalid(GetKernel(with([](v1::Shape& s) { s.set_op(v1::OP_UNSPECIFIED); }), &resp),
                "shape.op");
  ExpectInvalid(GetKernel(with([](v1::Shape& s) { s.set_dtype(v1::DTYPE_UNSPECIFIED); }), &resp),
                "shape.dtype");
  ExpectInvalid(GetKernel(with([](v1::Shape& s) { s.set_arch("x86"); }), &resp), "shape.arch");
  ExpectInvalid(GetKernel(with([](v1::Shape& s) {
                  for (int v : {0, 10, 5}) s.add_cu_seqlens_q(v);
                }),
                          &resp),
                "shape.cu_seqlens_q: decreases");
  ExpectInvalid(GetKernel(with([](v1::Shape& s) {
                  for (int v : {0, 10, 30}) s.add_cu_seqlens_q(v);  // total 30 != 4096
                }),
                          &resp),
                "shape.batch");
  ExpectInvalid(GetKernel(with([](v1::Shape& s) {
                  s.set_batch(0);
                  s.set_max_len_q(0);
                  s.set_total_q(31);
                  for (int v : {0, 10, 30}) s.add_cu_seqlens_q(v);
                }),
                          &resp),
                "shape.total_q: 31 disagrees with cu_seqlens_q");
  ExpectInvalid(GetKernel(with([](v1::Shape& s) { s.add_cu_seqlens_k(0); }), &resp),
                "shape.cu_seqlens_k");
  v1::GetKernelRequest none;
  EXPECT_EQ(kernels_->GetKernel(Ctx(kClient).get(), none, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // Offsets alone are a complete description.
  v1::Shape offsets = with([](v1::Shape& s) {
    s.set_batch(0);
    s.set_max_len_q(0);
    s.set_total_q(0);
    for (int v : {0, 100, 300, 350}) s.add_cu_seqlens_q(v);
  });
  EXPECT_TRUE(GetKernel(offsets, &resp).ok());
}

TEST_F(ServerTest, BadRequestFieldsAreInvalidArgument) {
  Start();
  {
    v1::ListShapesRequest req;
    req.set_page_size(5000);
    v1::ListShapesResponse resp;
    ExpectInvalid(kernels_->ListShapes(Ctx(kClient).get(), req, &resp), "page_size");
    req.set_page_size(-1);
    ExpectInvalid(kernels_->ListShapes(Ctx(kClient).get(), req, &resp), "page_size");
    req.set_page_size(10);
    req.set_page_token("not-a-token");
    ExpectInvalid(kernels_->ListShapes(Ctx(kClient).get(), req, &resp), "page_token");
    req.set_page_token("");
    req.set_arch("gpu9000");
    ExpectInvalid(kernels_->ListShapes(Ctx(kClient).get(), req, &resp), "arch");
  }
  {
    v1::ListVariantsRequest req;
    req.set_bucket("garbage");
    v1::ListVariantsResponse resp;
    ExpectInvalid(kernels_->ListVariants(Ctx(kClient).get(), req, &resp), "bucket");
    req.set_bucket("");
    req.set_page_token("!!");
    ExpectInvalid(kernels_->ListVariants(Ctx(kClient).get(), req, &resp), "page_token");
  }
  {
    v1::ListJobsRequest req;
    req.set_page_size(1001);
    v1::ListJobsResponse resp;
    ExpectInvalid(kernels_->ListJobs(Ctx(kClient).get(), req, &resp), "page_size");
  }
  {
    v1::SubmitJobRequest req;
    v1::Job job;
    ExpectInvalid(kernels_->SubmitJob(Ctx(kClient).get(), req, &job), "shapes");
    *req.add_shapes() = MakeShape();
    *req.add_shapes() = MakeShape();
    req.mutable_shapes(1)->set_head_dim(7);
    ExpectInvalid(kernels_->SubmitJob(Ctx(kClient).get(), req, &job), "shapes[1].head_dim");
    req.mutable_shapes(1)->set_head_dim(128);
    req.mutable_budget()->set_max_variants(-3);
    ExpectInvalid(kernels_->SubmitJob(Ctx(kClient).get(), req, &job), "budget.max_variants");
    req.mutable_budget()->set_max_variants(1);
    req.mutable_budget()->set_max_seconds(-1);
    ExpectInvalid(kernels_->SubmitJob(Ctx(kClient).get(), req, &job), "budget.max_seconds");
    req.mutable_budget()->set_max_seconds(0);
    req.set_proposer("Robert'); DROP TABLE jobs;--");
    ExpectInvalid(kernels_->SubmitJob(Ctx(kClient).get(), req, &job), "proposer");
    req.set_proposer("nosuch");
    ExpectInvalid(kernels_->SubmitJob(Ctx(kClient).get(), req, &job), "proposer");
  }
  {
    v1::RegisterRequest req;
    v1::RegisterResponse resp;
    ExpectInvalid(workers_->Register(Ctx(kWorker).get(), req, &resp), "worker_name");
    req.set_worker_name("w");
    req.mutable_gpu()->set_arch("banana");
    ExpectInvalid(workers_->Register(Ctx(kWorker).get(), req, &resp), "gpu.arch");
  }
  const std::string worker = RegisterWorker();
  {
    v1::LeaseTaskRequest req;
    req.set_worker_id(worker);
    req.set_wait_ms(-5);
    v1::LeaseTaskResponse resp;
    ExpectInvalid(workers_->LeaseTask(WCtx(worker).get(), req, &resp), "wait_ms");
  }
  {
    SubmitJob(1);
    auto task = Lease(worker);
    ASSERT_TRUE(task);
    v1::ReportResultRequest req;
    req.set_worker_id(worker);
    req.set_task_id(task->task_id());
    v1::ReportResultResponse resp;
    ExpectInvalid(workers_->ReportResult(WCtx(worker).get(), req, &resp), "result");
    req.mutable_result()->set_outcome(static_cast<v1::EvalOutcome>(77));
    ExpectInvalid(workers_->ReportResult(WCtx(worker).get(), req, &resp), "result.outcome");
    req.mutable_result()->set_outcome(v1::EVAL_OUTCOME_VERIFIED);
    req.mutable_result()->mutable_timing()->set_median_us(std::numeric_limits<double>::quiet_NaN());
    ExpectInvalid(workers_->ReportResult(WCtx(worker).get(), req, &resp), "result.timing");
    req.mutable_result()->mutable_timing()->set_median_us(-1);
    ExpectInvalid(workers_->ReportResult(WCtx(worker).get(), req, &resp), "result.timing");
    req.mutable_result()->mutable_timing()->set_median_us(500);
    req.mutable_result()->mutable_verified()->set_total_q(-1);
    ExpectInvalid(workers_->ReportResult(WCtx(worker).get(), req, &resp), "result.verified.total_q");
  }
  {
    v1::RegisterRequest req;
    req.set_worker_name("w");
    req.mutable_gpu()->set_arch("sm_90a");
    req.add_sanitizer_tools("memcheck; rm -rf /");
    v1::RegisterResponse resp;
    ExpectInvalid(workers_->Register(Ctx(kWorker).get(), req, &resp), "sanitizer_tools");
  }
}

TEST_F(ServerTest, UnknownIdsAreNotFound) {
  Start();
  for (const std::string& id : std::vector<std::string>{"", "j999999", "garbage", std::string(500, 'x')}) {
    v1::GetJobRequest g;
    g.set_job_id(id);
    v1::Job job;
    EXPECT_EQ(kernels_->GetJob(Ctx(kClient).get(), g, &job).error_code(),
              grpc::StatusCode::NOT_FOUND) << id;
    v1::CancelJobRequest c;
    c.set_job_id(id);
    EXPECT_EQ(kernels_->CancelJob(Ctx(kClient).get(), c, &job).error_code(),
              grpc::StatusCode::NOT_FOUND) << id;
    v1::WatchJobRequest w;
    w.set_job_id(id);
    auto ctx = Ctx(kClient);
    auto reader = kernels_->WatchJob(ctx.get(), w);
    v1::JobEvent ev;
    while (reader->Read(&ev)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND) << id;
  }
  const std::string worker = RegisterWorker();
  for (const std::string& id : std::vector<std::string>{"t999999", "garbage", "", std::string(500, 't')}) {
    v1::ReportResultRequest r;
    r.set_worker_id(worker);
    r.set_task_id(id);
    r.mutable_result()->set_outcome(v1::EVAL_OUTCOME_WRONG);
    v1::ReportResultResponse rr;
    EXPECT_EQ(workers_->ReportResult(WCtx(worker).get(), r, &rr).error_code(),
              grpc::StatusCode::NOT_FOUND)
        << id;
  }
}

// Random and extreme values for every field of every RPC: whatever comes
// back, the server must keep serving.
TEST_F(ServerTest, GarbageNeverCrashesTheServer) {
  Start();
  const std::string worker = RegisterWorker();
  std::mt19937_64 rng(12345);
  const int64_t extremes64[] = {0, 1, -1, std::numeric_limits<int64_t>::max(),
                                std::numeric_limits<int64_t>::min(), 1LL << 31, 1LL << 40};
  const int32_t extremes32[] = {0, 1, -1, 7, 128, std::numeric_limits<int32_t>::max(),
                                std::numeric_limits<int32_t>::min()};
  auto pick64 = [&] { return extremes64[rng() % std::size(extremes64)]; };
  auto pick32 = [&] { return extremes32[rng() % std::size(extremes32)]; };
  auto junk = [&] {
    std::string s(rng() % 40, '\0');
    // Printable: proto3 strings must be UTF-8, and a client library refuses
    // to send anything else.
    for (auto& c : s) c = static_cast<char>(32 + rng() % 95);
    return s;
  };
  auto garbage_shape = [&](v1::Shape* s) {
    s->set_op(static_cast<v1::Op>(pick32() & 3));
    s->set_dtype(static_cast<v1::DType>(pick32() & 1));
    s->set_head_dim(pick32());
    s->set_heads(pick32());
    s->set_kv_heads(pick32());
    s->set_causal(rng() & 1);
    s->set_cross(rng() & 1);
    s->set_arch(rng() & 1 ? "sm_90a" : junk());
    s->set_batch(pick64());
    s->set_max_len_q(pick64());
    s->set_total_q(pick64());
    s->set_max_len_k(pick64());
    s->set_total_k(pick64());
    const int n = static_cast<int>(rng() % 6);
    for (int i = 0; i < n; ++i) s->add_cu_seqlens_q(pick32());
    if (rng() & 1)
      for (int i = 0; i < n; ++i) s->add_cu_seqlens_k(pick32());
  };
  for (int i = 0; i < 300; ++i) {
    grpc::Status st;
    switch (i % 12) {
      case 0: {
        v1::GetKernelRequest r;
        garbage_shape(r.mutable_shape());
        r.set_tune_if_untuned(rng() & 1);
        v1::GetKernelResponse resp;
        st = kernels_->GetKernel(Ctx(kClient).get(), r, &resp);
        break;
      }
      case 1: {
        v1::ListShapesRequest r;
        r.set_page_size(pick32());
        r.set_page_token(rng() & 1 ? junk() : std::to_string(pick64()));
        r.set_arch(junk());
        v1::ListShapesResponse resp;
        st = kernels_->ListShapes(Ctx(kClient).get(), r, &resp);
        break;
      }
      case 2: {
        v1::ListVariantsRequest r;
        r.set_page_size(pick32());
        r.set_page_token(std::to_string(pick64()));
        r.set_bucket(rng() & 1 ? junk() : "fwd.bf16.d128.h8.kv8.causal.self.sm_90a.b4.mq1024.aq1024.mk1024.ak1024");
        v1::ListVariantsResponse resp;
        st = kernels_->ListVariants(Ctx(kClient).get(), r, &resp);
        break;
      }
      case 3: {
        v1::SubmitJobRequest r;
        r.set_name(junk());
        const int n = static_cast<int>(rng() % 3);
        for (int k = 0; k < n; ++k) garbage_shape(r.add_shapes());
        r.set_proposer(rng() & 1 ? "builtin" : junk());
        r.mutable_budget()->set_max_variants(pick32());
        r.mutable_budget()->set_max_seconds(pick32());
        r.mutable_budget()->set_max_tokens(pick64());
        r.set_seed(rng());
        v1::Job job;
        st = kernels_->SubmitJob(Ctx(kClient).get(), r, &job);
        break;
      }
      case 4: case 5: case 6: {
        v1::Job job;
        if (i % 12 == 4) {
          v1::GetJobRequest r;
          r.set_job_id(junk());
          st = kernels_->GetJob(Ctx(kClient).get(), r, &job);
        } else if (i % 12 == 5) {
          v1::CancelJobRequest r;
          r.set_job_id("j" + std::to_string(pick64()));
          st = kernels_->CancelJob(Ctx(kClient).get(), r, &job);
        } else {
          v1::ListJobsRequest r;
          r.set_page_size(pick32());
          r.set_page_token(std::to_string(pick64()));
          v1::ListJobsResponse resp;
          st = kernels_->ListJobs(Ctx(kClient).get(), r, &resp);
        }
        break;
      }
      case 7: {
        v1::WatchJobRequest r;
        r.set_job_id(junk());
        auto ctx = Ctx(kClient, 1);
        auto reader = kernels_->WatchJob(ctx.get(), r);
        v1::JobEvent ev;
        while (reader->Read(&ev)) {
        }
        st = reader->Finish();
        break;
      }
      case 8: {
        v1::RegisterRequest r;
        r.set_worker_name(junk());
        r.mutable_gpu()->set_arch(rng() & 1 ? "sm_90a" : junk());
        r.mutable_gpu()->set_name(junk());
        r.mutable_gpu()->set_sm_count(pick32());
        r.mutable_gpu()->set_memory_bytes(pick64());
        r.set_compile_only(rng() & 1);
        v1::RegisterResponse resp;
        st = workers_->Register(Ctx(kWorker).get(), r, &resp);
        break;
      }
      case 9: {
        v1::HeartbeatRequest r;
        r.set_worker_id(rng() & 1 ? worker : junk());
        for (int k = 0; k < 3; ++k) r.add_task_ids(rng() & 1 ? junk() : "t" + std::to_string(pick64()));
        v1::HeartbeatResponse resp;
        st = workers_->Heartbeat(WCtx(worker).get(), r, &resp);
        break;
      }
      case 10: {
        v1::LeaseTaskRequest r;
        r.set_worker_id(rng() & 1 ? worker : junk());
        r.set_wait_ms(pick32() & 0xff);
        v1::LeaseTaskResponse resp;
        st = workers_->LeaseTask(WCtx(worker).get(), r, &resp);
        break;
      }
      case 11: {
        v1::ReportResultRequest r;
        r.set_worker_id(rng() & 1 ? worker : junk());
        r.set_task_id(rng() & 1 ? "t1" : junk());
        r.mutable_result()->set_outcome(static_cast<v1::EvalOutcome>(pick32() & 7));
        r.mutable_result()->mutable_timing()->set_median_us(static_cast<double>(pick64()));
        r.mutable_result()->mutable_timing()->set_max_us(-static_cast<double>(pick64()));
        r.mutable_result()->mutable_compile()->set_cubin(junk());
        if (rng() & 1) r.mutable_result()->mutable_verified()->set_batch(pick64());
        v1::ReportResultResponse resp;
        st = workers_->ReportResult(WCtx(worker).get(), r, &resp);
        break;
      }
    }
    EXPECT_NE(st.error_code(), grpc::StatusCode::UNAVAILABLE) << i << ": " << st.error_message();
    EXPECT_NE(st.error_code(), grpc::StatusCode::INTERNAL) << i << ": " << st.error_message();
    EXPECT_NE(st.error_code(), grpc::StatusCode::UNKNOWN) << i << ": " << st.error_message();
  }
  v1::GetKernelResponse resp;
  EXPECT_TRUE(GetKernel(MakeShape(), &resp).ok());
}

TEST_F(ServerTest, UntunedBucketGetsTheSeedDefaultAndCanEnqueueTuning) {
  Start();
  v1::GetKernelResponse resp;
  ASSERT_TRUE(GetKernel(MakeShape(), &resp).ok());
  EXPECT_FALSE(resp.kernel().tuned());
  EXPECT_EQ(resp.kernel().served_bucket(), "");
  EXPECT_EQ(resp.kernel().cubin(), "CUBIN-sm_90a");
  EXPECT_EQ(resp.kernel().manifest().entry_point(), "kf_attn_fwd");
  EXPECT_EQ(resp.kernel().requested_bucket(),
            "fwd.bf16.d128.h8.kv8.causal.self.sm_90a.b4.mq1024.aq1024.mk1024.ak1024");
  EXPECT_TRUE(resp.tuning_job_id().empty());

  v1::GetKernelResponse tuned;
  ASSERT_TRUE(GetKernel(MakeShape(), &tuned, /*tune=*/true).ok());
  ASSERT_FALSE(tuned.tuning_job_id().empty());
  v1::GetKernelResponse again;
  ASSERT_TRUE(GetKernel(MakeShape(), &again, /*tune=*/true).ok());
  EXPECT_EQ(again.tuning_job_id(), tuned.tuning_job_id()) << "one tuning job per bucket";
  EXPECT_EQ(GetJob(tuned.tuning_job_id()).state(), v1::JOB_STATE_RUNNING);
}

// One promotion per round: the bucket's fastest verified candidate is
// confirmed once its round is in, not the first to arrive, and a slower one
// asks for nothing after it (every promotion costs the sanitizer gates).
TEST_F(ServerTest, TheRoundsFastestCandidateIsConfirmedNotTheFirst) {
  Start({}, /*proposals=*/3);
  const v1::Job job = SubmitJob(/*max_variants=*/3);
  const std::string w = RegisterWorker();
  auto t1 = Lease(w);
  auto t2 = Lease(w);
  auto t3 = Lease(w);
  ASSERT_TRUE(t1 && t2 && t3);
  ASSERT_TRUE(Report(w, *t1, 150.0));
  ASSERT_TRUE(Report(w, *t2, 100.0));
  ASSERT_TRUE(Report(w, *t3, 120.0));
  auto confirm = Lease(w);
  ASSERT_TRUE(confirm);
  EXPECT_EQ(confirm->kind(), v1::TASK_KIND_CONFIRM);
  EXPECT_EQ(confirm->variant().variant_id(), t2->variant().variant_id());
  ASSERT_TRUE(Report(w, *confirm, 100.0));
  v1::GetKernelResponse k;
  ASSERT_TRUE(GetKernel(MakeShape(), &k).ok());
  EXPECT_EQ(k.kernel().variant_id(), t2->variant().variant_id());
  EXPECT_FALSE(Lease(w, 300)) << "a slower candidate asked for a promotion";
}

TEST_F(ServerTest, WorkerFlowReplacesTheBestOnlyAfterARetimeWin) {
  Start({}, /*proposals=*/3);
  const v1::Job job = SubmitJob(/*max_variants=*/3);
  ASSERT_FALSE(job.id().empty());

  // Watch the whole job from the start.
  std::vector<v1::JobEvent> events;
  grpc::Status watch_status;
  std::thread watcher([&] {
    v1::WatchJobRequest req;
    req.set_job_id(job.id());
    auto ctx = Ctx(kClient, 30);
    auto reader = kernels_->WatchJob(ctx.get(), req);
    v1::JobEvent ev;
    while (reader->Read(&ev)) events.push_back(ev);
    watch_status = reader->Finish();
  });

  const std::string w = RegisterWorker();
  auto t1 = Lease(w);
  auto t2 = Lease(w);
  auto t3 = Lease(w);
  ASSERT_TRUE(t1 && t2 && t3);
  EXPECT_EQ(t1->kind(), v1::TASK_KIND_EVALUATE);
  EXPECT_EQ(t1->shape().head_dim(), 128);
  EXPECT_FALSE(t1->variant().source().empty());
  EXPECT_EQ(t1->variant().manifest_json(), kManifest);

  // First verified result: nothing to beat, but an EVALUATE alone never
  // promotes, and while the bucket's other evaluations run its promotion is
  // held (promotion.h). A slower candidate and a wrong one complete the
  // round; then the fastest verified one gets a CONFIRM (gates, then a
  // timing alone), leased before other work.
  ASSERT_TRUE(Report(w, *t1, 100.0));
  v1::GetKernelResponse k;
  ASSERT_TRUE(GetKernel(MakeShape(), &k).ok());
  EXPECT_FALSE(k.kernel().tuned()) << "promoted before its CONFIRM";
  ASSERT_TRUE(Report(w, *t2, 150.0));
  ASSERT_TRUE(Report(w, *t3, 0, 1, 0, v1::EVAL_OUTCOME_WRONG));
  auto confirm = Lease(w);
  ASSERT_TRUE(confirm);
  EXPECT_EQ(confirm->kind(), v1::TASK_KIND_CONFIRM);
  EXPECT_EQ(confirm->variant().variant_id(), t1->variant().variant_id());
  EXPECT_EQ(confirm->variant().source(), t1->variant().source());
  EXPECT_FALSE(confirm->has_incumbent());
  ASSERT_TRUE(Report(w, *confirm, 100.0));
  ASSERT_TRUE(GetKernel(MakeShape(), &k).ok());
  EXPECT_TRUE(k.kernel().tuned());
  EXPECT_EQ(k.kernel().variant_id(), t1->variant().variant_id());
  EXPECT_EQ(k.kernel().cubin(), "CUBIN-of-" + t1->variant().variant_id());
  EXPECT_EQ(k.kernel().served_bucket(), k.kernel().requested_bucket());
  EXPECT_DOUBLE_EQ(k.kernel().timing().median_us(), 100.0);

  // Re-running the job so that a faster candidate comes along needs a new
  // job; here the third proposal slot was the wrong one, so submit another.
  const v1::Job job2 = SubmitJob(1);
  auto t4 = Lease(w);
  ASSERT_TRUE(t4);
  ASSERT_TRUE(Report(w, *t4, 80.0));  // faster than 100: a RETIME follows
  ASSERT_TRUE(GetKernel(MakeShape(), &k).ok());
  EXPECT_EQ(k.kernel().variant_id(), t1->variant().variant_id()) << "not replaced before RETIME";
  auto retime = Lease(w);
  ASSERT_TRUE(retime);
  EXPECT_EQ(retime->kind(), v1::TASK_KIND_RETIME);
  EXPECT_EQ(retime->variant().variant_id(), t4->variant().variant_id());
  EXPECT_EQ(retime->incumbent().variant_id(), t1->variant().variant_id());
  // Wins by 20 us with a spread of 1 us: replaced.
  ASSERT_TRUE(Report(w, *retime, 80.0, 1.0, 100.0));
  ASSERT_TRUE(GetKernel(MakeShape(), &k).ok());
  EXPECT_EQ(k.kernel().variant_id(), t4->variant().variant_id());
  EXPECT_TRUE(k.kernel().tuned());

  // A client holding the current best gets a reply without source or cubin;
  // one holding the old best gets the new kernel in full.
  v1::GetKernelResponse same;
  ASSERT_TRUE(GetKernel(MakeShape(), &same, false, t4->variant().variant_id()).ok());
  EXPECT_TRUE(same.not_modified());
  EXPECT_EQ(same.kernel().variant_id(), t4->variant().variant_id());
  EXPECT_TRUE(same.kernel().source().empty());
  EXPECT_TRUE(same.kernel().cubin().empty());
  EXPECT_TRUE(same.kernel().tuned());
  v1::GetKernelResponse stale;
  ASSERT_TRUE(GetKernel(MakeShape(), &stale, false, t1->variant().variant_id()).ok());
  EXPECT_FALSE(stale.not_modified());
  EXPECT_EQ(stale.kernel().cubin(), "CUBIN-of-" + t4->variant().variant_id());

  EXPECT_EQ(WaitForState(job.id(), v1::JOB_STATE_SUCCEEDED).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(WaitForState(job2.id(), v1::JOB_STATE_SUCCEEDED).state(), v1::JOB_STATE_SUCCEEDED);
  watcher.join();
  EXPECT_TRUE(watch_status.ok()) << watch_status.error_message();
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back().job().state(), v1::JOB_STATE_SUCCEEDED);
  const auto& p = events.back().job().progress(0);
  EXPECT_EQ(p.proposed(), 3);
  EXPECT_EQ(p.evaluated(), 3);
  EXPECT_EQ(p.verified(), 2);
  EXPECT_EQ(p.failed(), 1);
  EXPECT_EQ(p.best_variant_id(), t1->variant().variant_id());

  v1::ListShapesRequest ls;
  v1::ListShapesResponse shapes;
  ASSERT_TRUE(kernels_->ListShapes(Ctx(kClient).get(), ls, &shapes).ok());
  ASSERT_EQ(shapes.shapes_size(), 1);
  EXPECT_EQ(shapes.shapes(0).best_variant_id(), t4->variant().variant_id());

  v1::ListVariantsRequest lv;
  lv.set_bucket(k.kernel().requested_bucket());
  lv.set_page_size(2);
  v1::ListVariantsResponse variants;
  ASSERT_TRUE(kernels_->ListVariants(Ctx(kClient).get(), lv, &variants).ok());
  EXPECT_EQ(variants.variants_size(), 2);
  EXPECT_FALSE(variants.next_page_token().empty());
  lv.set_page_token(variants.next_page_token());
  ASSERT_TRUE(kernels_->ListVariants(Ctx(kClient).get(), lv, &variants).ok());
  EXPECT_EQ(variants.variants_size(), 2);
}

TEST_F(ServerTest, RetimeWithinTheSpreadKeepsTheIncumbent) {
  std::optional<RetimeSetup> r = SetUpRetime();
  ASSERT_TRUE(r);
  // Faster by 3 us, but the timings spread over 10 us: noise, not a win.
  ASSERT_TRUE(Report(r->worker, r->retime, 97.0, 10.0, 100.0));
  v1::GetKernelResponse k;
  ASSERT_TRUE(GetKernel(MakeShape(), &k).ok());
  EXPECT_EQ(k.kernel().variant_id(), r->incumbent);
}

// With quartiles reported, the spread is their distance, as in the worker's
// own verdict: one slow outlier (a wide min..max) does not veto a clear win.
TEST_F(ServerTest, RetimeSpreadIsTheInterquartileRange) {
  std::optional<RetimeSetup> r = SetUpRetime();
  ASSERT_TRUE(r);
  // 5 us faster; min..max spans 20 us, the quartiles 2 us.
  ASSERT_TRUE(Report(r->worker, r->retime, 95.0, 20.0, 100.0, v1::EVAL_OUTCOME_VERIFIED, 2.0));
  v1::GetKernelResponse k;
  ASSERT_TRUE(GetKernel(MakeShape(), &k).ok());
  EXPECT_EQ(k.kernel().variant_id(), r->challenger);
}

// Fills `t` from per-launch samples as a worker sends them.
void SetSamples(v1::Timing* t, const std::vector<double>& samples) {
  const Timing s = Summarize(samples);
  t->Clear();
  t->set_median_us(s.median_us);
  t->set_min_us(s.min_us);
  t->set_max_us(s.max_us);
  t->set_p25_us(s.p25_us);
  t->set_p75_us(s.p75_us);
  t->set_samples(s.samples);
  for (double v : samples) t->add_samples_us(v);
}

// Clocks moving +-15% from pair to pair, the challenger 5% faster in every
// pair: far inside the spreads, and a win on the pairs. The served figure
// says how it was measured, and the decision is recomputed from what the
// store kept.
TEST_F(ServerTest, RetimeDecidesOnThePairsAndTheStoredSamplesReproduceIt) {
  std::optional<RetimeSetup> r = SetUpRetime();
  ASSERT_TRUE(r);
  std::vector<double> cand, inc;
  for (int i = 0; i < 24; ++i) {
    const double clock = 1.0 + 0.15 * std::sin(1.7 * i);
    cand.push_back(95.0 * clock * (1 + 0.004 * std::sin(2.9 * i)));
    inc.push_back(100.0 * clock * (1 + 0.004 * std::cos(3.7 * i)));
  }
  v1::ReportResultRequest req = Result(r->worker, r->retime, 95.0, 1.0, 100.0);
  SetSamples(req.mutable_result()->mutable_timing(), cand);
  SetSamples(req.mutable_result()->mutable_incumbent_timing(), inc);
  ASSERT_TRUE(Send(r->worker, req).ok());

  v1::GetKernelResponse k;
  ASSERT_TRUE(GetKernel(MakeShape(), &k).ok());
  EXPECT_EQ(k.kernel().variant_id(), r->challenger);
  const std::string& measured_by = k.kernel().timing().measured_by();
  EXPECT_EQ(measured_by.rfind("retime: median of 16 paired ratios", 0), 0u) << measured_by;
  EXPECT_NE(measured_by.find("95% overall"), std::string::npos) << measured_by;
  EXPECT_EQ(k.kernel().timing().samples_us_size(), 0) << "served figures carry no samples";

  // From the store alone: the RETIME's evaluation holds both kernels'
  // samples, and the rule gives the same answer and the same description.
  absl::StatusOr<std::vector<EvaluationRecord>> evals = store_->ListEvaluations(r->challenger);
  ASSERT_TRUE(evals.ok()) << evals.status();
  const EvaluationRecord* retime = nullptr;
  for (const EvaluationRecord& e : *evals)
    if (e.task_id == r->retime.task_id()) retime = &e;
  ASSERT_NE(retime, nullptr);
  EXPECT_EQ(retime->timing.samples_us, cand);
  EXPECT_EQ(retime->incumbent_timing.samples_us, inc);
  const Comparison again = CompareTimings(retime->timing, retime->incumbent_timing);
  EXPECT_TRUE(again.paired);
  EXPECT_TRUE(again.candidate_wins) << again.Describe();
  EXPECT_EQ(MeasuredAgainst(again, r->incumbent), measured_by);
  absl::StatusOr<BestRecord> best =
      store_->GetBest(k.kernel().served_bucket(), k.kernel().arch());
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->measured_by, measured_by);
  EXPECT_EQ(best->evaluation_id, retime->id);
}

TEST_F(ServerTest, RetimePairsThatAgreeWithinTheMinimumGainKeepTheIncumbent) {
  std::optional<RetimeSetup> r = SetUpRetime();
  ASSERT_TRUE(r);
  std::vector<double> cand, inc;
  for (int i = 0; i < 24; ++i) {
    cand.push_back(99.6 + 0.01 * i);
    inc.push_back(cand.back() * 1.004);  // 0.4% faster, every pair
  }
  v1::ReportResultRequest req = Result(r->worker, r->retime, 95.0, 1.0, 100.0);
  SetSamples(req.mutable_result()->mutable_timing(), cand);
  SetSamples(req.mutable_result()->mutable_incumbent_timing(), inc);
  ASSERT_TRUE(Send(r->worker, req).ok());
  v1::GetKernelResponse k;
  ASSERT_TRUE(GetKernel(MakeShape(), &k).ok());
  EXPECT_EQ(k.kernel().variant_id(), r->incumbent);
}

TEST_F(ServerTest, MalformedTimingSamplesAreInvalidArgument) {
  std::optional<RetimeSetup> r = SetUpRetime();
  ASSERT_TRUE(r);
  v1::ReportResultRequest req = Result(r->worker, r->retime, 95.0, 1.0, 100.0);
  SetSamples(req.mutable_result()->mutable_timing(), {95, 96, 94});
  req.mutable_result()->mutable_timing()->set_samples(4);
  ExpectInvalid(Send(r->worker, req), "result.timing.samples");
  SetSamples(req.mutable_result()->mutable_timing(), {95, 96, 94});
  SetSamples(req.mutable_result()->mutable_incumbent_timing(), {100, 101, 99});
  req.mutable_result()->mutable_incumbent_timing()->set_samples_us(1, -1);
  ExpectInvalid(Send(r->worker, req), "result.incumbent_timing.samples_us");
  // Samples on one side only, or sides that do not pair up, would let the
  // reporter pick the weaker spread rule.
  SetSamples(req.mutable_result()->mutable_incumbent_timing(), {100, 101, 99});
  SetSamples(req.mutable_result()->mutable_timing(), {95, 96, 94, 95});
  ExpectInvalid(Send(r->worker, req), "result.incumbent_timing.samples_us");
  req.mutable_result()->mutable_incumbent_timing()->clear_samples_us();
  req.mutable_result()->mutable_incumbent_timing()->set_samples(0);
  SetSamples(req.mutable_result()->mutable_timing(), {95, 96, 94});
  ExpectInvalid(Send(r->worker, req), "result.incumbent_timing.samples_us");
}

// A compile error's message leads with the error lines of the log, which
// ptxas's resource report would otherwise push past the clip.
TEST_F(ServerTest, CompileErrorMessageLeadsWithTheErrors) {
  Start({}, 1);
  SubmitJob(1);
  const std::string w = RegisterWorker();
  auto t = Lease(w);
  ASSERT_TRUE(t);
  v1::ReportResultRequest req;
  req.set_worker_id(w);
  req.set_task_id(t->task_id());
  auto* r = req.mutable_result();
  r->set_outcome(v1::EVAL_OUTCOME_COMPILE_ERROR);
  std::string log;
  for (int i = 0; i < 200; ++i) log += "ptxas info    : Used 128 registers, 0 bytes smem\n";
  log += "candidate.cu(12): error: identifier \"x\" is undefined\n";
  r->mutable_compile()->set_log(log);
  v1::ReportResultResponse resp;
  ASSERT_TRUE(workers_->ReportResult(WCtx(w).get(), req, &resp).ok());
  auto evals = store_->ListEvaluations(t->variant().variant_id());
  ASSERT_TRUE(evals.ok()) << evals.status();
  ASSERT_EQ(evals->size(), 1u);
  EXPECT_TRUE(evals->at(0).message.starts_with("candidate.cu(12): error: identifier"))
      << evals->at(0).message.substr(0, 200);
}

// A job shape given as exact offsets reaches the workers with them (every
// task of its bucket, also after a restart), so candidates are timed on that
// batch rather than on a draw from its statistics.
TEST_F(ServerTest, ExactOffsetsOfAJobShapeReachTheTasks) {
  Start({}, 2);
  v1::Shape shape = MakeShape(0, 0, 0);
  for (int cu : {0, 700, 700, 1724, 2000}) shape.add_cu_seqlens_q(cu);
  v1::Job job = SubmitJob(3, shape);
  ASSERT_FALSE(job.id().empty());
  const std::string w = RegisterWorker();
  auto t1 = Lease(w);
  ASSERT_TRUE(t1);
  EXPECT_EQ(std::vector<int>(t1->shape().cu_seqlens_q().begin(), t1->shape().cu_seqlens_q().end()),
            (std::vector<int>{0, 700, 700, 1724, 2000}));
  EXPECT_EQ(t1->shape().batch(), 4);
  EXPECT_EQ(t1->shape().max_len_q(), 1024);
  EXPECT_EQ(t1->shape().total_q(), 2000);
  ASSERT_TRUE(Report(w, *t1, 100.0));

  // After a restart the job's remaining tasks still carry them.
  server_.reset();
  Start({}, 2);
  const std::string w2 = RegisterWorker();
  auto t2 = Lease(w2);
  ASSERT_TRUE(t2);
  EXPECT_EQ(t2->shape().cu_seqlens_q_size(), 5);
}

// Backward shapes are accepted exactly when the catalog serves backward
// (main() sets the limit from CatalogServesBackward, true since bwd_mma).
TEST_F(ServerTest, BackwardShapesNeedABackwardTemplate) {
  v1::Shape bwd = MakeShape();
  bwd.set_op(v1::OP_BACKWARD);
  v1::SubmitJobRequest req;
  req.set_name("bwd");
  *req.add_shapes() = bwd;
  {
    Start({}, 1);
    v1::Job job;
    grpc::Status s = kernels_->SubmitJob(Ctx(kClient).get(), req, &job);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("OP_BACKWARD"), std::string::npos) << s.error_message();
    server_.reset();
  }
  ServerOptions o;
  o.api.limits.backward = true;
  Start(o, 1);
  v1::Job job;
  grpc::Status s = kernels_->SubmitJob(Ctx(kClient).get(), req, &job);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

// Proposes one candidate whose manifest is not deterministic, then one whose
// manifest is, then nothing.
class MixedDeterminismProposer final : public agent::Proposer {
 public:
  absl::StatusOr<std::vector<agent::Candidate>> Propose(const agent::ProposalContext& ctx,
                                                         int n) override {
    std::vector<agent::Candidate> out;
    for (; n > 0 && next_ < 2; --n, ++next_) {
      agent::Candidate c;
      c.source = fmt::format("// {} candidate for {}\nextern \"C\" __global__ void kf_attn_bwd() {{}}\n",
                             next_ == 0 ? "atomic" : "ordered", ctx.bucket.Id());
      c.manifest_json = next_ == 0 ? kManifest : kDetManifest;
      c.origin = "template";
      c.template_name = "scripted";
      c.knobs_json = "{}";
      out.push_back(std::move(c));
    }
    return out;
  }
  void Observe(const agent::Feedback& f) override {
    if (f.outcome == Outcome::kCompileError) refusals.push_back(f.message);
  }
  void Remember(const agent::Candidate&) override { ++next_; }
  std::string Name() const override { return "builtin"; }

  static constexpr char kDetManifest[] =
      R"({"entry_point":"kf_attn_bwd","threads":384,"tile_m":64,"tile_n":128,"archs":["sm_90a"],"head_dims":[128],"ops":["bwd"],"deterministic":true})";
  static inline std::vector<std::string> refusals;

 private:
  int next_ = 0;
};

// A deterministic backward shape is a bucket of its own (".det"): its job
// evaluates only the candidate whose manifest says deterministic (the other
// is refused before any worker sees it, and the proposer is told why), that
// one is confirmed and served to deterministic requests, and a request that
// did not ask is not served it.
TEST_F(ServerTest, ADeterministicBucketEvaluatesAndServesOnlyDeterministicVariants) {
  ServerOptions o;
  o.api.limits.backward = true;
  MixedDeterminismProposer::refusals.clear();
  Start(o, 0, [](const std::string&, uint64_t) -> absl::StatusOr<std::unique_ptr<agent::Proposer>> {
    return std::make_unique<MixedDeterminismProposer>();
  });
  v1::Shape det = MakeShape();
  det.set_op(v1::OP_BACKWARD);
  det.set_deterministic(true);
  v1::Job job = SubmitJob(4, det);
  const std::string worker = RegisterWorker();
  auto task = Lease(worker);
  ASSERT_TRUE(task);
  EXPECT_TRUE(task->shape().deterministic());
  EXPECT_NE(task->variant().manifest_json().find("\"deterministic\":true"), std::string::npos);
  ASSERT_TRUE(ReportAndConfirm(worker, *task, 100.0));
  EXPECT_FALSE(Lease(worker, 100)) << "the refused candidate is never evaluated";
  ASSERT_EQ(MixedDeterminismProposer::refusals.size(), 1u);
  EXPECT_NE(MixedDeterminismProposer::refusals[0].find("deterministic"), std::string::npos);
  WaitForState(job.id(), v1::JOB_STATE_SUCCEEDED);

  v1::GetKernelResponse served;
  ASSERT_TRUE(GetKernel(det, &served).ok());
  EXPECT_TRUE(served.kernel().tuned());
  EXPECT_EQ(served.kernel().variant_id(), task->variant().variant_id());
  v1::Shape plain = det;
  plain.set_deterministic(false);
  ASSERT_TRUE(GetKernel(plain, &served).ok());
  EXPECT_FALSE(served.kernel().tuned());
  EXPECT_NE(served.kernel().variant_id(), task->variant().variant_id());
  // The forward is always deterministic: asking for it is a mistake.
  v1::Shape fwd = MakeShape();
  fwd.set_deterministic(true);
  grpc::Status s = GetKernel(fwd, &served);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("shape.deterministic"), std::string::npos) << s.error_message();
}

TEST_F(ServerTest, RejectsQuartilesOutsideTheRange) {
  Start({}, 1);
  SubmitJob(1);
  const std::string w = RegisterWorker();
  auto t = Lease(w);
  ASSERT_TRUE(t);
  v1::ReportResultRequest req;
  req.set_worker_id(w);
  req.set_task_id(t->task_id());
  auto* r = req.mutable_result();
  r->set_outcome(v1::EVAL_OUTCOME_VERIFIED);
  r->mutable_timing()->set_median_us(100);
  r->mutable_timing()->set_min_us(90);
  r->mutable_timing()->set_max_us(120);
  r->mutable_timing()->set_p25_us(110);  // above the median
  r->mutable_timing()->set_p75_us(115);
  r->mutable_timing()->set_samples(5);
  v1::ReportResultResponse resp;
  grpc::Status s = workers_->ReportResult(WCtx(w).get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("p25_us"), std::string::npos) << s.error_message();
}

TEST_F(ServerTest, NearestTunedBucketServesAnUntunedOne) {
  Start({}, 1);
  SubmitJob(1);
  const std::string w = RegisterWorker();
  auto t = Lease(w);
  ASSERT_TRUE(t);
  // Verified up to 64 sequences of 1024 (the nearest-bucket request below).
  v1::ReportResultRequest evaluate = Result(w, *t, 50.0);
  v1::SizeExtent* e = evaluate.mutable_result()->mutable_verified();
  e->set_batch(64);
  e->set_max_len_q(1024);
  e->set_max_len_k(1024);
  e->set_total_q(64 * 1024);
  e->set_total_k(64 * 1024);
  ASSERT_TRUE(Send(w, evaluate).ok());
  auto confirm = Lease(w);
  ASSERT_TRUE(confirm);
  v1::ReportResultRequest confirmed = Result(w, *confirm, 50.0);
  *confirmed.mutable_result()->mutable_verified() = *e;
  ASSERT_TRUE(Send(w, confirmed).ok());
  v1::GetKernelResponse k;
  ASSERT_TRUE(GetKernel(MakeShape(64, 1024, 64 * 1000), &k).ok());
  EXPECT_FALSE(k.kernel().tuned());
  EXPECT_EQ(k.kernel().variant_id(), t->variant().variant_id());
  EXPECT_EQ(k.kernel().served_bucket(),
            "fwd.bf16.d128.h8.kv8.causal.self.sm_90a.b4.mq1024.aq1024.mk1024.ak1024");
  EXPECT_NE(k.kernel().requested_bucket(), k.kernel().served_bucket());
  // A different head layout is a different class: the seed serves it.
  v1::Shape other = MakeShape();
  other.set_heads(16);
  ASSERT_TRUE(GetKernel(other, &k).ok());
  EXPECT_EQ(k.kernel().served_bucket(), "");
  // Nearest-bucket serving stops where the winner was verified: 65
  // sequences were never checked.
  ASSERT_TRUE(GetKernel(MakeShape(65, 1024, 65 * 1000), &k).ok());
  EXPECT_EQ(k.kernel().served_bucket(), "") << "served past its verified batch";
  EXPECT_EQ(k.kernel().cubin(), "CUBIN-sm_90a");
}

TEST_F(ServerTest, ExpiredLeaseGoesBackToTheQueue) {
  ServerOptions o;
  o.api.lease_ttl_ms = 300;
  o.api.heartbeat_interval_ms = 100;
  Start(o, 1);
  SubmitJob(1);
  const std::string a = RegisterWorker("a");
  const std::string b = RegisterWorker("b");
  auto t = Lease(a);
  ASSERT_TRUE(t);
  EXPECT_FALSE(Lease(b, 50)) << "leased tasks are not handed out twice";
  // a stops heartbeating; after the TTL the reaper requeues the task.
  auto again = Lease(b, 3000);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->task_id(), t->task_id());
  // The expired lease's result is refused: the task is b's now.
  EXPECT_EQ(Send(a, Result(a, *t, 10.0)).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(Report(b, *again, 10.0));
}

TEST_F(ServerTest, ATaskThatNeverGetsAResultIsGivenUp) {
  ServerOptions o;
  o.api.lease_ttl_ms = 100;
  o.api.heartbeat_interval_ms = 50;
  o.api.max_task_attempts = 2;
  Start(o, 1);
  const v1::Job job = SubmitJob(1);
  const std::string a = RegisterWorker("a");
  // Two leases expire without a report; the third lease attempt records the
  // task as crashed instead of handing it out again.
  for (int i = 0; i < 2; ++i) {
    auto t = Lease(a, 3000);
    ASSERT_TRUE(t) << "lease " << i;
  }
  EXPECT_FALSE(Lease(a, 1500)) << "the task was handed out a third time";
  // The job ends, but a job whose every result is a crash did not succeed:
  // the workers that never answered are the likely cause, and it says so.
  const v1::Job done = WaitForState(job.id(), v1::JOB_STATE_FAILED);
  ASSERT_EQ(done.state(), v1::JOB_STATE_FAILED) << done.DebugString();
  EXPECT_NE(done.message().find("every one of its 1 result(s) was a crash (1 given up"),
            std::string::npos)
      << done.message();
  ASSERT_EQ(done.progress_size(), 1);
  EXPECT_EQ(done.progress(0).evaluated(), 1);
  EXPECT_EQ(done.progress(0).failed(), 1);
}

// On an injected clock: 800 ms pass, well past the 300 ms TTL, in no real time.
TEST_F(ServerTest, HeartbeatKeepsALeaseAlive) {
  auto now = std::make_shared<std::atomic<int64_t>>(1'700'000'000'000);
  ServerOptions o;
  o.api.clock = [now] { return now->load(); };
  o.api.lease_ttl_ms = 300;
  o.api.heartbeat_interval_ms = 100;
  Start(o, 1);
  SubmitJob(1);
  const std::string a = RegisterWorker("a");
  auto t = Lease(a);
  ASSERT_TRUE(t);
  for (int i = 0; i < 8; ++i) {
    v1::HeartbeatRequest h;
    h.set_worker_id(a);
    h.add_task_ids(t->task_id());
    v1::HeartbeatResponse hr;
    ASSERT_TRUE(workers_->Heartbeat(WCtx(a).get(), h, &hr).ok());
    EXPECT_EQ(hr.cancelled_task_ids_size(), 0);
    *now += 100;
  }
  EXPECT_TRUE(Report(a, *t, 10.0));
}

TEST_F(ServerTest, CancelJobCancelsTasksAndEndsWatchers) {
  Start({}, 4);
  const v1::Job job = SubmitJob(4);
  const std::string w = RegisterWorker();
  auto t = Lease(w);
  ASSERT_TRUE(t);
  grpc::Status watch_status;
  v1::JobEvent last;
  std::thread watcher([&] {
    v1::WatchJobRequest req;
    req.set_job_id(job.id());
    auto ctx = Ctx(kClient, 30);
    auto reader = kernels_->WatchJob(ctx.get(), req);
    v1::JobEvent ev;
    while (reader->Read(&ev)) last = ev;
    watch_status = reader->Finish();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  v1::CancelJobRequest c;
  c.set_job_id(job.id());
  v1::Job cancelled;
  ASSERT_TRUE(kernels_->CancelJob(Ctx(kClient).get(), c, &cancelled).ok());
  EXPECT_EQ(cancelled.state(), v1::JOB_STATE_CANCELLED);
  watcher.join();
  EXPECT_TRUE(watch_status.ok()) << watch_status.error_message();
  EXPECT_EQ(last.job().state(), v1::JOB_STATE_CANCELLED);

  v1::HeartbeatRequest h;
  h.set_worker_id(w);
  h.add_task_ids(t->task_id());
  v1::HeartbeatResponse hr;
  ASSERT_TRUE(workers_->Heartbeat(WCtx(w).get(), h, &hr).ok());
  ASSERT_EQ(hr.cancelled_task_ids_size(), 1);
  EXPECT_EQ(hr.cancelled_task_ids(0), t->task_id());
  EXPECT_FALSE(Lease(w, 100)) << "no task of a cancelled job is handed out";
  // Cancelling again returns the final job unchanged.
  ASSERT_TRUE(kernels_->CancelJob(Ctx(kClient).get(), c, &cancelled).ok());
  EXPECT_EQ(cancelled.state(), v1::JOB_STATE_CANCELLED);

  v1::ListJobsRequest lj;
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(kernels_->ListJobs(Ctx(kClient).get(), lj, &jobs).ok());
  ASSERT_EQ(jobs.jobs_size(), 1);
  EXPECT_EQ(jobs.jobs(0).id(), job.id());
}

TEST_F(ServerTest, HealthTurnsNotServingAndWatchersEndOnShutdown) {
  ServerOptions o;
  o.shutdown_grace_ms = 1500;
  Start(o, 2);
  const v1::Job job = SubmitJob(2);
  grpc::Status watch_status;
  std::thread watcher([&] {
    v1::WatchJobRequest req;
    req.set_job_id(job.id());
    auto ctx = Ctx(kClient, 30);
    auto reader = kernels_->WatchJob(ctx.get(), req);
    v1::JobEvent ev;
    while (reader->Read(&ev)) {
    }
    watch_status = reader->Finish();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::thread stopper([&] { server_->Shutdown(); });
  auto health = grpc::health::v1::Health::NewStub(channel_);
  bool saw_not_serving = false;
  for (int i = 0; i < 100 && !saw_not_serving; ++i) {
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    if (health->Check(Ctx("", 1).get(), req, &resp).ok() &&
        resp.status() == grpc::health::v1::HealthCheckResponse::NOT_SERVING)
      saw_not_serving = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(saw_not_serving);
  stopper.join();
  watcher.join();
  EXPECT_EQ(watch_status.error_code(), grpc::StatusCode::UNAVAILABLE) << watch_status.error_message();
}

// ------------------------------------------------- worker results are claims

// The evaluations and the cubin a variant's reports left in the store.
struct Stored {
  size_t evaluations = 0;
  bool cubin = false;
};

class ClaimsTest : public ServerTest {
 protected:
  Stored StoredFor(const v1::Task& task) {
    Stored st;
    auto evals = store_->ListEvaluations(task.variant().variant_id());
    EXPECT_TRUE(evals.ok()) << evals.status();
    if (evals.ok()) st.evaluations = evals->size();
    st.cubin = store_->GetCubin(Sha256Hex("CUBIN-of-" + task.variant().variant_id())).ok();
    return st;
  }
  std::vector<EvaluationRecord> Evaluations(const std::string& variant) {
    auto evals = store_->ListEvaluations(variant);
    EXPECT_TRUE(evals.ok()) << evals.status();
    return evals.ok() ? *evals : std::vector<EvaluationRecord>{};
  }
  static ShapeKey KeyOf(const v1::Shape& s) {
    ShapeKey k;
    k.head_dim = s.head_dim();
    k.heads = s.heads();
    k.kv_heads = s.kv_heads() == 0 ? s.heads() : s.kv_heads();
    k.causal = s.causal();
    k.arch = s.arch();
    k.batch = s.batch();
    k.max_len_q = s.max_len_q();
    k.total_q = s.total_q();
    return k;
  }
  bool Tuned(const v1::Shape& shape, std::string* variant = nullptr) {
    v1::GetKernelResponse k;
    grpc::Status s = GetKernel(shape, &k);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (variant) *variant = k.kernel().variant_id();
    return k.kernel().tuned();
  }
  // An injected clock: leases end when a test says so.
  std::shared_ptr<std::atomic<int64_t>> clock_ =
      std::make_shared<std::atomic<int64_t>>(1'700'000'000'000);
  ServerOptions WithClock() {
    ServerOptions o;
    auto clock = clock_;
    o.api.clock = [clock] { return clock->load(); };
    return o;
  }
};

TEST_F(ClaimsTest, AReportForATaskLeasedToAnotherWorkerIsRefusedAndStoresNothing) {
  Start({}, 1);
  SubmitJob(1);
  const std::string a = RegisterWorker("a");
  const std::string b = RegisterWorker("b");
  auto t = Lease(a);
  ASSERT_TRUE(t);
  grpc::Status s = Send(b, Result(b, *t, 50.0));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_message().find("leased to worker " + a), std::string::npos) << s.error_message();
  EXPECT_EQ(StoredFor(*t).evaluations, 0u);
  EXPECT_FALSE(StoredFor(*t).cubin) << "the cubin was stored before the lease was checked";
  EXPECT_TRUE(Report(a, *t, 50.0)) << "the holder still can";
}

TEST_F(ClaimsTest, ARequestUnderAnotherWorkersIdIsRefused) {
  Start({}, 1);
  SubmitJob(1);
  const std::string a = RegisterWorker("a");
  const std::string b = RegisterWorker("b");
  auto t = Lease(a);
  ASSERT_TRUE(t);
  // b's session, a's id: the session decides who calls.
  v1::ReportResultRequest forged = Result(a, *t, 50.0);
  grpc::Status s = Send(b, forged);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_message().find("acts only as itself"), std::string::npos) << s.error_message();
  EXPECT_EQ(StoredFor(*t).evaluations, 0u);
  EXPECT_FALSE(StoredFor(*t).cubin);
  v1::LeaseTaskRequest l;
  l.set_worker_id(a);
  v1::LeaseTaskResponse lr;
  EXPECT_EQ(workers_->LeaseTask(WCtx(b).get(), l, &lr).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::HeartbeatRequest h;
  h.set_worker_id(a);
  h.add_task_ids(t->task_id());
  v1::HeartbeatResponse hr;
  EXPECT_EQ(workers_->Heartbeat(WCtx(b).get(), h, &hr).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Without a declared id the call is the session's worker's.
  forged.clear_worker_id();
  EXPECT_EQ(Send(b, forged).error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << "b holds no lease on the task";
  forged.set_worker_id("");
  EXPECT_TRUE(Send(a, forged).ok());
}

TEST_F(ClaimsTest, CallsWithoutASessionAreUnauthenticated) {
  Start({}, 1);
  SubmitJob(1);
  const std::string a = RegisterWorker("a");
  auto t = Lease(a);
  ASSERT_TRUE(t);
  v1::ReportResultRequest req = Result(a, *t, 50.0);
  v1::ReportResultResponse resp;
  grpc::Status s = workers_->ReportResult(Ctx(kWorker).get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(s.error_message().find("x-kforge-session"), std::string::npos) << s.error_message();
  v1::LeaseTaskRequest l;
  l.set_worker_id(a);
  v1::LeaseTaskResponse lr;
  EXPECT_EQ(workers_->LeaseTask(Ctx(kWorker).get(), l, &lr).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  v1::HeartbeatRequest h;
  h.set_worker_id(a);
  v1::HeartbeatResponse hr;
  EXPECT_EQ(workers_->Heartbeat(Ctx(kWorker).get(), h, &hr).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(StoredFor(*t).evaluations, 0u);
  EXPECT_FALSE(StoredFor(*t).cubin);
}

TEST_F(ClaimsTest, AForgedOrStaleSessionIsUnauthenticated) {
  Start({}, 1);
  SubmitJob(1);
  const std::string a = RegisterWorker("a");
  auto t = Lease(a);
  ASSERT_TRUE(t);
  const std::string real = sessions_[a];
  for (std::string forged : {std::string("kfs_") + std::string(64, '0'), real.substr(0, 67) + "x",
                             real + "0", std::string("Bearer ") + kWorker, std::string(kWorker)}) {
    sessions_[a] = forged;
    grpc::Status s = Send(a, Result(a, *t, 50.0));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << forged;
    EXPECT_NE(s.error_message().find("not a session this server issued"), std::string::npos)
        << s.error_message();
  }
  EXPECT_EQ(StoredFor(*t).evaluations, 0u);
  // Stale: a session of a database the server no longer has.
  server_.reset();
  store_.reset();
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db_.string() + suffix);
  Start({}, 1);
  sessions_[a] = real;
  v1::LeaseTaskRequest l;
  v1::LeaseTaskResponse lr;
  grpc::Status stale = workers_->LeaseTask(WCtx(a).get(), l, &lr);
  EXPECT_EQ(stale.error_code(), grpc::StatusCode::UNAUTHENTICATED) << stale.error_message();
}

TEST_F(ClaimsTest, AReportAfterTheLeaseEndedIsRefusedAndStoresNothing) {
  ServerOptions o = WithClock();
  o.reaper_interval_ms = 3600 * 1000;  // the lease ends, nobody requeues it yet
  Start(o, 1);
  SubmitJob(1);
  const std::string a = RegisterWorker("a");
  auto t = Lease(a);
  ASSERT_TRUE(t);
  *clock_ += o.api.lease_ttl_ms + 1;
  grpc::Status s = Send(a, Result(a, *t, 50.0));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("live lease"), std::string::npos) << s.error_message();
  EXPECT_EQ(StoredFor(*t).evaluations, 0u);
  EXPECT_FALSE(StoredFor(*t).cubin);
}

TEST_F(ClaimsTest, ListWorkersSaysWhoIsConnected) {
  ServerOptions o = WithClock();
  Start(o, 1);
  v1::ListWorkersRequest req;
  v1::ListWorkersResponse resp;
  ASSERT_TRUE(kernels_->ListWorkers(Ctx(kClient).get(), req, &resp).ok());
  EXPECT_EQ(resp.workers_size(), 0);
  EXPECT_EQ(kernels_->ListWorkers(Ctx(kWorker).get(), req, &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  const std::string a = RegisterWorker("a", {"memcheck", "racecheck"});
  *clock_ += o.api.lease_ttl_ms / 2;
  const std::string b = RegisterWorker("b", {});
  *clock_ += o.api.lease_ttl_ms / 2 + 1;  // a silent past the TTL, b not
  resp.Clear();
  grpc::Status s = kernels_->ListWorkers(Ctx(kClient).get(), req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp.workers_size(), 2);
  const v1::Worker& wa = resp.workers(0);
  const v1::Worker& wb = resp.workers(1);
  EXPECT_EQ(wa.id(), a);
  EXPECT_EQ(wa.name(), "a");
  EXPECT_EQ(wa.arch(), "sm_90a");
  EXPECT_FALSE(wa.compile_only());
  EXPECT_EQ(wa.gpu().name(), "Fake H200");
  EXPECT_EQ(wa.gpu().nvrtc_version(), "13.0");
  EXPECT_FALSE(wa.principal().empty()) << "bound from the worker token";
  EXPECT_EQ(std::vector<std::string>(wa.sanitizer_tools().begin(), wa.sanitizer_tools().end()),
            (std::vector<std::string>{"memcheck", "racecheck"}));
  EXPECT_EQ(wa.state(), v1::WORKER_STATE_DISCONNECTED);
  EXPECT_EQ(wa.last_seen_unix_ms(), 1'700'000'000'000);
  EXPECT_EQ(wa.last_seen(), "2023-11-14T22:13:20.000Z");
  EXPECT_EQ(wb.id(), b);
  EXPECT_EQ(wb.state(), v1::WORKER_STATE_CONNECTED);
  EXPECT_TRUE(wb.sanitizer_tools().empty());
  // A heartbeat is a call: a comes back.
  v1::HeartbeatRequest hb;
  v1::HeartbeatResponse hr;
  ASSERT_TRUE(workers_->Heartbeat(WCtx(a).get(), hb, &hr).ok());
  resp.Clear();
  ASSERT_TRUE(kernels_->ListWorkers(Ctx(kClient).get(), req, &resp).ok());
  EXPECT_EQ(resp.workers(0).state(), v1::WORKER_STATE_CONNECTED);
}

TEST_F(ClaimsTest, AWorkerSilentPastTheLeaseTtlIsLoggedAsLeftAndItsNextCallAsBack) {
  // The ring buffer sink reads back under its own lock: the reaper logs on
  // its thread while the test reads.
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", sink));
  auto text_of = [&] {
    std::string all;
    for (const std::string& line : sink->last_formatted()) all += line;
    return all;
  };
  struct Restore {
    std::shared_ptr<spdlog::logger> logger;
    ~Restore() { spdlog::set_default_logger(logger); }
  } restore{previous};
  ServerOptions o = WithClock();
  Start(o, 1);
  const std::string w = RegisterWorker("leaver");
  auto logged = [&](const std::string& text) {
    for (int i = 0; i < 100; ++i) {
      if (text_of().find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  };
  EXPECT_TRUE(logged(fmt::format("leaver joined as {}", w))) << text_of();
  *clock_ += o.api.lease_ttl_ms + 1000;
  EXPECT_TRUE(logged(fmt::format("worker {} (leaver, sm_90a) left: no call for 61 s", w)))
      << text_of();
  v1::HeartbeatRequest hb;
  v1::HeartbeatResponse hr;
  ASSERT_TRUE(workers_->Heartbeat(WCtx(w).get(), hb, &hr).ok());
  EXPECT_TRUE(logged(fmt::format("worker {} (leaver) is back", w))) << text_of();
  const std::string text = text_of();
  EXPECT_EQ(text.find("left"), text.rfind("left")) << "logged once";
}

TEST_F(ClaimsTest, TimingsBelowThePhysicalFloorAreRefused) {
  Start({}, 1);
  SubmitJob(1);
  const std::string a = RegisterWorker("a");
  auto t = Lease(a);
  ASSERT_TRUE(t);
  const TimingFloor floor = FloorOf(KeyOf(MakeShape()), "sm_90a");
  ASSERT_GT(floor.us, 1.0);
  for (double us : {1e-6, floor.us * 0.99}) {
    grpc::Status s = Send(a, Result(a, *t, us, us / 10));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << us;
    EXPECT_NE(s.error_message().find("result.timing.median_us"), std::string::npos);
    EXPECT_NE(s.error_message().find(fmt::format("floor of this shape, {:.2f} us", floor.us)),
              std::string::npos)
        << s.error_message();
  }
  // The GPU a worker names does not move its floor: its registered arch does.
  v1::ReportResultRequest b200 = Result(a, *t, floor.us * 0.99, 0.01);
  b200.mutable_result()->mutable_gpu()->set_name("NVIDIA B200");
  b200.mutable_result()->mutable_gpu()->set_arch("sm_100a");
  EXPECT_EQ(Send(a, b200).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(StoredFor(*t).evaluations, 0u);
  EXPECT_TRUE(Report(a, *t, floor.us * 1.01, 0.01)) << "at the floor's edge a time is possible";
}

TEST_F(ClaimsTest, AnIncumbentTimingBelowTheFloorIsRefused) {
  std::optional<RetimeSetup> r = SetUpRetime();
  ASSERT_TRUE(r);
  const TimingFloor floor = FloorOf(KeyOf(MakeShape()), "sm_90a");
  for (double us : {1e-6, floor.us * 0.99}) {
    grpc::Status s = Send(r->worker, Result(r->worker, r->retime, 95.0, us / 100, us));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << us;
    EXPECT_NE(s.error_message().find("result.incumbent_timing.median_us"), std::string::npos)
        << s.error_message();
  }
  EXPECT_EQ(Evaluations(r->challenger).size(), 1u) << "only its EVALUATE";
}

// The served cubin is the one the promoting worker compiled and gated. An
// EVALUATE that reported other bytes for the same source, NVRTC and
// options means one of the two lied: nothing is promoted.
TEST_F(ClaimsTest, ACubinSwappedBetweenEvaluateAndConfirmIsNotPromoted) {
  Start({}, 2);
  const std::string a = RegisterWorker("a");
  auto with_toolchain = [](v1::ReportResultRequest r, const std::string& cubin,
                           const std::string& nvrtc, const std::string& options) {
    r.mutable_result()->mutable_gpu()->set_nvrtc_version(nvrtc);
    r.mutable_result()->mutable_compile()->set_options(options);
    r.mutable_result()->mutable_compile()->set_cubin(cubin);
    return r;
  };
  // The same claims, then a toolchain claimed to differ: the worker
  // registered one NVRTC, so its reports cannot dodge the comparison.
  for (const auto& [nvrtc, options] :
       std::vector<std::pair<std::string, std::string>>{{"13.0", "-arch=sm_90a -DBLOCK_M=128"},
                                                        {"12.8", "-arch=sm_90a -w"}}) {
    const v1::Job job = SubmitJob(1);
    auto t = Lease(a);
    ASSERT_TRUE(t);
    ASSERT_TRUE(Send(a, with_toolchain(Result(a, *t, 100.0), "honest cubin", "13.0",
                                       "-arch=sm_90a -DBLOCK_M=128"))
                    .ok());
    auto confirm = Lease(a);
    ASSERT_TRUE(confirm && confirm->kind() == v1::TASK_KIND_CONFIRM);
    ASSERT_TRUE(
        Send(a, with_toolchain(Result(a, *confirm, 100.0), "swapped " + nvrtc, nvrtc, options))
            .ok());
    EXPECT_FALSE(Tuned(MakeShape())) << nvrtc;
    std::vector<EvaluationRecord> evals = Evaluations(t->variant().variant_id());
    ASSERT_EQ(evals.size(), 2u);
    EXPECT_NE(
        evals[1].message.find("cubin differs from worker " + a + "'s compile of the same source"),
        std::string::npos)
        << evals[1].message;
    EXPECT_EQ(WaitForState(job.id(), v1::JOB_STATE_SUCCEEDED).state(), v1::JOB_STATE_SUCCEEDED);
  }
}

// Workers on different NVRTC versions compile different bytes honestly:
// the promoting report's own cubin is served.
TEST_F(ClaimsTest, CubinsOfWorkersOnDifferentNvrtcVersionsNeedNotMatch) {
  Start({}, 1);
  SubmitJob(1);
  const std::string a = RegisterWorker("a", {"memcheck"}, "", "13.0");
  const std::string b = RegisterWorker("b", {"memcheck"}, "", "13.1");
  auto t = Lease(a);
  ASSERT_TRUE(t);
  ASSERT_TRUE(Report(a, *t, 100.0));
  auto confirm = Lease(b);
  ASSERT_TRUE(confirm && confirm->kind() == v1::TASK_KIND_CONFIRM);
  v1::ReportResultRequest r = Result(b, *confirm, 100.0);
  r.mutable_result()->mutable_compile()->set_cubin("b's cubin");
  ASSERT_TRUE(Send(b, r).ok());
  v1::GetKernelResponse k;
  ASSERT_TRUE(GetKernel(MakeShape(), &k).ok());
  EXPECT_TRUE(k.kernel().tuned());
  EXPECT_EQ(k.kernel().cubin(), "b's cubin");
}

TEST_F(ClaimsTest, AnUngatedWorkersConfirmIsRecordedNotPromoted) {
  Start({}, 1);
  const v1::Job job = SubmitJob(1);
  const std::string a = RegisterWorker("a", /*tools=*/{});
  auto t = Lease(a);
  ASSERT_TRUE(t);
  ASSERT_TRUE(ReportAndConfirm(a, *t, 100.0));
  EXPECT_FALSE(Tuned(MakeShape()));
  std::vector<EvaluationRecord> evals = Evaluations(t->variant().variant_id());
  ASSERT_EQ(evals.size(), 2u);
  EXPECT_EQ(evals[1].outcome, Outcome::kVerified);
  EXPECT_NE(evals[1].message.find("not promoted: worker " + a +
                                  " registered without the memcheck sanitizer gate"),
            std::string::npos)
      << evals[1].message;
  EXPECT_EQ(WaitForState(job.id(), v1::JOB_STATE_SUCCEEDED).state(), v1::JOB_STATE_SUCCEEDED);
  // racecheck alone is no memcheck gate either.
  const std::string b = RegisterWorker("b", {"racecheck"});
  EXPECT_FALSE(sessions_[b].empty());
}

TEST_F(ClaimsTest, UngatedPromotionIsAConfigChoice) {
  ServerOptions o;
  o.api.allow_ungated_promotion = true;
  Start(o, 1);
  SubmitJob(1);
  const std::string a = RegisterWorker("a", /*tools=*/{});
  auto t = Lease(a);
  ASSERT_TRUE(t);
  ASSERT_TRUE(ReportAndConfirm(a, *t, 100.0));
  EXPECT_TRUE(Tuned(MakeShape()));
}

TEST_F(ClaimsTest, AConfirmGoesToAnotherWorkerWhileOneIsConnectedAndToTheSameOneAlone) {
  ServerOptions o = WithClock();
  o.worker_tokens = kHostTokens;
  Start(o, 2);
  SubmitJob(1);
  const std::string a = RegisterWith(kHostAToken, "a");
  const std::string b = RegisterWith(kHostBToken, "b");
  auto t = Lease(a);
  ASSERT_TRUE(t);
  ASSERT_TRUE(Report(a, *t, 100.0));
  EXPECT_FALSE(Lease(a, 300)) << "a was given the CONFIRM of its own candidate";
  auto confirm = Lease(b);
  ASSERT_TRUE(confirm);
  EXPECT_EQ(confirm->kind(), v1::TASK_KIND_CONFIRM);
  ASSERT_TRUE(Report(b, *confirm, 100.0));
  EXPECT_TRUE(Tuned(MakeShape()));

  // b goes quiet for longer than a lease: a is alone and confirms its own.
  SubmitJob(1, MakeShape(3, 1000, 3000));
  auto t2 = Lease(a);
  ASSERT_TRUE(t2);
  ASSERT_TRUE(Report(a, *t2, 50.0));  // faster: a RETIME follows
  *clock_ += o.api.lease_ttl_ms + 1;
  auto retime = Lease(a);
  ASSERT_TRUE(retime) << "a single worker must still promote";
  EXPECT_EQ(retime->kind(), v1::TASK_KIND_RETIME);
}

TEST_F(ClaimsTest, AStrictConfirmationWaitsForAnotherWorker) {
  ServerOptions o;
  o.api.require_distinct_confirmer = true;
  o.worker_tokens = kHostTokens;
  Start(o, 1);
  SubmitJob(1);
  const std::string a = RegisterWith(kHostAToken, "a");
  auto t = Lease(a);
  ASSERT_TRUE(t);
  ASSERT_TRUE(Report(a, *t, 100.0));
  EXPECT_FALSE(Lease(a, 300));
  const std::string b = RegisterWith(kHostBToken, "b");
  auto confirm = Lease(b);
  ASSERT_TRUE(confirm);
  EXPECT_EQ(confirm->kind(), v1::TASK_KIND_CONFIRM);
}

// "Another worker" is another principal. A holder of one worker token can
// register twice and get two worker ids and sessions, but both are the
// token's principal: the second cannot confirm the first one's forged
// result. The worker of another token can.
TEST_F(ClaimsTest, ASecondRegistrationOfOneTokenCannotConfirmTheFirstsCandidate) {
  ServerOptions o;
  o.api.confirm_on_another_worker = true;
  o.api.require_distinct_confirmer = true;
  o.worker_tokens = kHostTokens;
  Start(o, 1);
  const v1::Job job = SubmitJob(1);
  const std::string a = RegisterWith(kHostAToken, "a");
  const std::string a2 = RegisterWith(kHostAToken, "a-again");
  ASSERT_NE(a, a2) << "two registrations are two workers";
  auto t = Lease(a);
  ASSERT_TRUE(t);
  ASSERT_TRUE(Report(a, *t, 100.0));
  EXPECT_FALSE(Lease(a2, 300)) << "host-a's second worker was given host-a's CONFIRM";
  EXPECT_FALSE(Lease(a, 300));
  EXPECT_FALSE(Tuned(MakeShape()));

  const std::string b = RegisterWith(kHostBToken, "b");
  auto confirm = Lease(b);
  ASSERT_TRUE(confirm);
  EXPECT_EQ(confirm->kind(), v1::TASK_KIND_CONFIRM);
  ASSERT_TRUE(Report(b, *confirm, 100.0));
  EXPECT_TRUE(Tuned(MakeShape()));
  EXPECT_EQ(WaitForState(job.id(), v1::JOB_STATE_SUCCEEDED).state(), v1::JOB_STATE_SUCCEEDED);

  // The principal is bound from the token, stored with the worker.
  auto workers = store_->ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  std::map<std::string, std::string> principal;
  for (const WorkerRecord& w : *workers) principal[w.id] = w.principal;
  EXPECT_EQ(principal[a], "host-a");
  EXPECT_EQ(principal[a2], "host-a");
  EXPECT_EQ(principal[b], "host-b");
}

// With one shared token every worker is one principal: strictly, nothing is
// ever confirmed; otherwise confirmation falls back to any worker (as
// before principals), the candidate's own included.
TEST_F(ClaimsTest, WithOneSharedTokenEveryWorkerIsOnePrincipal) {
  {
    ServerOptions o;
    o.api.require_distinct_confirmer = true;
    Start(o, 1);
    SubmitJob(1);
    const std::string a = RegisterWorker("a");
    const std::string b = RegisterWorker("b");
    auto t = Lease(a);
    ASSERT_TRUE(t);
    ASSERT_TRUE(Report(a, *t, 100.0));
    EXPECT_FALSE(Lease(b, 300)) << "b shares a's token: not another worker";
    EXPECT_FALSE(Lease(a, 300));
    auto workers = store_->ListWorkers();
    ASSERT_TRUE(workers.ok()) << workers.status();
    ASSERT_EQ(workers->size(), 2u);
    for (const WorkerRecord& w : *workers) EXPECT_EQ(w.principal, DerivedPrincipal(kWorker));
    EXPECT_EQ(DerivedPrincipal(kWorker).rfind("token-", 0), 0u);
    EXPECT_EQ(DerivedPrincipal(kWorker).find(kWorker), std::string::npos);
  }
  server_.reset();
  store_.reset();
  sessions_.clear();
  tokens_.clear();
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db_.string() + suffix);
  Start({}, 1);
  SubmitJob(1);
  const std::string a = RegisterWorker("a");
  const std::string b = RegisterWorker("b");
  auto t = Lease(a);
  ASSERT_TRUE(t);
  ASSERT_TRUE(Report(a, *t, 100.0));
  auto confirm = Lease(a);
  ASSERT_TRUE(confirm) << "without another principal the candidate's own worker may confirm";
  EXPECT_EQ(confirm->kind(), v1::TASK_KIND_CONFIRM);
  (void)b;
}

// A session is good only with the token it was issued under: another
// principal's token with it is refused, and registering again with it
// under another token makes a new worker (no id, lease or identity moves).
TEST_F(ClaimsTest, ASessionIsBoundToTheTokenItWasIssuedUnder) {
  ServerOptions o;
  o.worker_tokens = kHostTokens;
  Start(o, 1);
  SubmitJob(1);
  const std::string a = RegisterWith(kHostAToken, "a");
  auto t = Lease(a);
  ASSERT_TRUE(t);
  tokens_[a] = kHostBToken;
  v1::HeartbeatRequest h;
  v1::HeartbeatResponse hr;
  grpc::Status s = workers_->Heartbeat(WCtx(a).get(), h, &hr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_message().find("host-a"), std::string::npos) << s.error_message();
  EXPECT_EQ(s.error_message().find(kHostBToken), std::string::npos) << "no token in messages";
  EXPECT_EQ(Send(a, Result(a, *t, 100.0)).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  const std::string b = RegisterWorker("a", {"memcheck"}, sessions_[a], "13.0", kHostBToken);
  EXPECT_NE(b, a) << "host-b's token resumed host-a's worker";
  tokens_[a] = kHostAToken;
  EXPECT_TRUE(workers_->Heartbeat(WCtx(a).get(), h, &hr).ok());
  const std::string again = RegisterWorker("a", {"memcheck"}, sessions_[a], "13.0", kHostAToken);
  EXPECT_EQ(again, a) << "the same token resumes its session";
}

// Workers stored before principals (schema v4) have none; the first
// authenticated call binds the credential's, and from then on it counts.
TEST_F(ClaimsTest, AWorkerStoredWithoutAPrincipalIsBoundAtItsNextCall) {
  auto store = OpenSqliteStore(db_.string());
  ASSERT_TRUE(store.ok()) << store.status();
  store_ = *std::move(store);
  const std::string session = "kfs_" + std::string(64, '7');
  WorkerRecord old;
  old.name = "old";
  old.arch = "sm_90a";
  old.session_hash = Sha256Hex(session);
  old.sanitizer_tools = {"memcheck"};
  auto id = store_->UpsertWorker(old);
  ASSERT_TRUE(id.ok()) << id.status();
  ServerOptions o;
  o.worker_tokens = kHostTokens;
  Start(o, 1);
  sessions_[*id] = session;
  tokens_[*id] = kHostAToken;
  v1::HeartbeatRequest h;
  v1::HeartbeatResponse hr;
  grpc::Status s = workers_->Heartbeat(WCtx(*id).get(), h, &hr);
  ASSERT_TRUE(s.ok()) << s.error_message();
  auto workers = store_->ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].principal, "host-a");
  EXPECT_EQ((*workers)[0].session_hash, old.session_hash);
  tokens_[*id] = kHostBToken;
  EXPECT_EQ(workers_->Heartbeat(WCtx(*id).get(), h, &hr).error_code(),
            grpc::StatusCode::PERMISSION_DENIED)
      << "bound now: another token cannot take it over";
}

// An ungated worker cannot promote: it does not count as the other worker
// that keeps a candidate from its own producer, and it is given no
// promotion task while a worker that can promote is connected.
TEST_F(ClaimsTest, AnUngatedWorkerNeitherConfirmsNorTakesPromotionsFromAGatedOne) {
  Start({}, 1);
  SubmitJob(1);
  const std::string a = RegisterWorker("a");
  const std::string ungated = RegisterWorker("ungated", /*tools=*/{});
  auto t = Lease(a);
  ASSERT_TRUE(t);
  ASSERT_TRUE(Report(a, *t, 100.0));
  EXPECT_FALSE(Lease(ungated, 300)) << "the CONFIRM went to a worker that cannot promote it";
  auto confirm = Lease(a);
  ASSERT_TRUE(confirm && confirm->kind() == v1::TASK_KIND_CONFIRM);
  ASSERT_TRUE(Report(a, *confirm, 100.0));
  EXPECT_TRUE(Tuned(MakeShape()));
}

TEST_F(ClaimsTest, ABestIsNotServedPastItsVerifiedExtent) {
  Start({}, 1);
  SubmitJob(1);
  const std::string a = RegisterWorker("a");
  auto t = Lease(a);
  ASSERT_TRUE(t);
  // Verified at most 4 sequences of up to 1024, 3000 tokens in all: less
  // than its bucket (b4.aq1024: up to 4096 tokens) holds.
  auto verified = [](v1::ReportResultRequest r) {
    v1::SizeExtent* e = r.mutable_result()->mutable_verified();
    e->set_batch(4);
    e->set_max_len_q(1024);
    e->set_max_len_k(1024);
    e->set_total_q(3000);
    e->set_total_k(3000);
    return r;
  };
  ASSERT_TRUE(Send(a, verified(Result(a, *t, 100.0))).ok());
  auto confirm = Lease(a);
  ASSERT_TRUE(confirm);
  ASSERT_TRUE(Send(a, verified(Result(a, *confirm, 100.0))).ok());
  std::string served;
  EXPECT_TRUE(Tuned(MakeShape(4, 1024, 3000), &served));
  EXPECT_EQ(served, t->variant().variant_id());
  EXPECT_FALSE(Tuned(MakeShape(4, 1024, 4000), &served)) << "served past its verified total";
  EXPECT_NE(served, t->variant().variant_id()) << "the seed serves it";
  EXPECT_EQ(served.rfind("s-", 0), 0u) << "seeds have content ids: " << served;
  EXPECT_FALSE(Tuned(MakeShape(3, 1024, 3001), &served));
  auto best = store_->GetBest(BucketOf(KeyOf(MakeShape())).Id(), "sm_90a");
  ASSERT_TRUE(best.ok());
  EXPECT_EQ(best->verified.total_q, 3000);
  // After a restart the extent still holds.
  server_.reset();
  Start({}, 1);
  EXPECT_TRUE(Tuned(MakeShape(4, 1024, 3000)));
  EXPECT_FALSE(Tuned(MakeShape(4, 1024, 4000)));
}

TEST_F(ClaimsTest, AWorkersSessionSurvivesAServerRestart) {
  Start({}, 2);
  SubmitJob(2);
  const std::string a = RegisterWorker("a");
  const std::string session = sessions_[a];
  auto t = Lease(a);
  ASSERT_TRUE(t);
  server_.reset();
  Start({}, 2);
  // The same session goes on where it was: its lease is still its own.
  EXPECT_TRUE(Report(a, *t, 100.0));
  // Registering again with the session keeps the id.
  EXPECT_EQ(RegisterWorker("a", {"memcheck"}, session), a);
  EXPECT_EQ(sessions_[a], session);
  // The same name without the session is another worker: no id, no lease.
  auto next = Lease(a);
  ASSERT_TRUE(next);
  const std::string impostor = RegisterWorker("a");
  EXPECT_NE(impostor, a);
  EXPECT_EQ(Send(impostor, Result(impostor, *next, 100.0)).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(Report(a, *next, 100.0));
}

TEST_F(ClaimsTest, SecretsInAReportedLogAreRedactedBeforeTheyAreStored) {
  Start({}, 1);
  SubmitJob(1);
  const std::string a = RegisterWorker("a");
  auto t = Lease(a);
  ASSERT_TRUE(t);
  const std::string session = sessions_[a];
  v1::ReportResultRequest req = Result(a, *t, 0, 1, 0, v1::EVAL_OUTCOME_COMPILE_ERROR);
  req.mutable_result()->set_message(fmt::format("NVRTC failed; session {}", session));
  // An environment block read as text: NUL-separated assignments.
  const std::string nul(1, '\0');
  req.mutable_result()->mutable_compile()->set_log(
      fmt::format("/proc/self/environ(1): error: KFORGE_WORKER_TOKEN={}", kWorker) + nul +
      fmt::format("KFORGE_CLIENT_TOKEN={}", kClient) + nul + "HOME=/root" + nul +
      fmt::format(" authorization: Bearer {} and plain {} and {}\n", kWorker, kClient, kWorker));
  req.mutable_result()->mutable_gpu()->set_name(std::string("H200 ") + kClient);
  req.mutable_result()->mutable_compile()->set_options(std::string("-DX=") + kWorker);
  ASSERT_TRUE(Send(a, req).ok());
  std::vector<EvaluationRecord> evals = Evaluations(t->variant().variant_id());
  ASSERT_EQ(evals.size(), 1u);
  for (const std::string& text :
       {evals[0].message, evals[0].gpu_name, evals[0].compile_options}) {
    for (const std::string secret : {std::string(kWorker), std::string(kClient), session}) {
      EXPECT_EQ(text.find(secret), std::string::npos) << secret << " in: " << text;
    }
  }
  EXPECT_NE(evals[0].message.find("[redacted]"), std::string::npos) << evals[0].message;
  EXPECT_NE(evals[0].message.find("/proc/self/environ(1): error:"), std::string::npos)
      << evals[0].message;
}

// Bytes changed in the database after they were checked in are not served:
// the cache re-checks a cubin against its hash when it loads it.
TEST_F(ClaimsTest, ACubinThatNoLongerMatchesItsHashIsNotServed) {
  Start({}, 1);
  SubmitJob(1);
  const std::string a = RegisterWorker("a");
  auto t = Lease(a);
  ASSERT_TRUE(t);
  ASSERT_TRUE(ReportAndConfirm(a, *t, 100.0));
  EXPECT_TRUE(Tuned(MakeShape()));
  server_.reset();
  store_.reset();
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(db_.string().c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "UPDATE cubins SET bytes = CAST('tampered' AS BLOB)", nullptr,
                           nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  Start({}, 1);
  v1::GetKernelResponse k;
  ASSERT_TRUE(GetKernel(MakeShape(), &k).ok());
  EXPECT_FALSE(k.kernel().tuned());
  EXPECT_NE(k.kernel().cubin(), "tampered");
}

// ------------------------------------------------ compile archs, waiting

TEST_F(ServerTest, AWorkerTakesCompileTasksOfItsCompileArchsAfterItsOwnArchsTasks) {
  Start({}, 2);
  v1::SubmitJobRequest compile_job;
  compile_job.set_name("b200");
  compile_job.set_compile_only(true);
  v1::Shape b200 = MakeShape();
  b200.set_arch("sm_100a");
  *compile_job.add_shapes() = b200;
  compile_job.mutable_budget()->set_max_variants(2);
  v1::Job cj;
  ASSERT_TRUE(kernels_->SubmitJob(Ctx(kClient).get(), compile_job, &cj).ok());
  // Nobody compiles for sm_100a yet: the job says so.
  v1::Job got;
  for (int i = 0; i < 100 && got.waiting_for().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    got = GetJob(cj.id());
  }
  EXPECT_EQ(got.waiting_for(), "waiting for a worker of arch sm_100a");
  const v1::Job gpu_job = SubmitJob(2);  // sm_90a, after the compile job

  // A worker of its own arch only takes none of the sm_100a tasks.
  const std::string plain = RegisterWorker("plain");
  for (int i = 0; i < 2; ++i) {
    auto t = Lease(plain, 100);
    ASSERT_TRUE(t);
    EXPECT_EQ(t->kind(), v1::TASK_KIND_EVALUATE);
  }
  EXPECT_FALSE(Lease(plain, 100)) << "sm_100a compile tasks are not for an sm_90a-only worker";

  v1::RegisterRequest req;
  req.set_worker_name("multi");
  req.mutable_gpu()->set_arch("sm_90a");
  req.set_compile_only(true);
  req.add_compile_archs("sm_100a");
  req.add_compile_archs("sm_90a");   // its own: dropped
  req.add_compile_archs("sm_100a");  // twice: once
  v1::RegisterResponse resp;
  ASSERT_TRUE(workers_->Register(Ctx(kWorker).get(), req, &resp).ok());
  sessions_[resp.worker_id()] = resp.session_token();
  const std::string multi = resp.worker_id();
  for (int i = 0; i < 2; ++i) {
    auto t = Lease(multi, 100);
    ASSERT_TRUE(t);
    EXPECT_EQ(t->kind(), v1::TASK_KIND_COMPILE);
    EXPECT_EQ(t->shape().arch(), "sm_100a");
    EXPECT_EQ(t->job_id(), cj.id());
    ASSERT_TRUE(Report(multi, *t, 0, 1, 0, v1::EVAL_OUTCOME_COMPILED));
  }
  v1::Job done = WaitForState(cj.id(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.progress(0).compiled(), 2);
  EXPECT_EQ(done.waiting_for(), "");

  v1::ListWorkersResponse listed;
  ASSERT_TRUE(kernels_->ListWorkers(Ctx(kClient).get(), v1::ListWorkersRequest(), &listed).ok());
  ASSERT_EQ(listed.workers_size(), 2);
  EXPECT_TRUE(listed.workers(0).compile_archs().empty());
  EXPECT_EQ(std::vector<std::string>(listed.workers(1).compile_archs().begin(),
                                     listed.workers(1).compile_archs().end()),
            std::vector<std::string>{"sm_100a"});
  EXPECT_EQ(GetJob(gpu_job.id()).waiting_for(), "") << "a GPU worker of sm_90a is connected";
}

TEST_F(ServerTest, RegisterRefusesACompileArchThatIsNoArchName) {
  Start();
  v1::RegisterRequest req;
  req.set_worker_name("bad");
  req.mutable_gpu()->set_arch("sm_90a");
  req.add_compile_archs("sm_100a");
  req.add_compile_archs("compute_90");
  v1::RegisterResponse resp;
  grpc::Status s = workers_->Register(Ctx(kWorker).get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("compile_archs[1]: ", 0), 0u) << s.error_message();
}

TEST_F(ServerTest, HeartbeatsReportTheGpuUsageWorkersListShow) {
  Start();
  const std::string w = RegisterWorker();
  v1::HeartbeatRequest hb;
  v1::HeartbeatResponse hr;
  hb.mutable_gpu_usage()->set_utilization(1.5);
  grpc::Status s = workers_->Heartbeat(WCtx(w).get(), hb, &hr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "gpu_usage.utilization: 1.5 is not a fraction from 0 to 1");
  hb.mutable_gpu_usage()->set_utilization(0.25);
  hb.mutable_gpu_usage()->set_memory_used_bytes(9);
  hb.mutable_gpu_usage()->set_memory_total_bytes(8);
  s = workers_->Heartbeat(WCtx(w).get(), hb, &hr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("gpu_usage.memory_used_bytes"), std::string::npos);
  v1::ListWorkersResponse listed;
  ASSERT_TRUE(kernels_->ListWorkers(Ctx(kClient).get(), v1::ListWorkersRequest(), &listed).ok());
  EXPECT_FALSE(listed.workers(0).has_gpu_usage()) << "none reported yet";
  hb.mutable_gpu_usage()->set_memory_used_bytes(4);
  ASSERT_TRUE(workers_->Heartbeat(WCtx(w).get(), hb, &hr).ok());
  ASSERT_TRUE(kernels_->ListWorkers(Ctx(kClient).get(), v1::ListWorkersRequest(), &listed).ok());
  ASSERT_TRUE(listed.workers(0).has_gpu_usage());
  EXPECT_DOUBLE_EQ(listed.workers(0).gpu_usage().utilization(), 0.25);
  EXPECT_EQ(listed.workers(0).gpu_usage().memory_used_bytes(), 4);
  EXPECT_EQ(listed.workers(0).gpu_usage().memory_total_bytes(), 8);
  EXPECT_FALSE(listed.workers(0).gpu_usage_at().empty());
}

TEST_F(ServerTest, MetricsCountEveryRpcByMethodAndCodeAndEveryAcceptedReport) {
  ServerMetrics metrics;
  ServerOptions o;
  o.metrics = &metrics;
  Start(o, 1);
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(kernels_->ListJobs(Ctx(kClient).get(), v1::ListJobsRequest(), &jobs).ok());
  EXPECT_FALSE(kernels_->ListJobs(Ctx("").get(), v1::ListJobsRequest(), &jobs).ok());
  v1::GetJobRequest missing;
  missing.set_job_id("j999");
  v1::Job job;
  EXPECT_FALSE(kernels_->GetJob(Ctx(kClient).get(), missing, &job).ok());
  v1::GetKernelResponse k;
  ASSERT_TRUE(GetKernel(MakeShape(), &k).ok());  // the raw callback method
  SubmitJob(1);
  const std::string w = RegisterWorker();
  auto t = Lease(w);
  ASSERT_TRUE(t);
  v1::ReportResultRequest r = Result(w, *t, 100.0);
  r.mutable_result()->mutable_compile()->set_compile_ms(1500);
  ASSERT_TRUE(Send(w, r).ok());

  MetricsSnapshot m = metrics.Snapshot();
  auto count = [&](const std::string& method, const std::string& code) -> uint64_t {
    auto it = m.rpcs.find(RpcKey{method, code});
    return it == m.rpcs.end() ? 0 : it->second.count;
  };
  EXPECT_EQ(count("kforge.v1.KernelService/ListJobs", "OK"), 1u);
  EXPECT_EQ(count("kforge.v1.KernelService/ListJobs", "UNAUTHENTICATED"), 1u);
  EXPECT_EQ(count("kforge.v1.KernelService/GetJob", "NOT_FOUND"), 1u);
  EXPECT_EQ(count("kforge.v1.KernelService/GetKernel", "OK"), 1u);
  EXPECT_EQ(count("kforge.v1.WorkerService/Register", "OK"), 1u);
  EXPECT_EQ(count("kforge.v1.WorkerService/ReportResult", "OK"), 1u);
  EXPECT_EQ((m.evaluations[EvaluationKey{TaskKind::kEvaluate, Outcome::kVerified}]), 1u);
  EXPECT_EQ(m.compile_seconds.count, 1u);
  EXPECT_DOUBLE_EQ(m.compile_seconds.sum, 1.5);
  EXPECT_EQ(m.verified_last_minute, 1);
}

}  // namespace
}  // namespace kforge::server
