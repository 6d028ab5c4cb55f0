// The drawn launch order (no GPU).
#include "worker/eval/launches.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace kforge::eval {
namespace {

LaunchPlanOptions Options() {
  return LaunchPlanOptions{.problems = 5, .timing_problem = 4, .warmup = 3, .iterations = 20,
                           .twice = {3}};
}

TEST(PlanLaunches, CountsStayInTheirRangesAndEveryProblemIsLaunched) {
  for (uint64_t seed = 0; seed < 50; ++seed) {
    std::map<int, int> launches;
    int warmup = 0, timed = 0;
    for (const LaunchStep& s : PlanLaunches(seed, Options())) {
      ++launches[s.problem];
      warmup += s.warmup;
      timed += s.timed;
      if (s.timed || s.warmup) EXPECT_EQ(s.problem, 4);
    }
    EXPECT_GE(warmup, 2);
    EXPECT_LE(warmup, 5);
    EXPECT_GE(timed, 20);
    EXPECT_LE(timed, 30);
    EXPECT_EQ(launches[0], 2) << "the first check problem is launched twice";
    EXPECT_EQ(launches[3], 2) << "problems listed in `twice`";
    for (int p : {1, 2}) {
      EXPECT_GE(launches[p], 1);
      EXPECT_LE(launches[p], 2);
    }
  }
}

TEST(PlanLaunches, ThePatternIsNotFixed) {
  // Over seeds the total count and the places of the check launches vary:
  // a kernel that counts its launches learns nothing it can rely on.
  std::set<size_t> totals;
  std::set<size_t> first_check_places;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const std::vector<LaunchStep> steps = PlanLaunches(seed, Options());
    totals.insert(steps.size());
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps[i].problem == 0) {
        first_check_places.insert(i);
        break;
      }
    }
  }
  EXPECT_GE(totals.size(), 5u);
  EXPECT_GE(first_check_places.size(), 10u);
}

TEST(PlanLaunches, TimedLaunchesFollowTheWarmUp) {
  const std::vector<LaunchStep> steps = PlanLaunches(7, Options());
  bool timed_seen = false;
  for (const LaunchStep& s : steps) {
    if (s.timed) timed_seen = true;
    if (s.warmup) EXPECT_FALSE(timed_seen);
  }
}

TEST(PlanLaunches, WithoutATimingProblemNothingIsTimed) {
  const std::vector<LaunchStep> steps =
      PlanLaunches(3, LaunchPlanOptions{.problems = 4, .timing_problem = -1});
  EXPECT_GE(steps.size(), 5u);
  for (const LaunchStep& s : steps) {
    EXPECT_FALSE(s.timed);
    EXPECT_FALSE(s.warmup);
  }
}

TEST(PlanLaunches, DependsOnTheSeedAlone) {
  auto a = PlanLaunches(11, Options()), b = PlanLaunches(11, Options());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].problem, b[i].problem);
}

}  // namespace
}  // namespace kforge::eval
