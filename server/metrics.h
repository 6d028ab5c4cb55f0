// ServerMetrics: what the server did since it started, for operators
// (/metrics, server/http/): RPCs by method and code with their latencies,
// evaluations by task kind and outcome, compile times, promotions, and
// leases that expired or were given up.
//
// Only events live here. What is stored (jobs by state, queued tasks,
// workers, tokens, database size) is read from the store when it is asked
// for, so it cannot drift from the store and survives restarts; these
// counters start from zero with the process, as Prometheus counters do.
//
// Thread-safe: every method may be called from any thread. Recording takes
// one short lock and allocates only the first time a label set is seen.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/outcome.h"
#include "core/task_kind.h"

namespace kforge::server {

// Cumulative bucket counts in Prometheus' sense: counts[i] is the number of
// observations <= bounds[i]; observations above the last bound count in
// `count` only (the +Inf bucket).
struct Histogram {
  std::vector<double> bounds;    // ascending upper bounds
  std::vector<uint64_t> counts;  // per bound, cumulative
  uint64_t count = 0;
  double sum = 0;

  explicit Histogram(std::vector<double> upper_bounds = {});
  void Observe(double value);
};

// Upper bounds in seconds. RPCs: GetKernel answers in microseconds from the
// cache, LeaseTask long polls for up to 30 s. Compiles: NVRTC takes from
// tens of milliseconds (an empty kernel) to about a minute (a large wgmma
// kernel).
const std::vector<double>& RpcLatencyBounds();
const std::vector<double>& CompileTimeBounds();

struct RpcKey {
  std::string method;  // "kforge.v1.KernelService/GetKernel"
  std::string code;    // "OK", "NOT_FOUND", ... (absl::StatusCodeToString)
  auto operator<=>(const RpcKey&) const = default;
};

struct EvaluationKey {
  TaskKind kind = TaskKind::kEvaluate;
  Outcome outcome = Outcome::kCompiled;
  auto operator<=>(const EvaluationKey&) const = default;
};

// A consistent copy of every counter, for rendering.
struct MetricsSnapshot {
  int64_t started_unix_ms = 0;
  std::map<RpcKey, Histogram> rpcs;
  std::map<EvaluationKey, uint64_t> evaluations;
  Histogram compile_seconds{CompileTimeBounds()};
  uint64_t promotions = 0;
  uint64_t leases_expired = 0;
  uint64_t tasks_given_up = 0;
  // Distinct variants verified (any task kind) in the minute before the
  // snapshot.
  int verified_last_minute = 0;
};

class ServerMetrics {
 public:
  // `clock`: unix ms; tests inject one. Empty: the system clock.
  explicit ServerMetrics(std::function<int64_t()> clock = {});

  // One finished RPC. `code` is the gRPC status code number (0 OK, 5
  // NOT_FOUND, ...); `method` is "/package.Service/Method" as gRPC names it
  // (the leading '/' is dropped).
  void RecordRpc(std::string_view method, int code, double seconds);
  // One accepted report (ReportResult, or a task given up). `compile_ms` is
  // the worker's NVRTC time (0: none, not observed).
  void RecordEvaluation(TaskKind kind, Outcome outcome, double compile_ms,
                        const std::string& variant_id);
  void RecordPromotion();
  void RecordLeasesExpired(int n);
  void RecordGivenUp();

  MetricsSnapshot Snapshot() const;

 private:
  int64_t Now() const;

  std::function<int64_t()> clock_;
  const int64_t started_unix_ms_;
  mutable std::mutex mu_;
  MetricsSnapshot counters_;  // guarded by mu_; verified_last_minute unused here
  // (unix ms, variant) of recent verified results, oldest first; entries
  // older than a minute are dropped as new ones come and when read.
  mutable std::deque<std::pair<int64_t, std::string>> verified_;  // guarded by mu_
};

}  // namespace kforge::server
