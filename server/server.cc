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
#include "server/auth.h"
#include "server/convert.h"
#include "server/waiting.h"

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

grpc::ByteBuffer Serialized(const google::protobuf::Message& m) {
  grpc::Slice slice(m.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

// A LeaseTask long poll that holds no thread while it waits. It attempts a
// lease on the pool; finding nothing, it waits in the room of long polls
// (capped: RESOURCE_EXHAUSTED past max_open_lease_polls) until a wake-up
// (tasks enqueued or requeued: it attempts again), its deadline (at most
// max_lease_wait_ms: an empty answer), the client's cancellation or
// shutdown (an empty answer, as before). Never finished while an attempt
// runs: the attempt answers, so a leased task is never dropped unanswered.
// Owned by itself (self_) until OnDone, and by the room while it waits.
class LeasePoll final : public grpc::ServerUnaryReactor,
                        public WaitRoom::Waiter,
                        public std::enable_shared_from_this<LeasePoll> {
 public:
  // `out` stays valid until OnDone.
  static LeasePoll* Make(KforgeApi* api, CallPool* pool, WaitRoom* room, grpc::ByteBuffer* out) {
    auto p = std::shared_ptr<LeasePoll>(new LeasePoll(api, pool, room, out));
    p->self_ = p;
    return p.get();
  }

  // On the pool: the call's checks (authentication, parse) came out as
  // `checked`; then the first attempt.
  void Begin(absl::Status checked, std::string caller, v1::LeaseTaskRequest req) {
    if (!checked.ok()) {
      Answer(ToGrpcStatus(checked), nullptr);
      return;
    }
    caller_ = std::move(caller);
    req_ = std::move(req);
    deadline_ = WaitRoom::Clock::now() + api_->LeaseWait(req_);
    Attempt();
  }

  void OnWake() override {
    {
      std::lock_guard lock(mu_);
      if (finished_ || ended_) return;
      if (attempting_) {
        again_ = true;  // what woke us may have come after the attempt looked
        return;
      }
      attempting_ = true;
    }
    pool_->Post([self = shared_from_this()] { self->Attempt(); });
  }
  void OnDeadline() override { End(grpc::Status::OK); }
  void OnClose() override { End(grpc::Status::OK); }
  void OnCancel() override { End(grpc::Status(grpc::StatusCode::CANCELLED, "client went away")); }

  void OnDone() override {
    uint64_t id;
    {
      std::lock_guard lock(mu_);
      id = room_id_;
    }
    if (id != 0) room_->Leave(id);
    std::shared_ptr<LeasePoll> last = std::move(self_);  // may delete this
  }

 private:
  LeasePoll(KforgeApi* api, CallPool* pool, WaitRoom* room, grpc::ByteBuffer* out)
      : api_(api), pool_(pool), room_(room), out_(out) {}

  // On the pool, with attempting_ set.
  void Attempt() {
    for (;;) {
      {
        // Cancelled (or shut down) before this attempt: lease nothing for a
        // call that is going away.
        std::unique_lock lock(mu_);
        if (ended_) {
          attempting_ = false;
          const grpc::Status s = *ended_;
          lock.unlock();
          v1::LeaseTaskResponse empty;
          Answer(s, &empty);
          return;
        }
      }
      const uint64_t wakes = room_->wakes();
      v1::LeaseTaskResponse resp;
      absl::Status s = api_->LeaseTask(caller_, req_, &resp);
      bool wait = s.ok() && !resp.has_task();
      bool entered = false;
      {
        std::lock_guard lock(mu_);
        entered = room_id_ != 0;
      }
      if (wait && !entered) {
        // Nothing now: wait in the room if the request asks to (and there
        // is room); shutting down, answer at once.
        wait = false;
        if (WaitRoom::Clock::now() < deadline_ && !api_->shutting_down()) {
          absl::StatusOr<uint64_t> id = room_->Enter(shared_from_this(), deadline_);
          if (id.ok()) {
            std::lock_guard lock(mu_);
            room_id_ = *id;
            wait = true;
            // A wake-up between the attempt and Enter found no entry to wake.
            if (room_->wakes() != wakes) again_ = true;
          } else if (id.status().code() != absl::StatusCode::kUnavailable) {
            s = id.status();  // the cap
          }
        }
      }
      std::unique_lock lock(mu_);
      attempting_ = false;
      if (wait && !ended_) {
        if (!again_) return;  // a wake-up, the deadline, cancellation or shutdown goes on
        again_ = false;
        attempting_ = true;
        continue;
      }
      grpc::Status status = !s.ok()          ? ToGrpcStatus(s)
                            : resp.has_task() ? grpc::Status::OK
                            : ended_          ? *ended_
                                              : grpc::Status::OK;
      lock.unlock();
      Answer(status, &resp);
      return;
    }
  }

  // Ends the wait with `s` (OK: an empty answer): now, unless an attempt
  // runs, which then answers.
  void End(grpc::Status s) {
    {
      std::lock_guard lock(mu_);
      if (finished_ || ended_) return;
      ended_ = s;
      if (attempting_) return;
    }
    v1::LeaseTaskResponse empty;
    Answer(s, &empty);
  }

  void Answer(grpc::Status s, const v1::LeaseTaskResponse* resp) {
    {
      std::lock_guard lock(mu_);
      if (finished_) return;
      finished_ = true;
    }
    if (s.ok()) *out_ = Serialized(*resp);
    Finish(std::move(s));
  }

  KforgeApi* api_;
  CallPool* pool_;
  WaitRoom* room_;
  grpc::ByteBuffer* out_;
  std::string caller_;
  v1::LeaseTaskRequest req_;
  WaitRoom::Clock::time_point deadline_;

  std::mutex mu_;
  bool attempting_ = true;             // guarded by mu_; Begin is the first attempt
  bool again_ = false;                 // guarded by mu_: woken during an attempt
  std::optional<grpc::Status> ended_;  // guarded by mu_: deadline, shutdown or cancellation
  bool finished_ = false;              // guarded by mu_
  uint64_t room_id_ = 0;               // guarded by mu_; 0: not in the room
  std::shared_ptr<LeasePoll> self_;    // until OnDone
};

// A WatchJob stream that holds no thread: the job engine's events are
// queued and written one at a time as the client takes them. It waits in
// the room of watch streams (capped: RESOURCE_EXHAUSTED past
// max_open_watch_streams) and ends after max_watch_ms with UNAVAILABLE
// ("watch again": the client re-watches and gets the current state first),
// at shutdown with UNAVAILABLE, when the job is final with OK, and on
// cancellation. A client that reads too slowly loses the oldest unsent
// events, never the newest: each event carries the whole job.
class WatchStream final : public grpc::ServerWriteReactor<grpc::ByteBuffer>,
                          public WaitRoom::Waiter,
                          public std::enable_shared_from_this<WatchStream> {
 public:
  static constexpr size_t kMaxQueued = 64;

  static WatchStream* Make(KforgeApi* api, WaitRoom* room, std::chrono::milliseconds lifetime) {
    auto w = std::shared_ptr<WatchStream>(new WatchStream(api, room, lifetime));
    w->self_ = w;
    return w.get();
  }

  // On the pool: the call's checks came out as `checked`.
  void Begin(absl::Status checked, const v1::WatchJobRequest& req) {
    absl::StatusOr<uint64_t> room =
        checked.ok() ? room_->Enter(shared_from_this(), WaitRoom::Clock::now() + lifetime_)
                     : absl::StatusOr<uint64_t>(checked);
    if (!room.ok() && checked.ok() && room.status().code() == absl::StatusCode::kUnavailable)
      room = absl::UnavailableError("server shutting down; watch again");
    if (!room.ok()) {
      Abort(ToGrpcStatus(room.status()));
      Prime(std::nullopt);
      return;
    }
    {
      std::lock_guard lock(mu_);
      room_id_ = *room;
    }
    std::weak_ptr<WatchStream> weak = shared_from_this();
    auto watch = api_->WatchJob(req, [weak](WatchUpdate u) {
      if (auto self = weak.lock()) self->Push(std::move(u));
    });
    if (!watch.ok()) {
      Abort(ToGrpcStatus(watch.status()));
      Prime(std::nullopt);
      return;
    }
    {
      std::lock_guard lock(mu_);
      watch_id_ = watch->first;
    }
    Prime(std::move(watch->second));
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock lock(mu_);
    writing_ = false;
    if (!ok && !(end_ && !end_->ok())) {
      end_ = grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      queue_.clear();
    }
    Pump(lock);
  }
  void OnDeadline() override {
    Abort(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                       fmt::format("watch stream open for {} ms (max_watch_ms); watch again",
                                   lifetime_.count())));
  }
  void OnClose() override {
    Abort(grpc::Status(grpc::StatusCode::UNAVAILABLE, "server shutting down; watch again"));
  }
  void OnWake() override {}
  void OnCancel() override { Abort(grpc::Status(grpc::StatusCode::CANCELLED, "client went away")); }

  void OnDone() override {
    uint64_t watch, room;
    {
      std::lock_guard lock(mu_);
      watch = watch_id_;
      room = room_id_;
    }
    if (watch != 0) api_->Unwatch(watch);
    if (room != 0) room_->Leave(room);
    std::shared_ptr<WatchStream> last = std::move(self_);  // may delete this
  }

 private:
  WatchStream(KforgeApi* api, WaitRoom* room, std::chrono::milliseconds lifetime)
      : api_(api), room_(room), lifetime_(lifetime) {}

  // The first update, the job's current state, goes before the events the
  // engine sent meanwhile; when it ends the stream (the job is final), those
  // are older and are dropped.
  void Prime(std::optional<WatchUpdate> first) {
    std::unique_lock lock(mu_);
    primed_ = true;
    if (first && !(end_ && !end_->ok())) {
      if (first->end) {
        queue_.clear();
        end_ = ToGrpcStatus(*first->end);
      }
      if (first->event) queue_.push_front(Serialized(*first->event));
    }
    Pump(lock);
  }

  // An update from the engine's thread.
  void Push(WatchUpdate u) {
    std::unique_lock lock(mu_);
    if (end_) return;  // ending, or the job was final already
    if (u.event) {
      queue_.push_back(Serialized(*u.event));
      if (queue_.size() > kMaxQueued) queue_.pop_front();
    }
    if (u.end) end_ = ToGrpcStatus(*u.end);
    Pump(lock);
  }

  // Ends the stream with `s` after the write in flight, dropping what is
  // queued (the client watches again, or is gone).
  void Abort(grpc::Status s) {
    std::unique_lock lock(mu_);
    if (finished_ || (end_ && !end_->ok())) return;
    end_ = std::move(s);
    queue_.clear();
    Pump(lock);
  }

  // One write at a time; the finish once nothing is left to write.
  void Pump(std::unique_lock<std::mutex>& lock) {
    if (!primed_ || writing_ || finished_) return;
    if (!queue_.empty()) {
      in_flight_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      lock.unlock();
      StartWrite(&in_flight_);
      return;
    }
    if (!end_) return;
    finished_ = true;
    grpc::Status s = *end_;
    lock.unlock();
    Finish(std::move(s));
  }

  KforgeApi* api_;
  WaitRoom* room_;
  const std::chrono::milliseconds lifetime_;

  std::mutex mu_;
  std::deque<grpc::ByteBuffer> queue_;  // guarded by mu_: serialized events not yet written
  grpc::ByteBuffer in_flight_;          // guarded by mu_ while writing_ is false
  bool primed_ = false;                 // guarded by mu_: the current state is queued
  bool writing_ = false;                // guarded by mu_
  std::optional<grpc::Status> end_;     // guarded by mu_: finish with this when written
  bool finished_ = false;               // guarded by mu_
  uint64_t watch_id_ = 0;               // guarded by mu_
  uint64_t room_id_ = 0;                // guarded by mu_
  std::shared_ptr<WatchStream> self_;   // until OnDone
};

// KernelService. GetKernel is the hot path: for a tuned bucket the
// pre-serialized response goes out as a slice that borrows the cached bytes
// (no copy, no serialization, no thread hand-off). The other unary methods
// are raw callback methods too, for ParseRequest's errors and limits, run
// on a fixed pool; so is WatchJob, a stream that holds no thread
// (WatchStream). ExportKernels, a finite stream, stays synchronous.
using KernelServiceBase = v1::KernelService::WithRawCallbackMethod_GetKernel<
    v1::KernelService::WithRawCallbackMethod_ListShapes<
        v1::KernelService::WithRawCallbackMethod_ListVariants<
            v1::KernelService::WithRawCallbackMethod_SubmitJob<
                v1::KernelService::WithRawCallbackMethod_GetJob<
                    v1::KernelService::WithRawCallbackMethod_ListJobs<
                        v1::KernelService::WithRawCallbackMethod_CancelJob<
                            v1::KernelService::WithRawCallbackMethod_ListWorkers<
                                v1::KernelService::WithRawCallbackMethod_WatchJob<
                                    v1::KernelService::Service>>>>>>>>>;

class KernelServiceImpl final : public KernelServiceBase {
 public:
  // `calls` and `watches` must outlive this.
  KernelServiceImpl(KforgeApi* api, const Authenticator* auth, CallPool* calls,
                    WaitRoom* watches, std::chrono::milliseconds max_watch)
      : api_(api), auth_(auth), calls_(calls), watches_(watches), max_watch_(max_watch),
        slow_(4) {}

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
  grpc::ServerWriteReactor<grpc::ByteBuffer>* WatchJob(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* raw) override {
    WatchStream* stream = WatchStream::Make(api_, watches_, max_watch_);
    // ctx and raw stay valid until the stream's OnDone, which comes after
    // its Finish, which comes after Begin.
    calls_->Post([this, ctx, raw, self = stream->shared_from_this()] {
      v1::WatchJobRequest req;
      absl::Status s = auth_->Check(Role::kClient, AuthHeader(ctx));
      if (s.ok()) s = ParseRaw(raw, kQueryBytes, &req);
      self->Begin(s, req);
    });
    return stream;
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
  WaitRoom* watches_;          // must outlive this
  std::chrono::milliseconds max_watch_;
  CallPool slow_;              // last: joined first, while api_ is still alive
};

// WorkerService: every method from its wire bytes on the pool (a report's
// texts come from candidate code: a byte that is not UTF-8 must be an
// answer naming the field, not a lost report); LeaseTask, a long poll,
// waits without a thread (LeasePoll).
using WorkerServiceBase = v1::WorkerService::WithRawCallbackMethod_Register<
    v1::WorkerService::WithRawCallbackMethod_Heartbeat<
        v1::WorkerService::WithRawCallbackMethod_ReportResult<
            v1::WorkerService::WithRawCallbackMethod_LeaseTask<v1::WorkerService::Service>>>>;

class WorkerServiceImpl final : public WorkerServiceBase {
 public:
  // `calls` and `polls` must outlive this.
  WorkerServiceImpl(KforgeApi* api, const Authenticator* auth, CallPool* calls, WaitRoom* polls,
                    size_t max_report_bytes)
      : api_(api), auth_(auth), calls_(calls), polls_(polls),
        max_report_bytes_(max_report_bytes) {}

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
  grpc::ServerUnaryReactor* LeaseTask(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* raw,
                                      grpc::ByteBuffer* resp) override {
    LeasePoll* poll = LeasePoll::Make(api_, calls_, polls_, resp);
    // ctx, raw and resp stay valid until the poll's OnDone.
    calls_->Post([this, ctx, raw, self = poll->shared_from_this()] {
      v1::LeaseTaskRequest req;
      absl::StatusOr<std::string> caller = Caller(ctx);
      absl::Status s = caller.status();
      if (s.ok()) s = ParseRaw(raw, kQueryBytes, &req);
      self->Begin(s, s.ok() ? *std::move(caller) : std::string(), std::move(req));
    });
    return poll;
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
  WaitRoom* polls_;            // must outlive this
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
        polls_("LeaseTask long polls", "max_open_lease_polls", options_.max_open_lease_polls),
        watches_("WatchJob streams", "max_open_watch_streams", options_.max_open_watch_streams),
        kernel_service_(&api_, &auth_, &calls_, &watches_,
                        std::chrono::milliseconds(options_.max_watch_ms)),
        worker_service_(&api_, &auth_, &calls_, &polls_,
                        static_cast<size_t>(options_.max_receive_message_bytes)) {}

  // Reported texts are scrubbed of every token the server holds. New tasks
  // wake the long polls.
  ApiOptions ApiOptionsOf(const ServerOptions& o) {
    ApiOptions api = o.api;
    api.secrets.insert(api.secrets.end(), o.client_tokens.begin(), o.client_tokens.end());
    for (const WorkerCredential& c : WorkerCredentialsOf(o)) api.secrets.push_back(c.token);
    api.metrics = o.metrics;
    // polls_ is built after the api; the api calls this only once serving.
    auto user = api.on_tasks;
    api.on_tasks = [this, user] {
      polls_.WakeAll();
      if (user) user();
    };
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
    // Waiting calls end now (long polls empty, watches UNAVAILABLE), and new
    // ones are answered so at once.
    polls_.Close();
    watches_.Close();
    if (options_.shutdown_grace_ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(options_.shutdown_grace_ms));
    if (server_)
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(options_.drain_timeout_ms));
    // Every waiting call is done (its OnDone ran) before what it uses goes.
    if (!polls_.WaitEmpty(std::chrono::milliseconds(options_.drain_timeout_ms)) ||
        !watches_.WaitEmpty(std::chrono::milliseconds(options_.drain_timeout_ms)))
      spdlog::warn("shutdown: {} long poll(s) and {} watch stream(s) still open after the drain",
                   polls_.open(), watches_.open());
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
  Server::Waiting waiting() const { return {polls_.open(), watches_.open()}; }

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
  // Calls that wait without a thread; after calls_ (their attempts run
  // there) and before the services and the gRPC server, so they outlive
  // every call.
  WaitRoom polls_;
  WaitRoom watches_;
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
Server::Waiting Server::waiting() const { return impl_->waiting(); }

}  // namespace kforge::server
