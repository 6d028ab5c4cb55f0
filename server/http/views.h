// DashboardViews: what the dashboard and /metrics show, as JSON documents
// and Prometheus text, built from the store, the api's view of the workers,
// the job engine (what a job waits for) and the server's counters. No HTTP
// here: dashboard.cc serves these; tests call them directly too.
//
// Read-only: nothing here writes to the store or changes a job.
//
// Thread-safe (every source is). Each call reads the store afresh, so a page
// is as current as the store; the cost is proportional to what it shows
// (a bucket page reads every evaluation of the bucket's variants).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "server/api.h"
#include "server/jobs.h"
#include "server/metrics.h"
#include "storage/store.h"

namespace kforge::server::http {

// A reference figure to compare a bucket's best with: another kernel's
// time on the bucket's shape (bench/anchors.py measures varlen_attn and
// FlexAttention). Loaded from the server's anchors_file.
struct Anchor {
  std::string bucket;  // a bucket id, as `kforge shapes` and the dashboard show it
  std::string name;    // "varlen_attn"
  double us = 0;       // its median time on the bucket's shape
};

// Reads an anchors file: a JSON array of {"bucket": "...", "name": "...",
// "us": 812.5}. INVALID_ARGUMENT naming the file, the entry and what is
// wrong (an unparseable bucket id, a time that is not positive, an unknown
// key); NOT_FOUND when the file cannot be opened.
absl::StatusOr<std::vector<Anchor>> LoadAnchors(const std::string& path);

struct ViewSources {
  Store* store = nullptr;            // must outlive the views
  KforgeApi* api = nullptr;          // must outlive the views
  JobEngine* engine = nullptr;       // must outlive the views
  ServerMetrics* metrics = nullptr;  // may be null; must outlive the views
  std::vector<Anchor> anchors;
  std::string version;               // kforge-server's
  // Unix ms; tests inject one. Empty: the system clock.
  std::function<int64_t()> clock;
};

class DashboardViews {
 public:
  explicit DashboardViews(ViewSources sources);

  // Workers (state, current tasks, last call), job and task counts, server
  // facts. The keys are those the dashboard's overview page reads.
  absl::StatusOr<nlohmann::json> Overview();
  // The newest `limit` jobs (1..1000) with their progress and what they
  // wait for.
  absl::StatusOr<nlohmann::json> Jobs(int limit);
  // One job: its buckets' progress, each bucket's best candidate over time
  // (the job's verified results in time order and the best so far), the
  // bucket's served best and the speedup against its anchors. NOT_FOUND
  // for an unknown job.
  absl::StatusOr<nlohmann::json> Job(const std::string& job_id);
  // Every bucket with a best or with a job, its best and anchors.
  absl::StatusOr<nlohmann::json> Buckets();
  // One bucket: its served best, the history of its best verified time,
  // every evaluation (outcome, timing, ptxas resources, worker, message)
  // and its variants' provenance. INVALID_ARGUMENT for a malformed bucket
  // id.
  absl::StatusOr<nlohmann::json> Bucket(const std::string& bucket_id);
  // One variant: source, manifest, provenance, evaluations. NOT_FOUND when
  // unknown.
  absl::StatusOr<nlohmann::json> Variant(const std::string& variant_id);
  // Model tokens by job and proposer, and the models each job's variants
  // name. Tokens are what the agent records of its spend (agent/proposer.h
  // Candidate::tokens_used); no price is recorded, so none is shown.
  absl::StatusOr<nlohmann::json> Spend();
  // Every metric, in Prometheus text format.
  absl::StatusOr<std::string> Metrics();

 private:
  int64_t Now() const;
  absl::StatusOr<std::vector<JobRecord>> AllJobs();
  absl::StatusOr<std::vector<BestRecord>> AllBests();
  // Tasks of the queued and running jobs (the only ones with open tasks).
  absl::StatusOr<std::vector<TaskRecord>> OpenTasks();
  nlohmann::json JobJson(const JobView& job);
  nlohmann::json AnchorsJson(const std::string& bucket, double best_us) const;

  ViewSources s_;
};

}  // namespace kforge::server::http
