// Test only: a minimal in-process kforge.v1.WorkerService, so the worker's
// client, reconnect and heartbeat logic can be tested without the real
// server. It keeps its state in memory (a restart forgets every worker, as a
// server that lost its state would, unless told to keep its sessions as the
// real server does), checks the bearer token and, like the real server, the
// session token on every call after Register, hands out queued tasks by long
// poll and records what the worker sent.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "kforge/v1/kforge.grpc.pb.h"

namespace kforge::worker::testing {

namespace pb = ::kforge::v1;

// Sessions (token -> worker id) and workers a previous instance issued, for
// a restart that keeps its state.
struct FakeServiceState {
  std::map<std::string, std::string> sessions;
  std::map<std::string, pb::RegisterRequest> workers;
  int next_worker = 0;
};

class FakeWorkerService final : public pb::WorkerService::Service {
 public:
  using State = FakeServiceState;

  explicit FakeWorkerService(std::string token, int heartbeat_ms = 100, State state = {})
      : token_(std::move(token)),
        heartbeat_ms_(heartbeat_ms),
        sessions_(std::move(state.sessions)),
        workers_(std::move(state.workers)),
        next_worker_(state.next_worker) {}

  grpc::Status Register(grpc::ServerContext* ctx, const pb::RegisterRequest* req,
                        pb::RegisterResponse* resp) override {
    if (!Authorized(ctx)) return {grpc::StatusCode::UNAUTHENTICATED, "bad token"};
    std::lock_guard<std::mutex> lock(mu_);
    ++registrations_;
    const std::string presented = Session(ctx);
    std::string id, session;
    if (auto it = sessions_.find(presented); it != sessions_.end()) {
      id = it->second;  // resumed
      session = presented;
    } else {
      id = "w" + std::to_string(++next_worker_);
      session = "session-of-" + id;
      sessions_[session] = id;
    }
    workers_[id] = *req;
    resp->set_worker_id(id);
    resp->set_session_token(session);
    resp->set_heartbeat_interval_ms(heartbeat_ms_);
    resp->set_lease_ttl_ms(5000);
    cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext* ctx, const pb::HeartbeatRequest* req,
                         pb::HeartbeatResponse* resp) override {
    if (!Authorized(ctx)) return {grpc::StatusCode::UNAUTHENTICATED, "bad token"};
    std::lock_guard<std::mutex> lock(mu_);
    if (grpc::Status s = CheckSession(ctx, req->worker_id()); !s.ok()) return s;
    ++heartbeats_;
    if (req->has_gpu_usage()) last_gpu_usage_ = req->gpu_usage();
    for (const std::string& id : req->task_ids()) {
      ++renewals_[id];
      if (cancelled_.count(id)) resp->add_cancelled_task_ids(id);
    }
    cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status LeaseTask(grpc::ServerContext* ctx, const pb::LeaseTaskRequest* req,
                         pb::LeaseTaskResponse* resp) override {
    if (!Authorized(ctx)) return {grpc::StatusCode::UNAUTHENTICATED, "bad token"};
    std::unique_lock<std::mutex> lock(mu_);
    if (grpc::Status s = CheckSession(ctx, req->worker_id()); !s.ok()) return s;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(req->wait_ms());
    cv_.wait_until(lock, until, [&] { return !queue_.empty() || stopping_ || ctx->IsCancelled(); });
    if (queue_.empty()) return grpc::Status::OK;
    *resp->mutable_task() = queue_.front();
    queue_.pop_front();
    leased_.push_back(resp->task().task_id());
    return grpc::Status::OK;
  }

  grpc::Status ReportResult(grpc::ServerContext* ctx, const pb::ReportResultRequest* req,
                            pb::ReportResultResponse* resp) override {
    if (!Authorized(ctx)) return {grpc::StatusCode::UNAUTHENTICATED, "bad token"};
    std::lock_guard<std::mutex> lock(mu_);
    if (grpc::Status s = CheckSession(ctx, req->worker_id()); !s.ok()) return s;
    ++report_attempts_;
    cv_.notify_all();
    if (failing_reports_ > 0) {
      --failing_reports_;
      return {grpc::StatusCode::UNAVAILABLE, "the server is busy"};
    }
    if (refuse_reports_) return {grpc::StatusCode::FAILED_PRECONDITION, "the lease ended"};
    reports_.push_back(*req);
    resp->set_accepted(true);
    cv_.notify_all();
    return grpc::Status::OK;
  }

  void Enqueue(pb::Task task) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    cv_.notify_all();
  }
  void Cancel(const std::string& task_id) {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_.insert(task_id);
  }
  // Refuses every report as the real server refuses one without a live lease.
  void RefuseReports(bool refuse) {
    std::lock_guard<std::mutex> lock(mu_);
    refuse_reports_ = refuse;
  }
  // The next `n` reports fail as a server that did not get them
  // (UNAVAILABLE): the worker is to send them again.
  void FailReports(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    failing_reports_ = n;
  }
  State state() {
    std::lock_guard<std::mutex> lock(mu_);
    return State{sessions_, workers_, next_worker_};
  }
  // Wakes long polls so a server shutdown does not wait for them.
  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }

