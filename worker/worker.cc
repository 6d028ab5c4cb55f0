#include "worker/worker.h"

#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

namespace kforge::worker {

Worker::Worker(ServerClient* client, TaskRunner* runner, WorkerOptions options)
    : client_(client),
      runner_(runner),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &system_clock_) {}

Worker::~Worker() {
  Stop();
  if (heartbeat_.joinable()) heartbeat_.join();
}

void Worker::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    if (current_cancel_ != nullptr) current_cancel_->store(true);
  }
  cv_.notify_all();
  client_->Shutdown();  // wakes a blocked long poll
}

WorkerStats Worker::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

Worker::CallFailure Worker::Classify(const absl::Status& status) const {
  switch (status.code()) {
    // The server does not know the session (it lost its database, or the
    // session was never valid) or says the call is not this worker's.
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return CallFailure::kSessionLost;
    // Down or restarting (sessions survive a restart), a deadline: the same
    // session works once the server answers again.
    default:
      return CallFailure::kRetry;
  }
}

bool Worker::SleepFor(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  clock_->WaitFor(lock, cv_, d, [&] { return stopping_; });
  return !stopping_;
}

std::chrono::milliseconds Worker::NextBackoff() {
  backoff_ = backoff_.count() == 0 ? options_.backoff_initial
                                   : std::min(options_.backoff_max, backoff_ * 2);
  // Jitter in [backoff/2, backoff] so a fleet of workers does not reconnect
  // in lockstep after a server restart.
  std::uniform_int_distribution<int64_t> jitter(backoff_.count() / 2, backoff_.count());
  return std::chrono::milliseconds(jitter(rng_));
}

void Worker::ResetBackoff() { backoff_ = std::chrono::milliseconds(0); }

void Worker::DropSession(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (session_ && session_->worker_id == worker_id) {
    session_.reset();
    stats_.worker_id.clear();
  }
}

bool Worker::EnsureSession() {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return false;
      if (session_) return true;
    }
    std::optional<Session> previous;
    {
      std::lock_guard<std::mutex> lock(mu_);
      previous = last_session_;
    }
    absl::StatusOr<Session> session = client_->Register(options_.registration, previous);
    if (session.ok()) {
      const bool resumed = previous && previous->worker_id == session->worker_id;
      {
        std::lock_guard<std::mutex> lock(mu_);
        session_ = *session;
        last_session_ = *session;
        ++stats_.registrations;
        stats_.worker_id = session->worker_id;
      }
      cv_.notify_all();  // the heartbeat thread starts on the new session
      spdlog::info("{} worker {}{} (heartbeat every {} ms, lease ttl {} ms)",
                   resumed ? "resumed the session of" : "registered as", session->worker_id,
                   options_.registration.compile_only ? ", compile-only" : "",
                   session->heartbeat_interval_ms, session->lease_ttl_ms);
      ResetBackoff();
      return true;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.connection_errors;
      if (stopping_) return false;
    }
    const std::chrono::milliseconds wait = NextBackoff();
    spdlog::warn("cannot register with the server: {}; retrying in {} ms",
                 std::string(session.status().message()), wait.count());
    if (!SleepFor(wait)) return false;
  }
}

void Worker::Run() {
  if (!heartbeat_.joinable()) heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  while (EnsureSession()) {
    Session session;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!session_) continue;
      session = *session_;
    }
    std::optional<TaskSpec> next = TakeAhead(session);
    if (!next) {
      absl::StatusOr<std::optional<TaskSpec>> lease =
          client_->LeaseTask(session, options_.lease_wait);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) break;
      }
      if (!lease.ok()) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          ++stats_.connection_errors;
        }
        const bool lost = Classify(lease.status()) == CallFailure::kSessionLost;
        if (lost) DropSession(session.worker_id);
        const std::chrono::milliseconds wait = NextBackoff();
        spdlog::warn("lease failed: {}; {} in {} ms", std::string(lease.status().message()),
                     lost ? "registering again" : "retrying", wait.count());
        if (!SleepFor(wait)) break;
        continue;
      }
      ResetBackoff();
      if (!lease->has_value()) continue;  // long poll ended without work
      next = **lease;
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.tasks_leased;
    }

    const TaskSpec task = *std::move(next);
    std::atomic<bool> cancel{false};
    {
      std::lock_guard<std::mutex> lock(mu_);
      current_task_id_ = task.task_id;
      current_cancel_ = &cancel;
      if (stopping_) cancel.store(true);
    }
    spdlog::info("task {}: {} variant {} (job {})", task.task_id, TaskKindName(task.kind),
                 task.variant.variant_id, task.job_id);
    if (options_.lease_ahead) LeaseAhead(session);
    std::optional<TaskResult> result = runner_->Run(task, cancel);
    {
      std::lock_guard<std::mutex> lock(mu_);
      current_task_id_.clear();
      current_cancel_ = nullptr;
      if (!result) ++stats_.tasks_cancelled;
    }
    if (!result) {
      spdlog::info("task {}: cancelled, not reported", task.task_id);
      continue;
    }
    if (result->worker_fault) {
      ++faults_in_a_row_;
      std::chrono::milliseconds pause = options_.fault_pause_initial;
      for (int i = 1; i < faults_in_a_row_ && pause < options_.fault_pause_max; ++i) pause *= 2;
      pause = std::min(pause, options_.fault_pause_max);
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.worker_faults;
      }
      spdlog::error("task {}: not reported, this worker failed ({} in a row): {}; pausing {} s",
                    task.task_id, faults_in_a_row_, result->message, pause.count() / 1000.0);
      if (!SleepFor(pause)) break;
      continue;
    }
    faults_in_a_row_ = 0;
    spdlog::info("task {}: {}{}{}", task.task_id, OutcomeName(result->outcome),
                 result->message.empty() ? "" : ": ", result->message);
    Report(session, task, *result);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
}

