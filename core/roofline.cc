#include "core/roofline.h"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "core/arch.h"

namespace kforge {
namespace {

struct ArchRow {
  std::string_view arch;  // without the "a" suffix
  ArchPeak peak;
};

// Datasheet peaks of the fastest GPU of each arch: dense bf16 tensor math
// (half the sparse figure NVIDIA quotes first) and HBM/GDDR bandwidth. Where
// two GPUs of one arch lead on different columns, each column takes the
// larger figure: the floor must hold for both.
constexpr std::array<ArchRow, 7> kPeaks = {{
    {"sm_80", {"A100 SXM 80GB", 312e12, 2.039e12}},
    {"sm_86", {"RTX 3090 Ti / RTX A6000", 160e12, 1.008e12}},
    {"sm_89", {"L40S / RTX 6000 Ada / RTX 4090", 366e12, 1.008e12}},
    {"sm_90", {"H100/H200", 989e12, 4.8e12}},
    {"sm_100", {"B200/GB200", 2.5e15, 8.0e12}},
    {"sm_103", {"B300/GB300", 2.5e15, 8.0e12}},
    {"sm_120", {"RTX PRO 6000 Blackwell / RTX 5090", 504e12, 1.792e12}},
}};

constexpr double kBf16 = 2, kFp32 = 4, kOffset = 4;

// Scores the mask allows for one sequence: Lq * Lk, or under the
// bottom-right aligned causal mask (query r sees keys up to r + Lk - Lq).
double Pairs(double lq, double lk, bool causal) {
  if (!causal) return lq * lk;
  if (lq <= lk) return lq * (2 * lk - lq + 1) / 2;
  return lk * (lk + 1) / 2;
}

}  // namespace

ArchPeak PeakOf(std::string_view arch) {
  if (absl::StatusOr<Arch> parsed = ParseArch(arch); parsed.ok()) {
    parsed->arch_specific = false;  // "sm_90a" and "sm_90" share their peaks
    const std::string base = ArchName(*parsed);
    for (const ArchRow& row : kPeaks)
      if (row.arch == base) return row.peak;
  }
  ArchPeak unknown{"an arch newer than this table (twice its largest peaks)", 0, 0};
  for (const ArchRow& row : kPeaks) {
    unknown.bf16_flops_per_s = std::max(unknown.bf16_flops_per_s, 2 * row.peak.bf16_flops_per_s);
    unknown.hbm_bytes_per_s = std::max(unknown.hbm_bytes_per_s, 2 * row.peak.hbm_bytes_per_s);
  }
  return unknown;
}

AttentionWork MinimalWork(const ShapeKey& key, std::span<const int32_t> cu_q,
                          std::span<const int32_t> cu_k) {
  const bool exact_q = cu_q.size() >= 2;
  const bool exact_k = !key.cross || cu_k.size() == cu_q.size();
  const double batch = exact_q ? static_cast<double>(cu_q.size() - 1) : static_cast<double>(key.batch);
  const double tq = exact_q ? static_cast<double>(cu_q.back()) : static_cast<double>(key.total_q);
  double tk = tq;
  if (key.cross) tk = exact_q && exact_k ? static_cast<double>(cu_k.back()) : static_cast<double>(key.total_k);
  const double d = key.head_dim;
  const double h = key.heads;
  const double kvh = key.kv_heads > 0 ? key.kv_heads : key.heads;

  double pairs = 0;
  if (exact_q && exact_k) {
    for (size_t i = 0; i + 1 < cu_q.size(); ++i) {
      const double lq = static_cast<double>(cu_q[i + 1]) - cu_q[i];
      const double lk = key.cross ? static_cast<double>(cu_k[i + 1]) - cu_k[i] : lq;
      pairs += Pairs(lq, lk, key.causal);
    }
  } else if (!key.cross && batch > 0) {
    // Cauchy-Schwarz: sum L^2 >= (sum L)^2 / B.
    const double squares = tq * tq / batch;
    pairs = key.causal ? (squares + tq) / 2 : squares;
  }
  // Cross attention from statistics alone: the lengths may pair every long
  // query sequence with an empty key sequence, so no score is certain.

  AttentionWork w;
  w.flops = 4 * d * h * pairs;
  const double q_like = tq * h * d * kBf16;   // Q, O, dO, dQ
  const double kv_like = tk * kvh * d * kBf16;  // each of K, V, dK, dV
  const double lse = tq * h * kFp32;
  const double offsets = (batch + 1) * kOffset * (key.cross ? 2 : 1);
  if (key.op == Op::kBackward) {
    w.flops *= 2.5;
    // In: Q, O, dO, K, V, LSE, offsets. Out: dQ, dK, dV.
    w.min_bytes = 3 * q_like + 2 * kv_like + lse + offsets + q_like + 2 * kv_like;
  } else {
    // In: Q, K, V, offsets. Out: O, LSE.
    w.min_bytes = q_like + 2 * kv_like + offsets + q_like + lse;
  }
  return w;
}

TimingFloor FloorOf(const ShapeKey& key, std::string_view arch, std::span<const int32_t> cu_q,
                    std::span<const int32_t> cu_k) {
  TimingFloor f;
  f.arch = std::string(arch);
  f.peak = PeakOf(arch);
  f.work = MinimalWork(key, cu_q, cu_k);
  const double seconds = std::max(f.work.flops / f.peak.bf16_flops_per_s,
                                  f.work.min_bytes / f.peak.hbm_bytes_per_s);
  f.us = seconds * 1e6;
  return f;
}

std::string TimingFloor::Describe() const {
  return fmt::format("{:.2f} us ({:.3g} flop at {:.0f} TFLOP/s, {:.3g} bytes at {:.2f} TB/s: {} on {})",
                     us, work.flops, peak.bf16_flops_per_s / 1e12, work.min_bytes,
                     peak.hbm_bytes_per_s / 1e12, arch, peak.gpu);
}

}  // namespace kforge
