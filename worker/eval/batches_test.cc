// Check and timing batches (no GPU).
#include "worker/eval/batches.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "kernels/catalog.h"
#include "kernels/schedule.h"
#include "worker/eval/split_test_shapes.h"

namespace kforge::eval {
namespace {

std::vector<int> Lengths(const std::vector<int>& cu) {
  std::vector<int> l;
  for (size_t b = 0; b + 1 < cu.size(); ++b) l.push_back(cu[b + 1] - cu[b]);
  return l;
}

ShapeKey Key(bool cross) {
  ShapeKey k;
  k.head_dim = 128;
  k.heads = 4;
  k.kv_heads = 2;
  k.causal = true;
  k.cross = cross;
  k.arch = "sm_90a";
  k.batch = 64;
  k.max_len_q = 1000;
  k.total_q = 64 * 300;
  k.max_len_k = cross ? 700 : 1000;
  k.total_k = cross ? 64 * 200 : 64 * 300;
  return k;
}

std::set<int> AllLengths(const std::vector<ProblemSpec>& problems, bool keys) {
  std::set<int> all;
  for (const ProblemSpec& p : problems) {
    for (int l : Lengths(keys ? p.shape.cu_k : p.shape.cu_q)) all.insert(l);
  }
  return all;
}

TEST(CheckProblems, EachHoldsTheLongestLengthZeroOneAndAwkwardLengths) {
  for (const ProblemSpec& p : CheckProblems(Key(false), 42, 4, 128)) {
    ASSERT_TRUE(reference::ValidateJaggedShape(p.shape).ok());
    auto l = Lengths(p.shape.cu_q);
    EXPECT_NE(std::find(l.begin(), l.end(), 0), l.end());
    EXPECT_NE(std::find(l.begin(), l.end(), 1), l.end());
    // The longest length the bucket serves (1000 rounds up to 1024).
    EXPECT_NE(std::find(l.begin(), l.end(), 1024), l.end());
    EXPECT_TRUE(std::any_of(l.begin(), l.end(), [](int x) { return x > 1 && x % 64 != 0 && x % 2; }));
    EXPECT_EQ(p.shape.cu_q, p.shape.cu_k);
    EXPECT_EQ(p.shape.heads, 4);
    EXPECT_EQ(p.shape.kv_heads, 2);
  }
}

// A kernel wrong for a few short lengths cannot hope to be missed: every
// length up to twice the largest tile appears in every evaluation.
TEST(CheckProblems, TogetherTheyHoldEveryLengthUpToTwiceTheLargestTile) {
  for (int tile : {64, 128, 176, 256}) {
    const int cover = CoverageLength(tile, 1024);
    EXPECT_EQ(cover, std::min(2 * std::max(tile, 128), 1024));
    for (uint64_t seed : {1, 2, 3}) {
      const std::set<int> all = AllLengths(CheckProblems(Key(false), seed, 3, tile), false);
      for (int l = 0; l <= cover; ++l) ASSERT_TRUE(all.count(l)) << "length " << l << " tile " << tile;
    }
  }
  // Never past what the bucket serves.
  ShapeKey small = Key(false);
  small.max_len_q = 100;
  small.total_q = 64 * 50;
  EXPECT_EQ(CoverageLength(128, BucketOf(small).max_q), 128);
  EXPECT_LE(*AllLengths(CheckProblems(small, 1, 3, 128), false).rbegin(), 128);
}

// The gate's check problems: the same coverage, the long sequences capped.
TEST(CheckProblems, UnderTheGateKeepTheCoverageAndCapTheLongSequences) {
  ShapeKey k = Key(false);
  k.max_len_q = k.max_len_k = 4096;
  k.total_q = k.total_k = 64 * 2000;
  const int cap = GateLongest(128);
  EXPECT_EQ(cap, 512);
  const std::set<int> all = AllLengths(CheckProblems(k, 4, 3, 128, cap), false);
  for (int l = 0; l <= CoverageLength(128, BucketOf(k).max_q); ++l) ASSERT_TRUE(all.count(l)) << l;
  EXPECT_EQ(*all.rbegin(), cap);
  EXPECT_GT(*AllLengths(CheckProblems(k, 4, 3, 128), false).rbegin(), cap);
}

TEST(CheckProblems, CrossCoversKeyLengthsAndPairsThemWithOtherQueryLengths) {
  const std::vector<ProblemSpec> problems = CheckProblems(Key(true), 7, 3, 128);
  const std::set<int> keys = AllLengths(problems, true);
  for (int l = 0; l <= CoverageLength(128, BucketOf(Key(true)).max_k); ++l)
    ASSERT_TRUE(keys.count(l)) << l;
  for (const ProblemSpec& p : problems) {
    auto lq = Lengths(p.shape.cu_q), lk = Lengths(p.shape.cu_k);
    ASSERT_EQ(lq.size(), lk.size());
    bool differs = false;
    for (size_t b = 0; b < lq.size(); ++b) differs |= lq[b] > 0 && lk[b] > 0 && lq[b] != lk[b];
    EXPECT_TRUE(differs);
    EXPECT_NE(std::find(lk.begin(), lk.end(), 0), lk.end());
  }
}

TEST(CheckProblems, ScalesMagnitudesAndGridsVary) {
  const std::vector<ProblemSpec> p = CheckProblems(Key(false), 5, 6, 128);
  const float usual = 1.0f / std::sqrt(128.0f);
  EXPECT_FLOAT_EQ(p[0].shape.scale(), usual);
  EXPECT_LT(p[1].shape.scale(), 0.75f * usual);
  EXPECT_GT(p[2].shape.scale(), 1.45f * usual);
  EXPECT_TRUE(p[0].style.plain());
  EXPECT_GT(p[1].style.outlier_period, 0u);
  EXPECT_GE(p[2].style.q_scale, 4.0f);
  EXPECT_GE(p[2].style.outlier_magnitude, 64.0f);
  EXPECT_EQ(p[1].grid_ctas, 1);
  EXPECT_GE(p[2].grid_ctas, 2);
  EXPECT_LE(p[2].grid_ctas, 3);
  EXPECT_EQ(p[0].grid_ctas, 0);
}

TEST(CheckProblems, DependOnTheSeed) {
  EXPECT_NE(CheckProblems(Key(false), 1, 3, 128)[0].shape.cu_q,
            CheckProblems(Key(false), 2, 3, 128)[0].shape.cu_q);
  EXPECT_EQ(CheckProblems(Key(false), 1, 3, 128)[1].shape.cu_q,
            CheckProblems(Key(false), 1, 3, 128)[1].shape.cu_q);
}

TEST(TimingProblem, IsTheTimingBatchWithAnUnusualScaleAndOutliers) {
  absl::StatusOr<ProblemSpec> p = TimingProblem(Key(true), {}, {}, 9);
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<reference::JaggedShape> batch = TimingBatch(Key(true), {}, {});
  ASSERT_TRUE(batch.ok());
  EXPECT_EQ(p->shape.cu_q, batch->cu_q);
  EXPECT_EQ(p->role, ProblemRole::kTiming);
  EXPECT_NE(p->shape.softmax_scale, 0.0f);
  EXPECT_GT(p->style.outlier_period, 0u);
}

// Promotion verifies the bucket's largest batch: the extent then covers
// every request of the bucket.
TEST(CornerProblem, ReachesTheBucketExtentWhenMemoryAllows) {
  for (bool cross : {false, true}) {
    const ShapeKey k = Key(cross);
    const ProblemSpec p = CornerProblem(k, 3, int64_t{1} << 40);
    ASSERT_TRUE(reference::ValidateJaggedShape(p.shape).ok());
    EXPECT_EQ(ExtentOf(p.shape), BucketExtent(BucketOf(k)));
    EXPECT_TRUE(ExtentCovers(ExtentOf(p.shape), k));
  }
}

TEST(CornerProblem, StopsShortOfTheCornerWhenMemoryDoesNot) {
  const ShapeKey k = Key(false);
  const int64_t budget = 20000 * int64_t(k.heads) * k.head_dim;
  const ProblemSpec p = CornerProblem(k, 3, budget);
  ASSERT_TRUE(reference::ValidateJaggedShape(p.shape).ok());
  EXPECT_LE(int64_t(p.shape.q_elems()), budget);
  EXPECT_LT(p.shape.total_q(), BucketExtent(BucketOf(k)).total_q);
}

TEST(GateProblem, KeepsTheBatchSizeWithFewTokens) {
  ShapeKey k = Key(false);
  k.total_q = 64 * 900;
  const ProblemSpec p = GateProblem(k, 1);
  ASSERT_TRUE(reference::ValidateJaggedShape(p.shape).ok());
  EXPECT_EQ(p.shape.batch(), 64);
  EXPECT_LE(p.shape.total_q(), kGateMaxTokens);
  EXPECT_EQ(p.shape.max_q(), 1000);
}

TEST(GateProblem, TheSampledGateCutsTokensAndLengths) {
  ShapeKey k = Key(false);
  k.total_q = 64 * 900;
  const ProblemSpec p = GateProblem(k, 1, kGateMaxTokens / 4, GateLongest(128));
  ASSERT_TRUE(reference::ValidateJaggedShape(p.shape).ok());
  EXPECT_EQ(p.shape.batch(), 64);
  EXPECT_LE(p.shape.total_q(), kGateMaxTokens / 4);
  EXPECT_EQ(p.shape.max_q(), GateLongest(128));
}

TEST(SampledCheckProblem, HoldsTheAwkwardLengths) {
  for (bool cross : {false, true}) {
    const ProblemSpec p = SampledCheckProblem(Key(cross), 3, 128);
    ASSERT_TRUE(reference::ValidateJaggedShape(p.shape).ok());
    const std::set<int> q = AllLengths({p}, false);
    for (int l : {0, 1, 2, 127, 128, 129, 255, 256}) EXPECT_TRUE(q.count(l)) << l;
    EXPECT_LE(*q.rbegin(), GateLongest(128));
    EXPECT_LT(p.shape.total_q(), 8000);
    // a persistent kernel runs it on a small grid: every CTA runs many tiles
    EXPECT_GE(p.grid_ctas, 2);
    EXPECT_LE(p.grid_ctas, 3);
    if (cross) {
      const std::set<int> k = AllLengths({p}, true);
      EXPECT_TRUE(k.count(0));
      EXPECT_NE(p.shape.cu_k, p.shape.cu_q);
    }
  }
}

TEST(StyleBf16, ScalesAndPlacesOutliersAtAboutTheRate) {
  std::mt19937_64 rng(1);
  std::vector<uint16_t> v = RandomBf16(100000, rng);
  std::vector<uint16_t> scaled = v;
  StyleBf16(scaled, 4.0f, 77, 0, 0);
  for (size_t i = 0; i < v.size(); ++i)
    ASSERT_EQ(reference::Bf16ToFloat(scaled[i]), 4.0f * reference::Bf16ToFloat(v[i]));
  std::vector<uint16_t> out = v;
  StyleBf16(out, 1.0f, 77, 257, 64.0f);
  int outliers = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const float x = std::fabs(reference::Bf16ToFloat(out[i]));
    if (out[i] != v[i]) {
      ++outliers;
      EXPECT_GE(x, 32.0f);
      EXPECT_LE(x, 64.0f);
    }
  }
  EXPECT_GT(outliers, 100000 / 257 / 2);
  EXPECT_LT(outliers, 100000 / 257 * 2);
}

TEST(TimingBatch, FollowsTheKeyStatistics) {
  absl::StatusOr<reference::JaggedShape> s = TimingBatch(Key(true), {}, {});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->batch(), 64);
  EXPECT_EQ(s->max_q(), 1000);
  EXPECT_EQ(s->max_k(), 700);
  // The totals are the key's (mean 300 and 200), not just near them.
  EXPECT_EQ(s->total_q(), 64 * 300);
  EXPECT_EQ(s->total_k(), 64 * 200);
}

