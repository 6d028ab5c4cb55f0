#include "runtime/plan_cache.h"

#include <algorithm>
#include <functional>
#include <string_view>

namespace kforge::runtime {
namespace {

uint64_t Mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ull + (h >> 29); }

uint64_t HashOf(const PlanRequest& r) {
  auto bytes = [](std::span<const int32_t> s) {
    return std::string_view(reinterpret_cast<const char*>(s.data()), s.size_bytes());
  };
  uint64_t h = std::hash<std::string_view>{}(r.kernel_key);
  h = Mix(h, std::hash<std::string_view>{}(bytes(r.cu_q)));
  h = Mix(h, std::hash<std::string_view>{}(bytes(r.cu_k)));
  for (int v : {r.heads, r.kv_heads, r.num_sms, r.ctas_per_sm, int(r.causal)}) h = Mix(h, uint64_t(v));
  return h;
}

}  // namespace

bool PlanCache::Matches(const Entry& e, const PlanRequest& r) {
  return e.kernel_key == r.kernel_key && e.heads == r.heads && e.kv_heads == r.kv_heads &&
         e.causal == r.causal && e.num_sms == r.num_sms && e.ctas_per_sm == r.ctas_per_sm &&
         std::equal(e.cu_q.begin(), e.cu_q.end(), r.cu_q.begin(), r.cu_q.end()) &&
         std::equal(e.cu_k.begin(), e.cu_k.end(), r.cu_k.begin(), r.cu_k.end());
}

absl::StatusOr<std::shared_ptr<const LaunchPlan>> PlanCache::Get(const PlanRequest& r,
                                                                 bool* built) {
  const uint64_t h = HashOf(r);
  {
    std::lock_guard lock(mu_);
    auto [lo, hi] = index_.equal_range(h);
    for (auto it = lo; it != hi; ++it) {
      if (Matches(*it->second, r)) {
        lru_.splice(lru_.begin(), lru_, it->second);
        *built = false;
        return it->second->plan;
      }
    }
  }
  // Built outside the lock: other batches' calls need not wait for this one.
  auto plan = PlanLaunch(*r.manifest, r.cu_q, r.cu_k, r.heads, r.causal, r.arch, r.num_sms,
                         r.ctas_per_sm, r.kv_heads);
  if (!plan.ok()) return plan.status();
  auto shared = std::make_shared<const LaunchPlan>(*std::move(plan));
  *built = true;
  std::lock_guard lock(mu_);
  // Another thread may have built the same plan meanwhile: keep one.
  auto [lo, hi] = index_.equal_range(h);
  for (auto it = lo; it != hi; ++it)
    if (Matches(*it->second, r)) return it->second->plan;
  lru_.push_front(Entry{h, r.kernel_key, {r.cu_q.begin(), r.cu_q.end()},
                        {r.cu_k.begin(), r.cu_k.end()}, r.heads, r.kv_heads, r.num_sms,
                        r.ctas_per_sm, r.causal, shared});
  index_.emplace(h, lru_.begin());
  while (lru_.size() > capacity_) {
    auto last = std::prev(lru_.end());
    auto [lo, hi] = index_.equal_range(last->hash);
    for (auto it = lo; it != hi; ++it) {
      if (it->second == last) {
        index_.erase(it);
        break;
      }
    }
    lru_.pop_back();
  }
  return shared;
}

size_t PlanCache::size() const {
  std::lock_guard lock(mu_);
  return lru_.size();
}

}  // namespace kforge::runtime
