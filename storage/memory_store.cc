// MemoryStore: the Store contract over std containers, for tests of the
// components above storage (and to pin down the contract: the typed suite in
// store_test.cc runs against this and SqliteStore alike).
//
// Thread-safe: one mutex guards everything; each method validates fully
// before it mutates, so a failed call changes nothing, as a rolled-back
// transaction would.
#include <fmt/format.h>

#include <map>
#include <unordered_map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "storage/store.h"
#include "storage/store_internal.h"

namespace kforge {
namespace {

using namespace storage_internal;  // NOLINT: this file is its implementation

// Rows are keyed by the number in their id, as SQLite keys them by rowid, so
// ordering (oldest first, newest first, paging) matches.
template <typename T>
using Table = std::map<int64_t, T>;

class MemoryStore final : public Store {
 public:
  absl::StatusOr<std::string> PutVariant(VariantRecord v) override {
    if (absl::Status s = PrepareVariant(v, NowUnixMs()); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    if (auto it = variant_by_hash_.find(v.source_hash); it != variant_by_hash_.end())
      return FormatId('v', it->second);
    absl::StatusOr<int64_t> n = NewRowId('v', v.id, variants_, next_variant_);
    if (!n.ok()) return n.status();
    v.id = FormatId('v', *n);
    variant_by_hash_[v.source_hash] = *n;
    variants_[*n] = std::move(v);
    return FormatId('v', *n);
  }

  absl::StatusOr<VariantRecord> GetVariant(const std::string& id) override {
    absl::MutexLock lock(&mu_);
    const VariantRecord* v = Find(variants_, 'v', id);
    if (v == nullptr) return NotFound("variant", id);
    return *v;
  }

  absl::StatusOr<PageOf<VariantRecord>> ListVariants(const std::string& bucket,
                                                     const Page& page) override {
    absl::StatusOr<int64_t> after = ParsePageToken(page.token);
    if (!after.ok()) return after.status();
    absl::MutexLock lock(&mu_);
    std::vector<const VariantRecord*> rows;
    auto it = *after == 0 ? variants_.end() : variants_.lower_bound(*after);
    while (it != variants_.begin() && rows.size() <= static_cast<size_t>(PageLimit(page))) {
      --it;
      if (bucket.empty() || EvaluatedOn(it->first, bucket)) rows.push_back(&it->second);
    }
    return MakePage(rows, PageLimit(page), [](const VariantRecord& v) {
      return fmt::format("{}", *ParseId('v', v.id));
    });
  }

  absl::StatusOr<std::vector<EvaluationRecord>> ListEvaluations(
      const std::string& variant_id) override {
    absl::MutexLock lock(&mu_);
    std::optional<int64_t> n = ParseId('v', variant_id);
    if (!n || !variants_.contains(*n)) return NotFound("variant", variant_id);
    std::vector<EvaluationRecord> out;
    for (int64_t e : evals_by_variant_[*n]) out.push_back(evaluations_.at(e));
    return out;
  }

  absl::Status PutCubin(const std::string& hash, const std::string& bytes) override {
    if (absl::Status s = CheckCubinHash(hash, bytes); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    cubins_.try_emplace(hash, bytes);
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> GetCubin(const std::string& hash) override {
    absl::MutexLock lock(&mu_);
    auto it = cubins_.find(hash);
    if (it == cubins_.end()) return NotFound("cubin", hash);
    return it->second;
  }

  absl::StatusOr<BestRecord> GetBest(const std::string& bucket,
                                     const std::string& arch) override {
    absl::MutexLock lock(&mu_);
    auto it = best_.find({bucket, arch});
    if (it == best_.end()) return NotFound("best", fmt::format("{} {}", bucket, arch));
    return it->second;
  }

  absl::StatusOr<PageOf<BestRecord>> ListBest(const std::string& arch,
                                              const Page& page) override {
    absl::StatusOr<std::pair<std::string, std::string>> after = ParseBestToken(page.token);
    if (!after.ok()) return after.status();
    absl::MutexLock lock(&mu_);
    std::vector<const BestRecord*> rows;
    auto it = page.token.empty() ? best_.begin() : best_.upper_bound(*after);
    for (; it != best_.end() && rows.size() <= static_cast<size_t>(PageLimit(page)); ++it) {
      if (arch.empty() || it->second.arch == arch) rows.push_back(&it->second);
    }
    return MakePage(rows, PageLimit(page), &BestToken);
  }

  absl::StatusOr<CompletedTask> CompleteTask(const std::string& task_id,
                                             const std::string& worker_id, int64_t now,
                                             TaskCompletion c) override {
    absl::MutexLock lock(&mu_);
    // Everything is checked before anything changes, as a transaction would.
    TaskRecord* task = Find(tasks_, 't', task_id);
    if (task == nullptr) return NotFound("task", task_id);
    if (absl::Status s = CheckLease(*task, worker_id, now); !s.ok()) return s;
    EvaluationRecord& eval = c.eval;
    PrepareEvaluation(*task, worker_id, now, eval);
    std::optional<int64_t> variant = ParseId('v', eval.variant_id);
    if (eval.variant_id.empty())
      return absl::InvalidArgumentError("evaluation: variant_id is empty");
    if (!variant || !variants_.contains(*variant)) return NotFound("variant", eval.variant_id);
    if (absl::Status s = PrepareCubin(c.cubin, eval); !s.ok()) return s;
    if (c.cubin.empty() && !eval.cubin_hash.empty() && !cubins_.contains(eval.cubin_hash))
      return NotFound("cubin", eval.cubin_hash);
    eval.id = next_evaluation_;
    if (c.new_best) {
      PrepareBest(eval, now, *c.new_best);
      if (absl::Status s = CheckBest(*c.new_best, eval); !s.ok()) return s;
    }
    PrepareFollowUps(eval, c.follow_ups);
    if (absl::Status s = CheckNewTasks(c.follow_ups, now); !s.ok()) return s;

    CompletedTask done;
    done.evaluation_id = eval.id;
    ++next_evaluation_;
    if (!c.cubin.empty()) cubins_.try_emplace(eval.cubin_hash, std::move(c.cubin));
    evals_by_variant_[*variant].push_back(eval.id);
    evaluations_[eval.id] = std::move(eval);
    task->state = TaskState::kDone;
    if (c.new_best) best_[{c.new_best->bucket, c.new_best->arch}] = std::move(*c.new_best);
    done.follow_up_ids = InsertTasks(std::move(c.follow_ups));
    return done;
  }

  absl::StatusOr<std::string> CreateJob(JobRecord job) override {
    if (absl::Status s = PrepareJob(job, NowUnixMs()); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    absl::StatusOr<int64_t> n = NewRowId('j', job.id, jobs_, next_job_);
    if (!n.ok()) return n.status();
    job.id = FormatId('j', *n);
    jobs_[*n] = Job{std::move(job), 0};
    return FormatId('j', *n);
  }

  absl::StatusOr<JobRecord> GetJob(const std::string& id) override {
    absl::MutexLock lock(&mu_);
    const Job* job = Find(jobs_, 'j', id);
    if (job == nullptr) return NotFound("job", id);
    return job->record;
  }

  absl::Status UpdateJob(const JobRecord& job) override {
    const int64_t now = NowUnixMs();
    absl::MutexLock lock(&mu_);
    Job* row = Find(jobs_, 'j', job.id);
    if (row == nullptr) return NotFound("job", job.id);
    const int64_t created = row->record.created_unix_ms;
    row->record = job;
    row->record.created_unix_ms = created;
    row->record.updated_unix_ms = now;
    return absl::OkStatus();
  }

  absl::StatusOr<PageOf<JobRecord>> ListJobs(const Page& page) override {
    absl::StatusOr<int64_t> after = ParsePageToken(page.token);
    if (!after.ok()) return after.status();
    absl::MutexLock lock(&mu_);
    std::vector<const JobRecord*> rows;
    auto it = *after == 0 ? jobs_.end() : jobs_.lower_bound(*after);
    while (it != jobs_.begin() && rows.size() <= static_cast<size_t>(PageLimit(page))) {
      --it;
      rows.push_back(&it->second.record);
    }
    return MakePage(rows, PageLimit(page), [](const JobRecord& j) {
      return fmt::format("{}", *ParseId('j', j.id));
    });
  }

  absl::StatusOr<std::vector<JobRecord>> ListActiveJobs() override {
    absl::MutexLock lock(&mu_);
    std::vector<JobRecord> out;
    for (const auto& [n, job] : jobs_) {
      if (job.record.state == JobState::kQueued || job.record.state == JobState::kRunning)
        out.push_back(job.record);
    }
    return out;
  }

  absl::StatusOr<std::vector<std::string>> EnqueueTasks(
      std::vector<TaskRecord> tasks) override {
    const int64_t now = NowUnixMs();
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckNewTasks(tasks, now); !s.ok()) return s;
    return InsertTasks(std::move(tasks));
  }

  absl::StatusOr<TaskRecord> GetTask(const std::string& id) override {
    absl::MutexLock lock(&mu_);
    const TaskRecord* t = Find(tasks_, 't', id);
    if (t == nullptr) return NotFound("task", id);
    return *t;
  }

  absl::StatusOr<std::vector<TaskRecord>> ListTasks(const std::string& job_id) override {
    absl::MutexLock lock(&mu_);
    if (Find(jobs_, 'j', job_id) == nullptr) return NotFound("job", job_id);
    std::vector<TaskRecord> out;
    for (const auto& [n, t] : tasks_)
      if (t.job_id == job_id) out.push_back(t);
    return out;
  }

  absl::StatusOr<std::optional<TaskRecord>> LeaseTask(const std::string& worker_id,
                                                      const std::string& arch,
                                                      bool compile_only, int64_t now_unix_ms,
                                                      int64_t ttl_ms,
                                                      PromotionLease promotions) override {
    if (worker_id.empty()) return absl::InvalidArgumentError("lease: worker_id is empty");
    if (ttl_ms <= 0) return absl::InvalidArgumentError("lease: ttl_ms must be positive");
    absl::MutexLock lock(&mu_);
    TaskRecord* pick = nullptr;
    Job* pick_job = nullptr;
    for (auto& [n, t] : tasks_) {
      if (t.state != TaskState::kQueued || t.arch != arch) continue;
      if (compile_only && t.kind != TaskKind::kCompile) continue;
      if (IsPromotion(t.kind) && (promotions == PromotionLease::kNone ||
                                  (promotions == PromotionLease::kNotOwn &&
                                   SameWorker(t.origin_worker_id, worker_id))))
        continue;
      Job* job = Find(jobs_, 'j', t.job_id);
      // Promotion tasks go first (see Store::LeaseTask). Tasks are visited
      // oldest first, so among equals only a strictly earlier turn wins.
      const bool promotion = IsPromotion(t.kind);
      const bool pick_promotion = pick != nullptr && IsPromotion(pick->kind);
      if (pick == nullptr || (promotion && !pick_promotion) ||
          (promotion == pick_promotion && job->lease_seq < pick_job->lease_seq)) {
        pick = &t;
        pick_job = job;
      }
    }
    if (pick == nullptr) return std::optional<TaskRecord>();
    pick_job->lease_seq = ++lease_seq_;
    pick->state = TaskState::kLeased;
    pick->worker_id = worker_id;
    pick->lease_expires_unix_ms = now_unix_ms + ttl_ms;
    ++pick->attempts;
    return std::optional<TaskRecord>(*pick);
  }

  absl::Status RenewLeases(const std::string& worker_id, const std::vector<std::string>& task_ids,
                           int64_t now_unix_ms, int64_t ttl_ms) override {
    if (ttl_ms <= 0) return absl::InvalidArgumentError("renew: ttl_ms must be positive");
    absl::MutexLock lock(&mu_);
    for (const std::string& id : task_ids) {
      TaskRecord* t = Find(tasks_, 't', id);
      if (t != nullptr && t->state == TaskState::kLeased && t->worker_id == worker_id)
        t->lease_expires_unix_ms = now_unix_ms + ttl_ms;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int> RequeueExpired(int64_t now_unix_ms) override {
    absl::MutexLock lock(&mu_);
    int count = 0;
    for (auto& [n, t] : tasks_) {
      if (t.state == TaskState::kLeased && t.lease_expires_unix_ms < now_unix_ms) {
        t.state = TaskState::kQueued;
        t.worker_id.clear();
        t.lease_expires_unix_ms = 0;
        ++count;
      }
    }
    return count;
  }

  absl::StatusOr<std::vector<std::string>> CancelTasks(const std::string& job_id) override {
    absl::MutexLock lock(&mu_);
    if (Find(jobs_, 'j', job_id) == nullptr) return NotFound("job", job_id);
    std::vector<std::string> ids;
    for (auto& [n, t] : tasks_) {
      if (t.job_id == job_id &&
          (t.state == TaskState::kQueued || t.state == TaskState::kLeased)) {
        t.state = TaskState::kCancelled;
        ids.push_back(t.id);
      }
    }
    return ids;
  }

  absl::StatusOr<std::string> UpsertWorker(WorkerRecord w) override {
    if (absl::Status s = PrepareWorker(w, NowUnixMs()); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    int64_t n = 0;
    if (!w.id.empty()) {
      std::optional<int64_t> given = ParseId('w', w.id);
      if (!given || !workers_.contains(*given)) return NotFound("worker", w.id);
      n = *given;
    }
    for (const auto& [other, row] : workers_) {
      if (!w.session_hash.empty() && other != n && row.session_hash == w.session_hash)
        return absl::InvalidArgumentError("worker: session_hash belongs to another worker");
    }
    if (n == 0) n = next_worker_++;
    w.id = FormatId('w', n);
    workers_[n] = std::move(w);
    return FormatId('w', n);
  }

  absl::StatusOr<std::vector<WorkerRecord>> ListWorkers() override {
    absl::MutexLock lock(&mu_);
    std::vector<WorkerRecord> out;
    for (const auto& [n, w] : workers_) out.push_back(w);
    return out;
  }

  absl::StatusOr<int64_t> AddModelCall(ModelCallRecord call) override {
    if (absl::Status s = PrepareModelCall(call, NowUnixMs()); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    call.id = next_model_call_++;
    const int64_t id = call.id;
    model_calls_[id] = std::move(call);
    return id;
  }

  absl::Status UpdateModelCall(const ModelCallRecord& call) override {
    ModelCallRecord c = call;
    if (absl::Status s = PrepareModelCall(c, NowUnixMs()); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    auto it = model_calls_.find(call.id);
    if (it == model_calls_.end()) return NotFound("model call", fmt::format("{}", call.id));
    c.id = call.id;
    c.created_unix_ms = it->second.created_unix_ms;
    it->second = std::move(c);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<ModelCallRecord>> ListModelCalls(const std::string& job_id) override {
    absl::MutexLock lock(&mu_);
    std::vector<ModelCallRecord> out;
    for (const auto& [id, c] : model_calls_)
      if (job_id.empty() || c.job_id == job_id) out.push_back(c);
    return out;
  }

  absl::StatusOr<ModelSpend> SumModelCalls(const std::string& job_id,
                                           int64_t since_unix_ms) override {
    absl::MutexLock lock(&mu_);
    ModelSpend sum;
    for (const auto& [id, c] : model_calls_) {
      if (!CountsFor(c, job_id, since_unix_ms)) continue;
      sum.calls++;
      sum.tokens += c.prompt_tokens + c.completion_tokens;
      sum.cost_usd += c.cost_usd;
      if (c.outcome == "pending") sum.pending_tokens += c.prompt_tokens + c.completion_tokens;
    }
    return sum;
  }

 private:
  // Store::LeaseTask's kNotOwn rule: the same id, or the same principal.
  bool SameWorker(const std::string& origin, const std::string& worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (origin == worker) return true;
    const WorkerRecord* me = Find(workers_, 'w', worker);
    const WorkerRecord* them = Find(workers_, 'w', origin);
    return me != nullptr && them != nullptr && !me->principal.empty() &&
           me->principal == them->principal;
  }

  struct Job {
    JobRecord record;
    int64_t lease_seq = 0;  // when the job last had a task leased; 0 = never
  };

  template <typename T>
  static T* Find(Table<T>& table, char prefix, const std::string& id) {
    std::optional<int64_t> n = ParseId(prefix, id);
    if (!n) return nullptr;
    auto it = table.find(*n);
    return it == table.end() ? nullptr : &it->second;
  }

  // The row number for a new row: the caller's id when given (it must be
  // free), else the next number. Like SQLite's AUTOINCREMENT, numbers only
  // grow, so a given id pushes the counter past itself.
  template <typename T>
  static absl::StatusOr<int64_t> NewRowId(char prefix, const std::string& given,
                                          const Table<T>& table, int64_t& next) {
    if (given.empty()) return next++;
    int64_t n = *ParseId(prefix, given);  // Prepare* checked the format
    if (table.contains(n))
      return absl::AlreadyExistsError(fmt::format("'{}' already exists", given));
    if (n >= next) next = n + 1;
    return n;
  }

  // `rows` holds up to limit + 1 rows; the extra one only says there is more.
  template <typename T, typename TokenFn>
  static PageOf<T> MakePage(const std::vector<const T*>& rows, int32_t limit, TokenFn token) {
    PageOf<T> page;
    for (size_t i = 0; i < rows.size() && i < static_cast<size_t>(limit); ++i)
      page.items.push_back(*rows[i]);
    if (rows.size() > static_cast<size_t>(limit)) page.next_token = token(page.items.back());
    return page;
  }

  // EnqueueTasks' rules, checked for a whole batch before any is stored:
  // the batch is all or nothing.
  absl::Status CheckNewTasks(std::vector<TaskRecord>& tasks, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::map<int64_t, bool> claimed;
    for (TaskRecord& t : tasks) {
      if (absl::Status s = PrepareTask(t, now); !s.ok()) return s;
      if (Find(jobs_, 'j', t.job_id) == nullptr) return NotFound("job", t.job_id);
      if (!t.id.empty()) {
        int64_t n = *ParseId('t', t.id);
        if (tasks_.contains(n) || !claimed.emplace(n, true).second)
          return absl::AlreadyExistsError(fmt::format("task '{}' already exists", t.id));
      }
    }
    return absl::OkStatus();
  }

  std::vector<std::string> InsertTasks(std::vector<TaskRecord> tasks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::string> ids;
    for (TaskRecord& t : tasks) {
      int64_t n = *NewRowId('t', t.id, tasks_, next_task_);
      t.id = FormatId('t', n);
      ids.push_back(t.id);
      tasks_[n] = std::move(t);
    }
    return ids;
  }

  bool EvaluatedOn(int64_t variant, const std::string& bucket) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = evals_by_variant_.find(variant);
    if (it == evals_by_variant_.end()) return false;
    for (int64_t e : it->second)
      if (evaluations_.at(e).bucket == bucket) return true;
    return false;
  }

  absl::Status CheckBest(const BestRecord& best, const EvaluationRecord& pending) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (best.bucket.empty() || best.arch.empty())
      return absl::InvalidArgumentError("best: bucket and arch must be set");
    if (best.evaluation_id == pending.id) {
      if (best.variant_id != pending.variant_id)
        return absl::InvalidArgumentError("best: evaluation is of another variant");
      return absl::OkStatus();
    }
    auto it = evaluations_.find(best.evaluation_id);
    if (it == evaluations_.end())
      return NotFound("evaluation", fmt::format("{}", best.evaluation_id));
    if (it->second.variant_id != best.variant_id)
      return absl::InvalidArgumentError("best: evaluation is of another variant");
    return absl::OkStatus();
  }

  absl::Mutex mu_;
  Table<VariantRecord> variants_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, int64_t> variant_by_hash_ ABSL_GUARDED_BY(mu_);
  Table<EvaluationRecord> evaluations_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::vector<int64_t>> evals_by_variant_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> cubins_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, BestRecord> best_ ABSL_GUARDED_BY(mu_);
  Table<Job> jobs_ ABSL_GUARDED_BY(mu_);
  Table<TaskRecord> tasks_ ABSL_GUARDED_BY(mu_);
  Table<WorkerRecord> workers_ ABSL_GUARDED_BY(mu_);
  Table<ModelCallRecord> model_calls_ ABSL_GUARDED_BY(mu_);
  int64_t next_model_call_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_variant_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_evaluation_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_job_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_task_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_worker_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t lease_seq_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::unique_ptr<Store> NewMemoryStore() { return std::make_unique<MemoryStore>(); }

}  // namespace kforge
