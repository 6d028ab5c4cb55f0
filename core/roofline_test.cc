#include "core/roofline.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/lengths.h"

namespace kforge {
namespace {

using nlohmann::json;

// The fastest time ever measured for each public shape on an H200
// (bench/RESULTS.md: the 14:41 bench table and the "best found" column of
// the tuning runs for the forward, the bwd_mma v3 run for the backward).
const std::map<std::string, std::pair<double, double>> kMeasuredUs = {
    // shape              forward   backward
    {"hstu_prod_causal", {4087.6, 58198}},
    {"hstu_imbal_causal", {761.3, 6248}},
    {"gdpa_self", {2103.3, 18455}},
    {"gdpa_dense", {4168.6, 42910}},
    {"pffn_cross_d64", {792.6, 4642}},
    {"powerlaw_short", {53.2, 642}},
    {"d64_self_causal", {1434.6, 12966}},
};

// Offsets of drawn lengths.
std::vector<int32_t> Offsets(const std::vector<int64_t>& lengths) {
  std::vector<int32_t> cu = {0};
  for (int64_t len : lengths) cu.push_back(cu.back() + int32_t(len));
  return cu;
}

struct PublicShape {
  std::string name;
  ShapeKey key;
  std::vector<int32_t> cu_q, cu_k;
};

std::vector<PublicShape> PublicShapes(Op op) {
  std::ifstream in(std::string(KFORGE_SOURCE_DIR) + "/bench/shapes.json");
  EXPECT_TRUE(in) << "bench/shapes.json";
  const json shapes = json::parse(in);
  std::vector<PublicShape> out;
  for (const json& s : shapes) {
    PublicShape p;
    p.name = s.at("name");
    ShapeKey& k = p.key;
    k.op = op;
    k.head_dim = s.at("D");
    k.heads = s.at("H");
    k.kv_heads = k.heads;
    k.causal = s.at("causal");
    k.arch = "sm_90a";
    // The batches the benchmarks time (core/lengths.h).
    absl::StatusOr<DrawnLengths> drawn = DrawShapeLengths(s);
    EXPECT_TRUE(drawn.ok()) << p.name << ": " << drawn.status();
    if (!drawn.ok()) continue;
    p.cu_q = Offsets(drawn->q);
    k.cross = drawn->cross;
    if (k.cross) p.cu_k = Offsets(drawn->k);
    EXPECT_TRUE(FillLengthStats(p.cu_q, p.cu_k, k).ok()) << p.name;
    out.push_back(std::move(p));
  }
  return out;
}

// Real kernels on real GPUs are never below the floor; a forged timing is.
TEST(Roofline, MeasuredTimesOfThePublicShapesPassAndAMicrosecondFractionDoesNot) {
  for (Op op : {Op::kForward, Op::kBackward}) {
    for (const PublicShape& p : PublicShapes(op)) {
      ASSERT_TRUE(kMeasuredUs.count(p.name)) << p.name;
      const double measured =
          op == Op::kForward ? kMeasuredUs.at(p.name).first : kMeasuredUs.at(p.name).second;
      const TimingFloor exact = FloorOf(p.key, "sm_90a", p.cu_q, p.cu_k);
      const TimingFloor stats = FloorOf(p.key, "sm_90a");
      EXPECT_LT(exact.us, measured) << p.name << " " << OpName(op) << ": " << exact.Describe();
      EXPECT_LE(stats.us, exact.us * (1 + 1e-12))
          << p.name << ": the statistics' floor must be a lower bound of the exact one";
      EXPECT_GT(stats.us, 1e-6) << p.name;
      EXPECT_GT(stats.us, 10.0) << p.name << ": every public shape moves megabytes";
    }
  }
}

TEST(Roofline, ForwardWorkCountsEveryScoreAndEveryByteOnce) {
  ShapeKey k;
  k.head_dim = 128;
  k.heads = 4;
  k.kv_heads = 4;
  const std::vector<int32_t> cu = {0, 3, 3, 10};  // lengths 3, 0, 7
  AttentionWork w = MinimalWork(k, cu);
  EXPECT_DOUBLE_EQ(w.flops, 4.0 * 128 * 4 * (9 + 0 + 49));
  EXPECT_DOUBLE_EQ(w.min_bytes, 10.0 * 4 * 128 * 2 * 4 + 10.0 * 4 * 4 + 4 * 4);
  k.causal = true;
  w = MinimalWork(k, cu);
  EXPECT_DOUBLE_EQ(w.flops, 4.0 * 128 * 4 * (6 + 0 + 28));
}

TEST(Roofline, CausalCrossIsBottomRightAligned) {
  ShapeKey k;
  k.head_dim = 64;
  k.heads = 2;
  k.kv_heads = 1;
  k.causal = true;
  k.cross = true;
  // Lq 2, Lk 5: rows see 4 and 5 keys. Lq 5, Lk 2: the last two rows see 1
  // and 2 keys, the first three none.
  const std::vector<int32_t> cu_q = {0, 2, 7};
  const std::vector<int32_t> cu_k = {0, 5, 7};
  AttentionWork w = MinimalWork(k, cu_q, cu_k);
  EXPECT_DOUBLE_EQ(w.flops, 4.0 * 64 * 2 * (9 + 3));
  // GQA: K and V have kv_heads heads.
  EXPECT_DOUBLE_EQ(w.min_bytes, 7.0 * 2 * 64 * 2 * 2 + 7.0 * 1 * 64 * 2 * 2 + 7.0 * 2 * 4 + 3 * 4 * 2);
}

TEST(Roofline, BackwardIsTwoAndAHalfTimesTheFlopsAndMovesTheGradients) {
  ShapeKey k;
  k.head_dim = 128;
  k.heads = 4;
  k.kv_heads = 4;
  k.batch = 2;
  k.max_len_q = 100;
  k.total_q = 200;
  AttentionWork fwd = MinimalWork(k);
  k.op = Op::kBackward;
  AttentionWork bwd = MinimalWork(k);
  EXPECT_DOUBLE_EQ(bwd.flops, 2.5 * fwd.flops);
  const double tensor = 200.0 * 4 * 128 * 2;
  EXPECT_DOUBLE_EQ(bwd.min_bytes, 8 * tensor + 200.0 * 4 * 4 + 3 * 4);
}

TEST(Roofline, StatisticsGiveALowerBoundAndCrossCountsBytesOnly) {
  ShapeKey k;
  k.head_dim = 128;
  k.heads = 1;
  k.kv_heads = 1;
  k.batch = 4;
  k.max_len_q = 100;
  k.total_q = 200;
  EXPECT_DOUBLE_EQ(MinimalWork(k).flops, 4.0 * 128 * (200.0 * 200 / 4));
  k.causal = true;
  EXPECT_DOUBLE_EQ(MinimalWork(k).flops, 4.0 * 128 * (200.0 * 200 / 4 + 200) / 2);
  k.cross = true;
  k.max_len_k = 50;
  k.total_k = 100;
  EXPECT_EQ(MinimalWork(k).flops, 0);
  EXPECT_GT(MinimalWork(k).min_bytes, 0);
}

TEST(Roofline, TheFloorUsesTheArchsFastestGpuAndNeverOverestimatesAnUnknownOne) {
  ShapeKey k;
  k.head_dim = 128;
  k.heads = 4;
  k.kv_heads = 4;
  k.batch = 256;
  k.max_len_q = 2048;
  k.total_q = 256 * 2048;
  const TimingFloor h200 = FloorOf(k, "sm_90a");
  EXPECT_DOUBLE_EQ(h200.us, FloorOf(k, "sm_90").us);
  // 4 * 128 * 4 * 256 * 2048^2 flop at 989 TFLOP/s: compute bound.
  EXPECT_NEAR(h200.us, 4.0 * 128 * 4 * 256 * 2048.0 * 2048 / 989e12 * 1e6, 1e-6);
  EXPECT_GT(FloorOf(k, "sm_80").us, h200.us);
  EXPECT_LT(FloorOf(k, "sm_100a").us, h200.us);
  EXPECT_LT(FloorOf(k, "sm_150").us, FloorOf(k, "sm_100a").us);
  EXPECT_NE(h200.Describe().find("989 TFLOP/s"), std::string::npos) << h200.Describe();
  EXPECT_NE(h200.Describe().find("sm_90a"), std::string::npos);
}

}  // namespace
}  // namespace kforge
