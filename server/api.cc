#include "server/api.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/hash.h"
#include "server/export.h"

namespace kforge::server {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

absl::Status Invalid(std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(fmt::format("{}: {}", field, why));
}

constexpr size_t kMaxIdLength = 64;
constexpr size_t kMaxNameLength = 200;
constexpr int kMaxHeartbeatTasks = 1000;
constexpr size_t kMaxMessageBytes = 64 * 1024;  // stored result messages are clipped

absl::Status CheckId(std::string_view field, const std::string& id) {
  if (id.empty()) return absl::NotFoundError(fmt::format("{}: empty", field));
  if (id.size() > kMaxIdLength)
    return absl::NotFoundError(fmt::format("{}: no such id (too long)", field));
  return absl::OkStatus();
}

// Timings must be finite and ordered; a verified result without one cannot
// be compared.
absl::Status CheckTiming(std::string_view field, const v1::Timing& t) {
  const double vals[] = {t.median_us(), t.min_us(), t.max_us(), t.p25_us(), t.p75_us()};
  for (double v : vals) {
    if (!std::isfinite(v) || v < 0)
      return Invalid(field, "times must be finite and non-negative");
  }
  if (t.median_us() <= 0) return Invalid(fmt::format("{}.median_us", field), "must be positive");
  if (t.samples() < 0) return Invalid(fmt::format("{}.samples", field), "is negative");
  if ((t.min_us() != 0 || t.max_us() != 0) &&
      !(t.min_us() <= t.median_us() && t.median_us() <= t.max_us()))
    return Invalid(field, "needs min_us <= median_us <= max_us");
  if ((t.p25_us() != 0 || t.p75_us() != 0) &&
      !(t.p25_us() <= t.median_us() && t.median_us() <= t.p75_us() &&
        (t.max_us() == 0 || (t.min_us() <= t.p25_us() && t.p75_us() <= t.max_us()))))
    return Invalid(field, "needs min_us <= p25_us <= median_us <= p75_us <= max_us");
  return absl::OkStatus();
}

int OutcomeRank(Outcome o) {
  switch (o) {
    case Outcome::kVerified: return 5;
    case Outcome::kCompiled: return 4;
    case Outcome::kWrong: return 3;
    case Outcome::kCrashed: return 2;
    case Outcome::kTimeout: return 1;
    case Outcome::kCompileError: return 0;
  }
  return 0;
}

std::string Clip(const std::string& s) { return s.size() > kMaxMessageBytes ? s.substr(0, kMaxMessageBytes) : s; }

// A compile log opens with ptxas's resource lines, so a clipped log can hide
// the error: its error lines come first, then the log.
std::string CompileLogMessage(const std::string& log) {
  std::string errors;
  size_t start = 0;
  int kept = 0;
  while (start < log.size() && kept < 10) {
    size_t end = log.find('\n', start);
    if (end == std::string::npos) end = log.size();
    std::string_view line(log.data() + start, end - start);
    if (line.find("error") != std::string_view::npos) {
      errors.append(line).push_back('\n');
      ++kept;
    }
    start = end + 1;
  }
  return Clip(errors.empty() ? log : errors + "--- full log ---\n" + log);
}

}  // namespace

KforgeApi::KforgeApi(Store* store, KernelCache* cache, JobEngine* engine, ApiOptions options)
    : store_(store), cache_(cache), engine_(engine), options_(std::move(options)) {}

absl::Status KforgeApi::Init() {
  auto workers = store_->ListWorkers();
  if (!workers.ok()) return workers.status();
  std::lock_guard lock(workers_mu_);
  for (const auto& w : *workers) workers_[w.id] = WorkerInfo{w.arch, w.compile_only, w};
  return absl::OkStatus();
}

// ------------------------------------------------------------ KernelService

