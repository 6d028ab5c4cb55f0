#include "server/http/views.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <fmt/format.h>

#include "core/shape.h"
#include "server/http/prometheus.h"

namespace kforge::server::http {
namespace {

using nlohmann::json;

int64_t SystemNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Messages can be long (a compile log); a table cell needs the start.
constexpr size_t kMessageExcerpt = 600;

std::string Excerpt(const std::string& text, size_t n) {
  return text.size() <= n ? text : text.substr(0, n) + " [...]";
}

// Every page of a paged store listing.
template <typename T, typename ListFn>
absl::StatusOr<std::vector<T>> ReadAll(ListFn list) {
  std::vector<T> out;
  Page page{1000, ""};
  for (;;) {
    absl::StatusOr<PageOf<T>> p = list(page);
    if (!p.ok()) return p.status();
    for (T& item : p->items) out.push_back(std::move(item));
    if (p->next_token.empty()) return out;
    page.token = p->next_token;
  }
}

json TimingJson(const Timing& t) {
  return json{{"median_us", t.median_us}, {"p25_us", t.p25_us}, {"p75_us", t.p75_us},
              {"min_us", t.min_us},       {"max_us", t.max_us}, {"samples", t.samples}};
}

json ExtentJson(const SizeExtent& e) {
  return json{{"batch", e.batch},
              {"max_len_q", e.max_len_q},
              {"max_len_k", e.max_len_k},
              {"total_q", e.total_q},
              {"total_k", e.total_k}};
}

json GpuJson(const std::string& gpu_json) {
  const json j = json::parse(gpu_json, nullptr, false);
  return j.is_object() ? j : json::object();
}

json EvaluationJson(const EvaluationRecord& e, std::string_view kind, bool served) {
  json j{{"id", e.id},
         {"variant", e.variant_id},
         {"bucket", e.bucket},
         {"arch", e.arch},
         {"job", e.job_id},
         {"task", e.task_id},
         {"kind", kind},
         {"worker", e.worker_id},
         {"gpu", e.gpu_name},
         {"nvrtc_version", e.nvrtc_version},
         {"outcome", OutcomeName(e.outcome)},
         {"message", Excerpt(e.message, kMessageExcerpt)},
         {"compile_ms", e.compile_ms},
         {"registers", e.registers},
         {"spill_bytes", e.spill_bytes},
         {"static_smem_bytes", e.static_smem_bytes},
         {"dynamic_smem_bytes", e.dynamic_smem_bytes},
         {"max_abs_error", e.max_abs_error},
         {"rel_l2_error", e.rel_l2_error},
         {"created_unix_ms", e.created_unix_ms},
         {"served", served}};
  j["timing"] = e.outcome == Outcome::kVerified ? TimingJson(e.timing) : json(nullptr);
  return j;
}

json VariantSummaryJson(const VariantRecord& v) {
  return json{{"id", v.id},
              {"origin", v.origin},
              {"template", v.template_name},
              {"knobs", v.knobs_json},
              {"model", v.model},
              {"prompt_hash", v.prompt_hash},
              {"parent", v.parent_id},
              {"job", v.job_id},
              {"source_hash", v.source_hash},
              {"created_unix_ms", v.created_unix_ms}};
}

// A task's kind by id, each task read once.
class TaskKinds {
 public:
  explicit TaskKinds(Store* store) : store_(store) {}
  void Add(const TaskRecord& t) { kinds_[t.id] = std::string(TaskKindName(t.kind)); }
  std::string Of(const std::string& task_id) {
    if (task_id.empty()) return "";
    auto it = kinds_.find(task_id);
    if (it != kinds_.end()) return it->second;
    absl::StatusOr<TaskRecord> t = store_->GetTask(task_id);
    std::string kind = t.ok() ? std::string(TaskKindName(t->kind)) : "";
    kinds_[task_id] = kind;
    return kind;
  }

