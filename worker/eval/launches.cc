#include "worker/eval/launches.h"

#include <algorithm>
#include <random>

namespace kforge::eval {

std::vector<LaunchStep> PlanLaunches(uint64_t seed, const LaunchPlanOptions& o) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + 0x500);
  auto between = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, std::max(lo, hi))(rng);
  };
  std::vector<LaunchStep> steps;
  if (o.timing_problem >= 0) {
    const int warmup = between(std::max(1, o.warmup - 1), o.warmup + 2);
    const int timed = between(std::max(1, o.iterations), std::max(1, o.iterations) * 3 / 2);
    for (int i = 0; i < warmup; ++i) steps.push_back({o.timing_problem, false, true});
    for (int i = 0; i < timed; ++i) steps.push_back({o.timing_problem, true, false});
  }
  std::vector<LaunchStep> others;
  bool first = true;
  for (int p = 0; p < o.problems; ++p) {
    if (p == o.timing_problem) continue;
    const bool listed = std::find(o.twice.begin(), o.twice.end(), p) != o.twice.end();
    const int launches = (first || listed || rng() % 3 == 0) ? 2 : 1;
    first = false;
    for (int i = 0; i < launches; ++i) others.push_back({p, false, false});
  }
  std::shuffle(others.begin(), others.end(), rng);
  // Each of the other launches goes to a random place among the timing
  // problem's, anywhere from before the first warm-up to after the last.
  for (const LaunchStep& s : others) {
    const size_t at = std::uniform_int_distribution<size_t>(0, steps.size())(rng);
    steps.insert(steps.begin() + static_cast<std::ptrdiff_t>(at), s);
  }
  return steps;
}

}  // namespace kforge::eval
