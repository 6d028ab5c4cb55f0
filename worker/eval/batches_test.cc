// Check and timing batches (no GPU).
#include "worker/eval/batches.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

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

TEST(CheckBatch, HoldsMaxEmptyAndLengthOneAndAwkwardLengths) {
  for (int i = 0; i < 4; ++i) {
    reference::JaggedShape s = CheckBatch(Key(false), 42, i);
    ASSERT_TRUE(reference::ValidateJaggedShape(s).ok());
    auto l = Lengths(s.cu_q);
    EXPECT_NE(std::find(l.begin(), l.end(), 0), l.end());
    EXPECT_NE(std::find(l.begin(), l.end(), 1), l.end());
    EXPECT_NE(std::find(l.begin(), l.end(), 1000), l.end());
    EXPECT_TRUE(std::any_of(l.begin(), l.end(), [](int x) { return x > 1 && x % 64 != 0 && x % 2; }));
    EXPECT_EQ(s.cu_q, s.cu_k);
    EXPECT_EQ(s.heads, 4);
    EXPECT_EQ(s.kv_heads, 2);
  }
}

TEST(CheckBatch, CrossHasDifferentKeyLengths) {
  reference::JaggedShape s = CheckBatch(Key(true), 7, 0);
  ASSERT_TRUE(reference::ValidateJaggedShape(s).ok());
  auto lq = Lengths(s.cu_q), lk = Lengths(s.cu_k);
  bool differs = false;
  for (size_t b = 0; b < lq.size(); ++b) differs |= lq[b] > 0 && lk[b] > 0 && lq[b] != lk[b];
  EXPECT_TRUE(differs);
  EXPECT_NE(std::find(lk.begin(), lk.end(), 0), lk.end());
  EXPECT_NE(std::find(lk.begin(), lk.end(), 700), lk.end());
}

TEST(CheckBatch, DependsOnSeedAndIndex) {
  EXPECT_NE(CheckBatch(Key(false), 1, 0).cu_q, CheckBatch(Key(false), 2, 0).cu_q);
  EXPECT_NE(CheckBatch(Key(false), 1, 0).cu_q, CheckBatch(Key(false), 1, 1).cu_q);
  EXPECT_EQ(CheckBatch(Key(false), 1, 0).cu_q, CheckBatch(Key(false), 1, 0).cu_q);
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
  k.total_q = int64_t{1} << 31;
  EXPECT_FALSE(TimingBatch(k, {}, {}).ok());
}

}  // namespace
}  // namespace kforge::eval