 private:
  Store* store_;
  std::map<std::string, std::string> kinds_;
};

}  // namespace

absl::StatusOr<std::vector<Anchor>> LoadAnchors(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(fmt::format("anchors_file {}: cannot open the file", path));
  std::stringstream buf;
  buf << in.rdbuf();
  const json j = json::parse(buf.str(), nullptr, false);
  auto bad = [&](std::string_view what) {
    return absl::InvalidArgumentError(fmt::format("anchors_file {}: {}", path, what));
  };
  if (j.is_discarded()) return bad("not valid JSON");
  if (!j.is_array()) return bad("must be a JSON array of {\"bucket\", \"name\", \"us\"} objects");
  std::vector<Anchor> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const json& e = j[i];
    const std::string at = fmt::format("[{}]", i);
    if (!e.is_object()) return bad(fmt::format("{}: must be an object", at));
    for (auto it = e.begin(); it != e.end(); ++it)
      if (it.key() != "bucket" && it.key() != "name" && it.key() != "us")
        return bad(fmt::format("{}.{}: unknown key (bucket, name, us)", at, it.key()));
    Anchor a;
    if (!e.contains("bucket") || !e["bucket"].is_string())
      return bad(fmt::format("{}.bucket: must be a bucket id string", at));
    a.bucket = e["bucket"].get<std::string>();
    if (absl::StatusOr<kforge::Bucket> b = ParseBucketId(a.bucket); !b.ok())
      return bad(fmt::format("{}.bucket: {}", at, std::string(b.status().message())));
    if (!e.contains("name") || !e["name"].is_string() || e["name"].get<std::string>().empty())
      return bad(fmt::format("{}.name: must be a non-empty string", at));
    a.name = e["name"].get<std::string>();
    if (!e.contains("us") || !e["us"].is_number() || !(e["us"].get<double>() > 0))
      return bad(fmt::format("{}.us: must be a positive number of microseconds", at));
    a.us = e["us"].get<double>();
    out.push_back(std::move(a));
  }
  return out;
}

DashboardViews::DashboardViews(ViewSources sources) : s_(std::move(sources)) {}

int64_t DashboardViews::Now() const { return s_.clock ? s_.clock() : SystemNowMs(); }

absl::StatusOr<std::vector<JobRecord>> DashboardViews::AllJobs() {
  return ReadAll<JobRecord>([&](const Page& p) { return s_.store->ListJobs(p); });
}

absl::StatusOr<std::vector<BestRecord>> DashboardViews::AllBests() {
  return ReadAll<BestRecord>([&](const Page& p) { return s_.store->ListBest("", p); });
}

absl::StatusOr<std::vector<TaskRecord>> DashboardViews::OpenTasks() {
  absl::StatusOr<std::vector<JobRecord>> active = s_.store->ListActiveJobs();
  if (!active.ok()) return active.status();
  std::vector<TaskRecord> out;
  for (const JobRecord& j : *active) {
    absl::StatusOr<std::vector<TaskRecord>> tasks = s_.store->ListTasks(j.id);
    if (!tasks.ok()) return tasks.status();
    for (TaskRecord& t : *tasks)
      if (t.state == TaskState::kQueued || t.state == TaskState::kLeased) out.push_back(std::move(t));
  }
  return out;
}

json DashboardViews::AnchorsJson(const std::string& bucket, double best_us) const {
  json out = json::array();
  for (const Anchor& a : s_.anchors) {
    if (a.bucket != bucket) continue;
    // speedup > 1: kforge's best is faster than the anchor.
    out.push_back(json{{"name", a.name},
                       {"us", a.us},
                       {"speedup", best_us > 0 ? json(a.us / best_us) : json(nullptr)}});
  }
  return out;
}

