#include "core/shape.h"

#include <gtest/gtest.h>

#include <vector>

namespace kforge {
namespace {

ShapeKey HstuProd() {
  ShapeKey k;
  k.op = Op::kForward;
  k.head_dim = 128;
  k.heads = 4;
  k.kv_heads = 4;
  k.causal = true;
  k.arch = "sm_90a";
  k.batch = 128;
  k.max_len_q = 4096;
  k.total_q = 498127;
  return k;
}

TEST(ShapeKey, ValidKeyPasses) { EXPECT_TRUE(ValidateShapeKey(HstuProd()).ok()); }

TEST(ShapeKey, ErrorsNameTheField) {
  struct Case {
    void (*mutate)(ShapeKey&);
    std::string field;
  };
  std::vector<Case> cases = {
      {[](ShapeKey& k) { k.head_dim = 0; }, "head_dim"},
      {[](ShapeKey& k) { k.head_dim = 100; }, "head_dim"},
      {[](ShapeKey& k) { k.head_dim = 512; }, "head_dim"},
      {[](ShapeKey& k) { k.heads = -1; }, "heads"},
      {[](ShapeKey& k) { k.kv_heads = 3; }, "kv_heads"},
      {[](ShapeKey& k) { k.arch = "gfx942"; }, "arch"},
      {[](ShapeKey& k) { k.batch = 0; }, "batch"},
      {[](ShapeKey& k) { k.max_len_q = -5; }, "max_len_q"},
      {[](ShapeKey& k) { k.total_q = 1000000; }, "total_q"},  // > batch * max
      {[](ShapeKey& k) { k.max_len_q = 600000; }, "max_len_q"},  // > total
      {[](ShapeKey& k) { k.max_len_q = int64_t{1} << 40; }, "max_len_q"},
      {[](ShapeKey& k) { k.cross = true; }, "total_k"},  // cross without key stats
      {[](ShapeKey& k) { k.deterministic = true; }, "deterministic"},  // forward
  };
  for (const auto& c : cases) {
    ShapeKey k = HstuProd();
    c.mutate(k);
    absl::Status s = ValidateShapeKey(k);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(s.message().substr(0, c.field.size() + 1), c.field + ":") << s.message();
  }
}

TEST(ShapeKey, FillLengthStatsFromOffsets) {
  ShapeKey k = HstuProd();
  std::vector<int32_t> cu_q = {0, 3, 3, 10};
  std::vector<int32_t> cu_k = {0, 5, 6, 6};
  ASSERT_TRUE(FillLengthStats(cu_q, cu_k, k).ok());
  EXPECT_EQ(k.batch, 3);
  EXPECT_EQ(k.max_len_q, 7);
  EXPECT_EQ(k.total_q, 10);
  EXPECT_TRUE(k.cross);
  EXPECT_EQ(k.max_len_k, 5);
  EXPECT_EQ(k.total_k, 6);
}

TEST(ShapeKey, FillLengthStatsRejectsBadOffsets) {
  ShapeKey k = HstuProd();
  std::vector<int32_t> decreasing = {0, 5, 4};
  EXPECT_NE(FillLengthStats(decreasing, {}, k).message().find("cu_seqlens_q"), std::string::npos);
  std::vector<int32_t> not_zero = {1, 5};
  EXPECT_FALSE(FillLengthStats(not_zero, {}, k).ok());
  std::vector<int32_t> q = {0, 1, 2};
  std::vector<int32_t> kk = {0, 1};
  EXPECT_NE(FillLengthStats(q, kk, k).message().find("cu_seqlens_k"), std::string::npos);
}

TEST(Bucket, RoundsLengthsUpToPowersOfTwo) {
  Bucket b = BucketOf(HstuProd());
  EXPECT_EQ(b.batch, 128);
  EXPECT_EQ(b.max_q, 4096);
  EXPECT_EQ(b.mean_q, 4096);  // 498127/128 = 3892 -> 4096
  EXPECT_EQ(b.Id(), "fwd.bf16.d128.h4.kv4.causal.self.sm_90a.b128.mq4096.aq4096.mk4096.ak4096");
}

TEST(Bucket, SimilarBatchesShareABucket) {
  ShapeKey a = HstuProd();
  ShapeKey b = HstuProd();
  b.total_q = 480000;
  b.batch = 120;
  EXPECT_EQ(BucketOf(a), BucketOf(b));
}

TEST(Bucket, IdRoundTrips) {
  ShapeKey k = HstuProd();
  k.cross = true;
  k.max_len_k = 256;
  k.total_k = 128 * 256;
  Bucket b = BucketOf(k);
  auto parsed = ParseBucketId(b.Id());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, b);
  EXPECT_FALSE(ParseBucketId("fwd.bf16.d128").ok());
  EXPECT_FALSE(ParseBucketId("fwd.bf16.d128.h4.kv4.causal.self.sm_90a.b128.mq0.aq1.mk1.ak1").ok());
}

// A deterministic backward shape is valid; the same flag on a forward shape
// is refused, the message naming the field and saying why.
TEST(ShapeKey, DeterministicIsForBackwardShapesOnly) {
  ShapeKey k = HstuProd();
  k.deterministic = true;
  absl::Status s = ValidateShapeKey(k);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("deterministic: applies to backward shapes only"), std::string::npos)
      << s.message();
  k.op = Op::kBackward;
  EXPECT_TRUE(ValidateShapeKey(k).ok());
}

