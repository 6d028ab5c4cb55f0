#include "server/jobs.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <future>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/logging.h"
#include "core/outcome.h"
#include "core/shape_json.h"
#include "server/promotion.h"

namespace kforge::server {

// The engine's per-bucket view of a job. Counters mirror BucketProgress.
struct JobEngine::BucketState {
  Bucket bucket;
  std::string id;
  ShapeKey shape;  // the first submitted shape of the bucket represents it
  ShapeLengths lengths;  // and its exact offsets, when it had any
  std::unique_ptr<agent::Proposer> proposer;
  BucketProgress progress;
  int outstanding = 0;  // EVALUATE tasks queued or leased
  int rounds = 0;       // rounds proposed so far
  int retries = 0;      // consecutive UNAVAILABLE answers from the proposer
  int64_t retry_at_ms = 0;  // > 0: ask the proposer again at this time
  bool exhausted = false;
  bool async = false;   // the proposer works in the background (SetWake)
  std::string error;  // the proposer failed; the bucket proposes no more
  int crashed = 0;    // results that were crashes, given-up tasks included
  int given_up = 0;   // tasks no worker answered (max_task_attempts leases)
  std::map<std::string, agent::Candidate> candidates;  // by variant id
};

struct JobEngine::JobState {
  JobRecord record;
  JobSpec spec;
  std::vector<BucketState> buckets;
  std::map<std::string, size_t> task_bucket;  // EVALUATE task id -> bucket index
  // Outstanding CONFIRM/RETIME task ids -> their arch ("" until looked up).
  std::map<std::string, std::string> promotions;
  int64_t deadline_ms = 0;                    // 0: none
  uint64_t tasks_made = 0;                    // for per-task seeds
  bool finished = false;
  std::string waiting;             // what no connected worker can run; "" for nothing
  int64_t waiting_since_ms = 0;    // when `waiting` was last set from ""
  int64_t next_wait_check_ms = 0;  // CheckWaiting runs about once a second
};

namespace {

using nlohmann::json;

// A bucket's crashes, and among them the tasks no worker answered.
void CountCrash(auto& bucket, const EvaluationRecord& e) {
  auto& b = bucket;
  if (e.outcome != Outcome::kCrashed) return;
  b.crashed++;
  if (std::string_view(e.message).starts_with(kGivenUpPrefix)) b.given_up++;
}

// Fresh, reproducible per-task seeds from the job's seed.
uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Task ids are "t<n>"; ordering them numerically is ordering them by creation.
int64_t IdNumber(const std::string& id) {
  int64_t n = 0;
  if (id.size() > 1) std::from_chars(id.data() + 1, id.data() + id.size(), n);
  return n;
}

// A stored shape that does not decode is lost data, not a bad request.
absl::StatusOr<ShapeKey> StoredShape(const json& j) {
  auto k = ShapeKeyFromJson(j);
  if (!k.ok()) return absl::DataLossError(fmt::format("stored {}", std::string(k.status().message())));
  return k;
}

json ProgressToJson(const std::vector<BucketProgress>& progress) {
  json out = json::array();
  for (const auto& p : progress) {
    out.push_back(json{{"bucket", p.bucket},
                       {"proposed", p.proposed},
                       {"evaluated", p.evaluated},
                       {"verified", p.verified},
                       {"failed", p.failed},
                       {"compiled", p.compiled},
                       {"best_variant_id", p.best_variant_id},
                       {"best_median_us", p.best_timing.median_us},
                       {"best_min_us", p.best_timing.min_us},
                       {"best_max_us", p.best_timing.max_us},
                       {"best_samples", p.best_timing.samples},
                       {"best_p25_us", p.best_timing.p25_us},
                       {"best_p75_us", p.best_timing.p75_us}});
  }
  return out;
}

std::vector<BucketProgress> ProgressFromJson(const std::string& text) {
  std::vector<BucketProgress> out;
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) return out;
  for (const auto& e : j) {
    if (!e.is_object()) continue;
    BucketProgress p;
    p.bucket = e.value("bucket", "");
    p.proposed = e.value("proposed", 0);
    p.evaluated = e.value("evaluated", 0);
    p.verified = e.value("verified", 0);
    p.failed = e.value("failed", 0);
    p.compiled = e.value("compiled", 0);
    p.best_variant_id = e.value("best_variant_id", "");
    p.best_timing.median_us = e.value("best_median_us", 0.0);
    p.best_timing.min_us = e.value("best_min_us", 0.0);
    p.best_timing.max_us = e.value("best_max_us", 0.0);
    p.best_timing.samples = e.value("best_samples", 0);
    p.best_timing.p25_us = e.value("best_p25_us", 0.0);
    p.best_timing.p75_us = e.value("best_p75_us", 0.0);
    out.push_back(std::move(p));
  }
  return out;
}

agent::Candidate CandidateOf(const VariantRecord& v) {
  agent::Candidate c;
  c.source = v.source;
  c.manifest_json = v.manifest_json;
  c.origin = v.origin;
  c.template_name = v.template_name;
  c.knobs_json = v.knobs_json;
  c.model = v.model;
  c.prompt = v.prompt;
  c.answer = v.answer;
  c.prompt_hash = v.prompt_hash;
  c.parent_id = v.parent_id;
  c.kind = v.kind;
  c.attempt = v.attempt;
  c.normalized_hash = v.normalized_hash;
  c.provenance_json = v.provenance_json;
  return c;
}

agent::Feedback FeedbackOf(const std::string& variant_id, const agent::Candidate& c,
                           const EvaluationRecord& e) {
  agent::Feedback f;
  f.variant_id = variant_id;
  f.candidate = c;
  f.outcome = e.outcome;
  f.median_us = e.timing.median_us;
  f.spread_us = e.timing.Spread();
  f.rel_l2_error = e.rel_l2_error;
  f.max_abs_error = e.max_abs_error;
  f.message = e.message;
  f.bucket = e.bucket;
  f.registers = e.registers;
  f.spill_bytes = e.spill_bytes;
  f.static_smem_bytes = e.static_smem_bytes;
  f.dynamic_smem_bytes = e.dynamic_smem_bytes;
  f.cubin_hash = e.cubin_hash;
  return f;
}

}  // namespace