absl::Status KforgeApi::GetKernel(const v1::GetKernelRequest& req, v1::GetKernelResponse* resp) {
  if (!req.has_shape()) return Invalid("shape", "is required");
  auto key = ShapeFromProto(req.shape(), "shape", options_.limits);
  if (!key.ok()) return key.status();
  const Bucket bucket = BucketOf(*key);
  auto served = cache_->Lookup(*key, bucket);
  if (!served.ok()) return served.status();
  v1::Kernel* k = resp->mutable_kernel();
  *k = *served->kernel;
  k->set_tuned(served->tuned);
  const std::string bucket_id = bucket.Id();
  k->set_requested_bucket(bucket_id);
  if (!req.if_none_match().empty() && req.if_none_match() == k->variant_id())
    MarkNotModified(*resp);
  if (!served->tuned && req.tune_if_untuned()) {
    if (auto active = engine_->ActiveJobForBucket(bucket_id)) {
      resp->set_tuning_job_id(*active);
    } else {
      JobSpec spec;
      spec.name = fmt::format("auto-tune {}", bucket_id);
      spec.shapes = {*key};
      spec.proposer = options_.tune_proposer;
      spec.max_variants = options_.tune_max_variants;
      spec.seed = static_cast<uint64_t>(NowMs());
      auto job = engine_->Submit(std::move(spec));
      if (job.ok()) {
        resp->set_tuning_job_id(job->record.id);
      } else {
        // Serving the kernel matters more than the tuning request.
        spdlog::warn("GetKernel: cannot enqueue tuning for {}: {}", bucket_id,
                     std::string(job.status().message()));
      }
    }
  }
  return absl::OkStatus();
}

std::shared_ptr<const std::string> KforgeApi::GetKernelCached(const v1::GetKernelRequest& req) {
  if (!req.has_shape()) return nullptr;
  auto key = ShapeFromProto(req.shape(), "shape", options_.limits);
  if (!key.ok()) return nullptr;
  return cache_->Cached(BucketOf(*key), req.if_none_match());
}

absl::StatusOr<std::shared_ptr<const std::string>> KforgeApi::GetKernelBytes(
    const v1::GetKernelRequest& req) {
  if (req.has_shape()) {
    auto key = ShapeFromProto(req.shape(), "shape", options_.limits);
    if (!key.ok()) return key.status();
    if (auto bytes = cache_->Cached(BucketOf(*key), req.if_none_match())) return bytes;
  }
  // Untuned (nearest or seed, maybe enqueueing a job) or invalid: the
  // general path, which also produces the error.
  v1::GetKernelResponse resp;
  if (absl::Status s = GetKernel(req, &resp); !s.ok()) return s;
  return std::make_shared<const std::string>(resp.SerializeAsString());
}

absl::Status KforgeApi::ListShapes(const v1::ListShapesRequest& req,
                                   v1::ListShapesResponse* resp) {
  auto page = PageFromProto(req.page_size(), req.page_token());
  if (!page.ok()) return page.status();
  if (!req.arch().empty()) {
    if (absl::Status s = ValidateArch(req.arch()); !s.ok()) return s;
  }
  auto bests = store_->ListBest(req.arch(), *page);
  if (!bests.ok()) return bests.status();
  for (const auto& b : bests->items) {
    auto* s = resp->add_shapes();
    s->set_bucket(b.bucket);
    s->set_arch(b.arch);
    s->set_best_variant_id(b.variant_id);
    TimingToProto(b.timing, s->mutable_best_timing());
    s->set_updated_at(FormatUnixMs(b.updated_unix_ms));
  }
  resp->set_next_page_token(bests->next_token);
  return absl::OkStatus();
}

