// The only translation unit of kforge_server that includes gRPC headers:
// they are heavy to compile, and keeping them here keeps the transport in
// one place.
#include "server/server.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/support/server_interceptor.h>
#include <spdlog/spdlog.h>

#include "core/status.h"
#include "core/transport.h"
#include "kforge/v1/kforge.grpc.pb.h"
#include "server/convert.h"
#include "server/auth.h"

namespace kforge::server {
namespace {

// The one place absl::Status becomes grpc::Status. The codes are the same
// numbers by design (both follow google.rpc.Code). A message is text of a
// bounded size whatever produced it: the checks quote little of what they
// refuse (core/status.h Excerpt), and this is the backstop.
constexpr size_t kMaxStatusMessageBytes = 4096;

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  std::string message(s.message());
  if (message.size() > kMaxStatusMessageBytes || !IsValidUtf8(message))
    message = Excerpt(message, kMaxStatusMessageBytes);
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::move(message));
}

std::optional<std::string_view> Metadata(const grpc::ServerContextBase* ctx,
                                         std::string_view key) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(grpc::string_ref(key.data(), key.size()));
  if (it == md.end()) return std::nullopt;
  return std::string_view(it->second.data(), it->second.size());
}

std::optional<std::string_view> AuthHeader(const grpc::ServerContextBase* ctx) {
  return Metadata(ctx, "authorization");
}

void ReleaseBytes(void* p) { delete static_cast<std::shared_ptr<const std::string>*>(p); }

// The largest request each call takes, checked before it is parsed (gRPC's
// own limit, ServerOptions::max_receive_message_bytes, is the largest of
// all: a result with its cubin). A request that names a few ids or a
// shape needs little; a job's shapes may carry exact offsets.
constexpr size_t kQueryBytes = 64 << 10;
constexpr size_t kShapeBytes = 4 << 20;   // GetKernel: a shape, perhaps with offsets
constexpr size_t kSubmitBytes = 8 << 20;  // SubmitJob: up to 256 shapes with offsets
constexpr size_t kHeartbeatBytes = 1 << 20;

// Threads for calls that may block (a seed kernel compiled by NVRTC takes
// seconds; any call touches the store): callback handlers must not block
// gRPC's own threads. A fixed number, so a flood of calls queues instead of
// making a thread each.
class CallPool {
 public:
  explicit CallPool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~CallPool() { Drain(); }
  void Post(std::function<void()> fn) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }
  // Runs what was posted, then ends the threads. Idempotent.
  void Drain() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  void Run() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and everything posted ran
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::vector<std::thread> threads_;
};

void SetResponse(const std::shared_ptr<const std::string>& bytes, grpc::ByteBuffer* resp) {
  grpc::Slice slice(const_cast<char*>(bytes->data()), bytes->size(), &ReleaseBytes,
                    new std::shared_ptr<const std::string>(bytes));
  *resp = grpc::ByteBuffer(&slice, 1);
}

// A request's wire bytes, parsed by ParseRequest: a malformed request is
// INVALID_ARGUMENT naming the field, where gRPC's parse says INTERNAL.
absl::Status ParseRaw(const grpc::ByteBuffer* raw, size_t max_bytes,
                      google::protobuf::Message* request) {
  grpc::Slice slice;
  if (!raw->DumpToSingleSlice(&slice).ok())
    return absl::InvalidArgumentError("request: unreadable");
  return ParseRequest(
      std::string_view(reinterpret_cast<const char*>(slice.begin()), slice.size()), max_bytes,
      request);
}

// One unary call from its wire bytes, on `pool`: `check` (authentication)
// first, then the parse, then `fn`, then the response serialized. `ctx`,
// `raw`, `out` and the reactor stay valid until Finish.
template <typename Req, typename Resp, typename Check, typename Fn>
grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw,
                                grpc::ByteBuffer* out, CallPool* pool, size_t max_bytes,
                                Check check, Fn fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  pool->Post([=] {
    Req req;
    Resp resp;
    absl::Status s = check();
    if (s.ok()) s = ParseRaw(raw, max_bytes, &req);
    if (s.ok()) s = fn(req, &resp);
    if (s.ok()) {
      auto bytes = std::make_shared<const std::string>(resp.SerializeAsString());
      SetResponse(bytes, out);
    }
    reactor->Finish(ToGrpcStatus(s));
  });
  return reactor;
}

