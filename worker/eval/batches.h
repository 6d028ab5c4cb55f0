// The problems a candidate is checked and timed on: jagged batches, how their
// input values are drawn, and how the candidate is launched on them.
//
// A kernel written to look fast learns whatever the evaluator holds fixed
// (verification.md): the lengths it checks, the softmax scale, the input
// magnitudes, the grid size. So every evaluation draws, from its task's seed:
//  - check problems that together hold every sequence length from 0 to
//    CoverageLength (twice the largest tile, at least 256, up to the bucket's
//    maximum), plus in each one the maximum length, 0 and 1; cross shapes
//    draw key lengths the same way, paired at random (Lq != Lk, Lk = 0);
//  - a softmax scale that is not 1/sqrt(D) on most problems (0.25x to 4x);
//  - input magnitudes: plain N(0, 1), sparse outliers up to 32, and large
//    inputs (Q and K four times larger, V eight, outliers up to 64), so that
//    scores reach the hundreds and an unshifted exp overflows;
//  - for persistent grids, launches on 1 to 3 CTAs, so one CTA runs many
//    tiles of every length;
//  - the timing problem (the shape's statistics or the task's offsets) with
//    a random scale and outliers too: it is checked like the others;
//  - for promotion (a kernel about to be served), the bucket's corner: its
//    largest batch, lengths and totals (as far as device memory allows),
//    so the kernel is verified at every size it will be served for.
//
// Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/shape.h"
#include "worker/reference/jagged.h"

namespace kforge::eval {

// Longest sequence in a check problem (the timing and corner problems have
// the shape's own lengths).
inline constexpr int kCheckMaxLen = 4096;
// Largest timing problem evaluated: elements of Q (total_q * heads * head_dim).
inline constexpr int64_t kMaxEvalElements = int64_t{1} << 32;
// The gate's timing-like problem keeps the shape's batch size and longest
// sequence but at most this many query tokens: the sanitizers slow the
// kernels they instrument by 10-1000x, and every promotion waits for them.
inline constexpr int64_t kGateMaxTokens = 8192;
// Under the gate, the check problems' long sequences stop at
// GateLongest(tile): past a few key blocks a kernel's loop only repeats
// what the sanitizer has seen (the pipeline's ring has wrapped), and the
// gate problem still runs the bucket's longest sequence once.
int GateLongest(int largest_tile);

// How one problem's input values are drawn: fresh RandomBf16 values (about
// N(0, 1)), each tensor multiplied by its scale, then about one element in
// `outlier_period` replaced by an outlier of magnitude in
// [outlier_magnitude / 2, outlier_magnitude] and random sign.
struct InputStyle {
  float q_scale = 1, k_scale = 1, v_scale = 1, dout_scale = 1;
  uint32_t outlier_period = 0;  // 0: no outliers
  float outlier_magnitude = 0;

  bool plain() const {
    return q_scale == 1 && k_scale == 1 && v_scale == 1 && dout_scale == 1 && outlier_period == 0;
  }
  std::string Describe() const;  // "plain", "outliers 1/257 up to 32", ...
};

enum class ProblemRole {
  kCheck,   // hostile lengths, scales, magnitudes, grids
  kTiming,  // the shape's own batch; timed, and checked on every launch
  kCorner,  // the bucket's largest sizes (promotion only)
  kGate,    // the timing batch scaled down for the sanitizer gate
};

struct ProblemSpec {
  ProblemRole role = ProblemRole::kCheck;
  reference::JaggedShape shape;  // lengths, head layout, mask, softmax scale
  InputStyle style;
  // Persistent grids: launch min(tiles, grid_ctas) CTAs instead of the usual
  // grid; 0: the usual grid. Ignored for per_tile grids.
  int grid_ctas = 0;

  // For the worker's own log, never for feedback: "check 2 (B=171 ...)".
  std::string Describe() const;
};

// Every length 0 .. CoverageLength(...) appears among an evaluation's check
// problems: twice the largest tile (at least 128), capped by the largest
// length the bucket serves.
int CoverageLength(int largest_tile, int64_t bucket_max_len);

// `count` (at least 3) check problems for `key`, drawn from `seed`.
// `largest_tile` is the candidate's largest declared tile (max of tile_m,
// tile_n). `longest` > 0 caps the long sequences (below kCheckMaxLen and the
// bucket's own maximum); every length up to CoverageLength still appears.
std::vector<ProblemSpec> CheckProblems(const ShapeKey& key, uint64_t seed, int count,
                                       int largest_tile, int longest = 0);

// One check problem for the sampled gates (EvalOptions::sampled_checks):
// lengths 0, 1, 2, the awkward ones around the tile and its multiples up to
// CoverageLength, the capped longest one, and a few drawn at random; the
// usual softmax scale and plain inputs (a hazard does not depend on values);
// two or three CTAs where the kernel is persistent, so that each runs many
// tiles in turn.
ProblemSpec SampledCheckProblem(const ShapeKey& key, uint64_t seed, int largest_tile);

// The timing problem: the task's offsets when given (cu_k empty: self), else
// lengths drawn to match the key's statistics (TimingBatch); its scale and
// outliers come from `seed`.
absl::StatusOr<ProblemSpec> TimingProblem(const ShapeKey& key, std::span<const int32_t> cu_q,
                                          std::span<const int32_t> cu_k, uint64_t seed);

// The bucket's largest batch (BucketExtent of the key's bucket), with its
// totals cut down so that Q has at most `max_q_elements` elements (then the
// problem, and so the verified extent, stops short of the corner).
ProblemSpec CornerProblem(const ShapeKey& key, uint64_t seed, int64_t max_q_elements);

// The timing batch's batch size and longest sequence with at most
// kGateMaxTokens query tokens: what the sanitizer gate runs besides the
// checks, so that a kernel cannot keep a bad path for large batches only.
// `max_tokens` and `longest` (when > 0) cut it down further.
ProblemSpec GateProblem(const ShapeKey& key, uint64_t seed, int64_t max_tokens = kGateMaxTokens,
                        int64_t longest = 0);

// The sizes of one batch, as a SizeExtent.
SizeExtent ExtentOf(const reference::JaggedShape& s);
// The statistic-wise maximum.
SizeExtent MaxExtent(const SizeExtent& a, const SizeExtent& b);

// The head layout and mask of `key` with empty offsets.
reference::JaggedShape HeadLayout(const ShapeKey& key);

// The timing batch's lengths: `cu_q`/`cu_k` when given (cu_k empty:
// self-attention), else lengths drawn to match key.batch, max_len_* and
// total_* (mean). The draw depends on the key alone, not on a task's seed:
// every evaluation of a shape is timed on the same lengths (with fresh
// values), so the times the search compares differ by the kernels, not by
// the batches.
absl::StatusOr<reference::JaggedShape> TimingBatch(const ShapeKey& key,
                                                   std::span<const int32_t> cu_q,
                                                   std::span<const int32_t> cu_k);

// Fresh near-N(0, 1) bf16 values.
std::vector<uint16_t> RandomBf16(size_t n, std::mt19937_64& rng);

// Applies `scale` and the outliers of InputStyle to `values` in place; the
// outliers are placed by `seed` (element i is one when a hash of (seed, i)
// falls in 1/period). DeviceTools::StyleBf16 is its device mirror.
void StyleBf16(std::span<uint16_t> values, float scale, uint64_t seed, uint32_t period,
               float magnitude);

}  // namespace kforge::eval