absl::Status KforgeApi::ListVariants(const v1::ListVariantsRequest& req,
                                     v1::ListVariantsResponse* resp) {
  auto page = PageFromProto(req.page_size(), req.page_token());
  if (!page.ok()) return page.status();
  if (!req.bucket().empty()) {
    auto b = ParseBucketId(req.bucket());
    if (!b.ok()) return Invalid("bucket", std::string(b.status().message()));
  }
  auto variants = store_->ListVariants(req.bucket(), *page);
  if (!variants.ok()) return variants.status();
  for (const auto& v : variants->items) {
    auto* s = resp->add_variants();
    s->set_variant_id(v.id);
    s->set_source_hash(v.source_hash);
    ProvenanceToProto(v, s->mutable_provenance());
    s->set_created_at(FormatUnixMs(v.created_unix_ms));
    auto evals = store_->ListEvaluations(v.id);
    if (!evals.ok()) return evals.status();
    int best_rank = -1;
    const EvaluationRecord* fastest = nullptr;
    int64_t count = 0;
    for (const auto& e : *evals) {
      if (!req.bucket().empty() && e.bucket != req.bucket()) continue;
      ++count;
      if (OutcomeRank(e.outcome) > best_rank) {
        best_rank = OutcomeRank(e.outcome);
        s->set_best_outcome(std::string(OutcomeName(e.outcome)));
      }
      if (e.outcome == Outcome::kVerified &&
          (!fastest || e.timing.median_us < fastest->timing.median_us))
        fastest = &e;
    }
    s->set_evaluations(count);
    if (fastest) TimingToProto(fastest->timing, s->mutable_best_timing());
  }
  resp->set_next_page_token(variants->next_token);
  return absl::OkStatus();
}

absl::Status KforgeApi::SubmitJob(const v1::SubmitJobRequest& req, v1::Job* resp) {
  auto spec = JobSpecFromProto(req, options_.limits);
  if (!spec.ok()) return spec.status();
  auto job = engine_->Submit(*std::move(spec));
  if (!job.ok()) return job.status();
  JobToProto(*job, resp);
  return absl::OkStatus();
}

absl::Status KforgeApi::GetJob(const v1::GetJobRequest& req, v1::Job* resp) {
  if (absl::Status s = CheckId("job_id", req.job_id()); !s.ok()) return s;
  auto job = engine_->Get(req.job_id());
  if (!job.ok()) return job.status();
  JobToProto(*job, resp);
  return absl::OkStatus();
}

absl::Status KforgeApi::ListJobs(const v1::ListJobsRequest& req, v1::ListJobsResponse* resp) {
  auto page = PageFromProto(req.page_size(), req.page_token());
  if (!page.ok()) return page.status();
  auto jobs = store_->ListJobs(*page);
  if (!jobs.ok()) return jobs.status();
  for (const auto& rec : jobs->items) {
    auto view = DecodeJob(rec);
    if (view.ok()) {
      JobToProto(*view, resp->add_jobs());
    } else {
      JobView bare;
      bare.record = rec;
      JobToProto(bare, resp->add_jobs());
    }
  }
  resp->set_next_page_token(jobs->next_token);
  return absl::OkStatus();
}

absl::Status KforgeApi::CancelJob(const v1::CancelJobRequest& req, v1::Job* resp) {
  if (absl::Status s = CheckId("job_id", req.job_id()); !s.ok()) return s;
  auto job = engine_->Cancel(req.job_id(), "cancelled by a client");
  if (!job.ok()) return job.status();
  JobToProto(*job, resp);
  return absl::OkStatus();
}

absl::Status KforgeApi::ExportKernels(
    const v1::ExportKernelsRequest& req,
    const std::function<bool(const v1::ExportedKernel&)>& write) {
  return server::ExportKernels(*cache_, req, write);
}

absl::Status KforgeApi::WatchJob(const v1::WatchJobRequest& req,
                                 const std::function<bool(const v1::JobEvent&)>& write,
                                 const std::function<bool()>& cancelled) {
  if (absl::Status s = CheckId("job_id", req.job_id()); !s.ok()) return s;
  // The engine calls back on its own thread; this RPC thread drains a queue
  // so a slow client never stalls the engine.
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<JobEvent> events;
  };
  auto q = std::make_shared<Queue>();
  // Watch before reading the current state so no change falls in between.
  const uint64_t watch = engine_->Watch(req.job_id(), [q](const JobEvent& ev) {
    {
      std::lock_guard lock(q->mu);
      q->events.push_back(ev);
    }
    q->cv.notify_one();
  });
  struct Unwatch {
    JobEngine* engine;
    uint64_t id;
    ~Unwatch() { engine->Unwatch(id); }
  } unwatch{engine_, watch};

  auto current = engine_->Get(req.job_id());
  if (!current.ok()) return current.status();
  {
    v1::JobEvent first;
    JobToProto(*current, first.mutable_job());
    first.set_message("current state");
    if (!write(first)) return absl::CancelledError("client went away");
    if (IsFinal(current->record.state)) return absl::OkStatus();
  }
  for (;;) {
    JobEvent ev;
    {
      std::unique_lock lock(q->mu);
      q->cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return !q->events.empty(); });
      if (q->events.empty()) {
        if (shutting_down_) return absl::UnavailableError("server shutting down; watch again");
        if (cancelled()) return absl::CancelledError("client went away");
        continue;
      }
      ev = std::move(q->events.front());
      q->events.pop_front();
    }
    if (ev.job.record.created_unix_ms == 0 && ev.final) {
      // The engine stopped (shutdown), the job itself did not finish.
      return absl::UnavailableError("server shutting down; watch again");
    }
    v1::JobEvent out;
    JobToProto(ev.job, out.mutable_job());
    out.set_message(ev.message);
    if (!write(out)) return absl::CancelledError("client went away");
    if (ev.final || IsFinal(ev.job.record.state)) return absl::OkStatus();
  }
}