// KernelService. GetKernel is the hot path: for a tuned bucket the
// pre-serialized response goes out as a slice that borrows the cached bytes
// (no copy, no serialization, no thread hand-off). The other unary methods
// are raw callback methods too, for ParseRequest's errors and limits, run
// on a fixed pool; the two streams stay synchronous.
using KernelServiceBase = v1::KernelService::WithRawCallbackMethod_GetKernel<
    v1::KernelService::WithRawCallbackMethod_ListShapes<
        v1::KernelService::WithRawCallbackMethod_ListVariants<
            v1::KernelService::WithRawCallbackMethod_SubmitJob<
                v1::KernelService::WithRawCallbackMethod_GetJob<
                    v1::KernelService::WithRawCallbackMethod_ListJobs<
                        v1::KernelService::WithRawCallbackMethod_CancelJob<
                            v1::KernelService::WithRawCallbackMethod_ListWorkers<
                                v1::KernelService::Service>>>>>>>>;

class KernelServiceImpl final : public KernelServiceBase {
 public:
  // `calls` must outlive this.
  KernelServiceImpl(KforgeApi* api, const Authenticator* auth, CallPool* calls)
      : api_(api), auth_(auth), calls_(calls), slow_(4) {}

  grpc::ServerUnaryReactor* GetKernel(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* req,
                                      grpc::ByteBuffer* resp) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    auto request = std::make_shared<v1::GetKernelRequest>();
    absl::Status s = auth_->Check(Role::kClient, AuthHeader(ctx));
    if (s.ok()) s = ParseRaw(req, kShapeBytes, request.get());
    if (!s.ok()) {
      reactor->Finish(ToGrpcStatus(s));
      return reactor;
    }
    if (auto bytes = api_->GetKernelCached(*request)) {
      SetResponse(bytes, resp);
      reactor->Finish(grpc::Status::OK);
      return reactor;
    }
    // ctx, resp and reactor stay valid until Finish.
    slow_.Post([this, request, resp, reactor] {
      auto out = api_->GetKernelBytes(*request);
      if (out.ok()) SetResponse(*out, resp);
      reactor->Finish(ToGrpcStatus(out.status()));
    });
    return reactor;
  }

  grpc::ServerUnaryReactor* ListShapes(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* req,
                                       grpc::ByteBuffer* resp) override {
    return Client<v1::ListShapesRequest, v1::ListShapesResponse>(
        ctx, req, resp, kQueryBytes,
        [this](const auto& r, auto* out) { return api_->ListShapes(r, out); });
  }
  grpc::ServerUnaryReactor* ListVariants(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* req,
                                         grpc::ByteBuffer* resp) override {
    return Client<v1::ListVariantsRequest, v1::ListVariantsResponse>(
        ctx, req, resp, kQueryBytes,
        [this](const auto& r, auto* out) { return api_->ListVariants(r, out); });
  }
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* req,
                                      grpc::ByteBuffer* resp) override {
    return Client<v1::SubmitJobRequest, v1::Job>(
        ctx, req, resp, kSubmitBytes,
        [this](const auto& r, auto* out) { return api_->SubmitJob(r, out); });
  }
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                   grpc::ByteBuffer* resp) override {
    return Client<v1::GetJobRequest, v1::Job>(
        ctx, req, resp, kQueryBytes,
        [this](const auto& r, auto* out) { return api_->GetJob(r, out); });
  }
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* req,
                                     grpc::ByteBuffer* resp) override {
    return Client<v1::ListJobsRequest, v1::ListJobsResponse>(
        ctx, req, resp, kQueryBytes,
        [this](const auto& r, auto* out) { return api_->ListJobs(r, out); });
  }
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* req,
                                      grpc::ByteBuffer* resp) override {
    return Client<v1::CancelJobRequest, v1::Job>(
        ctx, req, resp, kQueryBytes,
        [this](const auto& r, auto* out) { return api_->CancelJob(r, out); });
  }
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* req,
                                        grpc::ByteBuffer* resp) override {
    return Client<v1::ListWorkersRequest, v1::ListWorkersResponse>(
        ctx, req, resp, kQueryBytes,
        [this](const auto& r, auto* out) { return api_->ListWorkers(r, out); });
  }

  grpc::Status ExportKernels(grpc::ServerContext* ctx, const v1::ExportKernelsRequest* req,
                             grpc::ServerWriter<v1::ExportedKernel>* writer) override {
    return Run(ctx, [&] {
      return api_->ExportKernels(*req, [&](const v1::ExportedKernel& k) {
        return !ctx->IsCancelled() && writer->Write(k);
      });
    });
  }
  grpc::Status WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    return Run(ctx, [&] {
      return api_->WatchJob(
          *req, [&](const v1::JobEvent& ev) { return writer->Write(ev); },
          [&] { return ctx->IsCancelled(); });
    });
  }

 private:
  template <typename Req, typename Resp, typename Fn>
  grpc::ServerUnaryReactor* Client(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                   grpc::ByteBuffer* resp, size_t max_bytes, Fn fn) {
    return Unary<Req, Resp>(
        ctx, req, resp, calls_, max_bytes,
        [this, ctx] { return auth_->Check(Role::kClient, AuthHeader(ctx)); }, fn);
  }
  template <typename Fn>
  grpc::Status Run(grpc::ServerContext* ctx, Fn&& fn) {
    if (absl::Status s = auth_->Check(Role::kClient, AuthHeader(ctx)); !s.ok())
      return ToGrpcStatus(s);
    return ToGrpcStatus(fn());
  }
  KforgeApi* api_;             // must outlive this
  const Authenticator* auth_;  // must outlive this
  CallPool* calls_;            // must outlive this
  CallPool slow_;              // last: joined first, while api_ is still alive
};