std::string WaitingMessage(const std::vector<WorkerNeed>& unmet) {
  std::vector<std::string> parts;
  for (const WorkerNeed& n : unmet) {
    std::string part =
        fmt::format("{} of arch {}", n.gpu ? "a GPU worker" : "a worker", n.arch);
    if (std::find(parts.begin(), parts.end(), part) == parts.end()) parts.push_back(part);
  }
  if (parts.empty()) return "";
  std::string out = "waiting for " + parts[0];
  for (size_t i = 1; i < parts.size(); ++i)
    out += (i + 1 == parts.size() ? " and " : ", ") + parts[i];
  return out;
}

bool IsFinal(JobState s) {
  return s == JobState::kSucceeded || s == JobState::kFailed || s == JobState::kCancelled;
}

std::string EncodeShapeKey(const ShapeKey& key) { return ShapeKeyToJson(key).dump(); }

namespace {

void PutLengths(const ShapeLengths& l, json& j) {
  if (l.empty()) return;
  j["cu_seqlens_q"] = l.cu_q;
  if (!l.cu_k.empty()) j["cu_seqlens_k"] = l.cu_k;
}

// Offsets were validated on submission; stored ones that do not decode are lost data.
absl::StatusOr<ShapeLengths> GetLengths(const json& j) {
  ShapeLengths l;
  try {
    if (j.contains("cu_seqlens_q")) l.cu_q = j.at("cu_seqlens_q").get<std::vector<int32_t>>();
    if (j.contains("cu_seqlens_k")) l.cu_k = j.at("cu_seqlens_k").get<std::vector<int32_t>>();
  } catch (const json::exception& e) {
    return absl::DataLossError(fmt::format("stored shape offsets: {}", e.what()));
  }
  return l;
}

}  // namespace

absl::StatusOr<TaskShape> DecodeTaskShape(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::DataLossError("stored shape is not JSON");
  auto key = StoredShape(j);
  if (!key.ok()) return key.status();
  auto lengths = GetLengths(j);
  if (!lengths.ok()) return lengths.status();
  return TaskShape{*std::move(key), *std::move(lengths)};
}

std::string EncodeJobSpec(const JobSpec& spec) {
  json shapes = json::array();
  for (size_t i = 0; i < spec.shapes.size(); ++i) {
    json s = ShapeKeyToJson(spec.shapes[i]);
    if (i < spec.lengths.size()) PutLengths(spec.lengths[i], s);
    shapes.push_back(std::move(s));
  }
  return json{{"name", spec.name},
              {"proposer", spec.proposer},
              {"max_variants", spec.max_variants},
              {"max_seconds", spec.max_seconds},
              {"max_tokens", spec.max_tokens},
              {"max_cost_usd", spec.max_cost_usd},
              {"seed", spec.seed},
              {"compile_only", spec.compile_only},
              {"shapes", shapes}}
      .dump();
}

absl::StatusOr<JobSpec> DecodeJobSpec(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::DataLossError("job spec is not JSON");
  try {
    JobSpec s;
    s.name = j.value("name", "");
    s.proposer = j.value("proposer", "builtin");
    s.max_variants = j.value("max_variants", kDefaultMaxVariants);
    s.max_seconds = j.value("max_seconds", 0);
    s.max_tokens = j.value("max_tokens", int64_t{0});
    s.max_cost_usd = j.value("max_cost_usd", 0.0);
    s.seed = j.value("seed", uint64_t{0});
    s.compile_only = j.value("compile_only", false);
    bool any_lengths = false;
    for (const auto& e : j.at("shapes")) {
      auto k = StoredShape(e);
      if (!k.ok()) return k.status();
      s.shapes.push_back(*std::move(k));
      auto l = GetLengths(e);
      if (!l.ok()) return l.status();
      any_lengths = any_lengths || !l->empty();
      s.lengths.push_back(*std::move(l));
    }
    if (!any_lengths) s.lengths.clear();
    return s;
  } catch (const json::exception& e) {
    return absl::DataLossError(fmt::format("job spec is malformed: {}", e.what()));
  }
}

absl::StatusOr<JobView> DecodeJob(const JobRecord& record) {
  JobView v;
  v.record = record;
  auto spec = DecodeJobSpec(record.spec_json);
  if (!spec.ok()) return spec.status();
  v.spec = *std::move(spec);
  v.progress = ProgressFromJson(record.progress_json);
  return v;
}

JobEngine::JobEngine(Store* store, ProposerFactory factory, JobEngineOptions options)
    : store_(store),
      factory_(std::move(factory)),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &system_clock_) {}

