// Launch plans of batches already seen: the persistent tile list of a batch
// (kernels/schedule.h) is built on the host from its offsets and sorted by
// work, which costs far more than a launch for large batches. A training
// step runs every layer's forward and backward on one batch, so the plan
// of (kernel, batch) is built once and reused.
//
// Entries are keyed by the kernel, the head layout, the mask and the exact
// offsets (compared in full, not only hashed). Least recently used entries
// go first.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/schedule.h"

namespace kforge::runtime {

struct PlanRequest {
  std::string kernel_key;  // ResolvedKernel::key
  const Manifest* manifest = nullptr;
  std::span<const int32_t> cu_q;
  std::span<const int32_t> cu_k;  // empty: self-attention
  int heads = 0;
  int kv_heads = 0;
  bool causal = false;
  std::string arch;
  int num_sms = 0;
  int ctas_per_sm = 0;
};

class PlanCache {
 public:
  explicit PlanCache(size_t capacity = 256) : capacity_(capacity) {}

  // The plan, built with PlanLaunch on a miss (`*built` says which).
  absl::StatusOr<std::shared_ptr<const LaunchPlan>> Get(const PlanRequest& req, bool* built);
  size_t size() const;

 private:
  struct Entry {
    uint64_t hash;
    std::string kernel_key;
    std::vector<int32_t> cu_q, cu_k;
    int heads, kv_heads, num_sms, ctas_per_sm;
    bool causal;
    std::shared_ptr<const LaunchPlan> plan;
  };
  static bool Matches(const Entry& e, const PlanRequest& r);

  size_t capacity_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recent first; guarded by mu_
  std::unordered_multimap<uint64_t, std::list<Entry>::iterator> index_;  // guarded by mu_
};

}  // namespace kforge::runtime