json DashboardViews::JobJson(const JobView& job) {
  const JobRecord& r = job.record;
  json progress = json::array();
  for (const BucketProgress& p : job.progress) {
    progress.push_back(json{{"bucket", p.bucket},
                            {"proposed", p.proposed},
                            {"evaluated", p.evaluated},
                            {"verified", p.verified},
                            {"failed", p.failed},
                            {"compiled", p.compiled},
                            {"best_variant", p.best_variant_id},
                            {"best_us", p.best_variant_id.empty() ? json(nullptr)
                                                                  : json(p.best_timing.median_us)}});
  }
  return json{{"id", r.id},
              {"name", r.name},
              {"state", JobStateName(r.state)},
              {"proposer", r.proposer},
              {"compile_only", job.spec.compile_only},
              {"seed", r.seed},
              {"tokens_used", r.tokens_used},
              {"message", r.message},
              {"waiting_for", job.waiting_for},
              {"created_unix_ms", r.created_unix_ms},
              {"updated_unix_ms", r.updated_unix_ms},
              {"budget",
               {{"max_variants", job.spec.max_variants},
                {"max_seconds", job.spec.max_seconds},
                {"max_tokens", job.spec.max_tokens}}},
              {"progress", progress}};
}

absl::StatusOr<json> DashboardViews::Overview() {
  absl::StatusOr<std::vector<WorkerStatus>> workers = s_.api->Workers();
  if (!workers.ok()) return workers.status();
  absl::StatusOr<std::vector<TaskRecord>> open = OpenTasks();
  if (!open.ok()) return open.status();
  absl::StatusOr<std::vector<JobRecord>> jobs = AllJobs();
  if (!jobs.ok()) return jobs.status();
  absl::StatusOr<std::vector<BestRecord>> bests = AllBests();
  if (!bests.ok()) return bests.status();
  absl::StatusOr<int64_t> db = s_.store->DatabaseBytes();
  if (!db.ok()) return db.status();

  std::map<std::string, json> current;  // worker id -> its leased tasks
  int queued = 0, leased = 0;
  for (const TaskRecord& t : *open) {
    if (t.state == TaskState::kQueued) {
      ++queued;
      continue;
    }
    ++leased;
    current[t.worker_id].push_back(json{{"task", t.id},
                                        {"kind", TaskKindName(t.kind)},
                                        {"job", t.job_id},
                                        {"variant", t.variant_id},
                                        {"bucket", t.bucket},
                                        {"arch", t.arch},
                                        {"lease_expires_unix_ms", t.lease_expires_unix_ms}});
  }
  json ws = json::array();
  for (const WorkerStatus& w : *workers) {
    const WorkerRecord& r = w.record;
    auto it = current.find(r.id);
    json usage = nullptr;
    if (w.gpu_usage)
      usage = json{{"utilization", w.gpu_usage->utilization},
                   {"memory_used_bytes", w.gpu_usage->memory_used_bytes},
                   {"memory_total_bytes", w.gpu_usage->memory_total_bytes},
                   {"at_unix_ms", w.gpu_usage->at_unix_ms}};
    ws.push_back(json{{"id", r.id},
                      {"name", r.name},
                      {"arch", r.arch},
                      {"compile_only", r.compile_only},
                      {"compile_archs", r.compile_archs},
                      {"principal", r.principal},
                      {"state", w.connected ? "connected" : "disconnected"},
                      {"last_seen_unix_ms", w.last_call_unix_ms},
                      {"gpu", GpuJson(r.gpu_json)},
                      {"sanitizer_tools", r.sanitizer_tools},
                      {"gpu_usage", usage},
                      {"current_tasks", it == current.end() ? json::array() : it->second}});
  }
  json states = json::object();
  for (JobState st : {JobState::kQueued, JobState::kRunning, JobState::kSucceeded,
                      JobState::kFailed, JobState::kCancelled})
    states[std::string(JobStateName(st))] = 0;
  json waiting = json::array();
  for (const JobRecord& j : *jobs) {
    states[std::string(JobStateName(j.state))] = states[std::string(JobStateName(j.state))].get<int>() + 1;
    if (IsFinal(j.state)) continue;
    const std::string w = s_.engine->WaitingFor(j.id);
    if (!w.empty()) waiting.push_back(json{{"job", j.id}, {"waiting_for", w}});
  }
  json out{{"version", s_.version},
           {"now_unix_ms", Now()},
           {"database_bytes", *db},
           {"workers", ws},
           {"jobs", states},
           {"waiting_jobs", waiting},
           {"tasks", {{"queued", queued}, {"leased", leased}}},
           {"tuned_buckets", bests->size()}};
  if (s_.metrics) {
    const MetricsSnapshot m = s_.metrics->Snapshot();
    out["started_unix_ms"] = m.started_unix_ms;
    out["verified_last_minute"] = m.verified_last_minute;
  }
  return out;
}

