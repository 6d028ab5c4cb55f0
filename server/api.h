// KforgeApi: what every RPC of KernelService and WorkerService does, with
// the transport left out. Methods take and fill protobuf messages and return
// absl::Status; server.cc adapts them to gRPC (auth metadata, streaming,
// the waiting of long polls and watch streams, and the single absl -> grpc
// status conversion). No method here blocks waiting for an event.
//
// Worker results are claims. A WorkerService call acts as the worker its
// session names (server.cc resolves it with WorkerForSession before calling
// in), never as the worker_id a request declares, and that worker is bound
// to the principal of the worker token it registered with (server/auth.h):
// "another worker" for promotions is another principal. A report is accepted only
// from the worker holding a live lease on its task, and is checked before
// anything of it is stored: timings against the shape's physical floor on
// the worker's registered arch (core/roofline.h), the cubin against its
// hash. Its texts are scrubbed of secrets and clipped. Promotion (which
// kernel a bucket serves) follows server/promotion.h: a verified EVALUATE
// asks for a CONFIRM or a RETIME and never promotes by itself.
//
// Thread-safe: every method may be called from any RPC thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kforge/v1/kforge.pb.h"
#include "server/convert.h"
#include "server/jobs.h"
#include "server/promotion.h"
#include "server/kernel_cache.h"
#include "server/metrics.h"
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
  // Promote CONFIRM/RETIME results of workers that registered without the
  // memcheck sanitizer gate. Off: such a result is recorded, not promoted.
  bool allow_ungated_promotion = false;
  // A candidate's CONFIRM/RETIME is not leased to the worker whose EVALUATE
  // made it a contender, nor to any worker of that worker's principal,
  // while a worker of another principal that can promote it (same arch, not
  // compile-only, gated unless ungated promotion is allowed, seen within
  // lease_ttl_ms) is connected. With none, any worker may take it, unless
  // require_distinct_confirmer (then it waits for another principal's).
  // Workers without a principal (auth off, rows from before principals)
  // are told apart by id.
  // Independently of this, a worker that cannot promote (ungated) is given
  // no promotion task while one that can is connected.
  bool confirm_on_another_worker = true;
  bool require_distinct_confirmer = false;
  // Texts workers report are scrubbed of these (the server's client and
  // worker tokens) before they are stored (core/redact.h).
  std::vector<std::string> secrets;
  // Unix ms; tests inject one. Empty: the system clock.
  std::function<int64_t()> clock;
  // Where accepted reports, promotions and expired leases are counted (for
  // operators); may be null. Must outlive the api.
  ServerMetrics* metrics = nullptr;
  // Called (on any thread, without the api's locks) when tasks were
  // enqueued or requeued: server.cc has its waiting LeaseTask long polls
  // attempt again. May be empty.
  std::function<void()> on_tasks;
};

// What a watch stream sends next: an event, and perhaps the end of the
// stream after it.
struct WatchUpdate {
  std::optional<v1::JobEvent> event;
  // Set: the stream ends after `event` with this status. OK when the job
  // reached a final state; UNAVAILABLE when the server is stopping.
  std::optional<absl::Status> end;
};

// What a worker's GPU was doing at its last heartbeat (HeartbeatRequest.
// gpu_usage): kept in memory only, as the worker reports it anew.
struct ReportedGpuUsage {
  double utilization = 0;  // 0 to 1
  int64_t memory_used_bytes = 0;
  int64_t memory_total_bytes = 0;
  int64_t at_unix_ms = 0;  // when the heartbeat came
};