// Every evaluation of a shape is timed on the same lengths, whatever its
// seed, and another shape gets other lengths.
TEST(TimingBatch, DependsOnTheKeyAlone) {
  absl::StatusOr<reference::JaggedShape> a = TimingBatch(Key(true), {}, {});
  absl::StatusOr<reference::JaggedShape> b = TimingBatch(Key(true), {}, {});
  ShapeKey other = Key(true);
  other.total_q += 64;
  absl::StatusOr<reference::JaggedShape> c = TimingBatch(other, {}, {});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->cu_q, b->cu_q);
  EXPECT_EQ(a->cu_k, b->cu_k);
  EXPECT_NE(a->cu_q, c->cu_q);
}

TEST(TimingBatch, UsesGivenOffsets) {
  std::vector<int32_t> cu = {0, 5, 5, 100};
  absl::StatusOr<reference::JaggedShape> s = TimingBatch(Key(false), cu, {});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->cu_q, std::vector<int>(cu.begin(), cu.end()));
  EXPECT_EQ(s->cu_k, s->cu_q);
}

TEST(TimingBatch, RejectsHugeProblems) {
  ShapeKey k = Key(false);
  k.batch = 1 << 16;
  k.max_len_q = 1 << 16;
  k.total_q = (int64_t{1} << 31) - 1;
  k.heads = 16;
  EXPECT_FALSE(TimingBatch(k, {}, {}).ok());
}