// ------------------------------------------------------------ WorkerService

absl::StatusOr<KforgeApi::WorkerInfo> KforgeApi::KnownWorker(const std::string& worker_id) {
  if (absl::Status s = CheckId("worker_id", worker_id); !s.ok()) return s;
  std::lock_guard lock(workers_mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end())
    return absl::NotFoundError(
        fmt::format("worker_id: unknown worker '{}'; call Register first", worker_id));
  return it->second;
}

absl::Status KforgeApi::Register(const v1::RegisterRequest& req, v1::RegisterResponse* resp) {
  if (req.worker_name().empty()) return Invalid("worker_name", "is required");
  if (req.worker_name().size() > kMaxNameLength)
    return Invalid("worker_name", fmt::format("is longer than {} bytes", kMaxNameLength));
  if (absl::Status s = ValidateArch(req.gpu().arch()); !s.ok())
    return absl::InvalidArgumentError(fmt::format("gpu.{}", std::string(std::string(s.message()))));
  if (req.gpu().name().size() > kMaxNameLength)
    return Invalid("gpu.name", fmt::format("is longer than {} bytes", kMaxNameLength));
  WorkerRecord w;
  w.name = req.worker_name();
  w.arch = req.gpu().arch();
  w.compile_only = req.compile_only();
  w.gpu_json = nlohmann::json{{"name", req.gpu().name()},
                              {"compute_capability", req.gpu().compute_capability()},
                              {"sm_count", req.gpu().sm_count()},
                              {"memory_bytes", req.gpu().memory_bytes()},
                              {"driver_version", req.gpu().driver_version()},
                              {"nvrtc_version", req.gpu().nvrtc_version()}}
                   .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  w.last_seen_unix_ms = NowMs();
  auto id = store_->UpsertWorker(w);
  if (!id.ok()) return id.status();
  {
    std::lock_guard lock(workers_mu_);
    w.id = *id;
    workers_[*id] = WorkerInfo{w.arch, w.compile_only, w};
  }
  spdlog::info("worker {} registered as {} ({}{})", w.name, *id, w.arch,
               w.compile_only ? ", compile only" : "");
  resp->set_worker_id(*id);
  resp->set_heartbeat_interval_ms(options_.heartbeat_interval_ms);
  resp->set_lease_ttl_ms(static_cast<int32_t>(options_.lease_ttl_ms));
  return absl::OkStatus();
}

