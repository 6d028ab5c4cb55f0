// JobEngine: turns a tuning job into rounds of evaluation tasks.
//
// A job names shapes, a proposer and a budget. The engine groups the shapes
// by bucket; for each bucket it asks a fresh Proposer (built by the injected
// factory with the job's seed) for a few candidates, stores them as variants,
// enqueues one EVALUATE task per candidate and, as workers report, feeds each
// result back with Observe() and asks for the next round. A bucket is done
// when its variant budget is spent or its proposer has nothing more to offer;
// the job is done when every bucket is done and no task of it is
// outstanding (CONFIRM and RETIME tasks included, so the job's final best is
// settled).
//
// Durability: everything a job needs to continue lives in the Store (the job
// record, its variants, tasks and evaluations). Resume() rebuilds the
// proposers after a restart by replaying Remember()/Observe() in the order
// the events originally happened; progress is recomputed from the tasks, so
// a progress_json written just before a crash cannot mislead it.
//
// Threading: all proposer calls and job-state changes run on the engine's
// own thread (a strand), because proposers are not thread-safe; RPC threads
// only post work to it. Public methods are thread-safe.
//
// Asynchronous proposers (agent/proposer.h; the model's): the engine hands
// each one a wake function (SetWake) that posts the bucket's job back onto
// the strand, and then keeps up to candidates_per_round EVALUATE tasks of
// the bucket outstanding instead of proposing in lockstep rounds: it asks
// again whenever a result comes back or the proposer wakes it, so requests
// to the model overlap the workers' evaluations and one slow model does not
// hold up other jobs. A synchronous proposer (the builtin) keeps the rounds.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/proposer.h"
#include "core/clock.h"
#include "core/shape.h"
#include "storage/store.h"

namespace kforge::server {

// Builds a proposer by name ("builtin", "model") for one job and bucket.
// NOT_FOUND / INVALID_ARGUMENT for unknown names; main() decides which exist.
using ProposerFactory = std::function<absl::StatusOr<std::unique_ptr<agent::Proposer>>(
    const std::string& name, uint64_t seed)>;

inline constexpr int kDefaultMaxVariants = 16;
inline constexpr int kMaxVariantsLimit = 10000;

// The exact batch a job's shape was given as offsets (cu_seqlens). Workers
// time every candidate of its bucket on it, so a tuning job can tune for a
// user's real length distribution, not just its statistics. Empty: none.
struct ShapeLengths {
  std::vector<int32_t> cu_q;
  std::vector<int32_t> cu_k;  // cross-attention only
  bool empty() const { return cu_q.empty(); }
};

// What a client submitted, as stored in JobRecord::spec_json.
struct JobSpec {
  std::string name;
  std::vector<ShapeKey> shapes;  // validated
  std::vector<ShapeLengths> lengths;  // parallel to `shapes` when any was given
  std::string proposer = "builtin";
  int max_variants = kDefaultMaxVariants;  // per bucket
  int max_seconds = 0;                     // 0: no limit
  int64_t max_tokens = 0;                  // 0: no limit
  double max_cost_usd = 0;                 // model proposers: estimated cost; 0: no limit
  uint64_t seed = 0;
  bool compile_only = false;  // kCompile tasks instead of kEvaluate; no best is chosen
};

struct BucketProgress {
  std::string bucket;
  int proposed = 0;
  int evaluated = 0;
  int verified = 0;
  int failed = 0;
  int compiled = 0;  // compiled and not run (compile-only jobs)
  std::string best_variant_id;  // best of this job's candidates on the bucket
  Timing best_timing;
};

// A job as the API shows it: the record plus its decoded spec and progress.
struct JobView {
  JobRecord record;
  JobSpec spec;
  std::vector<BucketProgress> progress;
  // "waiting for a worker of arch sm_100a" while no connected worker can
  // run the job's open tasks (JobEngine::WaitingFor); "" otherwise.
  std::string waiting_for;
};

std::string EncodeJobSpec(const JobSpec& spec);
absl::StatusOr<JobSpec> DecodeJobSpec(const std::string& json);
// Shape keys travel inside TaskRecord::shape_json in the same encoding.
std::string EncodeShapeKey(const ShapeKey& key);
// A task's shape JSON: the key and the exact offsets it carries, if any.
struct TaskShape {
  ShapeKey key;
  ShapeLengths lengths;
};
absl::StatusOr<TaskShape> DecodeTaskShape(const std::string& json);
absl::StatusOr<JobView> DecodeJob(const JobRecord& record);

bool IsFinal(JobState s);

// How the message of the crashed result that stands for a task no worker
// answered begins (KforgeApi::GiveUp writes it, the engine counts it).
inline constexpr std::string_view kGivenUpPrefix = "given up:";

struct JobEvent {
  JobView job;
  std::string message;  // what happened
  bool final = false;   // the job reached a final state: no event follows
};

// What a job's open tasks need of a worker: its arch, and a GPU (EVALUATE,
// CONFIRM, RETIME) or a compiler only (COMPILE).
struct WorkerNeed {
  std::string arch;
  bool gpu = true;
};

// "waiting for a worker of arch sm_100a" / "... a GPU worker of arch sm_90a"
// for the needs no connected worker meets.
std::string WaitingMessage(const std::vector<WorkerNeed>& unmet);

struct JobEngineOptions {
  int candidates_per_round = 4;  // per bucket
  // A proposer answering UNAVAILABLE (model endpoint down, rate limited) is
  // asked again after base, 2x base, ... up to this many times; then the
  // bucket fails. RESOURCE_EXHAUSTED (budget spent) ends the bucket as done.
  int max_proposer_retries = 5;
  int64_t proposer_retry_base_ms = 15000;
  // Called after tasks were enqueued, so long-polling LeaseTask calls wake up.
  std::function<void()> on_tasks_enqueued;
  // What time budgets, proposer retries and the engine's tick read and wait
  // on; must outlive the engine. Null: the system's clock. A job's
  // created_unix_ms, from which its time budget runs, is this clock's.
  Clock* clock = nullptr;
  // Whether a connected worker can run tasks that need `need` (the server
  // asks the api, which knows the workers). Empty: every need is met. Called
  // on the engine thread about once a second per active job and bucket.
  std::function<bool(const WorkerNeed&)> worker_available;
  // A job that has waited this long for a worker that can run its open
  // tasks fails, saying what it waited for. 0: it waits as long as it takes.
  int64_t stuck_timeout_ms = 0;
};

class JobEngine {
 public:
  // `store` must outlive the engine.
  JobEngine(Store* store, ProposerFactory factory, JobEngineOptions options);
  ~JobEngine();  // Stop()s
  JobEngine(const JobEngine&) = delete;
  JobEngine& operator=(const JobEngine&) = delete;

