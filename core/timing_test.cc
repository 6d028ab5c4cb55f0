#include "core/timing.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace kforge {
namespace {

// Pairs whose clock moves by up to +-15% from pair to pair (both halves of
// a pair under the same clock), the candidate `gain` faster, each launch
// with +-`jitter` of its own. Deterministic.
void ClockedPairs(double candidate_us, double incumbent_us, int n, double jitter,
                  std::vector<double>& cand, std::vector<double>& inc) {
  cand.clear();
  inc.clear();
  for (int i = 0; i < n; ++i) {
    const double clock = 1.0 + 0.15 * std::sin(1.7 * i + 0.3);
    const double a = 1.0 + jitter * std::sin(2.9 * i + 1.1);
    const double b = 1.0 + jitter * std::cos(3.7 * i + 0.7);
    cand.push_back(candidate_us * clock * a);
    inc.push_back(incumbent_us * clock * b);
  }
}

TEST(TimingTest, SummarizeKeepsLaunchOrderAndQuartiles) {
  const Timing t = Summarize({5, 1, 4, 2, 3});
  EXPECT_EQ(t.samples, 5);
  EXPECT_DOUBLE_EQ(t.median_us, 3);
  EXPECT_DOUBLE_EQ(t.min_us, 1);
  EXPECT_DOUBLE_EQ(t.max_us, 5);
  EXPECT_DOUBLE_EQ(t.p25_us, 2);
  EXPECT_DOUBLE_EQ(t.p75_us, 4);
  EXPECT_EQ(t.samples_us, (std::vector<double>{5, 1, 4, 2, 3}));
  EXPECT_DOUBLE_EQ(t.Spread(), 2);
}

TEST(TimingTest, SpreadIsMaxMinusMinWithoutQuartiles) {
  Timing t{.median_us = 10, .min_us = 8, .max_us = 13, .samples = 5};
  EXPECT_DOUBLE_EQ(t.Spread(), 5);
}

TEST(TimingTest, MinPairsForABoundAt95IsFive) {
  EXPECT_EQ(MinPairs(0.95), 5);
  EXPECT_EQ(MinPairs(0.99), 7);
}

TEST(TimingTest, SignTestBoundIsAnOrderStatistic) {
  // 24 pairs: P(B(24, 1/2) <= 7) = 0.032, P(<= 8) = 0.076, so the bound at
  // 95% is the 8th smallest ratio.
  std::vector<double> cand, inc;
  for (int i = 1; i <= 24; ++i) {
    cand.push_back(100);
    inc.push_back(100 + i);  // ratios 1.01 ... 1.24
  }
  absl::StatusOr<PairedRatios> r = ComparePaired(cand, inc, 0.95);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->pairs, 24);
  EXPECT_DOUBLE_EQ(r->lower_bound, 1.08);
  EXPECT_NEAR(r->median, 1.125, 1e-12);
  EXPECT_EQ(r->favouring, 24);
}

TEST(TimingTest, TooFewPairsGiveNoBoundAndNoWin) {
  const Timing cand = Summarize({100, 100, 100, 100});
  const Timing inc = Summarize({200, 200, 200, 200});
  const Comparison c = CompareTimings(cand, inc);
  EXPECT_TRUE(c.paired);
  EXPECT_EQ(c.ratios.lower_bound, 0);
  EXPECT_FALSE(c.candidate_wins);
  EXPECT_NE(c.Describe().find("too few pairs"), std::string::npos) << c.Describe();
}

TEST(TimingTest, MismatchedOrBadPairsAreRefused) {
  std::vector<double> a{1, 2}, b{1};
  EXPECT_FALSE(ComparePaired(a, b, 0.95).ok());
  std::vector<double> c{1, -2}, d{1, 2};
  EXPECT_FALSE(ComparePaired(c, d, 0.95).ok());
}