absl::StatusOr<json> DashboardViews::Jobs(int limit) {
  if (limit < 1 || limit > 1000)
    return absl::InvalidArgumentError(fmt::format("limit: {} is not in [1, 1000]", limit));
  absl::StatusOr<PageOf<JobRecord>> page = s_.store->ListJobs(Page{limit, ""});
  if (!page.ok()) return page.status();
  json jobs = json::array();
  for (const JobRecord& rec : page->items) {
    absl::StatusOr<JobView> view = DecodeJob(rec);
    JobView v;
    if (view.ok()) v = *std::move(view);
    else v.record = rec;  // a spec that does not decode still lists
    if (!IsFinal(rec.state)) v.waiting_for = s_.engine->WaitingFor(rec.id);
    jobs.push_back(JobJson(v));
  }
  return json{{"jobs", jobs}};
}

absl::StatusOr<json> DashboardViews::Job(const std::string& job_id) {
  absl::StatusOr<JobView> view = s_.engine->Get(job_id);
  if (!view.ok()) return view.status();
  absl::StatusOr<std::vector<TaskRecord>> tasks = s_.store->ListTasks(job_id);
  if (!tasks.ok()) return tasks.status();
  TaskKinds kinds(s_.store);
  std::vector<std::string> variants;
  std::map<std::string, std::map<std::string, int>> task_states;  // bucket -> state -> n
  for (const TaskRecord& t : *tasks) {
    kinds.Add(t);
    if (std::find(variants.begin(), variants.end(), t.variant_id) == variants.end())
      variants.push_back(t.variant_id);
    ++task_states[t.bucket][std::string(TaskStateName(t.state))];
  }
  std::map<std::string, std::vector<EvaluationRecord>> verified;  // bucket -> this job's
  for (const std::string& v : variants) {
    absl::StatusOr<std::vector<EvaluationRecord>> evals = s_.store->ListEvaluations(v);
    if (!evals.ok()) return evals.status();
    for (EvaluationRecord& e : *evals)
      if (e.job_id == job_id && e.outcome == Outcome::kVerified)
        verified[e.bucket].push_back(std::move(e));
  }
  json out = JobJson(*view);
  json buckets = json::array();
  for (const BucketProgress& p : view->progress) {
    std::vector<EvaluationRecord>& evals = verified[p.bucket];
    std::sort(evals.begin(), evals.end(), [](const auto& a, const auto& b) {
      return std::tie(a.created_unix_ms, a.id) < std::tie(b.created_unix_ms, b.id);
    });
    // The plot: every verified result of this job, and the best candidate
    // so far, which (like the job's progress) counts EVALUATE results; a
    // CONFIRM or RETIME re-measures a candidate at promotion strength.
    json points = json::array();
    json best_line = json::array();
    double best = 0;
    for (const EvaluationRecord& e : evals) {
      const std::string kind = kinds.Of(e.task_id);
      points.push_back(json{{"t", e.created_unix_ms},
                            {"us", e.timing.median_us},
                            {"variant", e.variant_id},
                            {"kind", kind},
                            {"evaluation", e.id}});
      if (kind == "evaluate" && (best == 0 || e.timing.median_us < best)) {
        best = e.timing.median_us;
        best_line.push_back(json{{"t", e.created_unix_ms}, {"us", best}, {"variant", e.variant_id}});
      }
    }
    json served = nullptr;
    double served_us = 0;
    absl::StatusOr<kforge::Bucket> b = ParseBucketId(p.bucket);
    if (b.ok()) {
      absl::StatusOr<BestRecord> best_record = s_.store->GetBest(p.bucket, b->arch);
      if (best_record.ok()) {
        served_us = best_record->timing.median_us;
        served = json{{"variant", best_record->variant_id},
                      {"us", served_us},
                      {"measured_by", best_record->measured_by},
                      {"updated_unix_ms", best_record->updated_unix_ms}};
      } else if (!absl::IsNotFound(best_record.status())) {
        return best_record.status();
      }
    }
    const double compare_us = served_us > 0 ? served_us : best;
    buckets.push_back(json{{"bucket", p.bucket},
                           {"arch", b.ok() ? b->arch : ""},
                           {"tasks", task_states[p.bucket]},
                           {"points", points},
                           {"best_so_far", best_line},
                           {"served", served},
                           {"anchors", AnchorsJson(p.bucket, compare_us)}});
  }
  out["buckets"] = buckets;
  return out;
}