absl::Status KforgeApi::Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp) {
  auto worker = KnownWorker(req.worker_id());
  if (!worker.ok()) return worker.status();
  if (req.task_ids().size() > kMaxHeartbeatTasks)
    return Invalid("task_ids", fmt::format("{} ids; at most {}", req.task_ids().size(),
                                           kMaxHeartbeatTasks));
  std::vector<std::string> ids;
  for (const auto& id : req.task_ids()) {
    if (id.empty() || id.size() > kMaxIdLength) return Invalid("task_ids", "contains a malformed id");
    ids.push_back(id);
  }
  if (!ids.empty()) {
    if (absl::Status s = store_->RenewLeases(req.worker_id(), ids, NowMs(), options_.lease_ttl_ms);
        !s.ok())
      return s;
  }
  for (const auto& id : ids) {
    auto t = store_->GetTask(id);
    if (t.ok() && t->state == TaskState::kCancelled) resp->add_cancelled_task_ids(id);
  }
  // Record that the worker is alive (for operators), at most every 10 s.
  std::optional<WorkerRecord> seen;
  {
    std::lock_guard lock(workers_mu_);
    auto it = workers_.find(req.worker_id());
    const int64_t now = NowMs();
    if (it != workers_.end() && now - it->second.record.last_seen_unix_ms >= 10000) {
      it->second.record.last_seen_unix_ms = now;
      seen = it->second.record;
    }
  }
  if (seen) {
    if (auto s = store_->UpsertWorker(*seen); !s.ok())
      spdlog::warn("worker {}: recording last seen: {}", req.worker_id(), std::string(s.status().message()));
  }
  return absl::OkStatus();
}

absl::Status KforgeApi::FillTask(const TaskRecord& t, v1::Task* out) {
  out->set_task_id(t.id);
  out->set_kind(TaskKindToProto(t.kind));
  out->set_job_id(t.job_id);
  auto shape = DecodeTaskShape(t.shape_json);
  if (!shape.ok()) return shape.status();
  ShapeToProto(shape->key, out->mutable_shape());
  const ShapeLengths& l = shape->lengths;
  out->mutable_shape()->mutable_cu_seqlens_q()->Add(l.cu_q.begin(), l.cu_q.end());
  out->mutable_shape()->mutable_cu_seqlens_k()->Add(l.cu_k.begin(), l.cu_k.end());
  auto fill_variant = [&](const std::string& id, v1::VariantSource* vs) -> absl::Status {
    auto v = store_->GetVariant(id);
    if (!v.ok()) return v.status();
    vs->set_variant_id(v->id);
    vs->set_source(v->source);
    vs->set_manifest_json(v->manifest_json);
    return absl::OkStatus();
  };
  if (absl::Status s = fill_variant(t.variant_id, out->mutable_variant()); !s.ok()) return s;
  if (t.kind == TaskKind::kRetime) {
    if (absl::Status s = fill_variant(t.incumbent_variant_id, out->mutable_incumbent()); !s.ok())
      return s;
  }
  out->set_lease_expires_unix_ms(t.lease_expires_unix_ms);
  out->set_seed(t.seed);
  return absl::OkStatus();
}

absl::Status KforgeApi::LeaseTask(const v1::LeaseTaskRequest& req, v1::LeaseTaskResponse* resp,
                                  const std::function<bool()>& cancelled) {
  auto worker = KnownWorker(req.worker_id());
  if (!worker.ok()) return worker.status();
  if (req.wait_ms() < 0) return Invalid("wait_ms", fmt::format("{} is negative", req.wait_ms()));
  const int wait_ms = std::min(req.wait_ms(), options_.max_lease_wait_ms);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  for (;;) {
    uint64_t generation;
    {
      std::lock_guard lock(tasks_mu_);
      generation = tasks_generation_;
    }
    auto task = store_->LeaseTask(req.worker_id(), worker->arch, worker->compile_only, NowMs(),
                                  options_.lease_ttl_ms);
    if (!task.ok()) return task.status();
    if (task->has_value() && (*task)->attempts > options_.max_task_attempts) {
      if (absl::Status s = GiveUp(**task, req.worker_id()); !s.ok()) return s;
      continue;
    }
    if (task->has_value()) return FillTask(**task, resp->mutable_task());
    if (shutting_down_ || cancelled() || std::chrono::steady_clock::now() >= deadline)
      return absl::OkStatus();
    std::unique_lock lock(tasks_mu_);
    // Wake on new tasks, and at least every 250 ms to notice a cancelled call.
    tasks_cv_.wait_until(
        lock, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(250)),
        [&] { return tasks_generation_ != generation || shutting_down_; });
  }
}