std::optional<TaskSpec> Worker::TakeAhead(const Session& session) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ahead_) return std::nullopt;
  std::optional<TaskSpec> task = std::move(ahead_);
  ahead_.reset();
  if (ahead_cancelled_ || ahead_worker_id_ != session.worker_id) {
    // Its lease is gone or another session's: the server has re-queued it
    // or will once the lease runs out.
    spdlog::info("task {}: leased ahead, dropped unrun ({})", task->task_id,
                 ahead_cancelled_ ? "cancelled by the server" : "its session was lost");
    if (ahead_cancelled_) ++stats_.tasks_cancelled;
    return std::nullopt;
  }
  return task;
}

void Worker::LeaseAhead(const Session& session) {
  absl::StatusOr<std::optional<TaskSpec>> lease =
      client_->LeaseTask(session, std::chrono::milliseconds(0));
  // A failed or empty lease here costs nothing: the loop leases as usual
  // once the current task is done.
  if (!lease.ok() || !lease->has_value()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ahead_ = **lease;
    ahead_worker_id_ = session.worker_id;
    ahead_cancelled_ = false;
    ++stats_.tasks_leased;
    ++stats_.tasks_leased_ahead;
  }
  spdlog::debug("task {}: leased ahead; compiling it meanwhile", (*lease)->task_id);
  runner_->Prepare(**lease);
}

void Worker::Report(const Session& session, const TaskSpec& task, const TaskResult& result) {
  for (int attempt = 1; attempt <= options_.max_report_attempts; ++attempt) {
    absl::Status reported = client_->ReportResult(session, task.task_id, result);
    if (reported.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.results_accepted;
      ResetBackoff();
      return;
    }
    const absl::StatusCode code = reported.code();
    // The server answered and stored nothing: the lease ended or is
    // another's (FAILED_PRECONDITION, PERMISSION_DENIED), the task is gone
    // (NOT_FOUND), the result is not believable (INVALID_ARGUMENT), or the
    // session is unknown (UNAUTHENTICATED). Sending it again changes none.
    const bool refused = code == absl::StatusCode::kNotFound ||
                         code == absl::StatusCode::kFailedPrecondition ||
                         code == absl::StatusCode::kPermissionDenied ||
                         code == absl::StatusCode::kInvalidArgument ||
                         code == absl::StatusCode::kUnauthenticated;
    if (refused) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.results_rejected;
      }
      spdlog::warn("task {}: server refused the result: {}", task.task_id,
                   std::string(reported.message()));
      // Only an unknown session is this worker's to mend; a lost lease is
      // the task's, and the session goes on.
      if (code == absl::StatusCode::kUnauthenticated) DropSession(session.worker_id);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.connection_errors;
    }
    const std::chrono::milliseconds wait = NextBackoff();
    spdlog::warn("task {}: report failed (attempt {}/{}): {}; retrying in {} ms", task.task_id,
                 attempt, options_.max_report_attempts, std::string(reported.message()),
                 wait.count());
    if (!SleepFor(wait)) break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.results_dropped;
  spdlog::warn("task {}: result dropped; the server re-queues the task when its lease expires",
               task.task_id);
}

void Worker::HeartbeatLoop() {
  int64_t failures_in_a_row = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (!session_) {
      // Not a wait on time: EnsureSession and Stop notify.
      cv_.wait(lock, [&] { return stopping_ || session_; });
      continue;
    }
    const std::chrono::milliseconds interval(session_->heartbeat_interval_ms);
    const Session session = *session_;
    const std::string worker_id = session.worker_id;
    // Wait one interval; a new session (re-registration) restarts the wait.
    if (clock_->WaitFor(lock, cv_, interval, [&] {
          return stopping_ || !session_ || session_->worker_id != worker_id;
        })) {
      continue;
    }
    std::vector<std::string> tasks;
    if (!current_task_id_.empty()) tasks.push_back(current_task_id_);
    if (ahead_ && ahead_worker_id_ == worker_id) tasks.push_back(ahead_->task_id);
    lock.unlock();
    const std::optional<gpu::GpuUsage> usage =
        options_.gpu_usage ? options_.gpu_usage() : std::nullopt;
    absl::StatusOr<std::vector<std::string>> cancelled = client_->Heartbeat(session, tasks, usage);
    lock.lock();
    if (!cancelled.ok()) {
      ++stats_.heartbeats_failed;
      ++failures_in_a_row;
      // Every interval while the server is away would flood the log: the
      // 1st, 2nd, 4th, 8th... failure in a row.
      if ((failures_in_a_row & (failures_in_a_row - 1)) == 0) {
        spdlog::warn("heartbeat failed ({} in a row): {}", failures_in_a_row,
                     std::string(cancelled.status().message()));
      }
      // A server that answers but does not know the session means:
      // register again.
      if (Classify(cancelled.status()) == CallFailure::kSessionLost && session_ &&
          session_->worker_id == worker_id) {
        session_.reset();
        stats_.worker_id.clear();
      }
      continue;
    }
    ++stats_.heartbeats_ok;
    failures_in_a_row = 0;
    for (const std::string& id : *cancelled) {
      if (id == current_task_id_ && current_cancel_ != nullptr) {
        spdlog::info("task {}: cancelled by the server", id);
        current_cancel_->store(true);
      }
      if (ahead_ && id == ahead_->task_id) ahead_cancelled_ = true;
    }
  }
}

}  // namespace kforge::worker