// The GPU test of bwd_sm90's split key tiles (EvalGpu.BwdSm90Verifies,
// split_test_shapes.h) must take the split path: for every one of its cases,
// the evaluation's check or timing problems, planned for the full H200 grid
// (132 SMs), hold split halves (a head field with a half above bit 16).
TEST(CheckProblems, TheSplitTestsHeavyTailedBatchesPlanSplitKeyTiles) {
  for (const split_cases::SplitCase& c : split_cases::kSplitCases) {
    SCOPED_TRACE(::testing::Message() << "d" << c.d << " h" << c.h << "/" << c.kvh << " causal "
                                      << c.causal << " cross " << c.cross << " BM" << c.bm);
    const ShapeKey key =
        split_cases::HeavyTailedBwdShape(c.d, c.h, c.kvh, c.causal, c.cross, "sm_90a");
    auto v = Instantiate(
        "bwd_sm90",
        {{"BLOCK_M", c.bm}, {"BLOCK_N", 128}, {"STAGES", 2}, {"ORDER", 1}, {"SPLIT", 1}}, c.d);
    ASSERT_TRUE(v.ok()) << v.status();
    const uint64_t seed = split_cases::SplitCaseSeed(c);
    // (the evaluator's count and largest tile: 3 checks, max(tile_m, tile_n))
    std::vector<ProblemSpec> problems =
        CheckProblems(key, seed, 3, std::max(v->manifest.tile_m, v->manifest.tile_n));
    auto timing = TimingProblem(key, {}, {}, seed);
    ASSERT_TRUE(timing.ok()) << timing.status();
    problems.push_back(*timing);
    int halves = 0;
    for (const ProblemSpec& p : problems) {
      if (p.grid_ctas > 0) continue;  // the small grids: nothing to split for
      auto plan = PlanLaunch(v->manifest, p.shape.cu_q, c.cross ? p.shape.cu_k : p.shape.cu_q,
                             p.shape.heads, p.shape.causal, "sm_90a", 132, 1, p.shape.kv_heads);
      ASSERT_TRUE(plan.ok()) << plan.status();
      for (size_t i = 1; i < plan->tiles.size(); i += 4) halves += (plan->tiles[i] >> 16) != 0;
    }
    EXPECT_GT(halves, 0) << "no problem of this case plans a split key tile";
  }
}

}  // namespace
}  // namespace kforge::eval