absl::StatusOr<json> DashboardViews::Buckets() {
  absl::StatusOr<std::vector<BestRecord>> bests = AllBests();
  if (!bests.ok()) return bests.status();
  absl::StatusOr<std::vector<JobRecord>> jobs = AllJobs();
  if (!jobs.ok()) return jobs.status();
  struct Row {
    std::optional<BestRecord> best;
    std::set<std::string> jobs;
  };
  std::map<std::string, Row> rows;
  for (BestRecord& b : *bests) rows[b.bucket].best = std::move(b);
  for (const JobRecord& j : *jobs) {
    absl::StatusOr<JobView> v = DecodeJob(j);
    if (!v.ok()) continue;
    for (const BucketProgress& p : v->progress) rows[p.bucket].jobs.insert(j.id);
  }
  json out = json::array();
  for (const auto& [id, row] : rows) {
    absl::StatusOr<kforge::Bucket> b = ParseBucketId(id);
    json best = nullptr;
    if (row.best)
      best = json{{"variant", row.best->variant_id},
                  {"us", row.best->timing.median_us},
                  {"measured_by", row.best->measured_by},
                  {"updated_unix_ms", row.best->updated_unix_ms}};
    out.push_back(json{{"bucket", id},
                       {"arch", b.ok() ? b->arch : ""},
                       {"op", b.ok() ? (b->op == Op::kForward ? "fwd" : "bwd") : ""},
                       {"best", best},
                       {"jobs", row.jobs},
                       {"anchors", AnchorsJson(id, row.best ? row.best->timing.median_us : 0)}});
  }
  return json{{"buckets", out}};
}

