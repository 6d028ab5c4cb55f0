// KforgeApi: what every RPC of KernelService and WorkerService does, with
// the transport left out. Methods take and fill protobuf messages and return
// absl::Status; services.cc adapts them to gRPC (auth metadata, streaming,
// and the single absl -> grpc status conversion).
//
// Re-timing rule (how a best is replaced): a verified EVALUATE result
// becomes the best only when its (bucket, arch) has none. If it is faster
// than the incumbent, a RETIME task is enqueued in which one worker times
// candidate and incumbent interleaved in the same process; the candidate
// replaces the incumbent only when it wins by more than the spread
// (max - min) of either timing. This keeps noise between GPUs, processes and
// thermal states from promoting a variant that is not really faster.
//
// Thread-safe: every method may be called from any RPC thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "kforge/v1/kforge.pb.h"
#include "server/convert.h"
#include "server/jobs.h"
#include "server/kernel_cache.h"
#include "storage/store.h"

namespace kforge::server {

struct ApiOptions {
  ServedLimits limits;
  int64_t lease_ttl_ms = 60000;
  int32_t heartbeat_interval_ms = 10000;
  int32_t max_lease_wait_ms = 30000;  // longest LeaseTask long poll
  std::string tune_proposer = "builtin";  // for GetKernel's tune_if_untuned
  int tune_max_variants = kDefaultMaxVariants;
  // A task whose lease expired this many times without a result is given up
  // (recorded as crashed) instead of being handed out again: a worker that
  // fails before running a candidate does not report, so a task that breaks
  // every worker would otherwise cycle forever.
  int max_task_attempts = 5;
};

class KforgeApi {
 public:
  // Borrowed pointers must outlive the api.
  KforgeApi(Store* store, KernelCache* cache, JobEngine* engine, ApiOptions options);

  // Loads the registered workers (they need not register again after a
  // server restart).
  absl::Status Init();

  // KernelService.
  absl::Status GetKernel(const v1::GetKernelRequest& req, v1::GetKernelResponse* resp);
  // GetKernel answered as serialized GetKernelResponse bytes: for a tuned
  // bucket these are shared, pre-serialized bytes (no per-call copy).
  absl::StatusOr<std::shared_ptr<const std::string>> GetKernelBytes(
      const v1::GetKernelRequest& req);
  // The cached bytes when `req` names a tuned bucket; nullptr otherwise
  // (invalid request, nearest/seed path), which never blocks.
  std::shared_ptr<const std::string> GetKernelCached(const v1::GetKernelRequest& req);
  absl::Status ListShapes(const v1::ListShapesRequest& req, v1::ListShapesResponse* resp);
  absl::Status ListVariants(const v1::ListVariantsRequest& req, v1::ListVariantsResponse* resp);
  absl::Status SubmitJob(const v1::SubmitJobRequest& req, v1::Job* resp);
  absl::Status GetJob(const v1::GetJobRequest& req, v1::Job* resp);
  absl::Status ListJobs(const v1::ListJobsRequest& req, v1::ListJobsResponse* resp);
  absl::Status CancelJob(const v1::CancelJobRequest& req, v1::Job* resp);
  // Every best as served (server/export.h), one `write` per kernel.
  absl::Status ExportKernels(const v1::ExportKernelsRequest& req,
                             const std::function<bool(const v1::ExportedKernel&)>& write);
  // Writes the job's current state, then one event per change until the job
  // is final (OK), `write` fails or `cancelled` (CANCELLED), or the server
  // shuts down (UNAVAILABLE: watch again after the restart).
  absl::Status WatchJob(const v1::WatchJobRequest& req,
                        const std::function<bool(const v1::JobEvent&)>& write,
                        const std::function<bool()>& cancelled);

  // WorkerService.
  absl::Status Register(const v1::RegisterRequest& req, v1::RegisterResponse* resp);
  absl::Status Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp);
  absl::Status LeaseTask(const v1::LeaseTaskRequest& req, v1::LeaseTaskResponse* resp,
                         const std::function<bool()>& cancelled);
  absl::Status ReportResult(const v1::ReportResultRequest& req, v1::ReportResultResponse* resp);

  // Wakes long-polling LeaseTask calls (tasks were enqueued or requeued).
  void NotifyTasks();
  // Makes long polls and watch streams return promptly; new ones return at
  // once. Called first thing on shutdown.
  void BeginShutdown();
  // The reaper: returns expired leases to the queue; the number requeued.
  absl::StatusOr<int> RequeueExpired();

 private:
  struct WorkerInfo {
    std::string arch;
    bool compile_only = false;
    WorkerRecord record;         // as registered; last_seen refreshed by heartbeats
  };
  absl::StatusOr<WorkerInfo> KnownWorker(const std::string& worker_id);
  absl::Status FillTask(const TaskRecord& t, v1::Task* out);
  absl::Status DecideAndComplete(const TaskRecord& task, const v1::EvalResult& result,
                                 EvaluationRecord eval, bool* accepted);
  // Records a task that exhausted max_task_attempts as crashed; `worker_id`
  // holds its current lease.
  absl::Status GiveUp(const TaskRecord& task, const std::string& worker_id);

  Store* store_;          // must outlive this
  KernelCache* cache_;    // must outlive this
  JobEngine* engine_;     // must outlive this
  ApiOptions options_;

  std::mutex workers_mu_;
  std::map<std::string, WorkerInfo> workers_;  // guarded by workers_mu_

  std::mutex tasks_mu_;
  std::condition_variable tasks_cv_;
  uint64_t tasks_generation_ = 0;  // guarded by tasks_mu_; bumped by NotifyTasks
  std::atomic<bool> shutting_down_{false};

  // Serializes best decisions: read best, decide, CompleteTask, refresh.
  std::mutex best_mu_;
};

}  // namespace kforge::server