// The case: clocks moving 5-15% between launches, the candidate
// 1554.8 us against the incumbent's 1700.7 us, an interquartile range far
// above the gap. The spread rule turned it down; the pairs all favour the
// candidate and the paired rule accepts.
TEST(TimingTest, PairedRuleAcceptsAWinTheSpreadRuleTurnedDown) {
  std::vector<double> cand, inc;
  ClockedPairs(1554.8, 1700.7, 24, 0.01, cand, inc);
  const Timing c = Summarize(cand), i = Summarize(inc);
  ASSERT_GT(std::max(c.Spread(), i.Spread()), i.median_us - c.median_us);  // the old rule: no

  Timing c_old = c, i_old = i;
  c_old.samples_us.clear();
  i_old.samples_us.clear();
  EXPECT_FALSE(CompareTimings(c_old, i_old).candidate_wins);

  const Comparison paired = CompareTimings(c, i);
  EXPECT_TRUE(paired.paired);
  EXPECT_TRUE(paired.candidate_wins) << paired.Describe();
  EXPECT_GT(paired.ratios.lower_bound, 1.05);
  EXPECT_NEAR(paired.ratios.median, 1700.7 / 1554.8, 0.02);
  EXPECT_NE(paired.Describe().find("candidate wins: median of 24 paired ratios"), std::string::npos)
      << paired.Describe();
  EXPECT_NE(MeasuredAgainst(paired, "v3").find("retime: median of 24 paired ratios"),
            std::string::npos);
}

TEST(TimingTest, PairedRuleNeedsTheMinimumGain) {
  std::vector<double> cand, inc;
  ClockedPairs(1000, 1005, 40, 0.001, cand, inc);  // 0.5% faster, every pair
  const Comparison c = CompareTimings(Summarize(cand), Summarize(inc));
  EXPECT_TRUE(c.paired);
  EXPECT_GT(c.ratios.lower_bound, 1.0);
  EXPECT_FALSE(c.candidate_wins) << c.Describe();
  EXPECT_TRUE(CompareTimings(Summarize(cand), Summarize(inc), WinRule{.min_gain = 0.001})
                  .candidate_wins);
}

TEST(TimingTest, PairedRuleHoldsWhenPairsDisagree) {
  // Half the pairs favour each: no evidence of a gain, however the medians
  // fall.
  std::vector<double> cand, inc;
  for (int i = 0; i < 30; ++i) {
    cand.push_back(i % 2 ? 90 : 110);
    inc.push_back(100);
  }
  const Comparison c = CompareTimings(Summarize(cand), Summarize(inc));
  EXPECT_FALSE(c.candidate_wins) << c.Describe();
}

TEST(TimingTest, UnpairedRuleForTimingsWithoutSamples) {
  Timing cand{.median_us = 80, .min_us = 79, .max_us = 81, .samples = 10, .p25_us = 79.5,
              .p75_us = 80.5};
  Timing inc{.median_us = 100, .min_us = 98, .max_us = 102, .samples = 10, .p25_us = 99,
             .p75_us = 101};
  Comparison c = CompareTimings(cand, inc);
  EXPECT_FALSE(c.paired);
  EXPECT_TRUE(c.candidate_wins);
  EXPECT_DOUBLE_EQ(c.spread_us, 2);
  inc.median_us = 81;
  inc.p25_us = 80;
  inc.min_us = 80;
  EXPECT_FALSE(CompareTimings(cand, inc).candidate_wins);
}

TEST(TimingTest, SamplesRoundTripExactly) {
  const std::vector<double> s{1554.8123456789012, 0.1, 1e-7, 1700.7, 3.0};
  const std::string text = EncodeSamples(s);
  absl::StatusOr<std::vector<double>> back = DecodeSamples(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, s);
  EXPECT_TRUE(DecodeSamples("").ok());
  EXPECT_TRUE(DecodeSamples("").value().empty());
  EXPECT_FALSE(DecodeSamples("1,x").ok());
  EXPECT_FALSE(DecodeSamples("1,").ok());
}

}  // namespace
}  // namespace kforge