absl::StatusOr<json> DashboardViews::Bucket(const std::string& bucket_id) {
  absl::StatusOr<kforge::Bucket> b = ParseBucketId(bucket_id);
  if (!b.ok())
    return absl::InvalidArgumentError(
        fmt::format("bucket: {}", std::string(b.status().message())));
  std::optional<BestRecord> best;
  if (absl::StatusOr<BestRecord> r = s_.store->GetBest(bucket_id, b->arch); r.ok()) {
    best = *std::move(r);
  } else if (!absl::IsNotFound(r.status())) {
    return r.status();
  }
  absl::StatusOr<std::vector<VariantRecord>> variants = ReadAll<VariantRecord>(
      [&](const Page& p) { return s_.store->ListVariants(bucket_id, p); });
  if (!variants.ok()) return variants.status();
  TaskKinds kinds(s_.store);
  std::vector<EvaluationRecord> evals;
  json vs = json::array();
  for (const VariantRecord& v : *variants) {
    vs.push_back(VariantSummaryJson(v));
    absl::StatusOr<std::vector<EvaluationRecord>> e = s_.store->ListEvaluations(v.id);
    if (!e.ok()) return e.status();
    for (EvaluationRecord& r : *e)
      if (r.bucket == bucket_id) evals.push_back(std::move(r));
  }
  std::sort(evals.begin(), evals.end(),
            [](const auto& x, const auto& y) { return x.id < y.id; });
  json ej = json::array();
  json history = json::array();  // the fastest verified time so far, over time
  double fastest = 0;
  std::map<std::string, int> outcomes;
  for (const EvaluationRecord& e : evals) {
    const bool served = best && best->evaluation_id == e.id;
    ej.push_back(EvaluationJson(e, kinds.Of(e.task_id), served));
    ++outcomes[std::string(OutcomeName(e.outcome))];
    if (e.outcome == Outcome::kVerified && (fastest == 0 || e.timing.median_us < fastest)) {
      fastest = e.timing.median_us;
      history.push_back(json{{"t", e.created_unix_ms},
                             {"us", fastest},
                             {"variant", e.variant_id},
                             {"kind", kinds.Of(e.task_id)},
                             {"evaluation", e.id}});
    }
  }
  json best_json = nullptr;
  if (best) {
    best_json = json{{"variant", best->variant_id},
                     {"evaluation", best->evaluation_id},
                     {"timing", TimingJson(best->timing)},
                     {"measured_by", best->measured_by},
                     {"verified", ExtentJson(best->verified)},
                     {"updated_unix_ms", best->updated_unix_ms}};
  }
  return json{{"bucket", bucket_id},
              {"arch", b->arch},
              {"best", best_json},
              {"history", history},
              {"outcomes", outcomes},
              {"evaluations", ej},
              {"variants", vs},
              {"anchors", AnchorsJson(bucket_id, best ? best->timing.median_us : 0)}};
}

absl::StatusOr<json> DashboardViews::Variant(const std::string& variant_id) {
  absl::StatusOr<VariantRecord> v = s_.store->GetVariant(variant_id);
  if (!v.ok()) return v.status();
  absl::StatusOr<std::vector<EvaluationRecord>> evals = s_.store->ListEvaluations(variant_id);
  if (!evals.ok()) return evals.status();
  TaskKinds kinds(s_.store);
  json ej = json::array();
  for (const EvaluationRecord& e : *evals) {
    json j = EvaluationJson(e, kinds.Of(e.task_id), false);
    j["message"] = e.message;  // the variant's own page shows all of it
    ej.push_back(std::move(j));
  }
  json out = VariantSummaryJson(*v);
  out["source"] = v->source;
  out["manifest"] = v->manifest_json;
  out["evaluations"] = ej;
  return out;
}

absl::StatusOr<json> DashboardViews::Spend() {
  absl::StatusOr<std::vector<JobRecord>> jobs = AllJobs();
  if (!jobs.ok()) return jobs.status();
  absl::StatusOr<std::vector<VariantRecord>> variants =
      ReadAll<VariantRecord>([&](const Page& p) { return s_.store->ListVariants("", p); });
  if (!variants.ok()) return variants.status();
  struct Made {
    int variants = 0;
    int from_model = 0;
    std::set<std::string> models;
  };
  std::map<std::string, Made> by_job;
  for (const VariantRecord& v : *variants) {
    Made& m = by_job[v.job_id];
    ++m.variants;
    if (v.origin == "model") ++m.from_model;
    if (!v.model.empty()) m.models.insert(v.model);
  }
  int64_t total = 0;
  std::map<std::string, std::pair<int64_t, int>> by_proposer;  // tokens, jobs
  json js = json::array();
  for (const JobRecord& j : *jobs) {
    const Made& m = by_job[j.id];
    total += j.tokens_used;
    auto& p = by_proposer[j.proposer];
    p.first += j.tokens_used;
    ++p.second;
    absl::StatusOr<JobSpec> spec = DecodeJobSpec(j.spec_json);
    js.push_back(json{{"id", j.id},
                      {"name", j.name},
                      {"state", JobStateName(j.state)},
                      {"proposer", j.proposer},
                      {"tokens_used", j.tokens_used},
                      {"max_tokens", spec.ok() ? spec->max_tokens : 0},
                      {"variants", m.variants},
                      {"model_variants", m.from_model},
                      {"models", m.models},
                      {"created_unix_ms", j.created_unix_ms}});
  }
  json bp = json::array();
  for (const auto& [name, p] : by_proposer)
    bp.push_back(json{{"proposer", name}, {"tokens_used", p.first}, {"jobs", p.second}});
  return json{{"total_tokens", total}, {"by_proposer", bp}, {"jobs", js}};
}