// WorkerService: Register, Heartbeat and ReportResult from their wire bytes
// on the pool (a report's texts come from candidate code: a byte that is
// not UTF-8 must be an answer naming the field, not a lost report);
// LeaseTask, a long poll, stays synchronous.
using WorkerServiceBase = v1::WorkerService::WithRawCallbackMethod_Register<
    v1::WorkerService::WithRawCallbackMethod_Heartbeat<
        v1::WorkerService::WithRawCallbackMethod_ReportResult<v1::WorkerService::Service>>>;

class WorkerServiceImpl final : public WorkerServiceBase {
 public:
  // `calls` must outlive this.
  WorkerServiceImpl(KforgeApi* api, const Authenticator* auth, CallPool* calls,
                    size_t max_report_bytes)
      : api_(api), auth_(auth), calls_(calls), max_report_bytes_(max_report_bytes) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* req,
                                     grpc::ByteBuffer* resp) override {
    // The principal comes from the credential, never from the request.
    auto principal = std::make_shared<std::string>();
    return Unary<v1::RegisterRequest, v1::RegisterResponse>(
        ctx, req, resp, calls_, kQueryBytes,
        [this, ctx, principal]() -> absl::Status {
          absl::StatusOr<std::string> p = auth_->WorkerPrincipal(AuthHeader(ctx));
          if (!p.ok()) return p.status();
          *principal = *std::move(p);
          return absl::OkStatus();
        },
        [this, ctx, principal](const v1::RegisterRequest& r, v1::RegisterResponse* out) {
          return api_->Register(r, *principal, Metadata(ctx, kSessionMetadata), out);
        });
  }
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* req,
                                      grpc::ByteBuffer* resp) override {
    return AsWorker<v1::HeartbeatRequest, v1::HeartbeatResponse>(
        ctx, req, resp, kHeartbeatBytes,
        [this](const std::string& caller, const auto& r, auto* out) {
          return api_->Heartbeat(caller, r, out);
        });
  }
  grpc::ServerUnaryReactor* ReportResult(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* req,
                                         grpc::ByteBuffer* resp) override {
    return AsWorker<v1::ReportResultRequest, v1::ReportResultResponse>(
        ctx, req, resp, max_report_bytes_,
        [this](const std::string& caller, const auto& r, auto* out) {
          return api_->ReportResult(caller, r, out);
        });
  }
  grpc::Status LeaseTask(grpc::ServerContext* ctx, const v1::LeaseTaskRequest* req,
                         v1::LeaseTaskResponse* resp) override {
    absl::StatusOr<std::string> caller = Caller(ctx);
    if (!caller.ok()) return ToGrpcStatus(caller.status());
    return ToGrpcStatus(
        api_->LeaseTask(*caller, *req, resp, [&] { return ctx->IsCancelled(); }));
  }

 private:
  // The bearer token says the caller is a worker and whose credential it
  // holds; its session says which worker: the api acts as that worker, when
  // the session was issued under the same principal.
  absl::StatusOr<std::string> Caller(const grpc::ServerContextBase* ctx) {
    absl::StatusOr<std::string> principal = auth_->WorkerPrincipal(AuthHeader(ctx));
    if (!principal.ok()) return principal.status();
    return api_->WorkerForSession(Metadata(ctx, kSessionMetadata), *principal);
  }
  template <typename Req, typename Resp, typename Fn>
  grpc::ServerUnaryReactor* AsWorker(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* req, grpc::ByteBuffer* resp,
                                     size_t max_bytes, Fn fn) {
    auto caller = std::make_shared<std::string>();
    return Unary<Req, Resp>(
        ctx, req, resp, calls_, max_bytes,
        [this, ctx, caller]() -> absl::Status {
          absl::StatusOr<std::string> c = Caller(ctx);
          if (!c.ok()) return c.status();
          *caller = *std::move(c);
          return absl::OkStatus();
        },
        [fn, caller](const Req& r, Resp* out) { return fn(*caller, r, out); });
  }
  KforgeApi* api_;             // must outlive this
  const Authenticator* auth_;  // must outlive this
  CallPool* calls_;            // must outlive this
  size_t max_report_bytes_;
};

