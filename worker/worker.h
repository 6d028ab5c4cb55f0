// Worker: the kforge-worker main loop.
//
//   register → [lease (long poll) → run → report]* ; heartbeats on a thread
//
// The worker never gives up on the server: a failed Register, a dropped
// connection, a restarted server (which may no longer know this worker's id)
// all lead to waiting with exponential backoff and registering again. A
// result whose report fails is retried (same worker id, it is that id's
// lease) until the server answers or says it no longer knows the worker.
//
// A task the worker itself failed (TaskResult::worker_fault) is not reported:
// its lease expires and the server hands it out again; the worker pauses,
// longer with each such fault in a row.
//
// Heartbeats go out every heartbeat_interval_ms the server asked for, naming
// the task in progress (renewing its lease); a task the server reports
// cancelled is stopped (its child killed) and not reported.
//
// Thread-safety: Run() on one thread; Stop() and stats() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>

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
};

struct WorkerStats {
  int64_t registrations = 0;
  int64_t tasks_leased = 0;
  int64_t results_accepted = 0;
  int64_t results_rejected = 0;  // lease had expired
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
  // How the loop reacts to a failed RPC: re-register unless the failure is
  // clearly transient on a live session (a long poll's deadline).
  CallFailure Classify(const absl::Status& status) const;

  bool EnsureSession();  // false: stopping
  void Report(const Session& session, const TaskSpec& task, const TaskResult& result);
  void HeartbeatLoop();
  // Sleeps `d` or until Stop(); false when stopping.
  bool SleepFor(std::chrono::milliseconds d);
  std::chrono::milliseconds NextBackoff();
  void ResetBackoff();
  void DropSession(const std::string& worker_id);

  ServerClient* const client_;  // must outlive this
  TaskRunner* const runner_;    // must outlive this
  const WorkerOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;              // guarded by mu_
  std::optional<Session> session_;     // guarded by mu_
  std::string current_task_id_;        // guarded by mu_
  std::atomic<bool>* current_cancel_ = nullptr;  // guarded by mu_
  WorkerStats stats_;                  // guarded by mu_
  std::chrono::milliseconds backoff_{0};  // task loop only
  int faults_in_a_row_ = 0;               // task loop only
  std::mt19937_64 rng_{std::random_device{}()};  // task loop only
  std::thread heartbeat_;
};

}  // namespace kforge::worker
