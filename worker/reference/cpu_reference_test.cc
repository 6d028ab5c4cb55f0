// The float64 CPU reference on cases whose answer is known by hand, and the
// GPU reference's source compiling for every target architecture (no GPU).
#include "worker/reference/cpu_reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "gpu/compile.h"
#include "worker/reference/gpu_reference.h"
#include "worker/reference/test_util.h"

namespace kforge::reference {
namespace {

using testing::Offsets;

TEST(CpuReference, SingleKeyGivesItsValueAndZeroLse) {
  JaggedShape s{.heads = 1, .kv_heads = 1, .head_dim = 8, .cu_q = Offsets({1}),
                .cu_k = Offsets({1})};
  std::vector<uint16_t> q(8, FloatToBf16(0.5f)), k(8, FloatToBf16(0.0f)), v(8);
  for (int d = 0; d < 8; ++d) v[d] = FloatToBf16(float(d));
  CpuForwardResult r = CpuForward(s, q, k, v);
  for (int d = 0; d < 8; ++d) EXPECT_DOUBLE_EQ(r.o[d], d);
  EXPECT_DOUBLE_EQ(r.lse[0], 0.0);  // one key, score 0
}

TEST(CpuReference, EqualScoresAverageValuesAndLseIsLogN) {
  JaggedShape s{.heads = 1, .kv_heads = 1, .head_dim = 8, .cu_q = Offsets({1}),
                .cu_k = Offsets({4})};
  std::vector<uint16_t> q(8, FloatToBf16(0.0f)), k(32, FloatToBf16(1.0f)), v(32);
  for (int j = 0; j < 4; ++j)
    for (int d = 0; d < 8; ++d) v[j * 8 + d] = FloatToBf16(float(j));
  CpuForwardResult r = CpuForward(s, q, k, v);
  EXPECT_DOUBLE_EQ(r.o[0], 1.5);
  EXPECT_NEAR(r.lse[0], std::log(4.0), 1e-12);
}

TEST(CpuReference, CausalBottomRightRowsWithoutKeysAreZeroAndMinusInf) {
  // Lq = 3, Lk = 1: query i sees keys j <= i - 2, so only the last query sees key 0.
  JaggedShape s{.heads = 1, .kv_heads = 1, .head_dim = 8, .causal = true, .cu_q = Offsets({3}),
                .cu_k = Offsets({1})};
  std::vector<uint16_t> q(24, FloatToBf16(1.0f)), k(8, FloatToBf16(1.0f)), v(8, FloatToBf16(2.0f));
  CpuForwardResult r = CpuForward(s, q, k, v);
  EXPECT_EQ(r.lse[0], -std::numeric_limits<double>::infinity());
  EXPECT_EQ(r.lse[1], -std::numeric_limits<double>::infinity());
  EXPECT_EQ(r.o[0], 0.0);
  EXPECT_EQ(r.o[8], 0.0);
  EXPECT_DOUBLE_EQ(r.o[16], 2.0);
}

TEST(CpuReference, BackwardMatchesFiniteDifferences) {
  // d/dq of sum(O * dO) by central differences on one query element.
  std::mt19937_64 rng(7);
  JaggedShape s{.heads = 2, .kv_heads = 1, .head_dim = 8, .causal = true, .cu_q = Offsets({3, 2}),
                .cu_k = Offsets({4, 2})};
  auto q = testing::RandomBf16(s.q_elems(), rng);
  auto k = testing::RandomBf16(s.k_elems(), rng);
  auto v = testing::RandomBf16(s.k_elems(), rng);
  auto dout = testing::RandomBf16(s.q_elems(), rng);
  CpuForwardResult f = CpuForward(s, q, k, v);
  std::vector<uint16_t> o(f.o.size());
  for (size_t i = 0; i < o.size(); ++i) o[i] = FloatToBf16(float(f.o[i]));
  std::vector<float> lse(f.lse.begin(), f.lse.end());
  CpuBackwardResult g = CpuBackward(s, q, k, v, o, lse, dout);
  // The backward uses bf16-rounded O in delta, so compare loosely.
  auto loss = [&](const std::vector<uint16_t>& qq) {
    CpuForwardResult r = CpuForward(s, qq, k, v);
    double l = 0;
    for (size_t i = 0; i < r.o.size(); ++i) l += r.o[i] * Bf16ToFloat(dout[i]);
    return l;
  };
  // Perturb by exact bf16 steps: element 3 of row 2, head 1.
  size_t idx = (2 * 2 + 1) * 8 + 3;
  float x = Bf16ToFloat(q[idx]);
  float hstep = 1.0f / 64;
  auto qp = q, qm = q;
  qp[idx] = FloatToBf16(x + hstep);
  qm[idx] = FloatToBf16(x - hstep);
  double fd = (loss(qp) - loss(qm)) / (Bf16ToFloat(qp[idx]) - Bf16ToFloat(qm[idx]));
  EXPECT_NEAR(g.dq[idx], fd, 2e-2 * (1 + std::fabs(fd)));
}

class ReferenceSourceCompiles : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceSourceCompiles, ForArch) {
  gpu::CompileRequest req;
  req.source = std::string(ReferenceSource());
  req.arch = GetParam();
  absl::StatusOr<gpu::CompileResult> r = gpu::Compile(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok) << r->log;
  EXPECT_EQ(r->functions.size(), 4u) << r->log;
}

INSTANTIATE_TEST_SUITE_P(Archs, ReferenceSourceCompiles,
                         ::testing::Values("sm_80", "sm_90a", "sm_100a"));

}  // namespace
}  // namespace kforge::reference
