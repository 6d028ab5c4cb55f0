// Helpers shared by the reference and evaluator tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "worker/reference/jagged.h"

namespace kforge::reference::testing {

inline std::vector<uint16_t> RandomBf16(size_t n, std::mt19937_64& rng, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<uint16_t> out(n);
  for (auto& x : out) x = FloatToBf16(dist(rng));
  return out;
}

inline std::vector<int> Offsets(std::initializer_list<int> lengths) {
  std::vector<int> cu = {0};
  for (int l : lengths) cu.push_back(cu.back() + l);
  return cu;
}

struct Errors {
  double max_abs = 0;
  double rel_l2 = 0;
  double ref_max = 0;
};

// Errors of `got` against `want`, both finite; -inf == -inf counts as equal.
template <typename T>
Errors Compare(std::span<const T> got, std::span<const double> want) {
  Errors e;
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    double g = got[i], w = want[i];
    if (std::isinf(w) && g == w) continue;
    double d = std::isnan(g) ? INFINITY : std::fabs(g - w);
    e.max_abs = std::max(e.max_abs, d);
    e.ref_max = std::max(e.ref_max, std::fabs(w));
    num += d * d;
    den += w * w;
  }
  e.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

}  // namespace kforge::reference::testing
