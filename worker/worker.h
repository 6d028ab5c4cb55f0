// Worker: the kforge-worker main loop.
//
//   register → [lease (long poll) → run → report]* ; heartbeats on a thread
//
// The worker never gives up on the server: a failed Register or a dropped
// connection lead to waiting with exponential backoff. Its session (the
// token Register issued, sent with every call) survives a server restart, so
// an unreachable server is waited for with the session kept; only a server
// that answers that it does not know the session (UNAUTHENTICATED) or that
// the call is not this worker's (PERMISSION_DENIED) makes the worker
// register again, presenting its last session so that a server that still
// knows it keeps the worker id and its leases. A result whose report fails
// to arrive is retried (same session: it is that worker's lease) until the
// server answers; a report the server refuses (lease ended or not ours,
// timing below the floor, ...) is dropped, as the server stored nothing.
//
// A task the worker itself failed (TaskResult::worker_fault) is not reported:
// its lease expires and the server hands it out again; the worker pauses,
// longer with each such fault in a row.
//
// Heartbeats go out every heartbeat_interval_ms the server asked for, naming
// the task in progress (renewing its lease); a task the server reports
// cancelled is stopped (its child killed) and not reported.
//
// Lease-ahead: when a task starts, the worker leases the next one without
// waiting and has the runner start compiling it (TaskRunner::Prepare), so
// NVRTC on the CPU overlaps the evaluation on the GPU. The task leased
// ahead is heartbeated like the one in progress and runs next; cancelled
// meanwhile, or leased under a session since lost, it is dropped unrun.
//
// Thread-safety: Run() on one thread; Stop() and stats() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "core/clock.h"
#include "worker/rpc_client.h"
#include "worker/task.h"
#include "worker/task_runner.h"

namespace kforge::worker {

struct WorkerOptions {
  Registration registration;
  std::chrono::milliseconds lease_wait{20000};  // long poll
  std::chrono::milliseconds backoff_initial{250};
  std::chrono::milliseconds backoff_max{10000};
  int max_report_attempts = 8;
  // After a task the worker itself failed (TaskResult::worker_fault), it
  // pauses before leasing again: this long, doubling with each fault in a
  // row up to the maximum. A broken GPU thus never turns the queue into a
  // row of false results, and a recovered one resumes by itself.
  std::chrono::milliseconds fault_pause_initial{5000};
  std::chrono::milliseconds fault_pause_max{600000};
  // Lease one task ahead of the one running (see the top of this file).
  bool lease_ahead = true;
  // What the waits on time (heartbeat intervals, backoffs, fault pauses)
  // wait on; must outlive the Worker. Null: the system's clock. Tests pass
  // a ManualClock and move time themselves.
  Clock* clock = nullptr;
  // What the GPU is doing, sent with every heartbeat (nullopt: unknown, and
  // nothing is sent). Empty: no GPU to ask (compile-only). Called on the
  // heartbeat thread.
  std::function<std::optional<gpu::GpuUsage>()> gpu_usage;
};

struct WorkerStats {
  int64_t registrations = 0;
  int64_t tasks_leased = 0;
  int64_t tasks_leased_ahead = 0;  // of tasks_leased, those leased while another ran
  int64_t results_accepted = 0;
  int64_t results_rejected = 0;  // refused by the server (lease ended, not ours, invalid)
  int64_t results_dropped = 0;   // could not be reported at all
  int64_t tasks_cancelled = 0;
  int64_t worker_faults = 0;  // tasks not reported: the worker failed, not the candidate
  int64_t heartbeats_ok = 0;
  int64_t heartbeats_failed = 0;
  int64_t connection_errors = 0;
  std::string worker_id;  // current session's ("" between sessions)
};

class Worker {
 public:
  // `client` and `runner` must outlive the Worker.
  Worker(ServerClient* client, TaskRunner* runner, WorkerOptions options);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Serves until Stop(); returns then. A task in progress when Stop() comes
  // is cancelled (its lease expires on the server and it is re-queued).
  void Run();
  void Stop();

  WorkerStats stats() const;

 private:
  enum class CallFailure { kRetry, kSessionLost };
  // How the loop reacts to a failed RPC: register again only when the
  // server says the session is not (or no longer) this worker's; anything
  // else (server down, deadline) is retried on the same session.
  CallFailure Classify(const absl::Status& status) const;

  bool EnsureSession();  // false: stopping
  void Report(const Session& session, const TaskSpec& task, const TaskResult& result);
  void HeartbeatLoop();
  // Waits `d` on the clock or until Stop(); false when stopping.
  bool SleepFor(std::chrono::milliseconds d);
  std::chrono::milliseconds NextBackoff();
  void ResetBackoff();
  void DropSession(const std::string& worker_id);
  // The task leased ahead, when it is still this session's to run.
  std::optional<TaskSpec> TakeAhead(const Session& session);
  // Leases the next task without waiting and starts preparing it.
  void LeaseAhead(const Session& session);

  ServerClient* const client_;  // must outlive this
  TaskRunner* const runner_;    // must outlive this
  const WorkerOptions options_;
  SystemClock system_clock_;
  Clock* const clock_;  // options_.clock or &system_clock_

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;              // guarded by mu_
  std::optional<Session> session_;     // guarded by mu_
  // The last session held, presented when registering again.
  std::optional<Session> last_session_;  // guarded by mu_
  std::string current_task_id_;        // guarded by mu_
  std::atomic<bool>* current_cancel_ = nullptr;  // guarded by mu_
  std::optional<TaskSpec> ahead_;      // guarded by mu_
  std::string ahead_worker_id_;        // the session it was leased under; guarded by mu_
  bool ahead_cancelled_ = false;       // guarded by mu_
  WorkerStats stats_;                  // guarded by mu_
  std::chrono::milliseconds backoff_{0};  // task loop only
  int faults_in_a_row_ = 0;               // task loop only
  std::mt19937_64 rng_{std::random_device{}()};  // task loop only
  std::thread heartbeat_;
};

}  // namespace kforge::worker
