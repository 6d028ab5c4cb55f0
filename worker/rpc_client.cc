// The protobuf adapter: the only file in worker/ that includes generated code.
#include "worker/rpc_client.h"

#include <grpcpp/grpcpp.h>

#include <mutex>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "core/status.h"
#include "kforge/v1/kforge.grpc.pb.h"
#include "kforge/v1/kforge.pb.h"

namespace kforge::worker {
namespace {

namespace pb = ::kforge::v1;

absl::Status FromGrpc(std::string_view call, const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  // grpc::StatusCode and absl::StatusCode share their numbering.
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      fmt::format("{}: {}", call, s.error_message()));
}

// ------------------------------------------------------------ to proto ---

void ToProto(const GpuDescription& g, pb::GpuInfo* out) {
  out->set_name(ValidUtf8(g.name));
  out->set_compute_capability(g.compute_capability);
  out->set_arch(g.arch);
  out->set_sm_count(g.sm_count);
  out->set_memory_bytes(g.memory_bytes);
  out->set_driver_version(ValidUtf8(g.driver_version));
  out->set_nvrtc_version(ValidUtf8(g.nvrtc_version));
}

pb::EvalOutcome ToProto(Outcome o) {
  switch (o) {
    case Outcome::kCompiled: return pb::EVAL_OUTCOME_COMPILED;
    case Outcome::kCompileError: return pb::EVAL_OUTCOME_COMPILE_ERROR;
    case Outcome::kWrong: return pb::EVAL_OUTCOME_WRONG;
    case Outcome::kCrashed: return pb::EVAL_OUTCOME_CRASHED;
    case Outcome::kTimeout: return pb::EVAL_OUTCOME_TIMEOUT;
    case Outcome::kVerified: return pb::EVAL_OUTCOME_VERIFIED;
  }
  return pb::EVAL_OUTCOME_UNSPECIFIED;
}

void ToProto(const Timing& t, pb::Timing* out) {
  out->set_median_us(t.median_us);
  out->set_min_us(t.min_us);
  out->set_max_us(t.max_us);
  out->set_samples(t.samples);
  out->set_p25_us(t.p25_us);
  out->set_p75_us(t.p75_us);
  for (double s : t.samples_us) out->add_samples_us(s);
}

void ToProto(const TaskResult& r, pb::EvalResult* out) {
  out->set_outcome(ToProto(r.outcome));
  pb::CompileReport* c = out->mutable_compile();
  c->set_compile_ms(r.compile.compile_ms);
  c->set_registers(r.compile.registers);
  c->set_spill_stores_bytes(r.compile.spill_stores_bytes);
  c->set_spill_loads_bytes(r.compile.spill_loads_bytes);
  c->set_static_smem_bytes(r.compile.static_smem_bytes);
  c->set_dynamic_smem_bytes(r.compile.dynamic_smem_bytes);
  c->set_local_bytes(r.compile.local_bytes);
  // Texts from NVRTC and candidate code may hold any bytes; the wire takes
  // UTF-8 only (a report the server cannot parse would be lost).
  c->set_log(ValidUtf8(r.compile.log));
  c->set_cubin(r.compile.cubin);
  c->set_options(ValidUtf8(r.compile.options));
  if (r.errors) {
    pb::ErrorMetrics* e = out->mutable_errors();
    e->set_max_abs_error(r.errors->max_abs_error);
    e->set_rel_l2_error(r.errors->rel_l2_error);
    e->set_worst_output(ValidUtf8(r.errors->worst_output));
    e->set_detail(ValidUtf8(r.errors->detail));
  }
  if (r.timing) ToProto(*r.timing, out->mutable_timing());
  if (r.incumbent_timing) ToProto(*r.incumbent_timing, out->mutable_incumbent_timing());
  if (r.incumbent_failed) out->set_incumbent_outcome(ToProto(*r.incumbent_failed));
  if (r.verified) {
    pb::SizeExtent* e = out->mutable_verified();
    e->set_batch(r.verified->batch);
    e->set_max_len_q(r.verified->max_len_q);
    e->set_max_len_k(r.verified->max_len_k);
    e->set_total_q(r.verified->total_q);
    e->set_total_k(r.verified->total_k);
  }
  ToProto(r.gpu, out->mutable_gpu());
  out->set_message(ValidUtf8(r.message));
  out->set_reference_version(ValidUtf8(r.reference_version));
}

// ---------------------------------------------------------- from proto ---

VariantSpec FromProto(const pb::VariantSource& v) {
  return VariantSpec{.variant_id = v.variant_id(),
                     .source = v.source(),
                     .manifest_json = v.manifest_json(),
                     .compile_options = v.compile_options()};
}

ShapeSpec FromProto(const pb::Shape& s) {
  ShapeSpec out;
  ShapeKey& k = out.key;
  k.op = s.op() == pb::OP_BACKWARD ? Op::kBackward : Op::kForward;
  k.dtype = DType::kBF16;
  k.head_dim = s.head_dim();
  k.heads = s.heads();
  k.kv_heads = s.kv_heads() == 0 ? s.heads() : s.kv_heads();
  k.causal = s.causal();
  k.cross = s.cross();
  k.arch = s.arch();
  k.deterministic = s.deterministic();
  k.batch = s.batch();
  k.max_len_q = s.max_len_q();
  k.total_q = s.total_q();
  k.max_len_k = s.cross() ? s.max_len_k() : s.max_len_q();
  k.total_k = s.cross() ? s.total_k() : s.total_q();
  out.cu_seqlens_q.assign(s.cu_seqlens_q().begin(), s.cu_seqlens_q().end());
  out.cu_seqlens_k.assign(s.cu_seqlens_k().begin(), s.cu_seqlens_k().end());
  return out;
}

absl::StatusOr<TaskSpec> FromProto(const pb::Task& t) {
  TaskSpec out;
  out.task_id = t.task_id();
  switch (t.kind()) {
    case pb::TASK_KIND_EVALUATE: out.kind = TaskKind::kEvaluate; break;
    case pb::TASK_KIND_RETIME: out.kind = TaskKind::kRetime; break;
    case pb::TASK_KIND_COMPILE: out.kind = TaskKind::kCompile; break;
    case pb::TASK_KIND_CONFIRM: out.kind = TaskKind::kConfirm; break;
    default:
      return absl::InvalidArgumentError(
          fmt::format("task {}: unknown kind {}", t.task_id(), static_cast<int>(t.kind())));
  }
  out.job_id = t.job_id();
  out.shape = FromProto(t.shape());
  out.variant = FromProto(t.variant());
  if (t.has_incumbent()) out.incumbent = FromProto(t.incumbent());
  out.lease_expires_unix_ms = t.lease_expires_unix_ms();
  out.seed = t.seed();
  return out;
}

// ------------------------------------------------------------- client ---

class GrpcServerClient final : public ServerClient {
 public:
  explicit GrpcServerClient(const GrpcClientOptions& options) : options_(options) {
    grpc::ChannelArguments args;
    const int backoff = static_cast<int>(options.max_reconnect_backoff.count());
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(200, backoff));
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, std::min(200, backoff));
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, backoff);
    // Results carry cubins; allow them (the default send limit is unlimited,
    // the receive limit 4 MB: tasks carry only sources).
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    if (!options.tls.ca.empty()) {
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = options.tls.ca;
      ssl.pem_cert_chain = options.tls.cert;
      ssl.pem_private_key = options.tls.key;
      creds = grpc::SslCredentials(ssl);
      if (!options.tls.server_name.empty())
        args.SetSslTargetNameOverride(options.tls.server_name);
    }
    channel_ = grpc::CreateCustomChannel(options.target, creds, args);
    stub_ = pb::WorkerService::NewStub(channel_);
  }

  ~GrpcServerClient() override { Shutdown(); }

  absl::StatusOr<Session> Register(const Registration& registration,
                                   const std::optional<Session>& previous) override {
    pb::RegisterRequest req;
    req.set_worker_name(ValidUtf8(registration.worker_name));
    ToProto(registration.gpu, req.mutable_gpu());
    req.set_compile_only(registration.compile_only);
    for (const std::string& tool : registration.sanitizer_tools) req.add_sanitizer_tools(tool);
    for (const std::string& arch : registration.compile_archs) req.add_compile_archs(arch);
    pb::RegisterResponse resp;
    // Register waits for the channel to (re)connect, up to its deadline,
    // instead of failing fast while the channel backs off: a restarted
    // server is found as soon as it listens again.
    absl::Status s = Call(
        "Register", options_.call_timeout, previous ? previous->session_token : std::string(),
        [&](grpc::ClientContext* ctx) { return stub_->Register(ctx, req, &resp); },
        /*wait_for_ready=*/true);
    if (!s.ok()) return s;
    if (resp.worker_id().empty()) return absl::InternalError("Register: server sent no worker id");
    if (resp.session_token().empty())
      return absl::InternalError("Register: server sent no session token");
    Session session;
    session.worker_id = resp.worker_id();
    session.session_token = resp.session_token();
    if (resp.heartbeat_interval_ms() > 0) session.heartbeat_interval_ms = resp.heartbeat_interval_ms();
    if (resp.lease_ttl_ms() > 0) session.lease_ttl_ms = resp.lease_ttl_ms();
    return session;
  }

  absl::StatusOr<std::vector<std::string>> Heartbeat(
      const Session& session, const std::vector<std::string>& task_ids,
      const std::optional<gpu::GpuUsage>& usage) override {
    pb::HeartbeatRequest req;
    req.set_worker_id(session.worker_id);
    for (const std::string& id : task_ids) req.add_task_ids(id);
    if (usage) {
      req.mutable_gpu_usage()->set_utilization(usage->utilization);
      req.mutable_gpu_usage()->set_memory_used_bytes(usage->memory_used_bytes);
      req.mutable_gpu_usage()->set_memory_total_bytes(usage->memory_total_bytes);
    }
    pb::HeartbeatResponse resp;
    absl::Status s = Call("Heartbeat", options_.call_timeout, session.session_token,
                          [&](grpc::ClientContext* ctx) {
                            return stub_->Heartbeat(ctx, req, &resp);
                          });
    if (!s.ok()) return s;
    return std::vector<std::string>(resp.cancelled_task_ids().begin(),
                                    resp.cancelled_task_ids().end());
  }

  absl::StatusOr<std::optional<TaskSpec>> LeaseTask(const Session& session,
                                                    std::chrono::milliseconds wait) override {
    pb::LeaseTaskRequest req;
    req.set_worker_id(session.worker_id);
    req.set_wait_ms(static_cast<int32_t>(wait.count()));
    pb::LeaseTaskResponse resp;
    absl::Status s = Call("LeaseTask", wait + options_.long_poll_slack, session.session_token,
                          [&](grpc::ClientContext* ctx) {
                            return stub_->LeaseTask(ctx, req, &resp);
                          });
    if (!s.ok()) return s;
    if (!resp.has_task() || resp.task().task_id().empty()) return std::optional<TaskSpec>();
    absl::StatusOr<TaskSpec> task = FromProto(resp.task());
    if (!task.ok()) return task.status();
    return std::optional<TaskSpec>(*std::move(task));
  }

  absl::Status ReportResult(const Session& session, const std::string& task_id,
                            const TaskResult& result) override {
    pb::ReportResultRequest req;
    req.set_worker_id(session.worker_id);
    req.set_task_id(task_id);
    ToProto(result, req.mutable_result());
    pb::ReportResultResponse resp;
    return Call("ReportResult", options_.call_timeout, session.session_token,
                [&](grpc::ClientContext* ctx) { return stub_->ReportResult(ctx, req, &resp); });
  }

  void Shutdown() override {
    std::lock_guard<std::mutex> lock(mu_);
    shut_down_ = true;
    for (grpc::ClientContext* ctx : in_flight_) ctx->TryCancel();
  }

 private:
  // `session`: the session token to send ("" for none).
  template <typename Fn>
  absl::Status Call(std::string_view name, std::chrono::milliseconds timeout,
                    const std::string& session, Fn&& fn, bool wait_for_ready = false) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    ctx.set_wait_for_ready(wait_for_ready);
    if (!options_.token.empty()) ctx.AddMetadata("authorization", "Bearer " + options_.token);
    if (!session.empty()) ctx.AddMetadata("x-kforge-session", session);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shut_down_) return absl::CancelledError(fmt::format("{}: client shut down", name));
      in_flight_.insert(&ctx);
    }
    grpc::Status s = fn(&ctx);
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_.erase(&ctx);
    }
    return FromGrpc(name, s);
  }

  const GrpcClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::WorkerService::Stub> stub_;
  std::mutex mu_;
  bool shut_down_ = false;                   // guarded by mu_
  std::set<grpc::ClientContext*> in_flight_;  // guarded by mu_
};

}  // namespace

std::unique_ptr<ServerClient> MakeGrpcServerClient(const GrpcClientOptions& options) {
  return std::make_unique<GrpcServerClient>(options);
}

}  // namespace kforge::worker