// Ids are stored: a bucket without the flag keeps the id it always had,
// and the deterministic one is that id plus ".det", which parses back.
TEST(Bucket, DeterministicIdAddsASuffixAndKeepsEveryOldId) {
  ShapeKey k = HstuProd();
  k.op = Op::kBackward;
  const std::string old_id =
      "bwd.bf16.d128.h4.kv4.causal.self.sm_90a.b128.mq4096.aq4096.mk4096.ak4096";
  EXPECT_EQ(BucketOf(k).Id(), old_id);
  k.deterministic = true;
  Bucket det = BucketOf(k);
  EXPECT_TRUE(det.deterministic);
  EXPECT_EQ(det.Id(), old_id + ".det");
  auto parsed = ParseBucketId(det.Id());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, det);
  parsed = ParseBucketId(old_id);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->deterministic);
  EXPECT_FALSE(ParseBucketId(old_id + ".xyz").ok());
  EXPECT_FALSE(
      ParseBucketId("fwd.bf16.d128.h4.kv4.causal.self.sm_90a.b128.mq4096.aq4096.mk4096.ak4096.det")
          .ok());
  // Never served for each other.
  EXPECT_FALSE(BucketDistance(det, *parsed).has_value());
}

TEST(Bucket, DistanceOnlyBetweenCompatibleBuckets) {
  Bucket a = BucketOf(HstuProd());
  Bucket b = a;
  b.max_q = 2048;
  b.mean_q = 1024;
  EXPECT_EQ(BucketDistance(a, a), 0);
  EXPECT_EQ(BucketDistance(a, b), 3);
  b.causal = false;
  EXPECT_FALSE(BucketDistance(a, b).has_value());
  b = a;
  b.arch = "sm_100a";
  EXPECT_FALSE(BucketDistance(a, b).has_value());
}

TEST(SizeExtent, TheBucketExtentCoversEveryKeyOfTheBucket) {
  ShapeKey k = HstuProd();
  const SizeExtent e = BucketExtent(BucketOf(k));
  EXPECT_TRUE(ExtentCovers(e, k));
  // The largest key of the bucket still fits: every sequence at the maximum.
  k.batch = e.batch;
  k.max_len_q = e.max_len_q;
  k.total_q = e.total_q;
  EXPECT_EQ(BucketOf(k), BucketOf(HstuProd()));
  EXPECT_TRUE(ExtentCovers(e, k));
}

TEST(SizeExtent, AnyStatisticPastTheExtentIsNotCovered) {
  const ShapeKey k = HstuProd();
  SizeExtent e{.batch = k.batch, .max_len_q = k.max_len_q, .max_len_k = k.max_len_q,
               .total_q = k.total_q, .total_k = k.total_q};
  EXPECT_TRUE(ExtentCovers(e, k));
  for (int64_t SizeExtent::*field : {&SizeExtent::batch, &SizeExtent::max_len_q,
                                     &SizeExtent::max_len_k, &SizeExtent::total_q,
                                     &SizeExtent::total_k}) {
    SizeExtent smaller = e;
    smaller.*field -= 1;
    EXPECT_FALSE(ExtentCovers(smaller, k));
  }
}

}  // namespace
}  // namespace kforge
