// Test only: a minimal in-process kforge.v1.WorkerService, so the worker's
// client, reconnect and heartbeat logic can be tested without the real
// server. It keeps its state in memory (a restart forgets every worker, as a
// server that lost its state would), checks the bearer token, hands out
// queued tasks by long poll and records what the worker sent.
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

class FakeWorkerService final : public pb::WorkerService::Service {
 public:
  explicit FakeWorkerService(std::string token, int heartbeat_ms = 100)
      : token_(std::move(token)), heartbeat_ms_(heartbeat_ms) {}

  grpc::Status Register(grpc::ServerContext* ctx, const pb::RegisterRequest* req,
                        pb::RegisterResponse* resp) override {
    if (!Authorized(ctx)) return {grpc::StatusCode::UNAUTHENTICATED, "bad token"};
    std::lock_guard<std::mutex> lock(mu_);
    std::string id = "w" + std::to_string(++next_worker_);
    workers_[id] = *req;
    resp->set_worker_id(id);
    resp->set_heartbeat_interval_ms(heartbeat_ms_);
    resp->set_lease_ttl_ms(5000);
    cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext* ctx, const pb::HeartbeatRequest* req,
                         pb::HeartbeatResponse* resp) override {
    if (!Authorized(ctx)) return {grpc::StatusCode::UNAUTHENTICATED, "bad token"};
    std::lock_guard<std::mutex> lock(mu_);
    if (!workers_.count(req->worker_id())) return {grpc::StatusCode::NOT_FOUND, "unknown worker"};
    ++heartbeats_;
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
    if (!workers_.count(req->worker_id())) return {grpc::StatusCode::NOT_FOUND, "unknown worker"};
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
    if (!workers_.count(req->worker_id())) return {grpc::StatusCode::NOT_FOUND, "unknown worker"};
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
  int heartbeats_locked() const { return heartbeats_; }
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

  const std::string token_;
  const int heartbeat_ms_;
  std::mutex mu_;
  std::condition_variable cv_;
  int next_worker_ = 0;
  std::map<std::string, pb::RegisterRequest> workers_;
  std::deque<pb::Task> queue_;
  std::vector<std::string> leased_;
  std::vector<pb::ReportResultRequest> reports_;
  std::set<std::string> cancelled_;
  std::map<std::string, int> renewals_;
  int heartbeats_ = 0;
  bool stopping_ = false;
};

// A FakeWorkerService served on 127.0.0.1; Restart() replaces it with a fresh
// one (no memory of workers) on the same port.
class FakeServer {
 public:
  explicit FakeServer(std::string token, int port = 0) : token_(std::move(token)), port_(port) {
    Start();
  }
  ~FakeServer() { Shutdown(); }

  void Start() {
    service_ = std::make_unique<FakeWorkerService>(token_);
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
  void Restart() {
    Shutdown();
    Start();
  }

  bool running() const { return server_ != nullptr; }
  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  FakeWorkerService& service() { return *service_; }

 private:
  const std::string token_;
  int port_;
  std::unique_ptr<FakeWorkerService> service_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace kforge::worker::testing
