#include "server/metrics.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "absl/status/status.h"

namespace kforge::server {
namespace {

constexpr int64_t kMinuteMs = 60 * 1000;

int64_t SystemNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds(std::move(upper_bounds)), counts(bounds.size(), 0) {}

void Histogram::Observe(double value) {
  for (size_t i = 0; i < bounds.size(); ++i)
    if (value <= bounds[i]) ++counts[i];
  ++count;
  sum += value;
}

const std::vector<double>& RpcLatencyBounds() {
  static const std::vector<double> b = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                        0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5,
                                        5,      10,      30,     60};
  return b;
}

const std::vector<double>& CompileTimeBounds() {
  static const std::vector<double> b = {0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 60};
  return b;
}

ServerMetrics::ServerMetrics(std::function<int64_t()> clock)
    : clock_(std::move(clock)), started_unix_ms_(Now()) {
  counters_.started_unix_ms = started_unix_ms_;
}

int64_t ServerMetrics::Now() const { return clock_ ? clock_() : SystemNowMs(); }

void ServerMetrics::RecordRpc(std::string_view method, int code, double seconds) {
  if (!method.empty() && method.front() == '/') method.remove_prefix(1);
  RpcKey key{std::string(method), absl::StatusCodeToString(static_cast<absl::StatusCode>(code))};
  if (key.code.empty()) key.code = "UNKNOWN";  // a number gRPC does not define
  std::lock_guard lock(mu_);
  auto it = counters_.rpcs.find(key);
  if (it == counters_.rpcs.end())
    it = counters_.rpcs.emplace(std::move(key), Histogram(RpcLatencyBounds())).first;
  it->second.Observe(std::max(0.0, seconds));
}

void ServerMetrics::RecordEvaluation(TaskKind kind, Outcome outcome, double compile_ms,
                                     const std::string& variant_id) {
  const int64_t now = Now();
  std::lock_guard lock(mu_);
  ++counters_.evaluations[EvaluationKey{kind, outcome}];
  if (compile_ms > 0) counters_.compile_seconds.Observe(compile_ms / 1000.0);
  if (outcome == Outcome::kVerified) {
    verified_.emplace_back(now, variant_id);
    while (!verified_.empty() && verified_.front().first < now - kMinuteMs) verified_.pop_front();
  }
}

void ServerMetrics::RecordPromotion() {
  std::lock_guard lock(mu_);
  ++counters_.promotions;
}

void ServerMetrics::RecordLeasesExpired(int n) {
  if (n <= 0) return;
  std::lock_guard lock(mu_);
  counters_.leases_expired += static_cast<uint64_t>(n);
}

void ServerMetrics::RecordGivenUp() {
  std::lock_guard lock(mu_);
  ++counters_.tasks_given_up;
}

MetricsSnapshot ServerMetrics::Snapshot() const {
  const int64_t now = Now();
  std::lock_guard lock(mu_);
  MetricsSnapshot s = counters_;
  while (!verified_.empty() && verified_.front().first < now - kMinuteMs) verified_.pop_front();
  // A variant verified by its EVALUATE and again by its CONFIRM is one
  // verified variant.
  std::set<std::string> variants;
  for (const auto& [at, id] : verified_) variants.insert(id);
  s.verified_last_minute = static_cast<int>(variants.size());
  return s;
}

}  // namespace kforge::server
