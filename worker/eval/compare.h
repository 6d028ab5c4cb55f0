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
inline constexpr std::string_view kTolerancePolicyVersion = "tol-1";

// bf16 outputs (O, dQ, dK, dV) against the fp32 reference.
inline constexpr double kBf16MaxRelL2 = 1e-2;
inline constexpr double kBf16MaxAbsFraction = 2e-2;  // of max(1, max |reference|)
// LSE (fp32) against the fp32 reference, absolute (natural log units).
inline constexpr double kLseMaxAbs = 1e-3;

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

  // "seq 3 row 17 head 2 dim 5" (row within its sequence).
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

// Index of the first element whose bits differ, or -1.
template <typename T>
long long FirstBitDifference(std::span<const T> a, std::span<const T> b);

}  // namespace kforge::eval