JobEngine::~JobEngine() { Stop(); }

absl::Status JobEngine::Start() {
  auto active = store_->ListActiveJobs();
  if (!active.ok()) return active.status();
  // Which buckets the active jobs tune, known before the first call:
  // GetKernel's tune_if_untuned must not start a second job for a bucket
  // whose job is not rebuilt yet. Decoding specs calls no proposer.
  {
    std::lock_guard lock(watch_mu_);
    for (const JobRecord& rec : *active) {
      absl::StatusOr<JobSpec> spec = DecodeJobSpec(rec.spec_json);
      if (!spec.ok()) continue;  // ResumeJob fails the job
      for (const ShapeKey& s : spec->shapes) active_buckets_[BucketOf(s).Id()] = rec.id;
    }
  }
  thread_ = std::thread([this] { Loop(); });
  // The replay asks proposers (a model's, over HTTP) and reads every job's
  // history: it runs on the engine thread, after the server listens, so that
  // a restart with many jobs or a hanging endpoint cannot keep the server
  // down. Work posted later (results, cancels) queues behind it; GetJob reads
  // the store meanwhile.
  Post([this, jobs = *std::move(active)] {
    ResumeAll(jobs);
    {
      std::lock_guard lock(queue_mu_);
      resumed_ = true;
    }
    queue_cv_.notify_all();
  });
  return absl::OkStatus();
}

void JobEngine::WaitUntilResumed() {
  std::unique_lock lock(queue_mu_);
  queue_cv_.wait(lock, [&] { return resumed_ || stopping_; });
}

