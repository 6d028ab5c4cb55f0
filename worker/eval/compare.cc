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
  if (head_major) return fmt::format("seq {} (len {}) row {} head {}", b, len, in_seq, head);
  return fmt::format("seq {} (len {}) row {} head {} dim {}", b, len, in_seq, head, dim);
}

namespace {

struct Accumulator {
  double num = 0, den = 0, max_abs = 0, ref_max = 0;
  long long first_bad = -1;
  std::string first_bad_why;
  void Bad(size_t i, std::string why) {
    if (first_bad < 0) {
      first_bad = static_cast<long long>(i);
      first_bad_why = std::move(why);
    }
  }
};

void Finish(OutputCheck& c, const Accumulator& a, double bound, const Layout& layout) {
  c.max_abs = a.max_abs;
  c.rel_l2 = a.den > 0 ? std::sqrt(a.num / a.den) : std::sqrt(a.num);
  c.bound_max_abs = bound;
  if (c.unwritten + c.nonfinite > 0) {
    c.pass = false;
    c.detail = fmt::format("{} at {}: {}; {} of {} elements unwritten (NaN poison), {} other "
                           "non-finite",
                           c.output, layout.Describe(size_t(a.first_bad)), a.first_bad_why,
                           c.unwritten, c.elements, c.nonfinite);
  }
}

}  // namespace

OutputCheck CheckBf16(std::string_view name, std::span<const uint16_t> got,
                      std::span<const float> ref, const Layout& layout) {
  OutputCheck c;
  c.output = std::string(name);
  c.elements = ref.size();
  Accumulator a;
  double worst = -1;
  size_t worst_at = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    a.ref_max = std::max(a.ref_max, double(std::fabs(ref[i])));
  }
  const double bound = kBf16MaxAbsFraction * std::max(1.0, a.ref_max);
  for (size_t i = 0; i < ref.size(); ++i) {
    const double r = ref[i];
    if (got[i] == kPoisonBf16) {
      ++c.unwritten;
      a.Bad(i, "NaN (unwritten)");
      continue;
    }
    const double g = reference::Bf16ToFloat(got[i]);
    if (!std::isfinite(g)) {
      ++c.nonfinite;
      a.Bad(i, fmt::format("{} (reference {:.6g})", g, r));
      continue;
    }
    const double d = std::fabs(g - r);
    a.num += d * d;
    a.den += r * r;
    if (d > a.max_abs) a.max_abs = d;
    if (d > worst) {
      worst = d;
      worst_at = i;
    }
  }
  Finish(c, a, bound, layout);
  if (c.pass && (c.rel_l2 > kBf16MaxRelL2 || c.max_abs > bound)) {
    c.pass = false;
    c.detail = fmt::format(
        "{}: rel_l2 {:.3g} (limit {:.3g}), max_abs {:.3g} (limit {:.3g}); worst at {}: got "
        "{:.6g}, reference {:.6g}",
        c.output, c.rel_l2, kBf16MaxRelL2, c.max_abs, bound, layout.Describe(worst_at),
        reference::Bf16ToFloat(got[worst_at]), ref[worst_at]);
  }
  return c;
}

OutputCheck CheckLse(std::span<const float> got, std::span<const float> ref,
                     const Layout& layout) {
  OutputCheck c;
  c.output = "LSE";
  c.elements = ref.size();
  Accumulator a;
  double worst = -1;
  size_t worst_at = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &got[i], sizeof(bits));
    const double r = ref[i], g = got[i];
    if (bits == kPoisonF32) {
      ++c.unwritten;
      a.Bad(i, "NaN (unwritten)");
      continue;
    }
    if (std::isinf(r) && r < 0) {
      // A row that sees no key: exactly -inf.
      if (!(std::isinf(g) && g < 0)) {
        ++c.nonfinite;
        a.Bad(i, fmt::format("{} where -inf is due (row sees no key)", g));
      }
      continue;
    }
    if (!std::isfinite(g)) {
      ++c.nonfinite;
      a.Bad(i, fmt::format("{} (reference {:.6g})", g, r));
      continue;
    }
    const double d = std::fabs(g - r);
    a.num += d * d;
    a.den += r * r;
    if (d > a.max_abs) a.max_abs = d;
    if (d > worst) {
      worst = d;
      worst_at = i;
    }
  }
  Finish(c, a, kLseMaxAbs, layout);
  if (c.pass && c.max_abs > kLseMaxAbs) {
    c.pass = false;
    c.detail = fmt::format("LSE: max_abs {:.3g} (limit {:.3g}); worst at {}: got {:.7g}, "
                           "reference {:.7g}",
                           c.max_abs, kLseMaxAbs, layout.Describe(worst_at), got[worst_at],
                           ref[worst_at]);
  }
  return c;
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