  // Waits until `pred()` (called under the lock) holds; false on timeout.
  template <typename Pred>
  bool WaitFor(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return pred(*this); });
  }

  // Accessors for WaitFor predicates (already under the lock) and for tests
  // after the fact.
  size_t reports_locked() const { return reports_.size(); }
  size_t workers_locked() const { return workers_.size(); }
  int registrations_locked() const { return registrations_; }
  int unauthenticated_calls_locked() const { return unauthenticated_calls_; }
  int heartbeats_locked() const { return heartbeats_; }
  int report_attempts_locked() const { return report_attempts_; }
  std::optional<pb::GpuUsage> last_gpu_usage_locked() const { return last_gpu_usage_; }
  int renewals_locked(const std::string& id) const {
    auto it = renewals_.find(id);
    return it == renewals_.end() ? 0 : it->second;
  }
  std::vector<pb::ReportResultRequest> reports() {
    std::lock_guard<std::mutex> lock(mu_);
    return reports_;
  }
  std::map<std::string, pb::RegisterRequest> workers() {
    std::lock_guard<std::mutex> lock(mu_);
    return workers_;
  }
  int report_attempts() {
    std::lock_guard<std::mutex> lock(mu_);
    return report_attempts_;
  }
  std::vector<std::string> leased() {
    std::lock_guard<std::mutex> lock(mu_);
    return leased_;
  }

 private:
  bool Authorized(grpc::ServerContext* ctx) const {
    auto it = ctx->client_metadata().find("authorization");
    if (it == ctx->client_metadata().end()) return token_.empty();
    return std::string(it->second.data(), it->second.size()) == "Bearer " + token_;
  }
  static std::string Session(grpc::ServerContext* ctx) {
    auto it = ctx->client_metadata().find("x-kforge-session");
    if (it == ctx->client_metadata().end()) return "";
    return std::string(it->second.data(), it->second.size());
  }
  // The real server's rule: the session names the caller; a request for
  // another worker is refused. Called under mu_.
  grpc::Status CheckSession(grpc::ServerContext* ctx, const std::string& declared) {
    auto it = sessions_.find(Session(ctx));
    if (it == sessions_.end()) {
      ++unauthenticated_calls_;
      return {grpc::StatusCode::UNAUTHENTICATED, "unknown session"};
    }
    if (!declared.empty() && declared != it->second)
      return {grpc::StatusCode::PERMISSION_DENIED, "not this session's worker"};
    return grpc::Status::OK;
  }

  const std::string token_;
  const int heartbeat_ms_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> sessions_;  // token -> worker id
  std::map<std::string, pb::RegisterRequest> workers_;
  int next_worker_ = 0;
  int registrations_ = 0;
  int unauthenticated_calls_ = 0;
  bool refuse_reports_ = false;
  int failing_reports_ = 0;
  int report_attempts_ = 0;
  std::deque<pb::Task> queue_;
  std::vector<std::string> leased_;
  std::vector<pb::ReportResultRequest> reports_;
  std::set<std::string> cancelled_;
  std::map<std::string, int> renewals_;
  int heartbeats_ = 0;
  std::optional<pb::GpuUsage> last_gpu_usage_;
  bool stopping_ = false;
};

// A FakeWorkerService served on 127.0.0.1; Restart() replaces it with a fresh
// one (no memory of workers unless asked to keep its sessions) on the same
// port.
class FakeServer {
 public:
  // `heartbeat_ms`: the interval Register asks workers for.
  explicit FakeServer(std::string token, int port = 0, int heartbeat_ms = 100)
      : token_(std::move(token)), port_(port), heartbeat_ms_(heartbeat_ms) {
    Start();
  }
  ~FakeServer() { Shutdown(); }

  void Start(FakeWorkerService::State state = {}) {
    service_ = std::make_unique<FakeWorkerService>(token_, heartbeat_ms_, std::move(state));
    grpc::ServerBuilder builder;
    int selected = 0;
    builder.AddListeningPort("127.0.0.1:" + std::to_string(port_), grpc::InsecureServerCredentials(),
                             &selected);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    if (server_ && port_ == 0) port_ = selected;
  }
  void Shutdown() {
    if (!server_) return;
    service_->Stop();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    server_->Wait();
    server_.reset();
  }
  // `keep_sessions`: the new instance knows the workers and sessions of the
  // old one, as the real server (which stores them) does.
  void Restart(bool keep_sessions = false) {
    FakeWorkerService::State state;
    if (keep_sessions && service_) state = service_->state();
    Shutdown();
    Start(std::move(state));
  }

  bool running() const { return server_ != nullptr; }
  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  FakeWorkerService& service() { return *service_; }

 private:
  const std::string token_;
  int port_;
  const int heartbeat_ms_;
  std::unique_ptr<FakeWorkerService> service_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace kforge::worker::testing