// A stored worker as operators see it.
struct WorkerStatus {
  WorkerRecord record;
  // Its last call as far as this server knows (stored last_seen, or fresher).
  int64_t last_call_unix_ms = 0;
  // Called within the lease TTL.
  bool connected = false;
  std::optional<ReportedGpuUsage> gpu_usage;  // none reported (since the server started)
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
  // The stored workers, by id; a worker is connected when its last call
  // (heartbeats included) is within the lease TTL.
  absl::Status ListWorkers(const v1::ListWorkersRequest& req, v1::ListWorkersResponse* resp);
  // Every best as served (server/export.h), one `write` per kernel.
  absl::Status ExportKernels(const v1::ExportKernelsRequest& req,
                             const std::function<bool(const v1::ExportedKernel&)>& write);
  // Starts watching a job without holding a thread: returns the watch's id
  // and the first update (the job's current state; with `end` OK when the
  // job is final already), and from then on calls `on_update` on the job
  // engine's thread for every change, until the job is final or the engine
  // stops (`end` set) or Unwatch. `on_update` must not block, and may run
  // once more after Unwatch returns (it must keep what it touches alive).
  // Events that happen between the watch and the read of the current state
  // come after it, so none is missed (some may repeat what it says).
  absl::StatusOr<std::pair<uint64_t, WatchUpdate>> WatchJob(
      const v1::WatchJobRequest& req, std::function<void(WatchUpdate)> on_update);
  void Unwatch(uint64_t watch);

  // WorkerService. `principal` is the name of the worker credential that
  // authenticated the call (server/auth.h), "" when auth is off; the
  // transport says it, the request never does.
  //
  // Register issues a session and binds the worker to `principal` (or
  // resumes the worker of `session`, the x-kforge-session a re-registering
  // worker presents, when it is valid, the worker's arch and compile-only
  // flag are unchanged and it was bound to the same principal or to none;
  // otherwise it registers a new worker). Every other call acts as
  // `caller`, the worker id WorkerForSession resolved: UNAUTHENTICATED
  // when the session is missing or unknown, PERMISSION_DENIED when the
  // session's worker is bound to another principal (a session is good only
  // with the credential it was issued under). A worker bound to none (stored
  // before principals) is bound to `principal` at its first call. A request
  // whose worker_id is set to another worker is PERMISSION_DENIED.
  absl::StatusOr<std::string> WorkerForSession(std::optional<std::string_view> session,
                                               const std::string& principal);
  absl::Status Register(const v1::RegisterRequest& req, const std::string& principal,
                        std::optional<std::string_view> session, v1::RegisterResponse* resp);
  absl::Status Heartbeat(const std::string& caller, const v1::HeartbeatRequest& req,
                         v1::HeartbeatResponse* resp);
  // One attempt to lease a task for `caller`; it never waits. The long poll
  // is the transport's (server.cc): it attempts again when on_tasks fires,
  // until LeaseWait(req) has passed. A task that exhausted max_task_attempts
  // is given up here rather than handed out.
  absl::Status LeaseTask(const std::string& caller, const v1::LeaseTaskRequest& req,
                         v1::LeaseTaskResponse* resp);
  // How long a LeaseTask call may wait for a task: its wait_ms, at most
  // max_lease_wait_ms (0 for a negative wait_ms, which LeaseTask refuses).
  std::chrono::milliseconds LeaseWait(const v1::LeaseTaskRequest& req) const;
  // OK only when the result was recorded; a report without a live lease,
  // below the timing floor or otherwise malformed stores nothing.
  absl::Status ReportResult(const std::string& caller, const v1::ReportResultRequest& req,
                            v1::ReportResultResponse* resp);

  // Operators' view (read-only). Every stored worker, by id.
  absl::StatusOr<std::vector<WorkerStatus>> Workers();
  // True when a connected worker can run tasks that need `need`: a GPU
  // worker (not compile-only) of the arch, or for a compile, any worker of
  // the arch or with it among its compile archs. The job engine asks this
  // to say what a job waits for (JobEngineOptions::worker_available).
  bool WorkerAvailable(const WorkerNeed& need);
  // Logs the workers that went silent (no call within the lease TTL) since
  // the last call; the reaper calls it. A silent worker's next call logs
  // that it is back.
  void NoteDepartures();