// Counts every call by method and final status, timed from when gRPC
// created the call to when it sends the status (a long poll or a watch
// stream counts its whole length).
class MetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  MetricsInterceptor(std::string method, ServerMetrics* metrics)
      : method_(std::move(method)), metrics_(metrics), start_(std::chrono::steady_clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start_;
      metrics_->RecordRpc(method_, methods->GetSendStatus().error_code(), took.count());
    }
    methods->Proceed();
  }

 private:
  std::string method_;
  ServerMetrics* metrics_;  // must outlive the call
  std::chrono::steady_clock::time_point start_;
};

class MetricsInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit MetricsInterceptorFactory(ServerMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new MetricsInterceptor(info->method() ? info->method() : "", metrics_);
  }

 private:
  ServerMetrics* metrics_;  // must outlive the server
};

}  // namespace

absl::Status CheckAuthConfig(const ServerOptions& o) {
  const bool tls = !o.tls_cert_pem.empty();
  if (o.tls_cert_pem.empty() != o.tls_key_pem.empty())
    return absl::InvalidArgumentError("TLS needs both a certificate and its key");
  if (!o.tls_client_ca_pem.empty() && !tls)
    return absl::InvalidArgumentError("a client CA (mTLS) needs TLS: give a certificate and key");
  if (o.insecure_no_auth) {
    // Without auth, whoever reaches the port owns the service: only this
    // host may, whatever else is configured.
    if (!IsLoopbackAddress(o.listen_address))
      return absl::FailedPreconditionError(fmt::format(
          "--insecure-no-auth listens on loopback addresses only (127.0.0.1, [::1], "
          "localhost), not {}: configure tokens to serve other hosts",
          o.listen_address));
    return absl::OkStatus();
  }
  if (absl::Status s = CheckPlaintext(o.listen_address, tls, o.allow_plaintext,
                                      "tls_cert_file and tls_key_file (--tls-cert, --tls-key)");
      !s.ok())
    return s;
  if (o.client_tokens.empty() || o.worker_tokens.empty())
    return absl::FailedPreconditionError(fmt::format(
        "no {} configured: set KFORGE_CLIENT_TOKEN/KFORGE_WORKER_TOKEN, "
        "--client-tokens-file/--worker-tokens-file, or client_tokens and worker_tokens in the "
        "config file; or pass --insecure-no-auth to run without authentication (local "
        "development only)",
        o.client_tokens.empty() && o.worker_tokens.empty() ? "client or worker tokens"
        : o.client_tokens.empty()                          ? "client tokens"
                                                           : "worker tokens"));
  for (size_t i = 0; i < o.client_tokens.size(); ++i)
    if (absl::Status s = CheckToken(o.client_tokens[i], fmt::format("client tokens[{}]", i));
        !s.ok())
      return s;
  absl::StatusOr<std::vector<WorkerCredential>> workers = ParseWorkerTokens(o.worker_tokens, "worker tokens");
  if (!workers.ok()) return workers.status();
  for (const auto& t : o.client_tokens)
    for (const auto& w : *workers)
      if (t == w.token)
        return absl::InvalidArgumentError(fmt::format(
            "a token is configured as both a client and a worker token (worker '{}'); use "
            "distinct tokens",
            w.principal));
  return absl::OkStatus();
}

