#include "core/lengths.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace kforge {
namespace {

using nlohmann::json;

TEST(LengthRng, IsSplitMix64) {
  // The published SplitMix64 outputs for seed 0: the Python side
  // (python/kforge/lengths.py) is checked against the same numbers.
  LengthRng rng(0);
  EXPECT_EQ(rng.Next(), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(rng.Next(), 0x6e789e6aa1b965f4ULL);
  EXPECT_EQ(rng.Next(), 0x06c45d188009454fULL);
}

TEST(DrawLengths, FixedTakesNoDrawsAndUniformOnePerLength) {
  LengthRng a(5), b(5);
  const auto fixed = DrawLengths({.kind = LengthDistribution::Kind::kFixed, .hi = 9}, 4, a);
  EXPECT_EQ(fixed, (std::vector<int64_t>{9, 9, 9, 9}));
  EXPECT_EQ(a.Next(), b.Next()) << "a fixed length consumes nothing";
  LengthRng c(7), d(7);
  const auto uniform =
      DrawLengths({.kind = LengthDistribution::Kind::kUniform, .lo = 10, .hi = 12}, 3, c);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(uniform[size_t(i)], 10 + int64_t(d.Next() % 3));
  }
  EXPECT_EQ(c.Next(), d.Next());
}

TEST(DrawLengths, UniformCoversItsRangeAndParetoStaysInsideIt) {
  LengthRng rng(1);
  const auto u = DrawLengths({.kind = LengthDistribution::Kind::kUniform, .lo = 1, .hi = 4}, 400, rng);
  for (int64_t v = 1; v <= 4; ++v) EXPECT_NE(std::find(u.begin(), u.end(), v), u.end()) << v;
  const auto p = DrawLengths(
      {.kind = LengthDistribution::Kind::kPareto, .lo = 3, .hi = 50, .alpha = 1.2}, 4000, rng);
  int at_lo = 0, at_hi = 0;
  for (int64_t v : p) {
    ASSERT_GE(v, 3);
    ASSERT_LE(v, 50);
    at_lo += v == 3;
    at_hi += v == 50;
  }
  // Heavy tail: most sequences short, a few clipped at the cap.
  EXPECT_GT(at_lo, 4000 / 5);
  EXPECT_GT(at_hi, 0);
}

TEST(DrawShapeLengths, DrawsKeysAfterQueriesFromTheSameGenerator) {
  const json shape = json::parse(R"({"B": 5, "q": {"dist": "uniform", "lo": 1, "hi": 100},
                                     "kv": {"dist": "uniform", "lo": 1, "hi": 100}})");
  absl::StatusOr<DrawnLengths> d = DrawShapeLengths(shape, 42);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->cross);
  LengthRng rng(42);
  const LengthDistribution u{.kind = LengthDistribution::Kind::kUniform, .lo = 1, .hi = 100};
  EXPECT_EQ(d->q, DrawLengths(u, 5, rng));
  EXPECT_EQ(d->k, DrawLengths(u, 5, rng));
  EXPECT_NE(d->q, d->k);
  // The seed decides the batch; the same seed, the same batch.
  EXPECT_EQ(DrawShapeLengths(shape, 42)->q, d->q);
  EXPECT_NE(DrawShapeLengths(shape, 43)->q, d->q);
}

TEST(DrawShapeLengths, SameKeysAreSelfAttention) {
  for (const char* text : {R"({"B": 3, "q": {"dist": "fixed", "hi": 7}, "kv": "same"})",
                           R"({"batch": 3, "q": {"dist": "fixed", "hi": 7}})"}) {
    absl::StatusOr<DrawnLengths> d = DrawShapeLengths(json::parse(text));
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_FALSE(d->cross);
    EXPECT_TRUE(d->k.empty());
    EXPECT_EQ(d->q, (std::vector<int64_t>{7, 7, 7}));
  }
}

TEST(DrawShapeLengths, MalformedDistributionsSayWhatIsWrong) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"B": 2, "q": {"dist": "normal", "hi": 3}})", "unknown length distribution 'normal'"},
      {R"({"B": 2, "q": {"dist": "uniform", "lo": 5, "hi": 3}})", "\"lo\" 5 is above \"hi\" 3"},
      {R"({"B": 2, "q": {"dist": "fixed"}})", "\"hi\" is missing"},
      {R"({"B": 2, "q": {"dist": "pareto", "lo": 1, "hi": 9}})", "needs a number \"alpha\""},
      {R"({"B": 2, "q": {"dist": "pareto", "lo": 0, "hi": 9, "alpha": 1}})", "at least 1"},
      {R"({"B": 2, "q": {"dist": "pareto", "lo": 1, "hi": 9, "alpha": -1}})", "positive"},
      {R"({"B": 2, "q": {"dist": "fixed", "hi": 3}, "kv": "other"})", "kv: "},
      {R"({"B": -1, "q": {"dist": "fixed", "hi": 3}})", "batch must not be negative"},
      {R"({"q": {"dist": "fixed", "hi": 3}})", "\"batch\" is missing"},
      {R"({"B": 2})", "\"q\" is missing"},
      {R"({"B": 2.5, "q": {"dist": "fixed", "hi": 3}})", "must be an integer"},
  };
  for (const auto& [text, want] : cases) {
    absl::StatusOr<DrawnLengths> d = DrawShapeLengths(json::parse(text));
    ASSERT_FALSE(d.ok()) << text;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find(want), std::string_view::npos)
        << text << ": " << d.status().message();
  }
}

}  // namespace
}  // namespace kforge