void JobEngine::Stop() {
  {
    std::lock_guard lock(queue_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::map<uint64_t, Watcher> watchers;
  {
    std::lock_guard lock(watch_mu_);
    watchers.swap(watchers_);
  }
  // Watch streams end cleanly on shutdown: a last event tells them why.
  for (auto& [id, w] : watchers) {
    JobEvent ev;
    ev.job.record.id = w.job_id;
    ev.message = "server shutting down";
    ev.final = true;
    w.fn(ev);
  }
}

void JobEngine::Post(std::function<void()> fn) {
  {
    std::lock_guard lock(queue_mu_);
    queue_.push_back(std::move(fn));
  }
  queue_cv_.notify_one();
}

void JobEngine::Loop() {
  Clock::TimePoint next_tick = clock_->Now();
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock lock(queue_mu_);
      clock_->WaitUntil(lock, queue_cv_, next_tick, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      if (!queue_.empty()) {
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
    }
    if (fn) fn();
    // The next tick is due 250 ms after this one began, not after it ended:
    // time that passes during a tick (a test advancing its clock) counts.
    if (const Clock::TimePoint now = clock_->Now(); now >= next_tick) {
      Tick();
      next_tick = now + std::chrono::milliseconds(250);
    }
  }
}

void JobEngine::Tick() {
  // Time budgets end without any task completing; check them here. So do
  // the workers a job waits for: they come and go between its events.
  const int64_t now = NowMs();
  for (auto& [id, job] : jobs_) {
    bool due = job->deadline_ms > 0 && now >= job->deadline_ms;
    for (const auto& b : job->buckets) due |= b.retry_at_ms > 0 && now >= b.retry_at_ms;
    if (due) Advance(*job);
    if (!job->finished && now >= job->next_wait_check_ms) {
      job->next_wait_check_ms = now + 1000;
      CheckWaiting(*job);
    }
  }
  std::erase_if(jobs_, [](const auto& kv) { return kv.second->finished; });
}

std::vector<WorkerNeed> JobEngine::UnmetNeeds(JobState& job) {
  std::vector<WorkerNeed> needs;
  for (const auto& b : job.buckets)
    if (b.outstanding > 0) needs.push_back({b.bucket.arch, !job.spec.compile_only});
  for (auto& [task_id, arch] : job.promotions) {
    if (arch.empty()) {
      // Enqueued by a report (OnPromotionEnqueued names the id only).
      auto t = store_->GetTask(task_id);
      if (!t.ok()) continue;
      arch = t->arch;
    }
    needs.push_back({arch, true});
  }
  std::vector<WorkerNeed> unmet;
  if (!options_.worker_available) return unmet;
  for (const WorkerNeed& n : needs)
    if (!options_.worker_available(n)) unmet.push_back(n);
  return unmet;
}

void JobEngine::CheckWaiting(JobState& job) {
  const std::string waiting = WaitingMessage(UnmetNeeds(job));
  const int64_t now = NowMs();
  if (waiting != job.waiting) {
    const bool started = job.waiting.empty();
    job.waiting = waiting;
    if (started) job.waiting_since_ms = now;
    {
      std::lock_guard lock(watch_mu_);
      if (waiting.empty()) waiting_.erase(job.record.id);
      else waiting_[job.record.id] = waiting;
    }
    if (waiting.empty()) {
      LogEvent(spdlog::level::info, "job_unblocked", {{"job", job.record.id}},
               fmt::format("job {}: a connected worker can run its tasks again", job.record.id));
      Persist(job, "a connected worker can run its tasks");
    } else {
      LogEvent(spdlog::level::warn, "job_waiting",
               {{"job", job.record.id}, {"waiting_for", waiting}},
               fmt::format("job {}: {} (no connected worker can run its open tasks)",
                           job.record.id, waiting));
      Persist(job, waiting);
    }
  }
  if (!job.waiting.empty() && options_.stuck_timeout_ms > 0 &&
      now - job.waiting_since_ms >= options_.stuck_timeout_ms) {
    if (auto c = store_->CancelTasks(job.record.id); !c.ok())
      spdlog::error("job {}: cancelling tasks: {}", job.record.id, std::string(c.status().message()));
    // The configured timeout, not the time measured: checks run once a
    // second, and the message should not depend on when one fell.
    Finish(job, kforge::JobState::kFailed,
           fmt::format("{} for {:g} s: no connected worker can run its tasks", job.waiting,
                       static_cast<double>(options_.stuck_timeout_ms) / 1000.0));
  }
}

absl::StatusOr<JobView> JobEngine::Submit(JobSpec spec) {
  if (spec.shapes.empty()) return absl::InvalidArgumentError("shapes: at least one is needed");
  if (spec.proposer.empty()) spec.proposer = "builtin";
  if (spec.max_variants == 0) spec.max_variants = kDefaultMaxVariants;
  // Building one proposer up front turns an unknown name into an error for
  // the caller instead of a failed job.
  if (auto p = factory_(spec.proposer, spec.seed); !p.ok()) {
    return absl::InvalidArgumentError(
        fmt::format("proposer: '{}' is not available: {}", spec.proposer, std::string(p.status().message())));
  }
  JobRecord rec;
  rec.name = spec.name;
  // The time budget runs from here, on the engine's clock.
  rec.created_unix_ms = rec.updated_unix_ms = NowMs();
  rec.state = kforge::JobState::kRunning;
  rec.proposer = spec.proposer;
  rec.spec_json = EncodeJobSpec(spec);
  rec.seed = spec.seed;
  std::vector<BucketProgress> progress;
  for (const auto& s : spec.shapes) {
    const std::string id = BucketOf(s).Id();
    if (std::none_of(progress.begin(), progress.end(),
                     [&](const BucketProgress& p) { return p.bucket == id; })) {
      progress.push_back(BucketProgress{.bucket = id});
    }
  }
  rec.progress_json = ProgressToJson(progress).dump();
  auto id = store_->CreateJob(rec);
  if (!id.ok()) return id.status();
  auto stored = store_->GetJob(*id);
  if (!stored.ok()) return stored.status();
  LogEvent(spdlog::level::info, "job_submitted",
           {{"job", *id},
            {"name", spec.name},
            {"buckets", progress.size()},
            {"proposer", spec.proposer},
            {"max_variants", spec.max_variants},
            {"compile_only", spec.compile_only}},
           fmt::format("job {} submitted: '{}', {} bucket(s), proposer {}, {} variants a bucket{}",
                       *id, spec.name, progress.size(), spec.proposer, spec.max_variants,
                       spec.compile_only ? ", compile only" : ""));
  {
    std::lock_guard lock(watch_mu_);
    for (const auto& p : progress) active_buckets_[p.bucket] = *id;
  }
  JobRecord copy = *stored;
  Post([this, copy] {
    if (absl::Status s = ResumeJob(copy); !s.ok())
      spdlog::error("job {}: cannot start: {}", copy.id, std::string(s.message()));
  });
  return DecodeJob(*stored);
}

absl::StatusOr<JobView> JobEngine::Get(const std::string& job_id) {
  if (job_id.empty()) return absl::NotFoundError("job_id: empty");
  auto rec = store_->GetJob(job_id);
  if (!rec.ok()) return rec.status();
  auto view = DecodeJob(*rec);
  if (view.ok() && !IsFinal(view->record.state)) view->waiting_for = WaitingFor(job_id);
  return view;
}

std::string JobEngine::WaitingFor(const std::string& job_id) {
  std::lock_guard lock(watch_mu_);
  auto it = waiting_.find(job_id);
  return it == waiting_.end() ? std::string() : it->second;
}

absl::StatusOr<JobView> JobEngine::Cancel(const std::string& job_id, const std::string& why) {
  auto current = Get(job_id);
  if (!current.ok() || IsFinal(current->record.state)) return current;
  auto done = std::make_shared<std::promise<void>>();
  auto fut = done->get_future();
  Post([this, job_id, why, done] {
    auto it = jobs_.find(job_id);
    if (it != jobs_.end() && !it->second->finished) {
      if (auto c = store_->CancelTasks(job_id); !c.ok())
        spdlog::error("job {}: cancelling tasks: {}", job_id, std::string(c.status().message()));
      Finish(*it->second, kforge::JobState::kCancelled, why);
      jobs_.erase(it);
    }
    done->set_value();
  });
  // The engine thread is gone after Stop(); do not wait forever then.
  if (fut.wait_for(std::chrono::seconds(30)) != std::future_status::ready)
    return absl::UnavailableError("job engine is not running");
  return Get(job_id);
}

void JobEngine::OnTaskCompleted(const TaskRecord& task, const EvaluationRecord& eval) {
  Post([this, task, eval] { HandleCompleted(task, eval); });
}

void JobEngine::OnPromotionEnqueued(const std::string& job_id, const std::string& task_id) {
  Post([this, job_id, task_id] {
    auto it = jobs_.find(job_id);
    if (it != jobs_.end()) it->second->promotions.emplace(task_id, "");
  });
}

uint64_t JobEngine::Watch(const std::string& job_id, WatchFn fn) {
  std::lock_guard lock(watch_mu_);
  const uint64_t id = next_watch_id_++;
  watchers_[id] = Watcher{job_id, std::move(fn)};
  return id;
}

void JobEngine::Unwatch(uint64_t watch_id) {
  std::lock_guard lock(watch_mu_);
  watchers_.erase(watch_id);
}

std::optional<std::string> JobEngine::ActiveJobForBucket(const std::string& bucket_id) {
  std::lock_guard lock(watch_mu_);
  auto it = active_buckets_.find(bucket_id);
  if (it == active_buckets_.end()) return std::nullopt;
  return it->second;
}

void JobEngine::ResumeAll(const std::vector<JobRecord>& active) {
  size_t resumed = 0;
  for (const auto& rec : active) {
    {
      std::lock_guard lock(queue_mu_);
      if (stopping_) return;  // the rest resume at the next start
    }
    ++resumed;
    if (absl::Status s = ResumeJob(rec); !s.ok()) {
      // One broken job must not keep the server down: fail it, keep going.
      spdlog::error("job {}: cannot resume: {}", rec.id, std::string(s.message()));
      JobRecord failed = rec;
      failed.state = kforge::JobState::kFailed;
      failed.message = fmt::format("cannot resume after restart: {}", std::string(s.message()));
      (void)store_->UpdateJob(failed);
      (void)store_->CancelTasks(rec.id);
    }
  }
  if (resumed > 0) spdlog::info("resumed {} active job(s)", resumed);
}

absl::Status JobEngine::ResumeJob(const JobRecord& record) {
  auto spec = DecodeJobSpec(record.spec_json);
  if (!spec.ok()) return spec.status();
  auto job = std::make_unique<JobState>();
  job->record = record;
  job->spec = *std::move(spec);
  if (job->spec.max_seconds > 0)
    job->deadline_ms = record.created_unix_ms + int64_t{job->spec.max_seconds} * 1000;
  std::map<std::string, size_t> bucket_index;
  for (size_t i = 0; i < job->spec.shapes.size(); ++i) {
    const ShapeKey& s = job->spec.shapes[i];
    const Bucket b = BucketOf(s);
    if (bucket_index.count(b.Id())) continue;
    BucketState bs;
    bs.bucket = b;
    bs.id = b.Id();
    bs.shape = s;
    if (i < job->spec.lengths.size()) bs.lengths = job->spec.lengths[i];
    bs.progress.bucket = bs.id;
    // Each bucket gets its own stream of randomness, stable across restarts.
    auto p = factory_(job->spec.proposer, SplitMix(job->spec.seed ^ bucket_index.size()));
    if (!p.ok()) return p.status();
    bs.proposer = *std::move(p);
    bucket_index[bs.id] = job->buckets.size();
    job->buckets.push_back(std::move(bs));
  }

  // Replay: Remember() every candidate and Observe() every recorded result
  // in the order they happened. A bucket's next round is proposed only when
  // every task of the previous one is complete, so the original order is:
  // per round, its candidates (task id order), then its results (evaluation
  // id order).
  auto tasks = store_->ListTasks(record.id);
  if (!tasks.ok()) return tasks.status();
  std::sort(tasks->begin(), tasks->end(), [](const TaskRecord& a, const TaskRecord& b) {
    return IdNumber(a.id) < IdNumber(b.id);
  });
  struct Event {
    int64_t round;
    int kind;  // 0 remember, 1 observe
    int64_t order;
    size_t bucket;
    std::string variant_id;
    EvaluationRecord eval;
  };
  std::vector<Event> events;
  for (const auto& t : *tasks) {
    job->tasks_made++;
    if (IsPromotion(t.kind)) {
      if (t.state == TaskState::kQueued || t.state == TaskState::kLeased)
        job->promotions[t.id] = t.arch;
      continue;
    }
    if (t.kind != TaskKind::kEvaluate && t.kind != TaskKind::kCompile) continue;
    auto bi = bucket_index.find(t.bucket);
    if (bi == bucket_index.end()) continue;
    BucketState& b = job->buckets[bi->second];
    json shape = json::parse(t.shape_json, nullptr, /*allow_exceptions=*/false);
    const int64_t round = shape.is_object() ? shape.value("round", int64_t{0}) : 0;
    b.rounds = std::max<int>(b.rounds, static_cast<int>(round) + 1);
    if (!b.candidates.count(t.variant_id)) {
      auto v = store_->GetVariant(t.variant_id);
      if (!v.ok()) return v.status();
      b.candidates[t.variant_id] = CandidateOf(*v);
      events.push_back(Event{round, 0, IdNumber(t.id), bi->second, t.variant_id, {}});
    }
    b.progress.proposed++;
    if (t.state == TaskState::kQueued || t.state == TaskState::kLeased) {
      b.outstanding++;
      job->task_bucket[t.id] = bi->second;
    } else if (t.state == TaskState::kDone) {
      auto evals = store_->ListEvaluations(t.variant_id);
      if (!evals.ok()) return evals.status();
      for (const auto& e : *evals) {
        if (e.task_id != t.id) continue;
        events.push_back(Event{round, 1, e.id, bi->second, t.variant_id, e});
      }
    }
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return std::tie(a.bucket, a.round, a.kind, a.order) <
           std::tie(b.bucket, b.round, b.kind, b.order);
  });
  for (const auto& ev : events) {
    BucketState& b = job->buckets[ev.bucket];
    const agent::Candidate& c = b.candidates[ev.variant_id];
    if (ev.kind == 0) {
      b.proposer->Remember(c);
      continue;
    }
    b.progress.evaluated++;
    if (ev.eval.outcome == Outcome::kVerified) {
      b.progress.verified++;
      if (b.progress.best_variant_id.empty() ||
          ev.eval.timing.median_us < b.progress.best_timing.median_us) {
        b.progress.best_variant_id = ev.variant_id;
        b.progress.best_timing = ev.eval.timing;
      }
    } else if (IsFailure(ev.eval.outcome)) {
      b.progress.failed++;
    } else if (ev.eval.outcome == Outcome::kCompiled) {
      b.progress.compiled++;
    }
    CountCrash(b, ev.eval);
    agent::Feedback f = FeedbackOf(ev.variant_id, c, ev.eval);
    if (f.bucket.empty()) f.bucket = b.id;
    b.proposer->Observe(f);
  }

  // Asynchronous proposers get their wake after the replay: results are
  // acted on at the next Propose(), from here on.
  for (BucketState& b : job->buckets) {
    const std::string job_id = record.id;
    b.async = b.proposer->SetWake([this, job_id] { Post([this, job_id] { Wake(job_id); }); });
  }

  const bool fresh = events.empty() && tasks->empty();
  JobState& ref = *job;
  {
    std::lock_guard lock(watch_mu_);
    for (const auto& b : ref.buckets) active_buckets_[b.id] = record.id;
  }
  jobs_[record.id] = std::move(job);
  if (ref.record.state == kforge::JobState::kQueued) ref.record.state = kforge::JobState::kRunning;
  Persist(ref, fresh ? "job started" : "job resumed after a server restart");
  Advance(ref);
  if (ref.finished) jobs_.erase(record.id);
  return absl::OkStatus();
}

void JobEngine::Advance(JobState& job) {
  if (job.finished) return;
  if (job.deadline_ms > 0 && NowMs() >= job.deadline_ms) {
    if (auto c = store_->CancelTasks(job.record.id); !c.ok())
      spdlog::error("job {}: cancelling tasks: {}", job.record.id, std::string(c.status().message()));
    FinishDone(job, fmt::format("time budget of {} s reached", job.spec.max_seconds));
    return;
  }
  const bool tokens_spent =
      job.spec.max_tokens > 0 && job.record.tokens_used >= job.spec.max_tokens;
  bool all_done = true;
  const int64_t now = NowMs();
  for (auto& b : job.buckets) {
    const bool bucket_done = b.exhausted || !b.error.empty() || tokens_spent ||
                             b.progress.proposed >= job.spec.max_variants;
    const bool waiting = b.retry_at_ms > now;  // backing off an unavailable proposer
    // Lockstep rounds for synchronous proposers; a pipeline for
    // asynchronous ones, which are asked whenever there is room.
    const bool room = b.async ? b.outstanding < options_.candidates_per_round : b.outstanding == 0;
    if (!bucket_done && !waiting && room) ProposeRound(job, b);
    const bool still_done = b.exhausted || !b.error.empty() || tokens_spent ||
                            b.progress.proposed >= job.spec.max_variants;
    if (!still_done || b.outstanding > 0) all_done = false;
  }
  if (!all_done || !job.promotions.empty()) return;
  bool all_failed = true;
  std::string errors;
  for (const auto& b : job.buckets) {
    if (b.error.empty() || b.progress.verified > 0) all_failed = false;
    if (!b.error.empty()) errors += fmt::format("{}{}: {}", errors.empty() ? "" : "; ", b.id, b.error);
  }
  if (all_failed) {
    Finish(job, kforge::JobState::kFailed, errors);
  } else {
    FinishDone(job, errors.empty() ? std::string("done") : fmt::format("done; {}", errors));
  }
}

void JobEngine::FinishDone(JobState& job, const std::string& message) {
  int evaluated = 0, crashed = 0, given_up = 0;
  for (const auto& b : job.buckets) {
    evaluated += b.progress.evaluated;
    crashed += b.crashed;
    given_up += b.given_up;
  }
  // A job that learned nothing did not succeed: when every result is a
  // crash, the workers (that lease and never answer, or whose sandbox
  // fails) are the likelier cause than every candidate.
  if (evaluated > 0 && crashed == evaluated) {
    Finish(job, kforge::JobState::kFailed,
           fmt::format("{}; but every one of its {} result(s) was a crash ({} given up after "
                       "{} leases without an answer): the workers, not the candidates, are the "
                       "likely cause; see their logs",
                       message, evaluated, given_up, "max_task_attempts"));
    return;
  }
  Finish(job, kforge::JobState::kSucceeded,
         given_up == 0 ? message
                       : fmt::format("{}; {} of {} task(s) given up without an answer", message,
                                     given_up, evaluated));
}

void JobEngine::ProposeRound(JobState& job, BucketState& b) {
  const int per_round = b.async ? options_.candidates_per_round - b.outstanding : options_.candidates_per_round;
  const int n = std::min(per_round, job.spec.max_variants - b.progress.proposed);
  if (n <= 0) return;
  agent::ProposalContext ctx;
  ctx.shape = b.shape;
  ctx.bucket = b.bucket;
  ctx.job_id = job.record.id;
  ctx.max_tokens = job.spec.max_tokens;
  ctx.max_cost_usd = job.spec.max_cost_usd;
  ctx.variants_left = job.spec.max_variants - b.progress.proposed;
  ctx.compile_only = job.spec.compile_only;
  if (job.spec.max_tokens > 0)
    ctx.tokens_left = std::max<int64_t>(0, job.spec.max_tokens - job.record.tokens_used);
  if (auto best = store_->GetBest(b.id, b.bucket.arch); best.ok()) {
    if (auto v = store_->GetVariant(best->variant_id); v.ok()) {
      agent::Feedback f;
      f.variant_id = v->id;
      f.candidate = CandidateOf(*v);
      f.outcome = Outcome::kVerified;
      f.median_us = best->timing.median_us;
      f.spread_us = best->timing.Spread();
      f.bucket = b.id;
      ctx.best = std::move(f);
    }
  }
  auto proposed = b.proposer->Propose(ctx, n);
  if (!proposed.ok()) {
    const std::string why(proposed.status().message());
    if (absl::IsUnavailable(proposed.status()) && b.retries < options_.max_proposer_retries) {
      // A model endpoint that is down or rate-limiting may recover: try the
      // round again later instead of giving up on the bucket.
      const int64_t wait_ms = options_.proposer_retry_base_ms << b.retries;
      b.retries++;
      b.retry_at_ms = NowMs() + wait_ms;
      Persist(job, fmt::format("proposer unavailable on {} (retry {} in {} ms): {}", b.id,
                               b.retries, wait_ms, why));
      return;
    }
    if (absl::IsResourceExhausted(proposed.status())) {
      // A spent budget ends the bucket normally; its results stand.
      b.exhausted = true;
      Persist(job, fmt::format("proposer budget spent on {}: {}", b.id, why));
      return;
    }
    b.error = why;
    Persist(job, fmt::format("proposer failed on {}: {}", b.id, b.error));
    return;
  }
  b.retries = 0;
  b.retry_at_ms = 0;
  if (proposed->empty() && b.async && b.proposer->Busy()) return;  // it will wake us
  if (proposed->empty()) {
    b.exhausted = true;
    Persist(job, fmt::format("proposer has nothing more for {}", b.id));
    return;
  }
  std::vector<TaskRecord> tasks;
  std::vector<std::string> variant_ids;
  for (auto& c : *proposed) {
    job.record.tokens_used += c.tokens_used;
    if (b.bucket.deterministic && !ManifestSaysDeterministic(c.manifest_json)) {
      // Could never be the bucket's best: refused before any GPU time, the
      // reason on the job and told to the proposer (the proposers' own
      // static checks refuse such a candidate first).
      agent::Feedback f;
      f.candidate = c;
      f.bucket = b.id;
      f.outcome = Outcome::kCompileError;
      f.message = "refused: the bucket asks for a deterministic backward and the candidate's "
                  "manifest does not say \"deterministic\": true";
      b.proposer->Observe(f);
      Persist(job, fmt::format("candidate for {} refused: {}", b.id, f.message));
      continue;
    }
    VariantRecord v;
    v.source = c.source;
    v.manifest_json = c.manifest_json;
    v.origin = c.origin;
    v.template_name = c.template_name;
    v.knobs_json = c.knobs_json;
    v.model = c.model;
    v.prompt_hash = c.prompt_hash;
    v.prompt = c.prompt;
    v.answer = c.answer;
    v.parent_id = c.parent_id;
    v.job_id = job.record.id;
    v.kind = c.kind;
    v.attempt = c.attempt;
    v.normalized_hash = c.normalized_hash;
    v.provenance_json = c.provenance_json;
    auto id = store_->PutVariant(std::move(v));
    if (!id.ok()) {
      // A malformed candidate is the proposer's failure, recorded, not fatal.
      spdlog::warn("job {}: storing a candidate: {}", job.record.id, std::string(id.status().message()));
      continue;
    }
    if (b.candidates.count(*id)) continue;  // proposed twice: evaluate once
    b.candidates[*id] = c;
    TaskRecord t;
    t.job_id = job.record.id;
    t.kind = job.spec.compile_only ? TaskKind::kCompile : TaskKind::kEvaluate;
    t.variant_id = *id;
    t.bucket = b.id;
    t.arch = b.bucket.arch;
    // The round rides along in the task's shape JSON (ignored by readers of
    // the shape): replay after a restart needs the round structure, and
    // millisecond timestamps cannot order events of one round.
    json shape = ShapeKeyToJson(b.shape);
    shape["round"] = b.rounds;
    PutLengths(b.lengths, shape);
    t.shape_json = shape.dump();
    t.seed = SplitMix(job.spec.seed + ++job.tasks_made);
    tasks.push_back(std::move(t));
    variant_ids.push_back(*id);
  }
  if (tasks.empty()) {
    // Nothing new came back: treat it as exhaustion so the job cannot spin.
    b.exhausted = true;
    Persist(job, fmt::format("proposer offered nothing new for {}", b.id));
    return;
  }
  auto ids = store_->EnqueueTasks(tasks);
  if (!ids.ok()) {
    b.error = fmt::format("enqueueing tasks: {}", std::string(ids.status().message()));
    Persist(job, b.error);
    return;
  }
  const size_t index = static_cast<size_t>(&b - job.buckets.data());
  for (const auto& id : *ids) job.task_bucket[id] = index;
  b.rounds++;
  b.outstanding += static_cast<int>(ids->size());
  b.progress.proposed += static_cast<int>(ids->size());
  Persist(job, fmt::format("proposed {} candidate(s) for {}", ids->size(), b.id));
  if (options_.on_tasks_enqueued) options_.on_tasks_enqueued();
}

void JobEngine::HandleCompleted(const TaskRecord& task, const EvaluationRecord& eval) {
  auto it = jobs_.find(task.job_id);
  if (it == jobs_.end()) return;
  JobState& job = *it->second;
  if (IsPromotion(task.kind)) {
    job.promotions.erase(task.id);
    Advance(job);
  } else {
    auto tb = job.task_bucket.find(task.id);
    if (tb == job.task_bucket.end()) return;
    BucketState& b = job.buckets[tb->second];
    job.task_bucket.erase(tb);
    b.outstanding--;
    b.progress.evaluated++;
    std::string msg;
    if (eval.outcome == Outcome::kVerified) {
      b.progress.verified++;
      if (b.progress.best_variant_id.empty() ||
          eval.timing.median_us < b.progress.best_timing.median_us) {
        b.progress.best_variant_id = task.variant_id;
        b.progress.best_timing = eval.timing;
      }
      msg = fmt::format("variant {} verified: {:.1f} us", task.variant_id, eval.timing.median_us);
    } else {
      if (IsFailure(eval.outcome)) b.progress.failed++;
      CountCrash(b, eval);
      if (eval.outcome == Outcome::kCompiled) b.progress.compiled++;
      msg = fmt::format("variant {} {}{}{}", task.variant_id, OutcomeName(eval.outcome),
                        eval.message.empty() ? "" : ": ", eval.message.substr(0, 200));
    }
    agent::Feedback f = FeedbackOf(task.variant_id, b.candidates[task.variant_id], eval);
    if (f.bucket.empty()) f.bucket = b.id;
    b.proposer->Observe(f);
    Persist(job, msg);
    Advance(job);
  }
  if (job.finished) jobs_.erase(it);
}

// The model call ledger counts every token a job spent, refused answers
// included (the candidates' sum misses calls that produced no candidate);
// calls still in flight are not spent yet.
void JobEngine::RefreshTokens(JobState& job) {
  absl::StatusOr<ModelSpend> spent = store_->SumModelCalls(job.record.id, 0);
  if (spent.ok() && spent->calls > 0) job.record.tokens_used = spent->tokens - spent->pending_tokens;
}

void JobEngine::Wake(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second->finished) return;
  Advance(*it->second);
  if (it->second->finished) jobs_.erase(it);
}

