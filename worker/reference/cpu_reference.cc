#include "worker/reference/cpu_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "fmt/format.h"

namespace kforge::reference {
namespace {

int VisibleKeys(int i, int lq, int lk, bool causal) {
  if (!causal) return lk;
  return std::clamp(i + (lk - lq) + 1, 0, lk);
}

double Dot(std::span<const uint16_t> a, size_t ao, std::span<const uint16_t> b, size_t bo, int d) {
  double s = 0;
  for (int x = 0; x < d; ++x) s += double(Bf16ToFloat(a[ao + x])) * Bf16ToFloat(b[bo + x]);
  return s;
}

}  // namespace

int JaggedShape::max_q() const {
  int m = 0;
  for (size_t b = 0; b + 1 < cu_q.size(); ++b) m = std::max(m, cu_q[b + 1] - cu_q[b]);
  return m;
}

int JaggedShape::max_k() const {
  int m = 0;
  for (size_t b = 0; b + 1 < cu_k.size(); ++b) m = std::max(m, cu_k[b + 1] - cu_k[b]);
  return m;
}

std::string JaggedShape::Describe() const {
  auto lengths = [](const std::vector<int>& cu) {
    std::string s;
    for (size_t b = 0; b + 1 < cu.size() && b < 16; ++b) {
      s += fmt::format("{}{}", b ? "," : "", cu[b + 1] - cu[b]);
    }
    if (cu.size() > 17) s += ",...";
    return s;
  };
  return fmt::format("B={} H={}/{} D={} {} lq=[{}] lk=[{}]", batch(), heads, kv_heads, head_dim,
                     causal ? "causal" : "full", lengths(cu_q), lengths(cu_k));
}

absl::Status ValidateJaggedShape(const JaggedShape& s) {
  if (s.heads <= 0 || s.kv_heads <= 0 || s.heads % s.kv_heads != 0) {
    return absl::InvalidArgumentError(
        fmt::format("heads {} must be a positive multiple of kv_heads {}", s.heads, s.kv_heads));
  }
  if (s.head_dim < 8 || s.head_dim > 256 || s.head_dim % 8 != 0) {
    return absl::InvalidArgumentError(
        fmt::format("head_dim {} is not a multiple of 8 in 8..256", s.head_dim));
  }
  if (s.cu_q.size() < 2 || s.cu_q.size() != s.cu_k.size()) {
    return absl::InvalidArgumentError("cu_q and cu_k need batch + 1 >= 2 entries each");
  }
  for (const auto* cu : {&s.cu_q, &s.cu_k}) {
    if ((*cu)[0] != 0) return absl::InvalidArgumentError("offsets must start at 0");
    for (size_t b = 0; b + 1 < cu->size(); ++b) {
      if ((*cu)[b + 1] < (*cu)[b]) {
        return absl::InvalidArgumentError(fmt::format("offsets decrease at {}", b));
      }
    }
  }
  return absl::OkStatus();
}

CpuForwardResult CpuForward(const JaggedShape& s, std::span<const uint16_t> q,
                            std::span<const uint16_t> k, std::span<const uint16_t> v) {
  const int H = s.heads, G = s.kv_heads, D = s.head_dim, group = H / G;
  const double scale = s.scale();
  CpuForwardResult r;
  r.o.assign(s.q_elems(), 0.0);
  r.lse.assign(s.lse_elems(), -std::numeric_limits<double>::infinity());
  std::vector<double> scores;
  for (int b = 0; b < s.batch(); ++b) {
    const int q0 = s.cu_q[b], lq = s.cu_q[b + 1] - q0;
    const int k0 = s.cu_k[b], lk = s.cu_k[b + 1] - k0;
    for (int i = 0; i < lq; ++i) {
      const int nk = VisibleKeys(i, lq, lk, s.causal);
      for (int h = 0; h < H; ++h) {
        if (nk == 0) continue;
        const int g = h / group;
        const size_t qo = (size_t(q0 + i) * H + h) * D;
        scores.resize(nk);
        double m = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < nk; ++j) {
          scores[j] = Dot(q, qo, k, (size_t(k0 + j) * G + g) * D, D) * scale;
          m = std::max(m, scores[j]);
        }
        double l = 0;
        for (int j = 0; j < nk; ++j) l += std::exp(scores[j] - m);
        for (int j = 0; j < nk; ++j) {
          const double w = std::exp(scores[j] - m) / l;
          const size_t vo = (size_t(k0 + j) * G + g) * D;
          for (int d = 0; d < D; ++d) r.o[qo + d] += w * Bf16ToFloat(v[vo + d]);
        }
        r.lse[size_t(h) * s.total_q() + q0 + i] = m + std::log(l);
      }
    }
  }
  return r;
}

CpuBackwardResult CpuBackward(const JaggedShape& s, std::span<const uint16_t> q,
                              std::span<const uint16_t> k, std::span<const uint16_t> v,
                              std::span<const uint16_t> o, std::span<const float> lse,
                              std::span<const uint16_t> dout) {
  const int H = s.heads, G = s.kv_heads, D = s.head_dim, group = H / G;
  const double scale = s.scale();
  CpuBackwardResult r;
  r.dq.assign(s.q_elems(), 0.0);
  r.dk.assign(s.k_elems(), 0.0);
  r.dv.assign(s.k_elems(), 0.0);
  for (int b = 0; b < s.batch(); ++b) {
    const int q0 = s.cu_q[b], lq = s.cu_q[b + 1] - q0;
    const int k0 = s.cu_k[b], lk = s.cu_k[b + 1] - k0;
    for (int i = 0; i < lq; ++i) {
      const int nk = VisibleKeys(i, lq, lk, s.causal);
      for (int h = 0; h < H; ++h) {
        const int g = h / group;
        const size_t qo = (size_t(q0 + i) * H + h) * D;
        const double delta = Dot(dout, qo, o, qo, D);
        const double row_lse = lse[size_t(h) * s.total_q() + q0 + i];
        for (int j = 0; j < nk; ++j) {
          const size_t ko = (size_t(k0 + j) * G + g) * D;
          const double p = std::exp(Dot(q, qo, k, ko, D) * scale - row_lse);
          const double dp = Dot(dout, qo, v, ko, D);
          const double ds = p * (dp - delta);
          for (int d = 0; d < D; ++d) {
            r.dq[qo + d] += ds * scale * Bf16ToFloat(k[ko + d]);
            r.dk[ko + d] += ds * scale * Bf16ToFloat(q[qo + d]);
            r.dv[ko + d] += p * Bf16ToFloat(dout[qo + d]);
          }
        }
      }
    }
  }
  return r;
}

}  // namespace kforge::reference