namespace {

// TLS when a certificate is configured; with a client CA, every client must
// present a certificate it signed (the bearer tokens are still checked).
std::shared_ptr<grpc::ServerCredentials> Credentials(const ServerOptions& o) {
  if (o.tls_cert_pem.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(
      o.tls_client_ca_pem.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                  : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = o.tls_client_ca_pem;
  ssl.pem_key_cert_pairs.push_back({o.tls_key_pem, o.tls_cert_pem});
  return grpc::SslServerCredentials(ssl);
}

// Unparseable entries leave no credential; Start refuses them first
// (CheckAuthConfig).
std::vector<WorkerCredential> WorkerCredentialsOf(const ServerOptions& o) {
  absl::StatusOr<std::vector<WorkerCredential>> c = ParseWorkerTokens(o.worker_tokens);
  return c.ok() ? *std::move(c) : std::vector<WorkerCredential>{};
}

// What the configured worker credentials make of "another worker".
void LogPrincipals(const ServerOptions& o) {
  if (o.insecure_no_auth) {
    spdlog::info("workers have no principal without auth: another worker for confirmation is "
                 "another session");
    return;
  }
  const std::vector<WorkerCredential> creds = WorkerCredentialsOf(o);
  std::vector<std::string> names;
  for (const auto& c : creds) names.push_back(c.principal);
  spdlog::info("worker principals: {}", fmt::join(names, ", "));
  if (creds.size() == 1 && o.api.confirm_on_another_worker) {
    if (o.api.require_distinct_confirmer)
      spdlog::warn("one worker token: every worker is principal {}, and require_distinct_confirmer "
                   "never lets a principal confirm its own candidate, so nothing is promoted; "
                   "give each worker host its own token (worker_tokens \"name:token\")",
                   creds[0].principal);
    else
      spdlog::info("one worker token: every worker is principal {}, so CONFIRM/RETIME cannot go "
                   "to another worker and runs on any; give each worker host its own token "
                   "(worker_tokens \"name:token\") for confirmation on another worker",
                   creds[0].principal);
  }
}

}  // namespace

class Server::Impl {
 public:
  Impl(ServerOptions options, Store* store, ProposerFactory proposers, SeedProvider seeds)
      : options_(std::move(options)),
        cache_(store, std::move(seeds)),
        engine_(store, std::move(proposers), EngineOptions()),
        api_(store, &cache_, &engine_, ApiOptionsOf(options_)),
        auth_(options_.client_tokens, WorkerCredentialsOf(options_), options_.insecure_no_auth),
        calls_(kCallThreads),
        kernel_service_(&api_, &auth_, &calls_),
        worker_service_(&api_, &auth_, &calls_,
                        static_cast<size_t>(options_.max_receive_message_bytes)) {}

  // Reported texts are scrubbed of every token the server holds.
  static ApiOptions ApiOptionsOf(const ServerOptions& o) {
    ApiOptions api = o.api;
    api.secrets.insert(api.secrets.end(), o.client_tokens.begin(), o.client_tokens.end());
    for (const WorkerCredential& c : WorkerCredentialsOf(o)) api.secrets.push_back(c.token);
    api.metrics = o.metrics;
    return api;
  }

  JobEngineOptions EngineOptions() {
    JobEngineOptions o = options_.engine;
    auto user = o.on_tasks_enqueued;
    // The api is built after the engine; it is only called once both exist.
    o.on_tasks_enqueued = [this, user] {
      api_.NotifyTasks();
      if (user) user();
    };
    if (!o.worker_available)
      o.worker_available = [this](const WorkerNeed& need) { return api_.WorkerAvailable(need); };
    return o;
  }

  absl::Status Start() {
    if (absl::Status s = CheckAuthConfig(options_); !s.ok()) return s;
    LogPrincipals(options_);
    if (absl::Status s = cache_.LoadAll(); !s.ok()) return s;
    if (absl::Status s = api_.Init(); !s.ok()) return s;
    if (absl::Status s = engine_.Start(); !s.ok()) return s;
    // Leases that expired while the server was down go back to the queue
    // before any worker asks.
    (void)api_.RequeueExpired();

    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::ServerBuilder builder;
    builder.AddListeningPort(options_.listen_address, Credentials(options_), &port_);
    builder.RegisterService(&kernel_service_);
    builder.RegisterService(&worker_service_);
    builder.SetMaxReceiveMessageSize(options_.max_receive_message_bytes);
    if (options_.metrics) {
      std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> f;
      f.push_back(std::make_unique<MetricsInterceptorFactory>(options_.metrics));
      builder.experimental().SetInterceptorCreators(std::move(f));
    }
    server_ = builder.BuildAndStart();
    if (!server_ || port_ == 0)
      return absl::UnavailableError(
          fmt::format("cannot listen on {} (address in use or not valid)", options_.listen_address));
    auto* health = server_->GetHealthCheckService();
    health->SetServingStatus(true);
    health->SetServingStatus("kforge.v1.KernelService", true);
    health->SetServingStatus("kforge.v1.WorkerService", true);
    reaper_ = std::thread([this] { Reap(); });
    const size_t colon = options_.listen_address.rfind(':');
    address_ = fmt::format("{}:{}", options_.listen_address.substr(0, colon), port_);
    spdlog::info("kforge-server listening on {} ({} served kernels, auth {}, {})", address_,
                 cache_.size(), options_.insecure_no_auth ? "OFF" : "on",
                 options_.tls_cert_pem.empty()        ? "plaintext"
                 : options_.tls_client_ca_pem.empty() ? "TLS"
                                                      : "TLS with client certificates");
    return absl::OkStatus();
  }

  void Reap() {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      cv_.wait_for(lock, std::chrono::milliseconds(options_.reaper_interval_ms));
      if (stopping_) break;
      lock.unlock();
      if (auto n = api_.RequeueExpired(); !n.ok())
        spdlog::error("reaper: {}", std::string(n.status().message()));
      api_.NoteDepartures();
      lock.lock();
    }
  }

  void Shutdown() {
    {
      std::unique_lock lock(mu_);
      if (shutdown_started_) {
        // A second caller waits for the first to finish.
        done_cv_.wait(lock, [&] { return done_; });
        return;
      }
      shutdown_started_ = true;
    }
    spdlog::info("shutting down: health NOT_SERVING, draining calls");
    if (server_) {
      auto* health = server_->GetHealthCheckService();
      health->SetServingStatus(false);
      health->SetServingStatus("kforge.v1.KernelService", false);
      health->SetServingStatus("kforge.v1.WorkerService", false);
    }
    api_.BeginShutdown();
    if (options_.shutdown_grace_ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(options_.shutdown_grace_ms));
    if (server_)
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(options_.drain_timeout_ms));
    calls_.Drain();
    engine_.Stop();
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (reaper_.joinable()) reaper_.join();
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    done_cv_.notify_all();
    spdlog::info("shutdown complete");
  }

