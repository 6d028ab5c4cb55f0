// Lengths: how a jagged batch's sequence lengths are drawn from a shape's
// length distribution (bench/shapes.json's "q" and "kv" entries).
//
// This is the one rule. `kforge tune --shapes` (cli/main.cc) draws with it,
// and so does everything in Python (the benchmarks under bench/, the GPU
// tests of the Python package) through python/kforge/lengths.py, which
// implements the same rule step for step; tests/lengths checks that the two
// draw identical lengths for the same seed and shape. Both sides having to
// agree bit for bit is why the generator is a small integer one written out
// here rather than a library's (std::mt19937 or torch.Generator), whose
// draws the other language cannot reproduce.
//
// A distribution:
//   {"dist": "fixed", "hi": N}                        every length N
//   {"dist": "uniform", "lo": A, "hi": B}             integers in [A, B]
//   {"dist": "pareto", "alpha": a, "lo": A, "hi": B}  heavy tail: most near A,
//                                                     a few up to B
// ("lo" defaults to 1). The generator is SplitMix64 seeded with the seed.
// Each uniform or pareto length takes one 64-bit output x:
//   uniform  A + x mod (B - A + 1)
//   pareto   u = ((x >> 11) + 1) * 2^-53 in (0, 1];
//            trunc(clamp(A * pow(u, -1 / a), A, B))   (IEEE doubles)
// and a fixed length takes none. A shape draws its B query lengths first,
// then, with the same generator, its B key lengths ("kv": "same" is
// self-attention: no key lengths of its own).
//
// Thread-safe: pure functions; a LengthRng is a value owned by its caller.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/statusor.h"

namespace kforge {

// The seed the public shapes are drawn with, per shape.
inline constexpr uint64_t kDefaultLengthSeed = 1;

struct LengthDistribution {
  enum class Kind { kFixed, kUniform, kPareto };
  Kind kind = Kind::kFixed;
  int64_t lo = 1, hi = 1;
  double alpha = 1;  // pareto only
};

// INVALID_ARGUMENT naming what is wrong: an unknown "dist", a missing "hi"
// or "alpha", lo > hi, negative lengths, a pareto lo below 1 or alpha not
// positive.
absl::StatusOr<LengthDistribution> LengthDistributionFromJson(const nlohmann::json& j);

// SplitMix64 (Steele, Lea and Flood, 2014).
class LengthRng {
 public:
  explicit LengthRng(uint64_t seed) : state_(seed) {}
  uint64_t Next();

 private:
  uint64_t state_;
};

// `batch` lengths of `d`, drawn from `rng` (which moves on).
std::vector<int64_t> DrawLengths(const LengthDistribution& d, int64_t batch, LengthRng& rng);

struct DrawnLengths {
  std::vector<int64_t> q;
  bool cross = false;     // the shape has key lengths of its own
  std::vector<int64_t> k;  // cross only
};

// A shapes.json entry's lengths: "B" (or "batch") sequences, "q" and "kv"
// as above, from a generator seeded with `seed`.
absl::StatusOr<DrawnLengths> DrawShapeLengths(const nlohmann::json& shape,
                                              uint64_t seed = kDefaultLengthSeed);

}  // namespace kforge
