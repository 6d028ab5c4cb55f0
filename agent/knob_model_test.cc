#include "agent/knob_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace kforge::agent {
namespace {

// One template, knobs A and B with 5 values each (positions 0, .25, ..., 1).
KnobPoint At(int a, int b, int tmpl = 0) { return KnobPoint{tmpl, {a / 4.0, b / 4.0}}; }

// log(us): A matters (a bowl around a = 3), B does nothing.
double Truth(int a, int b) {
  (void)b;
  return std::log(100.0 + 20.0 * (a - 3) * (a - 3));
}

struct Data {
  std::vector<KnobPoint> points;
  std::vector<double> y;
};

Data Grid(const std::vector<std::pair<int, int>>& at) {
  Data d;
  for (auto [a, b] : at) {
    d.points.push_back(At(a, b));
    d.y.push_back(Truth(a, b));
  }
  return d;
}

const std::vector<std::pair<int, int>> kSample = {{0, 0}, {4, 4}, {2, 1}, {1, 3}, {3, 4},
                                                  {4, 0}, {0, 2}, {2, 3}, {1, 1}, {3, 0}};

TEST(KnobModel, ReproducesWhatItMeasured) {
  Data d = Grid(kSample);
  KnobModel m(d.points, d.y, {2});
  for (size_t i = 0; i < d.points.size(); ++i) {
    EXPECT_NEAR(m.Predict(d.points[i]).mean, d.y[i], 0.05) << i;
    EXPECT_LT(m.Predict(d.points[i]).sd, 0.1) << i;
  }
  EXPECT_DOUBLE_EQ(m.best_log_us(), std::log(100.0));
}

TEST(KnobModel, LearnsWhichKnobMatters) {
  Data d = Grid(kSample);
  KnobModel m(d.points, d.y, {2});
  // B changes nothing: its correlations decay no faster than A's.
  EXPECT_LT(m.theta(0, 1), m.theta(0, 0));
  // So an unmeasured setting with a good A is predicted fast whatever its B.
  EXPECT_LT(m.Predict(At(3, 2)).mean, std::log(110.0));
  EXPECT_GT(m.Predict(At(0, 1)).mean, std::log(200.0));
}

TEST(KnobModel, ExpectsImprovementWhereTheDataPoints) {
  // The best measured is a = 2 (120 us); a = 3 (100 us) is unmeasured.
  Data d = Grid({{0, 0}, {0, 4}, {1, 2}, {2, 0}, {2, 4}, {4, 2}, {4, 0}});
  KnobModel m(d.points, d.y, {2});
  const double near = m.ExpectedImprovement(At(3, 2));
  EXPECT_GT(near, m.ExpectedImprovement(At(0, 2)));  // next to the slowest
  EXPECT_GT(near, m.ExpectedImprovement(At(2, 0)));  // measured already
  EXPECT_GE(m.ExpectedImprovement(At(0, 0)), 0.0);
}

TEST(KnobModel, PendingSettingsLowerTheSpreadNotTheMean) {
  Data d = Grid({{0, 0}, {4, 4}, {2, 2}});
  KnobModel m(d.points, d.y, {2});
  const auto before = m.Predict(At(3, 3));
  const auto other = m.Predict(At(1, 0));
  m.SetPending({At(3, 3)});
  const auto after = m.Predict(At(3, 3));
  EXPECT_NEAR(after.mean, before.mean, 1e-9);
  EXPECT_LT(after.sd, 0.5 * before.sd);
  EXPECT_NEAR(m.Predict(At(1, 0)).mean, other.mean, 1e-9);
  m.SetPending({});  // replaces: back to the measured ones alone
  EXPECT_NEAR(m.Predict(At(3, 3)).sd, before.sd, 1e-9);
}

TEST(KnobModel, TemplatesKeepTheirOwnLevel) {
  // Template 1 is uniformly 3x slower than template 0.
  Data d = Grid(kSample);
  for (auto [a, b] : kSample) {
    d.points.push_back(At(a, b, 1));
    d.y.push_back(Truth(a, b) + std::log(3.0));
  }
  KnobModel m(d.points, d.y, {2, 2});
  EXPECT_NEAR(m.Predict(At(3, 2, 1)).mean - m.Predict(At(3, 2, 0)).mean, std::log(3.0), 0.2);
}

TEST(KnobModel, NothingMeasuredIsThePrior) {
  KnobModel m({}, {}, {2});
  const auto p = m.Predict(At(1, 1));
  EXPECT_GT(p.sd, 0);
  m.SetPending({At(1, 1)});
  EXPECT_LT(m.Predict(At(1, 1)).sd, p.sd);  // spreading picks out works before any timing
  EXPECT_GT(m.Predict(At(4, 4)).sd, m.Predict(At(1, 2)).sd);
}

TEST(KnobModel, IsAPureFunctionOfItsInputs) {
  Data d = Grid(kSample);
  KnobModel a(d.points, d.y, {2}), b(d.points, d.y, {2});
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 5; ++j) {
      EXPECT_EQ(a.ExpectedImprovement(At(i, j)), b.ExpectedImprovement(At(i, j)));
    }
}

}  // namespace
}  // namespace kforge::agent