  void Wait() {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return done_; });
  }

  int port_ = 0;
  std::string address_;
  KforgeApi& api() { return api_; }
  JobEngine& engine() { return engine_; }

 private:
  ServerOptions options_;
  KernelCache cache_;
  JobEngine engine_;
  KforgeApi api_;
  Authenticator auth_;
  // Threads for the unary calls; drained in Shutdown while the gRPC server
  // still exists, so every call it runs finishes on a live server.
  static constexpr int kCallThreads = 16;
  CallPool calls_;
  KernelServiceImpl kernel_service_;
  WorkerServiceImpl worker_service_;
  std::unique_ptr<grpc::Server> server_;
  std::thread reaper_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable done_cv_;
  bool stopping_ = false;          // guarded by mu_
  bool shutdown_started_ = false;  // guarded by mu_
  bool done_ = false;              // guarded by mu_
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  if (impl_) impl_->Shutdown();
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(ServerOptions options, Store* store,
                                                      ProposerFactory proposers,
                                                      SeedProvider seeds) {
  auto impl = std::make_unique<Impl>(std::move(options), store, std::move(proposers),
                                     std::move(seeds));
  if (absl::Status s = impl->Start(); !s.ok()) return s;
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

int Server::port() const { return impl_->port_; }
std::string Server::address() const { return impl_->address_; }
void Server::Shutdown() { impl_->Shutdown(); }
void Server::Wait() { impl_->Wait(); }
KforgeApi& Server::api() { return impl_->api(); }
JobEngine& Server::engine() { return impl_->engine(); }

}  // namespace kforge::server
