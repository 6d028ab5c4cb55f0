// The one tolerance policy every candidate is judged by (TOLERANCE.md), and
// the comparison of a candidate's outputs with the reference's.
//
// Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kforge::eval {

// Versioned with the reference (reference::kReferenceVersion): stored
// results name both, so a policy change re-verifies winners.
inline constexpr std::string_view kTolerancePolicyVersion = "tol-2";

// bf16 outputs (O, dQ, dK, dV) against the fp32 reference.
inline constexpr double kBf16MaxRelL2 = 1e-2;
inline constexpr double kBf16MaxAbsFraction = 2e-2;  // of max(1, max |reference|)
// LSE (fp32) against the fp32 reference (natural log units): 1e-3 absolute
// plus 4e-6 of the largest |LSE|. A correct fp32 kernel's LSE error grows
// with the scores (measured on the H200: 1.0-1.5e-3 at LSE 770-1500, inputs
// with scores in the hundreds); 4e-6 is about 33 fp32 ulps there.
inline constexpr double kLseMaxAbs = 1e-3;
inline constexpr double kLseMaxRel = 4e-6;

// The bits the host writes into every candidate output before every run.
inline constexpr uint16_t kPoisonBf16 = 0x7fc0;      // bf16 quiet NaN
inline constexpr uint32_t kPoisonF32 = 0x7fc00000u;  // fp32 quiet NaN
inline constexpr uint32_t kPoisonBf16Pair = 0x7fc07fc0u;

// Where element `index` of an output lives, for messages.
struct Layout {
  std::span<const int> cu;  // offsets of the tensor's rows (cu_q or cu_k)
  int heads = 1;
  int head_dim = 1;         // 1 for LSE
  bool head_major = false;  // LSE: (heads, rows); else (rows, heads, head_dim)

  // "row 17 of a sequence of 40, head 2, dim 5": the place within its
  // sequence and that sequence's length, not its index in the batch.
  std::string Describe(size_t index) const;
};

struct OutputCheck {
  std::string output;  // "O", "LSE", "dQ", ...
  bool pass = true;
  double max_abs = 0;
  double rel_l2 = 0;
  double bound_max_abs = 0;  // the bound max_abs was held to
  size_t elements = 0;
  size_t unwritten = 0;   // still holding the poison bits
  size_t nonfinite = 0;   // other NaN/inf (or a finite value where -inf was due)
  std::string detail;     // empty when it passed
};

OutputCheck CheckBf16(std::string_view name, std::span<const uint16_t> got,
                      std::span<const float> reference, const Layout& layout);
// Rows whose reference is -inf (no visible key) must be exactly -inf.
OutputCheck CheckLse(std::span<const float> got, std::span<const float> reference,
                     const Layout& layout);

// A check is two steps: a pass over the elements that gathers the sums
// (Tally*), then the policy applied to them (Judge*). The evaluator runs the
// pass on the GPU (eval_kernels.cu mirrors Tally*; DeviceTools::Tally*) and
// judges on the host; Check* above run both steps on the host.
//
// The layout is shared with the device's KfTally: fixed-size fields, no
// padding, in this order.
struct Tally {
  double num = 0;       // sum of squared errors over finite outputs
  double den = 0;       // sum of squared reference values there
  double max_abs = 0;   // largest error
  double ref_max = 0;   // largest |reference| over all elements (LSE: finite ones)
  double worst = -1;    // the error at worst_at (-1: no finite output)
  int64_t unwritten = 0;   // still holding the poison bits
  int64_t nonfinite = 0;   // other NaN/inf, or not -inf where -inf was due
  int64_t first_bad = -1;  // lowest index of an unwritten or non-finite output
  int64_t worst_at = 0;    // lowest index of the largest error
  uint32_t first_bad_bits = 0, worst_bits = 0;  // the output's bits there
  float first_bad_ref = 0, worst_ref = 0;       // the reference there
};
static_assert(sizeof(Tally) == 88, "Tally must match KfTally in eval_kernels.cu");

Tally TallyBf16(std::span<const uint16_t> got, std::span<const float> reference);
Tally TallyLse(std::span<const float> got, std::span<const float> reference);
// Folds `b` (a tally of other elements) into `a`, as eval_kernels.cu does.
void MergeTally(Tally& a, const Tally& b);
OutputCheck JudgeBf16(std::string_view name, const Tally& t, size_t elements,
                      const Layout& layout);
OutputCheck JudgeLse(const Tally& t, size_t elements, const Layout& layout);

// A variant that says it gives dq_accum back zeroed (manifest
// restores_dq_accum), judged on how many of its `words` 32-bit words are not
// zero after a launch (DeviceTools::CountNonZero32): "" when none, else why
// that is wrong.
std::string JudgeDqAccumRestored(uint64_t nonzero, size_t words);

// Index of the first element whose bits differ, or -1.
template <typename T>
long long FirstBitDifference(std::span<const T> a, std::span<const T> b);

}  // namespace kforge::eval
