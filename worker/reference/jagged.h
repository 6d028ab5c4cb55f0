// Host-side description of a jagged attention problem, and bf16 helpers.
//
// Layouts are the kforge contract's (kernels/include/kforge/attn_params.h):
//   q, o, dout: (total_q, heads, head_dim); k, v: (total_k, kv_heads, head_dim);
//   lse, delta: (heads, total_q). Tensors hold bf16 as raw uint16_t bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace kforge::reference {

struct JaggedShape {
  int heads = 1;
  int kv_heads = 1;  // divides heads; query head h reads kv head h / (heads / kv_heads)
  int head_dim = 64;
  bool causal = false;  // bottom-right aligned
  float softmax_scale = 0;  // 0 means 1/sqrt(head_dim)
  std::vector<int> cu_q;  // batch + 1 prefix offsets, starting at 0
  std::vector<int> cu_k;  // self-attention: equal to cu_q

  int batch() const { return cu_q.empty() ? 0 : static_cast<int>(cu_q.size()) - 1; }
  int total_q() const { return cu_q.empty() ? 0 : cu_q.back(); }
  int total_k() const { return cu_k.empty() ? 0 : cu_k.back(); }
  int max_q() const;
  int max_k() const;
  float scale() const {
    return softmax_scale != 0 ? softmax_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  }
  size_t q_elems() const { return size_t(total_q()) * heads * head_dim; }
  size_t k_elems() const { return size_t(total_k()) * kv_heads * head_dim; }
  size_t lse_elems() const { return size_t(total_q()) * heads; }

  // "B=5 H=4/2 D=128 causal lq=[0,1,63,...] lk=[...]" (lengths cut after 16).
  std::string Describe() const;
};

// Checks the offsets, head layout (heads % kv_heads == 0, head_dim a multiple
// of 8 in 8..256).
absl::Status ValidateJaggedShape(const JaggedShape& shape);

inline float Bf16ToFloat(uint16_t bits) {
  uint32_t u = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace kforge::reference