absl::Status KforgeApi::GiveUp(const TaskRecord& task, const std::string& worker_id) {
  EvaluationRecord e;
  e.task_id = task.id;
  e.worker_id = worker_id;
  e.outcome = Outcome::kCrashed;
  e.message = fmt::format(
      "given up: leased {} times without a result (the workers failed before running the "
      "candidate; their logs say why)",
      task.attempts - 1);
  spdlog::warn("task {} of job {}: {}", task.id, task.job_id, e.message);
  bool accepted = false;
  return DecideAndComplete(task, v1::EvalResult(), std::move(e), &accepted);
}

absl::Status KforgeApi::ReportResult(const v1::ReportResultRequest& req,
                                     v1::ReportResultResponse* resp) {
  auto worker = KnownWorker(req.worker_id());
  if (!worker.ok()) return worker.status();
  if (absl::Status s = CheckId("task_id", req.task_id()); !s.ok()) return s;
  if (!req.has_result()) return Invalid("result", "is required");
  const v1::EvalResult& r = req.result();
  auto outcome = OutcomeFromProto(r.outcome());
  if (!outcome.ok()) return outcome.status();
  auto task = store_->GetTask(req.task_id());
  if (!task.ok()) return task.status();
  if (*outcome == Outcome::kVerified && task->kind == TaskKind::kCompile)
    return Invalid("result.outcome", "a compile task cannot be verified (nothing was run)");
  if (*outcome == Outcome::kVerified) {
    if (absl::Status s = CheckTiming("result.timing", r.timing()); !s.ok()) return s;
    if (task->kind == TaskKind::kRetime) {
      if (absl::Status s = CheckTiming("result.incumbent_timing", r.incumbent_timing()); !s.ok())
        return s;
    }
  }
  for (double v : {r.errors().max_abs_error(), r.errors().rel_l2_error(), r.compile().compile_ms()}) {
    if (std::isnan(v)) return Invalid("result", "error metrics and compile time must not be NaN");
  }

  EvaluationRecord e;
  e.variant_id = task->variant_id;
  e.bucket = task->bucket;
  e.arch = task->arch;
  e.job_id = task->job_id;
  e.task_id = task->id;
  e.worker_id = req.worker_id();
  e.gpu_name = r.gpu().name();
  e.compute_capability = r.gpu().compute_capability();
  e.driver_version = r.gpu().driver_version();
  e.nvrtc_version = r.gpu().nvrtc_version();
  e.compile_options = r.compile().options();
  e.reference_version = r.reference_version();
  e.outcome = *outcome;
  e.message = Clip(r.message().empty() ? r.errors().detail() : r.message());
  if (e.outcome == Outcome::kCompileError && !r.compile().log().empty())
    // The worker's message says which step failed (NVRTC, loading, the
    // launch plan); the log's error lines follow.
    e.message = r.message().empty()
                    ? CompileLogMessage(r.compile().log())
                    : Clip(r.message() + "\n" + CompileLogMessage(r.compile().log()));
  e.compile_ms = r.compile().compile_ms();
  e.registers = r.compile().registers();
  e.spill_bytes = r.compile().spill_stores_bytes() + r.compile().spill_loads_bytes();
  e.static_smem_bytes = r.compile().static_smem_bytes();
  e.dynamic_smem_bytes = r.compile().dynamic_smem_bytes();
  e.max_abs_error = r.errors().max_abs_error();
  e.rel_l2_error = r.errors().rel_l2_error();
  if (e.outcome == Outcome::kVerified) e.timing = TimingFromProto(r.timing());
  if (!r.compile().cubin().empty()) {
    e.cubin_hash = Sha256Hex(r.compile().cubin());
    if (absl::Status s = store_->PutCubin(e.cubin_hash, r.compile().cubin()); !s.ok()) return s;
  }
  if (task->kind == TaskKind::kRetime && e.outcome == Outcome::kVerified) {
    const TimingRecord inc = TimingFromProto(r.incumbent_timing());
    e.message = Clip(fmt::format("retime vs {}: incumbent {:.2f} us (spread {:.2f}){}{}",
                                 task->incumbent_variant_id, inc.median_us, inc.Spread(),
                                 e.message.empty() ? "" : "; ", e.message));
  }

  bool accepted = false;
  if (absl::Status s = DecideAndComplete(*task, r, std::move(e), &accepted); !s.ok()) return s;
  resp->set_accepted(accepted);
  return absl::OkStatus();
}

