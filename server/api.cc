#include "server/api.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <utility>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/hash.h"
#include "core/logging.h"
#include "core/redact.h"
#include "core/roofline.h"
#include "core/status.h"
#include "server/auth.h"
#include "server/export.h"
#include "server/promotion.h"

namespace kforge::server {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

constexpr size_t kMaxIdLength = 64;
constexpr size_t kMaxNameLength = 200;
constexpr int kMaxHeartbeatTasks = 1000;
constexpr size_t kMaxMessageBytes = 64 * 1024;  // stored result messages are clipped
constexpr size_t kMaxLogBytes = 1024 * 1024;    // a compile log, before its error lines are picked
constexpr size_t kMaxOptionsBytes = 4096;

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
  return ClipMiddle(errors.empty() ? log : errors + "--- full log ---\n" + log, kMaxMessageBytes);
}

}  // namespace

KforgeApi::KforgeApi(Store* store, KernelCache* cache, JobEngine* engine, ApiOptions options)
    : store_(store), cache_(cache), engine_(engine), options_(std::move(options)) {}

absl::Status KforgeApi::Init() {
  auto workers = store_->ListWorkers();
  if (!workers.ok()) return workers.status();
  std::lock_guard lock(workers_mu_);
  for (const auto& w : *workers) {
    const bool gated = std::find(w.sanitizer_tools.begin(), w.sanitizer_tools.end(),
                                 "memcheck") != w.sanitizer_tools.end();
    // Last seen before the restart counts as connected until the TTL says
    // otherwise; a worker without a session (rows from before sessions)
    // cannot call until it registers again.
    const nlohmann::json gpu = nlohmann::json::parse(w.gpu_json, nullptr, false);
    const std::string nvrtc =
        gpu.is_object() ? gpu.value("nvrtc_version", std::string()) : std::string();
    workers_[w.id] = WorkerInfo{w, w.last_seen_unix_ms, gated, nvrtc};
    if (!w.session_hash.empty()) sessions_[w.session_hash] = w.id;
  }
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
  // No new job while shutting down: the engine is about to stop.
  if (!served->tuned && req.tune_if_untuned() && !shutting_down_) {
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
  return cache_->Cached(*key, BucketOf(*key), req.if_none_match());
}

absl::StatusOr<std::shared_ptr<const std::string>> KforgeApi::GetKernelBytes(
    const v1::GetKernelRequest& req) {
  if (req.has_shape()) {
    auto key = ShapeFromProto(req.shape(), "shape", options_.limits);
    if (!key.ok()) return key.status();
    if (auto bytes = cache_->Cached(*key, BucketOf(*key), req.if_none_match())) return bytes;
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
  if (!bests.ok()) return PageTokenError(bests.status());
  for (const auto& b : bests->items) {
    auto* s = resp->add_shapes();
    s->set_bucket(b.bucket);
    s->set_arch(b.arch);
    s->set_best_variant_id(b.variant_id);
    TimingToProto(b.timing, s->mutable_best_timing(), b.measured_by);
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
  if (!variants.ok()) return PageTokenError(variants.status());
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
  if (shutting_down_) return ShuttingDown();
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
  if (!jobs.ok()) return PageTokenError(jobs.status());
  for (const auto& rec : jobs->items) {
    auto view = DecodeJob(rec);
    if (view.ok()) {
      if (!IsFinal(rec.state)) view->waiting_for = engine_->WaitingFor(rec.id);
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
  if (shutting_down_) return ShuttingDown();
  if (absl::Status s = CheckId("job_id", req.job_id()); !s.ok()) return s;
  auto job = engine_->Cancel(req.job_id(), "cancelled by a client");
  if (!job.ok()) return job.status();
  JobToProto(*job, resp);
  return absl::OkStatus();
}

absl::Status KforgeApi::ListWorkers(const v1::ListWorkersRequest&,
                                    v1::ListWorkersResponse* resp) {
  auto workers = Workers();
  if (!workers.ok()) return workers.status();
  for (const WorkerStatus& w : *workers) {
    v1::Worker* out = resp->add_workers();
    WorkerToProto(w.record, w.last_call_unix_ms, w.connected, out);
    if (w.gpu_usage) {
      out->mutable_gpu_usage()->set_utilization(w.gpu_usage->utilization);
      out->mutable_gpu_usage()->set_memory_used_bytes(w.gpu_usage->memory_used_bytes);
      out->mutable_gpu_usage()->set_memory_total_bytes(w.gpu_usage->memory_total_bytes);
      out->set_gpu_usage_at(FormatUnixMs(w.gpu_usage->at_unix_ms));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<WorkerStatus>> KforgeApi::Workers() {
  auto workers = store_->ListWorkers();
  if (!workers.ok()) return workers.status();
  const int64_t now = Now();
  std::vector<WorkerStatus> out;
  std::lock_guard lock(workers_mu_);
  for (auto& w : *workers) {
    // The stored last_seen is written at most every 10 s; the last call
    // this server saw is fresher. A worker stored but not loaded (none, as
    // Init loads every row) counts as silent since its stored time.
    int64_t last = w.last_seen_unix_ms;
    std::optional<ReportedGpuUsage> usage;
    if (auto it = workers_.find(w.id); it != workers_.end()) {
      last = std::max(last, it->second.last_call_ms);
      usage = it->second.gpu_usage;
    }
    const bool connected = last > 0 && now - last <= options_.lease_ttl_ms;
    out.push_back(WorkerStatus{std::move(w), last, connected, usage});
  }
  return out;
}

bool KforgeApi::Connected(const WorkerInfo& w, int64_t now) const {
  return w.last_call_ms > 0 && now - w.last_call_ms <= options_.lease_ttl_ms;
}

bool KforgeApi::WorkerAvailable(const WorkerNeed& need) {
  const int64_t now = Now();
  std::lock_guard lock(workers_mu_);
  for (const auto& [id, w] : workers_) {
    if (!Connected(w, now)) continue;
    if (need.gpu) {
      if (!w.record.compile_only && w.record.arch == need.arch) return true;
      continue;
    }
    const auto& extra = w.record.compile_archs;
    if (w.record.arch == need.arch ||
        std::find(extra.begin(), extra.end(), need.arch) != extra.end())
      return true;
  }
  return false;
}

void KforgeApi::NoteDepartures() {
  const int64_t now = Now();
  std::lock_guard lock(workers_mu_);
  for (auto& [id, w] : workers_) {
    // A worker last seen before a restart that does not come back is
    // noticed the same way, once its stored last call is a TTL old; one
    // never seen at all has nothing to report.
    if (w.departed || Connected(w, now)) continue;
    w.departed = true;
    if (w.last_call_ms == 0) continue;
    const int64_t silent_s = (now - w.last_call_ms) / 1000;
    LogEvent(spdlog::level::info, "worker_left",
             {{"worker", id}, {"name", w.record.name}, {"arch", w.record.arch},
              {"compile_only", w.record.compile_only}, {"silent_s", silent_s}},
             fmt::format("worker {} ({}, {}{}) left: no call for {} s", id, w.record.name,
                         w.record.arch, w.record.compile_only ? ", compile only" : "", silent_s));
  }
}

absl::Status KforgeApi::ExportKernels(
    const v1::ExportKernelsRequest& req,
    const std::function<bool(const v1::ExportedKernel&)>& write) {
  return server::ExportKernels(*cache_, req, write);
}

absl::StatusOr<std::pair<uint64_t, WatchUpdate>> KforgeApi::WatchJob(
    const v1::WatchJobRequest& req, std::function<void(WatchUpdate)> on_update) {
  if (absl::Status s = CheckId("job_id", req.job_id()); !s.ok()) return s;
  // Watch before reading the current state so no change falls in between.
  const uint64_t watch =
      engine_->Watch(req.job_id(), [on_update = std::move(on_update)](const JobEvent& ev) {
        WatchUpdate u;
        if (ev.job.record.created_unix_ms == 0 && ev.final) {
          // The engine stopped (shutdown); the job itself did not finish.
          u.end = absl::UnavailableError("server shutting down; watch again");
          on_update(std::move(u));
          return;
        }
        u.event.emplace();
        JobToProto(ev.job, u.event->mutable_job());
        u.event->set_message(ev.message);
        if (ev.final || IsFinal(ev.job.record.state)) u.end = absl::OkStatus();
        on_update(std::move(u));
      });
  auto current = engine_->Get(req.job_id());
  if (!current.ok()) {
    engine_->Unwatch(watch);
    return current.status();
  }
  WatchUpdate first;
  first.event.emplace();
  JobToProto(*current, first.event->mutable_job());
  first.event->set_message("current state");
  if (IsFinal(current->record.state)) first.end = absl::OkStatus();
  return std::make_pair(watch, std::move(first));
}

void KforgeApi::Unwatch(uint64_t watch) { engine_->Unwatch(watch); }

// ------------------------------------------------------------ WorkerService

int64_t KforgeApi::Now() const { return options_.clock ? options_.clock() : NowMs(); }

std::string KforgeApi::Scrub(std::string_view text, size_t cap) const {
  return ClipMiddle(RedactSessions(Redact(text, options_.secrets)), cap);
}

namespace {

bool SamePrincipal(const WorkerRecord& a, const WorkerRecord& b) {
  return a.id == b.id || (!a.principal.empty() && a.principal == b.principal);
}

}  // namespace

absl::StatusOr<std::string> KforgeApi::WorkerForSession(std::optional<std::string_view> session,
                                                        const std::string& principal) {
  if (!session || session->empty())
    return absl::UnauthenticatedError(fmt::format(
        "missing '{}' metadata: WorkerService calls after Register carry the session token "
        "Register returned",
        kSessionMetadata));
  std::optional<WorkerRecord> bound;
  std::string id;
  {
    std::lock_guard lock(workers_mu_);
    auto it = sessions_.find(SessionHash(*session));
    if (it == sessions_.end())
      return absl::UnauthenticatedError(fmt::format(
          "the '{}' token is not a session this server issued (forged, or from a registration "
          "it no longer has); call Register for a new one",
          kSessionMetadata));
    id = it->second;
    WorkerRecord& w = workers_.at(id).record;
    if (!principal.empty() && w.principal != principal) {
      if (!w.principal.empty())
        return absl::PermissionDeniedError(fmt::format(
            "the session is worker {}'s, which registered with the worker token of '{}', and this "
            "call carries the token of '{}': a session is good only with the token it was "
            "issued under; call Register",
            id, w.principal, principal));
      // Registered before principals: bound by the first credential it
      // calls with.
      w.principal = principal;
      bound = w;
    }
  }
  if (bound) {
    spdlog::info("worker {} ({}) is principal {} (registered before principals)", id, bound->name,
                 principal);
    if (auto s = store_->UpsertWorker(*bound); !s.ok())
      spdlog::warn("worker {}: recording its principal: {}", id, std::string(s.status().message()));
  }
  return id;
}

absl::StatusOr<KforgeApi::WorkerInfo> KforgeApi::Caller(const std::string& caller,
                                                        const std::string& declared) {
  std::lock_guard lock(workers_mu_);
  auto it = workers_.find(caller);
  if (it == workers_.end())
    return absl::UnauthenticatedError(fmt::format("worker {} is not registered", caller));
  if (!declared.empty() && declared != caller)
    return absl::PermissionDeniedError(fmt::format(
        "worker_id: the request names worker '{}' but its session is worker {}'s; a worker "
        "acts only as itself",
        declared.substr(0, kMaxIdLength), caller));
  it->second.last_call_ms = Now();
  if (it->second.departed) {
    it->second.departed = false;
    LogEvent(spdlog::level::info, "worker_back",
             {{"worker", caller}, {"name", it->second.record.name}},
             fmt::format("worker {} ({}) is back", caller, it->second.record.name));
  }
  return it->second;
}

bool KforgeApi::AnotherWorkerCanPromote(const std::string& caller, bool other_principal) {
  const int64_t now = Now();
  std::lock_guard lock(workers_mu_);
  auto me = workers_.find(caller);
  if (me == workers_.end()) return false;
  for (const auto& [id, w] : workers_) {
    if (id == caller || (other_principal && SamePrincipal(w.record, me->second.record)) ||
        w.record.arch != me->second.record.arch || w.record.compile_only)
      continue;
    if (!w.gated && !options_.allow_ungated_promotion) continue;
    if (now - w.last_call_ms <= options_.lease_ttl_ms) return true;
  }
  return false;
}

PromotionLease KforgeApi::PromotionsFor(const WorkerInfo& worker) {
  // A worker whose results cannot promote would only waste a promotion
  // task that a worker which can (of any principal) is there to run.
  // Alone, it takes them: its results are recorded and the job finishes.
  if (!worker.gated && !options_.allow_ungated_promotion &&
      AnotherWorkerCanPromote(worker.record.id, /*other_principal=*/false))
    return PromotionLease::kNone;
  // Its own candidates (its principal's) go to another principal's worker
  // while one can promote them.
  if (options_.confirm_on_another_worker &&
      (options_.require_distinct_confirmer ||
       AnotherWorkerCanPromote(worker.record.id, /*other_principal=*/true)))
    return PromotionLease::kNotOwn;
  return PromotionLease::kAny;
}

absl::Status KforgeApi::Register(const v1::RegisterRequest& req, const std::string& principal,
                                 std::optional<std::string_view> session,
                                 v1::RegisterResponse* resp) {
  if (absl::Status s = ValidateRegistration(req); !s.ok()) return s;
  std::vector<std::string> tools;
  for (const std::string& t : req.sanitizer_tools())
    if (std::find(tools.begin(), tools.end(), t) == tools.end()) tools.push_back(t);
  // compile_archs were checked by ValidateRegistration; the worker's own
  // arch and repeats are dropped here.
  std::vector<std::string> compile_archs;
  for (const std::string& a : req.compile_archs())
    if (a != req.gpu().arch() &&
        std::find(compile_archs.begin(), compile_archs.end(), a) == compile_archs.end())
      compile_archs.push_back(a);
  WorkerRecord w;
  w.name = Scrub(req.worker_name(), kMaxNameLength);
  w.arch = req.gpu().arch();
  w.compile_only = req.compile_only();
  w.sanitizer_tools = tools;
  w.compile_archs = compile_archs;
  w.gpu_json = nlohmann::json{{"name", Scrub(req.gpu().name(), kMaxNameLength)},
                              {"compute_capability", Scrub(req.gpu().compute_capability(), 32)},
                              {"sm_count", req.gpu().sm_count()},
                              {"memory_bytes", req.gpu().memory_bytes()},
                              {"driver_version", Scrub(req.gpu().driver_version(), 64)},
                              {"nvrtc_version", Scrub(req.gpu().nvrtc_version(), 64)}}
                   .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  w.last_seen_unix_ms = Now();
  w.principal = principal;

  // A worker that presents its session keeps its id (and its leases), as
  // long as it is still the same kind of worker under the same credential;
  // anything else is a new worker with a new session: neither a name nor a
  // session hands an identity to another principal.
  std::string token;
  if (session && !session->empty()) {
    std::lock_guard lock(workers_mu_);
    auto s = sessions_.find(SessionHash(*session));
    if (s != sessions_.end()) {
      const WorkerRecord& old = workers_.at(s->second).record;
      const bool same_principal =
          principal.empty() || old.principal.empty() || old.principal == principal;
      if (old.arch == w.arch && old.compile_only == w.compile_only && same_principal) {
        w.id = old.id;
        w.session_hash = old.session_hash;
        if (principal.empty()) w.principal = old.principal;
        token = std::string(*session);
      }
    }
  }
  const bool resumed = !w.id.empty();
  if (!resumed) {
    auto fresh = NewSessionToken();
    if (!fresh.ok()) return fresh.status();
    token = *std::move(fresh);
    w.session_hash = SessionHash(token);
  }
  auto id = store_->UpsertWorker(w);
  if (!id.ok()) return id.status();
  std::vector<std::string> peers;  // connected workers of the same principal and arch
  {
    std::lock_guard lock(workers_mu_);
    w.id = *id;
    const bool gated = std::find(tools.begin(), tools.end(), "memcheck") != tools.end();
    workers_[*id] = WorkerInfo{w, Now(), gated, Scrub(req.gpu().nvrtc_version(), 64)};
    sessions_[w.session_hash] = *id;
    for (const auto& [other, info] : workers_) {
      if (other != *id && !w.principal.empty() && info.record.principal == w.principal &&
          info.record.arch == w.arch && !info.record.compile_only &&
          Now() - info.last_call_ms <= options_.lease_ttl_ms)
        peers.push_back(other);
    }
  }
  LogEvent(spdlog::level::info, resumed ? "worker_resumed" : "worker_joined",
           {{"worker", *id},
            {"name", w.name},
            {"principal", w.principal},
            {"arch", w.arch},
            {"compile_only", w.compile_only},
            {"sanitizer_tools", tools},
            {"compile_archs", compile_archs}},
           fmt::format("worker {} {} as {} (principal {}, {}{}, sanitizer gate: {}{})", w.name,
                       resumed ? "resumed its session" : "joined", *id,
                       w.principal.empty() ? "none" : w.principal, w.arch,
                       w.compile_only ? ", compile only" : "",
                       tools.empty() ? "none" : fmt::format("{}", fmt::join(tools, "+")),
                       compile_archs.empty()
                           ? ""
                           : fmt::format(", compiles for {} too", fmt::join(compile_archs, " "))));
  if (!peers.empty() && !w.compile_only && options_.confirm_on_another_worker)
    spdlog::info("worker {} shares principal {} with connected worker(s) {}: they count as one "
                 "worker for confirmation on another worker (a host gets its own worker token "
                 "to count as another)",
                 *id, w.principal, fmt::join(peers, ", "));
  resp->set_worker_id(*id);
  resp->set_session_token(token);
  resp->set_heartbeat_interval_ms(options_.heartbeat_interval_ms);
  resp->set_lease_ttl_ms(static_cast<int32_t>(options_.lease_ttl_ms));
  return absl::OkStatus();
}

absl::Status KforgeApi::Heartbeat(const std::string& caller, const v1::HeartbeatRequest& req,
                                  v1::HeartbeatResponse* resp) {
  auto worker = Caller(caller, req.worker_id());
  if (!worker.ok()) return worker.status();
  if (req.task_ids().size() > kMaxHeartbeatTasks)
    return Invalid("task_ids", fmt::format("{} ids; at most {}", req.task_ids().size(),
                                           kMaxHeartbeatTasks));
  std::vector<std::string> ids;
  for (const auto& id : req.task_ids()) {
    if (id.empty() || id.size() > kMaxIdLength) return Invalid("task_ids", "contains a malformed id");
    ids.push_back(id);
  }
  std::optional<ReportedGpuUsage> usage;
  if (req.has_gpu_usage()) {
    const v1::GpuUsage& u = req.gpu_usage();
    if (!std::isfinite(u.utilization()) || u.utilization() < 0 || u.utilization() > 1)
      return Invalid("gpu_usage.utilization", fmt::format("{} is not a fraction from 0 to 1",
                                                          u.utilization()));
    if (u.memory_used_bytes() < 0 || u.memory_total_bytes() < 0 ||
        (u.memory_total_bytes() > 0 && u.memory_used_bytes() > u.memory_total_bytes()))
      return Invalid("gpu_usage.memory_used_bytes",
                     "must be between 0 and memory_total_bytes");
    usage = ReportedGpuUsage{u.utilization(), u.memory_used_bytes(), u.memory_total_bytes(), Now()};
  }
  if (!ids.empty()) {
    if (absl::Status s = store_->RenewLeases(caller, ids, Now(), options_.lease_ttl_ms); !s.ok())
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
    auto it = workers_.find(caller);
    if (it != workers_.end() && usage) it->second.gpu_usage = usage;
    const int64_t now = Now();
    if (it != workers_.end() && now - it->second.record.last_seen_unix_ms >= 10000) {
      it->second.record.last_seen_unix_ms = now;
      seen = it->second.record;
    }
  }
  if (seen) {
    if (auto s = store_->UpsertWorker(*seen); !s.ok())
      spdlog::warn("worker {}: recording last seen: {}", caller, std::string(s.status().message()));
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

std::chrono::milliseconds KforgeApi::LeaseWait(const v1::LeaseTaskRequest& req) const {
  return std::chrono::milliseconds(std::clamp(req.wait_ms(), 0, options_.max_lease_wait_ms));
}

absl::Status KforgeApi::LeaseTask(const std::string& caller, const v1::LeaseTaskRequest& req,
                                  v1::LeaseTaskResponse* resp) {
  auto worker = Caller(caller, req.worker_id());
  if (!worker.ok()) return worker.status();
  if (req.wait_ms() < 0) return Invalid("wait_ms", fmt::format("{} is negative", req.wait_ms()));
  for (;;) {
    // Decided per attempt: a worker that connects during a long poll takes
    // over the promotions from then on.
    auto task = store_->LeaseTask(caller, worker->record.arch, worker->record.compile_only, Now(),
                                  options_.lease_ttl_ms, PromotionsFor(*worker));
    // Its own arch first (what only it may be able to run), then COMPILE
    // tasks of the other archs its compiler serves.
    for (const std::string& arch : worker->record.compile_archs) {
      if (!task.ok() || task->has_value()) break;
      task = store_->LeaseTask(caller, arch, /*compile_only=*/true, Now(), options_.lease_ttl_ms,
                               PromotionLease::kNone);
    }
    if (!task.ok()) return task.status();
    if (!task->has_value()) return absl::OkStatus();
    if ((*task)->attempts > options_.max_task_attempts) {
      if (absl::Status s = GiveUp(**task, *worker); !s.ok()) return s;
      continue;
    }
    return FillTask(**task, resp->mutable_task());
  }
}

absl::Status KforgeApi::GiveUp(const TaskRecord& task, const WorkerInfo& worker) {
  EvaluationRecord e;
  e.task_id = task.id;
  e.worker_id = worker.record.id;
  e.outcome = Outcome::kCrashed;
  e.message = fmt::format(
      "{} leased {} times without a result (the workers failed before running the "
      "candidate; their logs say why)",
      kGivenUpPrefix, task.attempts - 1);
  spdlog::warn("task {} of job {}: {}", task.id, task.job_id, e.message);
  if (options_.metrics) options_.metrics->RecordGivenUp();
  return DecideAndComplete(task, worker, std::move(e), "", /*incumbent_failed=*/false);
}

absl::Status KforgeApi::ReportResult(const std::string& caller,
                                     const v1::ReportResultRequest& req,
                                     v1::ReportResultResponse* resp) {
  auto worker = Caller(caller, req.worker_id());
  if (!worker.ok()) return worker.status();
  if (absl::Status s = CheckId("task_id", req.task_id()); !s.ok()) return s;
  if (!req.has_result()) return Invalid("result", "is required");
  const v1::EvalResult& r = req.result();
  auto outcome = OutcomeFromProto(r.outcome());
  if (!outcome.ok()) return outcome.status();
  auto task = store_->GetTask(req.task_id());
  if (!task.ok()) return task.status();
  // The lease first: a worker reports only what it holds, and nothing of a
  // refused report is looked at further, let alone stored.
  if (absl::Status s = CheckLease(*task, caller, Now()); !s.ok()) return s;
  if (*outcome == Outcome::kVerified && task->kind == TaskKind::kCompile)
    return Invalid("result.outcome", "a compile task cannot be verified (nothing was run)");
  auto shape = DecodeTaskShape(task->shape_json);
  if (!shape.ok()) return shape.status();
  // A verified result's timings, as stored and compared: recomputed from
  // the samples when the worker sent them.
  Timing timing, incumbent_timing;
  bool incumbent_failed = false;
  if (*outcome == Outcome::kVerified) {
    if (absl::Status s = CheckTiming("result.timing", r.timing()); !s.ok()) return s;
    auto t = TimingFromProto(r.timing(), "result.timing");
    if (!t.ok()) return t.status();
    timing = *std::move(t);
    // Judged on the arch the worker registered with, never the GPU it names.
    const TimingFloor floor =
        FloorOf(shape->key, worker->record.arch, shape->lengths.cu_q, shape->lengths.cu_k);
    auto below_floor = [&](std::string_view field, double us) -> absl::Status {
      if (us >= floor.us) return absl::OkStatus();
      return Invalid(field, fmt::format("{:.6g} us is below the physical floor of this shape, {}: "
                                        "no GPU of the arch runs it that fast",
                                        us, floor.Describe()));
    };
    if (absl::Status s = below_floor("result.timing.median_us", timing.median_us); !s.ok())
      return s;
    incumbent_failed = r.incumbent_outcome() == v1::EVAL_OUTCOME_WRONG ||
                       r.incumbent_outcome() == v1::EVAL_OUTCOME_CRASHED ||
                       r.incumbent_outcome() == v1::EVAL_OUTCOME_TIMEOUT;
    if (r.incumbent_outcome() != v1::EVAL_OUTCOME_UNSPECIFIED && !incumbent_failed)
      return Invalid("result.incumbent_outcome", "is WRONG, CRASHED, TIMEOUT or unset");
    if (task->kind == TaskKind::kRetime && !incumbent_failed) {
      if (absl::Status s = CheckTiming("result.incumbent_timing", r.incumbent_timing()); !s.ok())
        return s;
      auto inc = TimingFromProto(r.incumbent_timing(), "result.incumbent_timing");
      if (!inc.ok()) return inc.status();
      incumbent_timing = *std::move(inc);
      // The pairs decide a RETIME (core/timing.h); samples on one side only,
      // or counts that do not pair up, would fall back to the weaker spread
      // rule at the reporter's choice.
      if ((!timing.samples_us.empty() || !incumbent_timing.samples_us.empty()) &&
          timing.samples_us.size() != incumbent_timing.samples_us.size()) {
        return Invalid("result.incumbent_timing.samples_us",
                       fmt::format("holds {} samples and result.timing.samples_us {}: a re-timing "
                                   "reports one pair per timed launch",
                                   incumbent_timing.samples_us.size(), timing.samples_us.size()));
      }
      if (absl::Status s = below_floor("result.incumbent_timing.median_us",
                                       incumbent_timing.median_us);
          !s.ok())
        return s;
    }
    incumbent_failed = incumbent_failed && task->kind == TaskKind::kRetime;
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
  e.worker_id = caller;
  // Every text a worker sends is scrubbed here, once, before it is stored,
  // shown to clients or fed to a proposer.
  e.gpu_name = Scrub(r.gpu().name(), kMaxNameLength);
  e.compute_capability = Scrub(r.gpu().compute_capability(), 32);
  e.driver_version = Scrub(r.gpu().driver_version(), 64);
  e.nvrtc_version = Scrub(r.gpu().nvrtc_version(), 64);
  e.compile_options = Scrub(r.compile().options(), kMaxOptionsBytes);
  e.reference_version = Scrub(r.reference_version(), kMaxNameLength);
  e.outcome = *outcome;
  const std::string message = Scrub(r.message(), kMaxMessageBytes);
  e.message = message.empty() ? Scrub(r.errors().detail(), kMaxMessageBytes) : message;
  if (e.outcome == Outcome::kCompileError && !r.compile().log().empty()) {
    // The worker's message says which step failed (NVRTC, loading, the
    // launch plan); the log's error lines follow.
    const std::string log = CompileLogMessage(Scrub(r.compile().log(), kMaxLogBytes));
    e.message = ClipMiddle(message.empty() ? log : message + "\n" + log, kMaxMessageBytes);
  }
  e.compile_ms = r.compile().compile_ms();
  e.registers = r.compile().registers();
  e.spill_bytes = r.compile().spill_stores_bytes() + r.compile().spill_loads_bytes();
  e.static_smem_bytes = r.compile().static_smem_bytes();
  e.dynamic_smem_bytes = r.compile().dynamic_smem_bytes();
  e.max_abs_error = r.errors().max_abs_error();
  e.rel_l2_error = r.errors().rel_l2_error();
  if (e.outcome == Outcome::kVerified) {
    e.timing = timing;
    // Without a reported extent the worker verified at least the shape it
    // was given.
    if (r.has_verified()) {
      auto extent = ExtentFromProto(r.verified(), "result.verified");
      if (!extent.ok()) return extent.status();
      e.verified = *extent;
    } else {
      e.verified = ExtentOf(shape->key);
    }
  }
  if (!r.compile().cubin().empty()) e.cubin_hash = Sha256Hex(r.compile().cubin());
  if (incumbent_failed) {
    e.message = ClipMiddle(fmt::format("retime vs {}: the incumbent failed the same checks ({}){}{}",
                                       task->incumbent_variant_id,
                                       v1::EvalOutcome_Name(r.incumbent_outcome()),
                                       e.message.empty() ? "" : "; ", e.message),
                           kMaxMessageBytes);
  } else if (task->kind == TaskKind::kRetime && e.outcome == Outcome::kVerified) {
    e.incumbent_timing = incumbent_timing;
    e.message = ClipMiddle(fmt::format("retime vs {}: incumbent {:.2f} us (spread {:.2f}){}{}",
                                       task->incumbent_variant_id, incumbent_timing.median_us,
                                       incumbent_timing.Spread(), e.message.empty() ? "" : "; ",
                                       e.message),
                           kMaxMessageBytes);
  }

  if (absl::Status s = DecideAndComplete(*task, *worker, std::move(e), r.compile().cubin(),
                                         incumbent_failed);
      !s.ok())
    return s;
  resp->set_accepted(true);
  return absl::OkStatus();
}

namespace {

// A CONFIRM or RETIME of `variant` in `task`'s job, bucket and shape, with a
// seed of its own drawn from the candidate's EVALUATE seed. Origin fields are
// the caller's to set.
TaskRecord PromotionTask(const TaskRecord& task, TaskKind kind, std::string variant,
                         std::string incumbent, uint64_t candidate_seed) {
  TaskRecord t;
  t.job_id = task.job_id;
  t.kind = kind;
  t.variant_id = std::move(variant);
  t.incumbent_variant_id = std::move(incumbent);
  t.bucket = task.bucket;
  t.arch = task.arch;
  t.shape_json = task.shape_json;
  t.seed = candidate_seed ^ (kind == TaskKind::kRetime ? 0x5bd1e995ULL : 0x27d4eb2fULL);
  return t;
}

}  // namespace

absl::Status KforgeApi::DecideAndComplete(const TaskRecord& task, const WorkerInfo& worker,
                                          EvaluationRecord eval, std::string cubin,
                                          bool incumbent_failed) {
  std::unique_lock lock(best_mu_);
  PromotionInput in;
  in.task = &task;
  in.eval = &eval;
  in.incumbent_failed = incumbent_failed;
  in.gated = worker.gated || options_.allow_ungated_promotion;
  if (auto b = store_->GetBest(task.bucket, task.arch); b.ok()) {
    in.current = *std::move(b);
  } else if (!absl::IsNotFound(b.status())) {
    return b.status();
  }
  in.nvrtc_version = worker.nvrtc_version;
  if (absl::StatusOr<Bucket> b = ParseBucketId(task.bucket); b.ok() && b->deterministic) {
    in.deterministic_bucket = true;
    absl::StatusOr<bool> det = VariantIsDeterministic(task.variant_id);
    if (!det.ok()) return det.status();
    in.candidate_deterministic = *det;
  }
  if (IsPromotion(task.kind) && task.origin_evaluation_id != 0) {
    auto evals = store_->ListEvaluations(task.variant_id);
    if (!evals.ok()) return evals.status();
    for (const EvaluationRecord& e : *evals)
      if (e.id == task.origin_evaluation_id) in.origin = e;
    if (in.origin) {
      std::lock_guard workers_lock(workers_mu_);
      auto w = workers_.find(in.origin->worker_id);
      in.origin_nvrtc_version =
          w != workers_.end() ? w->second.nvrtc_version : in.origin->nvrtc_version;
    }
  }
  PromotionDecision decision = DecidePromotion(in);
  absl::StatusOr<std::optional<TaskRecord>> held =
      HeldPromotion(task, eval, in, decision);
  if (!held.ok()) return held.status();
  if (!decision.note.empty()) {
    eval.message = ClipMiddle(
        eval.message.empty() ? decision.note : decision.note + "; " + eval.message,
        kMaxMessageBytes);
    spdlog::info("task {} ({} of {}): {}", task.id, TaskKindName(task.kind), task.variant_id,
                 decision.note);
  }

  TaskCompletion c;
  c.cubin = std::move(cubin);
  if (decision.promote) {
    BestRecord best;
    best.verified = decision.extent;
    best.measured_by = decision.measured_by;
    c.new_best = best;  // the rest defaults to the evaluation being recorded
  }
  if (decision.follow_up) {
    TaskRecord t = PromotionTask(task, *decision.follow_up, task.variant_id,
                                 decision.incumbent_variant_id, task.seed);
    // The candidate's producer stays its origin through every re-timing;
    // from an EVALUATE the store fills in the evaluation being recorded.
    t.origin_worker_id = task.origin_worker_id;
    t.origin_evaluation_id = task.origin_evaluation_id;
    if (task.kind == TaskKind::kEvaluate) {
      t.origin_worker_id.clear();
      t.origin_evaluation_id = 0;
    }
    c.follow_ups.push_back(std::move(t));
  }
  if (*held) c.follow_ups.push_back(**std::move(held));
  c.eval = eval;
  auto done = store_->CompleteTask(task.id, worker.record.id, Now(), std::move(c));
  if (!done.ok()) return done.status();
  eval.id = done->evaluation_id;
  if (options_.metrics) {
    options_.metrics->RecordEvaluation(task.kind, eval.outcome, eval.compile_ms, task.variant_id);
    if (decision.promote) options_.metrics->RecordPromotion();
  }
  if (decision.promote) {
    if (absl::Status s = cache_->Refresh(task.bucket, task.arch); !s.ok())
      spdlog::error("refreshing the served kernel of {}: {}", task.bucket, std::string(s.message()));
    nlohmann::json fields = {{"bucket", task.bucket},
                             {"arch", task.arch},
                             {"variant", task.variant_id},
                             {"median_us", eval.timing.median_us},
                             {"evaluation", eval.id},
                             {"task_kind", TaskKindName(task.kind)},
                             {"worker", worker.record.id},
                             {"job", task.job_id}};
    if (in.current) {
      fields["previous_variant"] = in.current->variant_id;
      fields["previous_median_us"] = in.current->timing.median_us;
    }
    LogEvent(spdlog::level::info, "promotion", fields,
             fmt::format("promotion: new best for {} on {}: {} ({:.2f} us, {} by worker {}, job "
                         "{}; was {})",
                         task.bucket, task.arch, task.variant_id, eval.timing.median_us,
                         TaskKindName(task.kind), worker.record.id, task.job_id,
                         in.current ? fmt::format("{} at {:.2f} us", in.current->variant_id,
                                                  in.current->timing.median_us)
                                    : std::string("none")));
  }
  // Tell the engine before the completion so the job waits for them.
  for (const std::string& id : done->follow_up_ids) engine_->OnPromotionEnqueued(task.job_id, id);
  lock.unlock();
  engine_->OnTaskCompleted(task, eval);
  if (!done->follow_up_ids.empty()) NotifyTasks();
  return absl::OkStatus();
}

absl::StatusOr<bool> KforgeApi::VariantIsDeterministic(const std::string& variant_id) {
  absl::StatusOr<VariantRecord> v = store_->GetVariant(variant_id);
  if (!v.ok()) return v.status();
  return ManifestSaysDeterministic(v->manifest_json);
}

absl::StatusOr<std::optional<TaskRecord>> KforgeApi::HeldPromotion(
    const TaskRecord& task, const EvaluationRecord& eval, const PromotionInput& in,
    PromotionDecision& decision) {
  if (task.kind == TaskKind::kCompile) return std::nullopt;
  // A promotion that asks for another (its best changed meanwhile) goes on.
  if (IsPromotion(task.kind) && decision.follow_up) return std::nullopt;
  auto tasks = store_->ListTasks(task.job_id);
  if (!tasks.ok()) return tasks.status();
  int in_flight = 0;
  std::set<std::string> tried;  // variants that had a promotion task in this job
  std::vector<const TaskRecord*> done;
  for (const TaskRecord& t : *tasks) {
    if (t.bucket != task.bucket || t.id == task.id) continue;
    const bool active = t.state == TaskState::kQueued || t.state == TaskState::kLeased;
    if (IsPromotion(t.kind)) {
      tried.insert(t.variant_id);
      in_flight += active;
    } else if (t.kind == TaskKind::kEvaluate) {
      if (active) ++in_flight;
      if (t.state == TaskState::kDone) done.push_back(&t);
    }
  }
  if (IsPromotion(task.kind)) tried.insert(task.variant_id);
  // A deterministic bucket's candidates are its deterministic variants only
  // (task's own variant was read for the decision already).
  auto may_serve = [&](const std::string& variant_id) -> absl::StatusOr<bool> {
    if (!in.deterministic_bucket) return true;
    return VariantIsDeterministic(variant_id);
  };
  const bool candidate = task.kind == TaskKind::kEvaluate && eval.outcome == Outcome::kVerified &&
                         (!in.deterministic_bucket || in.candidate_deterministic);
  if (task.kind == TaskKind::kEvaluate) decision.follow_up.reset();  // decided here
  if (in_flight > 0) {
    if (candidate) {
      decision.note = "held: the bucket's other evaluations or its promotion come first, then its "
                      "fastest verified candidate is promoted";
    }
    return std::nullopt;
  }
  std::deque<EvaluationRecord> kept;  // stable addresses for the candidates
  std::vector<HeldCandidate> candidates;
  if (candidate && !tried.count(task.variant_id))
    candidates.push_back({.variant_id = task.variant_id, .task_id = task.id, .eval = &eval, .seed = task.seed});
  for (const TaskRecord* t : done) {
    if (tried.count(t->variant_id) || t->variant_id == task.variant_id) continue;
    absl::StatusOr<bool> ok = may_serve(t->variant_id);
    if (!ok.ok()) return ok.status();
    if (!*ok) continue;
    auto evals = store_->ListEvaluations(t->variant_id);
    if (!evals.ok()) return evals.status();
    for (EvaluationRecord& e : *evals) {
      if (e.task_id != t->id || e.outcome != Outcome::kVerified) continue;
      kept.push_back(std::move(e));
      candidates.push_back(
          {.variant_id = t->variant_id, .task_id = t->id, .eval = &kept.back(), .seed = t->seed});
      break;
    }
  }
  std::optional<BestRecord> best = in.current;
  if (decision.promote) {
    best = BestRecord{};
    best->variant_id = task.variant_id;
    best->timing = eval.timing;
  }
  const std::optional<HeldChoice> choice = ChooseHeldCandidate(candidates, best);
  if (!choice) return std::nullopt;
  TaskRecord t = PromotionTask(task, choice->kind, choice->candidate->variant_id,
                               choice->incumbent_variant_id, choice->candidate->seed);
  // The candidate's EVALUATE is its origin; the store fills it in when that
  // is the report being recorded.
  if (choice->candidate->eval != &eval) {
    t.origin_worker_id = choice->candidate->eval->worker_id;
    t.origin_evaluation_id = choice->candidate->eval->id;
  }
  return std::optional<TaskRecord>(std::move(t));
}

void KforgeApi::NotifyTasks() {
  if (options_.on_tasks) options_.on_tasks();
}

absl::Status KforgeApi::ShuttingDown() {
  return absl::UnavailableError(
      "kforge-server is shutting down; retry when it is back (or on another server)");
}

void KforgeApi::BeginShutdown() { shutting_down_ = true; }

absl::StatusOr<int> KforgeApi::RequeueExpired() {
  auto n = store_->RequeueExpired(Now());
  if (n.ok() && options_.metrics) options_.metrics->RecordLeasesExpired(*n);
  if (n.ok() && *n > 0) {
    spdlog::info("requeued {} task(s) whose lease expired", *n);
    NotifyTasks();
  }
  return n;
}

}  // namespace kforge::server