void JobEngine::Finish(JobState& job, kforge::JobState state, const std::string& message) {
  job.finished = true;
  job.record.state = state;
  job.record.message = message;
  job.waiting.clear();
  int proposed = 0, evaluated = 0;
  for (const auto& b : job.buckets) {
    proposed += b.progress.proposed;
    evaluated += b.progress.evaluated;
  }
  LogEvent(state == kforge::JobState::kFailed ? spdlog::level::warn : spdlog::level::info,
           state == kforge::JobState::kCancelled ? "job_cancelled" : "job_finished",
           {{"job", job.record.id},
            {"state", JobStateName(state)},
            {"message", message},
            {"proposed", proposed},
            {"evaluated", evaluated},
            {"tokens", job.record.tokens_used}},
           fmt::format("job {} {}: {} ({} proposed, {} evaluated, {} tokens)", job.record.id,
                       JobStateName(state), message, proposed, evaluated,
                       job.record.tokens_used));
  {
    std::lock_guard lock(watch_mu_);
    waiting_.erase(job.record.id);
    for (const auto& b : job.buckets) {
      auto it = active_buckets_.find(b.id);
      if (it != active_buckets_.end() && it->second == job.record.id) active_buckets_.erase(it);
    }
  }
  RefreshTokens(job);
  job.record.progress_json = ProgressToJson(ViewOf(job).progress).dump();
  job.record.updated_unix_ms = NowMs();
  if (absl::Status s = store_->UpdateJob(job.record); !s.ok())
    spdlog::error("job {}: saving final state: {}", job.record.id, std::string(s.message()));
  Notify(job, fmt::format("job {}: {}", JobStateName(state), message), /*final=*/true);
}