absl::Status KforgeApi::DecideAndComplete(const TaskRecord& task, const v1::EvalResult& r,
                                          EvaluationRecord eval, bool* accepted) {
  std::optional<BestRecord> new_best;
  std::optional<std::string> retime_against;
  std::unique_lock lock(best_mu_);
  std::optional<BestRecord> current;
  if (auto b = store_->GetBest(task.bucket, task.arch); b.ok()) {
    current = *std::move(b);
  } else if (!absl::IsNotFound(b.status())) {
    return b.status();
  }
  if (eval.outcome == Outcome::kVerified) {
    BestRecord candidate;
    candidate.bucket = task.bucket;
    candidate.arch = task.arch;
    candidate.variant_id = task.variant_id;
    candidate.timing = eval.timing;
    if (!current) {
      // First verified variant of the bucket: nothing to beat.
      new_best = candidate;
    } else if (current->variant_id == task.variant_id) {
      // The incumbent itself, re-measured: keep it.
    } else if (task.kind == TaskKind::kEvaluate) {
      if (eval.timing.median_us < current->timing.median_us) retime_against = current->variant_id;
    } else if (task.kind == TaskKind::kRetime) {
      if (current->variant_id != task.incumbent_variant_id) {
        // The best changed while this ran: a fair comparison needs a new
        // interleaved run against the new incumbent.
        if (eval.timing.median_us < current->timing.median_us)
          retime_against = current->variant_id;
      } else {
        const TimingRecord inc = TimingFromProto(r.incumbent_timing());
        const double spread = std::max(eval.timing.Spread(), inc.Spread());
        if (inc.median_us - eval.timing.median_us > spread) new_best = candidate;
      }
    }
  }
  auto ok = store_->CompleteTask(task.id, eval.worker_id, eval, new_best);
  if (!ok.ok()) return ok.status();
  *accepted = *ok;
  if (!*ok) return absl::OkStatus();
  if (new_best) {
    if (absl::Status s = cache_->Refresh(task.bucket, task.arch); !s.ok())
      spdlog::error("refreshing the served kernel of {}: {}", task.bucket, std::string(s.message()));
    spdlog::info("new best for {}: {} ({:.2f} us)", task.bucket, task.variant_id,
                 eval.timing.median_us);
  }
  bool enqueued = false;
  if (retime_against) {
    TaskRecord t;
    t.job_id = task.job_id;
    t.kind = TaskKind::kRetime;
    t.variant_id = task.variant_id;
    t.incumbent_variant_id = *retime_against;
    t.bucket = task.bucket;
    t.arch = task.arch;
    t.shape_json = task.shape_json;
    t.seed = task.seed ^ 0x5bd1e995ULL;
    auto ids = store_->EnqueueTasks({t});
    if (ids.ok() && !ids->empty()) {
      // Tell the engine before the completion so the job waits for it.
      if (!task.job_id.empty()) engine_->OnRetimeEnqueued(task.job_id, ids->front());
      enqueued = true;
    } else if (!ids.ok()) {
      spdlog::error("enqueueing a retime of {}: {}", task.variant_id, std::string(ids.status().message()));
    }
  }
  lock.unlock();
  engine_->OnTaskCompleted(task, eval);
  if (enqueued) NotifyTasks();
  return absl::OkStatus();
}

void KforgeApi::NotifyTasks() {
  {
    std::lock_guard lock(tasks_mu_);
    ++tasks_generation_;
  }
  tasks_cv_.notify_all();
}

void KforgeApi::BeginShutdown() {
  shutting_down_ = true;
  NotifyTasks();
}

absl::StatusOr<int> KforgeApi::RequeueExpired() {
  auto n = store_->RequeueExpired(NowMs());
  if (n.ok() && *n > 0) {
    spdlog::info("requeued {} task(s) whose lease expired", *n);
    NotifyTasks();
  }
  return n;
}

}  // namespace kforge::server