  // Starts the engine thread and resumes the store's active jobs on it, in
  // the background: Start returns once it knows which buckets they tune
  // (ActiveJobForBucket), before any proposer is asked anything. An error
  // only when the store cannot list them.
  absl::Status Start();
  // Blocks until the jobs active at Start were resumed (or the engine
  // stopped). For tests and tools; serving needs no wait.
  void WaitUntilResumed();
  // Ends the engine thread; watchers get a last (non-final) event and are
  // dropped. Idempotent.
  void Stop();

  // Validates nothing about shapes (the caller did); checks the proposer
  // name by building one. Returns the created job.
  absl::StatusOr<JobView> Submit(JobSpec spec);
  absl::StatusOr<JobView> Get(const std::string& job_id);
  // Cancels a queued/running job (its outstanding tasks too); a final job is
  // returned unchanged.
  absl::StatusOr<JobView> Cancel(const std::string& job_id, const std::string& why);

  // A worker's accepted result for `task` (after Store::CompleteTask).
  void OnTaskCompleted(const TaskRecord& task, const EvaluationRecord& eval);
  // A result enqueued a promotion task (CONFIRM or RETIME) for `job_id`,
  // which must wait for it. Called before OnTaskCompleted of that result.
  void OnPromotionEnqueued(const std::string& job_id, const std::string& task_id);

  // Watching: `fn` runs on the engine thread for every event of the job
  // until it reached a final state or Unwatch(); keep it short and
  // non-blocking. Returns 0 when the job is unknown.
  using WatchFn = std::function<void(const JobEvent&)>;
  uint64_t Watch(const std::string& job_id, WatchFn fn);
  void Unwatch(uint64_t watch_id);

  // Active job that is tuning `bucket_id`, if any (for GetKernel's
  // tune_if_untuned, so repeated requests do not pile up jobs).
  std::optional<std::string> ActiveJobForBucket(const std::string& bucket_id);

  // What the active job waits for (JobView::waiting_for); "" when a
  // connected worker can run each of its open tasks, or it is not active.
  std::string WaitingFor(const std::string& job_id);

 private:
  struct BucketState;
  struct JobState;

  void Post(std::function<void()> fn);
  void Loop();
  void Tick();
  // The needs of the job's open tasks that no connected worker meets.
  std::vector<WorkerNeed> UnmetNeeds(JobState& job);
  // Updates what the job waits for; fails it past stuck_timeout_ms.
  void CheckWaiting(JobState& job);
  void ResumeAll(const std::vector<JobRecord>& active);
  absl::Status ResumeJob(const JobRecord& record);
  void Advance(JobState& job);
  void ProposeRound(JobState& job, BucketState& bucket);
  void Finish(JobState& job, kforge::JobState state, const std::string& message);
  // Finishes a job that ran out of work, budget or time: SUCCEEDED, or
  // FAILED when every result it got was a crash (given-up tasks included).
  void FinishDone(JobState& job, const std::string& message);
  void HandleCompleted(const TaskRecord& task, const EvaluationRecord& eval);
  void Wake(const std::string& job_id);
  void RefreshTokens(JobState& job);
  void Persist(JobState& job, const std::string& message);
  JobView ViewOf(const JobState& job) const;
  void Notify(const JobState& job, const std::string& message, bool final);
  int64_t NowMs() const { return clock_->UnixMs(); }

  Store* store_;  // must outlive the engine
  ProposerFactory factory_;
  JobEngineOptions options_;
  SystemClock system_clock_;
  Clock* const clock_;  // options_.clock or &system_clock_

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<std::function<void()>> queue_;  // guarded by queue_mu_
  bool stopping_ = false;                    // guarded by queue_mu_
  bool resumed_ = false;                     // guarded by queue_mu_
  std::thread thread_;

  // Only touched on the engine thread.
  std::map<std::string, std::unique_ptr<JobState>> jobs_;

  std::mutex watch_mu_;
  struct Watcher {
    std::string job_id;
    WatchFn fn;
  };
  std::map<uint64_t, Watcher> watchers_;  // guarded by watch_mu_
  uint64_t next_watch_id_ = 1;            // guarded by watch_mu_
  std::map<std::string, std::string> active_buckets_;  // bucket -> job; guarded by watch_mu_
  std::map<std::string, std::string> waiting_;  // job -> what it waits for; guarded by watch_mu_
};

}  // namespace kforge::server
