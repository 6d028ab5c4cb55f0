// The order of a candidate's launches in one evaluation.
//
// A kernel can count its launches (verification.md): any fixed pattern of
// which launches are checked is a schedule it can learn. So every launch is
// checked, and the pattern itself is drawn from the task's seed: how many
// warm-up and timed launches the timing problem gets, how often each other
// problem is launched (the first check problem always twice, to prove the
// output depends on the inputs alone), and where those launches fall among
// the timing problem's.
//
// Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <vector>

namespace kforge::eval {

struct LaunchStep {
  int problem = 0;      // index into the evaluation's problems
  bool timed = false;   // recorded with events; its time is a sample
  bool warmup = false;  // a launch of the timing problem before the timed ones
};

struct LaunchPlanOptions {
  int problems = 0;        // problems of the evaluation, the timing one included
  int timing_problem = -1; // its index; -1: no timing (the sanitizer gate)
  int warmup = 3;          // nominal warm-up launches; the drawn count is within [w-1, w+2]
  int iterations = 20;     // nominal timed launches; drawn within [n, 3n/2]
  // Problems launched exactly twice (the bucket's corner: two launches that
  // must agree); the first non-timing problem always is.
  std::vector<int> twice;
};

std::vector<LaunchStep> PlanLaunches(uint64_t seed, const LaunchPlanOptions& options);

}  // namespace kforge::eval