  // Tasks were enqueued or requeued: calls ApiOptions::on_tasks, which
  // wakes the long-polling LeaseTask calls.
  void NotifyTasks();
  // From now on SubmitJob and CancelJob answer UNAVAILABLE (ShuttingDown)
  // and GetKernel enqueues no tuning, since the engine is about to stop; the
  // transport ends its long polls (empty) and watch streams (UNAVAILABLE)
  // and answers new ones so at once. Reads and worker reports are still
  // served until the listener closes. Called first thing on shutdown.
  void BeginShutdown();
  bool shutting_down() const { return shutting_down_; }
  // The reaper: returns expired leases to the queue; the number requeued.
  absl::StatusOr<int> RequeueExpired();

 private:
  static absl::Status ShuttingDown();
  struct WorkerInfo {
    WorkerRecord record;         // as registered; last_seen refreshed by heartbeats
    int64_t last_call_ms = 0;    // any call; says the worker is connected
    bool gated = false;          // registered with the memcheck gate
    std::string nvrtc_version;   // as registered
    bool departed = false;       // its silence was logged (NoteDepartures)
    std::optional<ReportedGpuUsage> gpu_usage;  // its last heartbeat's
  };
  int64_t Now() const;
  // The caller's record, refreshing its last call; PERMISSION_DENIED when
  // `declared` (a request's worker_id) is set and names another worker.
  absl::StatusOr<WorkerInfo> Caller(const std::string& caller, const std::string& declared);
  // True when a worker other than `caller` could promote a promotion task
  // of its arch (see ApiOptions::confirm_on_another_worker); with
  // `other_principal`, only a worker of another principal counts (another
  // worker, when either has no principal).
  bool AnotherWorkerCanPromote(const std::string& caller, bool other_principal);
  // The promotion tasks `worker` may lease now.
  PromotionLease PromotionsFor(const WorkerInfo& worker);
  absl::Status FillTask(const TaskRecord& t, v1::Task* out);
  // Decides what the result changes (server/promotion.h) and records it
  // with its follow-ups in one CompleteTask. A RETIME's incumbent timing is
  // eval.incumbent_timing; `incumbent_failed`: the incumbent failed the
  // checks the candidate passed in that run.
  absl::Status DecideAndComplete(const TaskRecord& task, const WorkerInfo& worker,
                                 EvaluationRecord eval, std::string cubin, bool incumbent_failed);
  // The promotion held back for `task`'s bucket (promotion.h,
  // ChooseHeldCandidate) to ask for with this report, if any; clears an
  // EVALUATE's own follow-up from `decision` (held promotions replace it)
  // and notes why a verified candidate waits.
  // In a deterministic bucket only deterministic variants are candidates
  // (`in` says whether the bucket is one, and whether task's variant is).
  absl::StatusOr<std::optional<TaskRecord>> HeldPromotion(const TaskRecord& task,
                                                          const EvaluationRecord& eval,
                                                          const PromotionInput& in,
                                                          PromotionDecision& decision);
  // Whether the stored variant's manifest says it is deterministic.
  absl::StatusOr<bool> VariantIsDeterministic(const std::string& variant_id);
  // Records a task that exhausted max_task_attempts as crashed; `worker`
  // holds its current lease.
  absl::Status GiveUp(const TaskRecord& task, const WorkerInfo& worker);
  // A text a worker reported, as it may be stored and shown: secrets and
  // sessions redacted, at most `cap` bytes.
  std::string Scrub(std::string_view text, size_t cap) const;
  bool Connected(const WorkerInfo& w, int64_t now) const;

  Store* store_;          // must outlive this
  KernelCache* cache_;    // must outlive this
  JobEngine* engine_;     // must outlive this
  ApiOptions options_;

  std::mutex workers_mu_;
  std::map<std::string, WorkerInfo> workers_;   // by id; guarded by workers_mu_
  std::map<std::string, std::string> sessions_;  // session hash -> id; guarded by workers_mu_

  std::atomic<bool> shutting_down_{false};

  // Serializes best decisions: read best, decide, CompleteTask, refresh.
  std::mutex best_mu_;
};

}  // namespace kforge::server