absl::StatusOr<std::string> DashboardViews::Metrics() {
  absl::StatusOr<std::vector<JobRecord>> jobs = AllJobs();
  if (!jobs.ok()) return jobs.status();
  absl::StatusOr<std::vector<TaskRecord>> open = OpenTasks();
  if (!open.ok()) return open.status();
  absl::StatusOr<std::vector<WorkerStatus>> workers = s_.api->Workers();
  if (!workers.ok()) return workers.status();
  absl::StatusOr<std::vector<BestRecord>> bests = AllBests();
  if (!bests.ok()) return bests.status();
  absl::StatusOr<int64_t> db = s_.store->DatabaseBytes();
  if (!db.ok()) return db.status();
  const MetricsSnapshot m = s_.metrics ? s_.metrics->Snapshot() : MetricsSnapshot{};

  PrometheusText p;
  p.Gauge("kforge_build_info", "The running kforge-server's version (value 1).",
          {{{{"version", s_.version}}, 1}});
  p.Gauge("kforge_start_time_seconds", "When this server process started (unix seconds).",
          {{{}, static_cast<double>(m.started_unix_ms) / 1000.0}});

  std::vector<std::pair<Labels, Histogram>> rpcs;
  for (const auto& [key, h] : m.rpcs) rpcs.push_back({{{"method", key.method}, {"code", key.code}}, h});
  p.Histograms("kforge_rpc_duration_seconds",
               "gRPC calls by method and status code, from arrival to status sent (long polls "
               "and watch streams count their whole length); _count is the number of calls.",
               rpcs);

  std::map<std::string, int> by_state;
  std::map<std::string, int64_t> tokens;
  int waiting = 0;
  for (JobState st : {JobState::kQueued, JobState::kRunning, JobState::kSucceeded,
                      JobState::kFailed, JobState::kCancelled})
    by_state[std::string(JobStateName(st))] = 0;
  for (const JobRecord& j : *jobs) {
    ++by_state[std::string(JobStateName(j.state))];
    tokens[j.proposer] += j.tokens_used;
    if (!IsFinal(j.state) && !s_.engine->WaitingFor(j.id).empty()) ++waiting;
  }
  std::vector<Sample> job_samples;
  for (const auto& [st, n] : by_state) job_samples.push_back({{{"state", st}}, double(n)});
  p.Gauge("kforge_jobs", "Stored jobs by state.", job_samples);
  p.Gauge("kforge_jobs_waiting_for_worker",
          "Running jobs whose open tasks no connected worker can run.", {{{}, double(waiting)}});

  int queued = 0, leased = 0;
  std::map<std::tuple<std::string, std::string, std::string>, int> open_by;
  for (const TaskRecord& t : *open) {
    (t.state == TaskState::kQueued ? queued : leased)++;
    ++open_by[{std::string(TaskStateName(t.state)), std::string(TaskKindName(t.kind)), t.arch}];
  }
  p.Gauge("kforge_tasks_queued", "Tasks waiting for a worker.", {{{}, double(queued)}});
  p.Gauge("kforge_tasks_leased", "Tasks a worker holds a lease on.", {{{}, double(leased)}});
  std::vector<Sample> open_samples;
  for (const auto& [k, n] : open_by)
    open_samples.push_back(
        {{{"state", std::get<0>(k)}, {"kind", std::get<1>(k)}, {"arch", std::get<2>(k)}}, double(n)});
  p.Gauge("kforge_tasks_open", "Queued and leased tasks by state, kind and arch.", open_samples);
  p.Counter("kforge_task_leases_expired_total",
            "Leases that ended without a report and went back to the queue.",
            {{{}, double(m.leases_expired)}});
  p.Counter("kforge_tasks_given_up_total",
            "Tasks recorded as crashed after max_task_attempts leases without a result.",
            {{{}, double(m.tasks_given_up)}});

  std::vector<Sample> evals;
  for (const auto& [k, n] : m.evaluations)
    evals.push_back({{{"kind", std::string(TaskKindName(k.kind))},
                      {"outcome", std::string(OutcomeName(k.outcome))}},
                     double(n)});
  p.Counter("kforge_evaluations_total",
            "Results recorded since the server started, by task kind and outcome.", evals);
  p.Gauge("kforge_verified_variants_last_minute",
          "Distinct variants verified (any task kind) in the last 60 s.",
          {{{}, double(m.verified_last_minute)}});
  p.Counter("kforge_promotions_total", "Bests replaced since the server started.",
            {{{}, double(m.promotions)}});
  p.Histograms("kforge_compile_duration_seconds",
               "NVRTC compile times workers reported with their results.",
               {{{}, m.compile_seconds}});

  std::map<std::tuple<std::string, std::string, std::string>, int> worker_counts;
  for (const WorkerStatus& w : *workers)
    ++worker_counts[{w.record.arch, w.connected ? "connected" : "disconnected",
                     w.record.compile_only ? "compile" : "gpu"}];
  std::vector<Sample> worker_samples;
  for (const auto& [k, n] : worker_counts)
    worker_samples.push_back(
        {{{"arch", std::get<0>(k)}, {"state", std::get<1>(k)}, {"kind", std::get<2>(k)}}, double(n)});
  p.Gauge("kforge_workers", "Stored workers by arch, state and kind (gpu or compile only).",
          worker_samples);
  std::vector<Sample> utilization, memory;
  for (const WorkerStatus& w : *workers) {
    if (!w.connected || !w.gpu_usage) continue;
    const Labels l = {{"worker", w.record.id}, {"name", w.record.name}, {"arch", w.record.arch}};
    utilization.push_back({l, w.gpu_usage->utilization});
    memory.push_back({l, double(w.gpu_usage->memory_used_bytes)});
  }
  p.Gauge("kforge_worker_gpu_utilization_ratio",
          "Fraction of time a kernel ran on a connected worker's GPU, as its last heartbeat "
          "reported (NVML).",
          utilization);
  p.Gauge("kforge_worker_gpu_memory_used_bytes",
          "GPU memory in use on a connected worker, as its last heartbeat reported.", memory);

  std::map<std::string, int> best_by_arch;
  for (const BestRecord& b : *bests) ++best_by_arch[b.arch];
  std::vector<Sample> best_samples;
  for (const auto& [arch, n] : best_by_arch) best_samples.push_back({{{"arch", arch}}, double(n)});
  p.Gauge("kforge_tuned_buckets", "Buckets with a served best, by arch.", best_samples);

  std::vector<Sample> token_samples;
  for (const auto& [proposer, n] : tokens)
    token_samples.push_back({{{"proposer", proposer}}, double(n)});
  p.Counter("kforge_model_tokens_total",
            "Model tokens the stored jobs spent, by proposer (what the agent records of its "
            "spend; no price is recorded).",
            token_samples);
  p.Gauge("kforge_database_bytes", "Size of the SQLite database file.", {{{}, double(*db)}});
  return p.text();
}

}  // namespace kforge::server::http
