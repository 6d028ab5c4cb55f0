#include "worker/eval/compare.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "fmt/format.h"
#include "worker/reference/jagged.h"

namespace kforge::eval {

std::string Layout::Describe(size_t index) const {
  size_t row, head, dim = 0;
  if (head_major) {
    const size_t rows = cu.empty() ? 0 : size_t(cu.back());
    head = rows ? index / rows : 0;
    row = rows ? index % rows : index;
  } else {
    dim = index % head_dim;
    head = (index / head_dim) % heads;
    row = index / (size_t(head_dim) * heads);
  }
  // The sequence holding `row`: the last b with cu[b] <= row.
  size_t b = 0;
  if (cu.size() >= 2) {
    auto it = std::upper_bound(cu.begin(), cu.end() - 1, int(row));
    b = size_t(std::distance(cu.begin(), it)) - 1;
  }
  const size_t in_seq = cu.empty() ? row : row - size_t(cu[b]);
  const int len = cu.size() >= 2 ? cu[b + 1] - cu[b] : 0;
  // Where in a sequence, not which sequence of which batch: feedback names
  // what went wrong, never the check schedule (verification.md).
  if (head_major) return fmt::format("row {} of a sequence of {}, head {}", in_seq, len, head);
  return fmt::format("row {} of a sequence of {}, head {}, dim {}", in_seq, len, head, dim);
}

namespace {

void Bad(Tally& t, size_t i, uint32_t bits, float r) {
  if (t.first_bad < 0) {
    t.first_bad = int64_t(i);
    t.first_bad_bits = bits;
    t.first_bad_ref = r;
  }
}

void Value(Tally& t, size_t i, uint32_t bits, double g, float r) {
  const double d = std::fabs(g - double(r));
  t.num += d * d;
  t.den += double(r) * double(r);
  if (d > t.max_abs) t.max_abs = d;
  if (d > t.worst) {
    t.worst = d;
    t.worst_at = int64_t(i);
    t.worst_bits = bits;
    t.worst_ref = r;
  }
}

float F32FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// The check's common part: rel_l2, and the failure for unwritten or
// non-finite outputs. `why` describes the first bad element.
OutputCheck Judge(std::string name, const Tally& t, size_t elements, double bound,
                  const Layout& layout, const std::string& why) {
  OutputCheck c;
  c.output = std::move(name);
  c.elements = elements;
  c.unwritten = size_t(t.unwritten);
  c.nonfinite = size_t(t.nonfinite);
  c.max_abs = t.max_abs;
  c.rel_l2 = t.den > 0 ? std::sqrt(t.num / t.den) : std::sqrt(t.num);
  c.bound_max_abs = bound;
  if (c.unwritten + c.nonfinite > 0) {
    c.pass = false;
    c.detail = fmt::format("{} at {}: {}; {} of {} elements unwritten (NaN poison), {} other "
                           "non-finite",
                           c.output, layout.Describe(size_t(std::max<int64_t>(t.first_bad, 0))),
                           why, c.unwritten, c.elements, c.nonfinite);
  }
  return c;
}

}  // namespace

void MergeTally(Tally& a, const Tally& b) {
  a.num += b.num;
  a.den += b.den;
  a.max_abs = std::fmax(a.max_abs, b.max_abs);
  a.ref_max = std::fmax(a.ref_max, b.ref_max);
  a.unwritten += b.unwritten;
  a.nonfinite += b.nonfinite;
  if (b.first_bad >= 0 && (a.first_bad < 0 || b.first_bad < a.first_bad)) {
    a.first_bad = b.first_bad;
    a.first_bad_bits = b.first_bad_bits;
    a.first_bad_ref = b.first_bad_ref;
  }
  if (b.worst > a.worst || (b.worst == a.worst && b.worst_at < a.worst_at)) {
    a.worst = b.worst;
    a.worst_at = b.worst_at;
    a.worst_bits = b.worst_bits;
    a.worst_ref = b.worst_ref;
  }
}

Tally TallyBf16(std::span<const uint16_t> got, std::span<const float> ref) {
  Tally t;
  for (size_t i = 0; i < ref.size(); ++i) {
    const float r = ref[i];
    t.ref_max = std::fmax(t.ref_max, std::fabs(double(r)));
    const uint32_t bits = got[i];
    if (bits == kPoisonBf16) {
      ++t.unwritten;
      Bad(t, i, bits, r);
      continue;
    }
    const double g = reference::Bf16ToFloat(uint16_t(bits));
    if (!std::isfinite(g)) {
      ++t.nonfinite;
      Bad(t, i, bits, r);
      continue;
    }
    Value(t, i, bits, g, r);
  }
  return t;
}

Tally TallyLse(std::span<const float> got, std::span<const float> ref) {
  Tally t;
  for (size_t i = 0; i < ref.size(); ++i) {
    const float r = ref[i];
    // The largest finite |LSE|: rows that see no key are -inf.
    if (std::isfinite(r)) t.ref_max = std::fmax(t.ref_max, std::fabs(double(r)));
    uint32_t bits;
    std::memcpy(&bits, &got[i], sizeof(bits));
    const double g = got[i];
    if (bits == kPoisonF32) {
      ++t.unwritten;
      Bad(t, i, bits, r);
    } else if (std::isinf(r) && r < 0) {
      if (!(std::isinf(g) && g < 0)) {  // a row that sees no key: exactly -inf
        ++t.nonfinite;
        Bad(t, i, bits, r);
      }
    } else if (!std::isfinite(g)) {
      ++t.nonfinite;
      Bad(t, i, bits, r);
    } else {
      Value(t, i, bits, g, r);
    }
  }
  return t;
}

OutputCheck JudgeBf16(std::string_view name, const Tally& t, size_t elements,
                      const Layout& layout) {
  const double bound = kBf16MaxAbsFraction * std::max(1.0, t.ref_max);
  std::string why;
  if (t.first_bad >= 0) {
    why = t.first_bad_bits == kPoisonBf16
              ? "NaN (unwritten)"
              : fmt::format("{} (reference {:.6g})",
                            reference::Bf16ToFloat(uint16_t(t.first_bad_bits)), t.first_bad_ref);
  }
  OutputCheck c = Judge(std::string(name), t, elements, bound, layout, why);
  if (c.pass && (c.rel_l2 > kBf16MaxRelL2 || c.max_abs > bound)) {
    c.pass = false;
    c.detail = fmt::format(
        "{}: rel_l2 {:.3g} (limit {:.3g}), max_abs {:.3g} (limit {:.3g}); worst at {}: got "
        "{:.6g}, reference {:.6g}",
        c.output, c.rel_l2, kBf16MaxRelL2, c.max_abs, bound, layout.Describe(size_t(t.worst_at)),
        reference::Bf16ToFloat(uint16_t(t.worst_bits)), t.worst_ref);
  }
  return c;
}

std::string JudgeDqAccumRestored(uint64_t nonzero, size_t words) {
  if (nonzero == 0) return "";
  return fmt::format(
      "restores_dq_accum: {} of dq_accum's {} words are not zero after the launch (the next "
      "launch would add into them)",
      nonzero, words);
}

OutputCheck JudgeLse(const Tally& t, size_t elements, const Layout& layout) {
  std::string why;
  if (t.first_bad >= 0) {
    const float g = F32FromBits(t.first_bad_bits);
    if (t.first_bad_bits == kPoisonF32) {
      why = "NaN (unwritten)";
    } else if (std::isinf(t.first_bad_ref) && t.first_bad_ref < 0) {
      why = fmt::format("{} where -inf is due (row sees no key)", g);
    } else {
      why = fmt::format("{} (reference {:.6g})", g, t.first_bad_ref);
    }
  }
  const double bound = kLseMaxAbs + kLseMaxRel * t.ref_max;
  OutputCheck c = Judge("LSE", t, elements, bound, layout, why);
  if (c.pass && c.max_abs > bound) {
    c.pass = false;
    c.detail = fmt::format("LSE: max_abs {:.3g} (limit {:.3g}); worst at {}: got {:.7g}, "
                           "reference {:.7g}",
                           c.max_abs, bound, layout.Describe(size_t(t.worst_at)),
                           F32FromBits(t.worst_bits), t.worst_ref);
  }
  return c;
}

OutputCheck CheckBf16(std::string_view name, std::span<const uint16_t> got,
                      std::span<const float> ref, const Layout& layout) {
  return JudgeBf16(name, TallyBf16(got, ref), ref.size(), layout);
}

OutputCheck CheckLse(std::span<const float> got, std::span<const float> ref,
                     const Layout& layout) {
  return JudgeLse(TallyLse(got, ref), ref.size(), layout);
}

template <typename T>
long long FirstBitDifference(std::span<const T> a, std::span<const T> b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<long long>(i);
  }
  return -1;
}

template long long FirstBitDifference<uint16_t>(std::span<const uint16_t>,
                                                std::span<const uint16_t>);
template long long FirstBitDifference<float>(std::span<const float>, std::span<const float>);

}  // namespace kforge::eval
