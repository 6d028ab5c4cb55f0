#include "runtime/plan_cache.h"

#include <gtest/gtest.h>

namespace kforge::runtime {
namespace {

Manifest Persistent() {
  Manifest m;
  m.threads = 128;
  m.grid = GridPolicy::kPersistent;
  m.tile_m = 64;
  m.tile_n = 64;
  m.archs = {"sm_90a"};
  m.head_dims = {128};
  return m;
}

PlanRequest Req(const Manifest& m, const std::vector<int32_t>& cu) {
  PlanRequest r;
  r.kernel_key = "v1:abc";
  r.manifest = &m;
  r.cu_q = cu;
  r.heads = 4;
  r.kv_heads = 4;
  r.causal = true;
  r.arch = "sm_90a";
  r.num_sms = 132;
  r.ctas_per_sm = 2;
  return r;
}

TEST(PlanCache, BuildsABatchsPlanOnceAndReusesIt) {
  const Manifest m = Persistent();
  PlanCache cache;
  const std::vector<int32_t> cu = {0, 100, 350, 351};
  bool built = false;
  auto a = cache.Get(Req(m, cu), &built);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(built);
  EXPECT_EQ((*a)->num_tiles, (2 + 4 + 1) * 4);
  auto b = cache.Get(Req(m, cu), &built);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(built);
  EXPECT_EQ(a->get(), b->get());
}

TEST(PlanCache, AnyDifferenceIsAnotherPlan) {
  const Manifest m = Persistent();
  PlanCache cache;
  const std::vector<int32_t> cu = {0, 100, 350, 351}, other = {0, 100, 350, 352};
  bool built = false;
  ASSERT_TRUE(cache.Get(Req(m, cu), &built).ok());
  ASSERT_TRUE(cache.Get(Req(m, other), &built).ok());
  EXPECT_TRUE(built);
  PlanRequest r = Req(m, cu);
  r.causal = false;
  ASSERT_TRUE(cache.Get(r, &built).ok());
  EXPECT_TRUE(built);
  r = Req(m, cu);
  r.kernel_key = "v2:def";
  ASSERT_TRUE(cache.Get(r, &built).ok());
  EXPECT_TRUE(built);
  EXPECT_EQ(cache.size(), 4u);
}

TEST(PlanCache, ForgetsTheLeastRecentlyUsed) {
  const Manifest m = Persistent();
  PlanCache cache(2);
  const std::vector<int32_t> a = {0, 10}, b = {0, 20}, c = {0, 30};
  bool built = false;
  ASSERT_TRUE(cache.Get(Req(m, a), &built).ok());
  ASSERT_TRUE(cache.Get(Req(m, b), &built).ok());
  ASSERT_TRUE(cache.Get(Req(m, a), &built).ok());  // a is now the most recent
  ASSERT_TRUE(cache.Get(Req(m, c), &built).ok());  // evicts b
  EXPECT_EQ(cache.size(), 2u);
  ASSERT_TRUE(cache.Get(Req(m, a), &built).ok());
  EXPECT_FALSE(built);
  ASSERT_TRUE(cache.Get(Req(m, b), &built).ok());
  EXPECT_TRUE(built);
}

TEST(PlanCache, BadOffsetsAreTheCallersError) {
  const Manifest m = Persistent();
  PlanCache cache;
  const std::vector<int32_t> cu = {0, 100, 50};
  bool built = false;
  auto p = cache.Get(Req(m, cu), &built);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(cache.size(), 0u);
}

}  // namespace
}  // namespace kforge::runtime