void JobEngine::Persist(JobState& job, const std::string& message) {
  RefreshTokens(job);
  job.record.progress_json = ProgressToJson(ViewOf(job).progress).dump();
  job.record.updated_unix_ms = NowMs();
  if (absl::Status s = store_->UpdateJob(job.record); !s.ok())
    spdlog::error("job {}: saving progress: {}", job.record.id, std::string(s.message()));
  Notify(job, message, /*final=*/false);
}

JobView JobEngine::ViewOf(const JobState& job) const {
  JobView v;
  v.record = job.record;
  v.spec = job.spec;
  v.waiting_for = job.waiting;
  for (const auto& b : job.buckets) v.progress.push_back(b.progress);
  return v;
}

void JobEngine::Notify(const JobState& job, const std::string& message, bool final) {
  std::vector<WatchFn> fns;
  {
    std::lock_guard lock(watch_mu_);
    for (auto it = watchers_.begin(); it != watchers_.end();) {
      if (it->second.job_id == job.record.id) {
        fns.push_back(it->second.fn);
        if (final) {
          it = watchers_.erase(it);
          continue;
        }
      }
      ++it;
    }
  }
  if (fns.empty()) return;
  JobEvent ev{ViewOf(job), message, final};
  for (auto& fn : fns) fn(ev);
}

}  // namespace kforge::server
