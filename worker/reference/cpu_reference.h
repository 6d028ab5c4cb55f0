// Float64 CPU reference of jagged attention: the same math as the GPU
// reference (reference_attn.cu), used to check that reference itself.
// Slow (O(total_q * max_k * head_dim)); meant for test-sized problems.
// Thread-compatible: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "worker/reference/jagged.h"

namespace kforge::reference {

struct CpuForwardResult {
  std::vector<double> o;    // (total_q, heads, head_dim)
  std::vector<double> lse;  // (heads, total_q); -inf for rows that see no key
};

CpuForwardResult CpuForward(const JaggedShape& shape, std::span<const uint16_t> q,
                            std::span<const uint16_t> k, std::span<const uint16_t> v);

struct CpuBackwardResult {
  std::vector<double> dq;  // (total_q, heads, head_dim)
  std::vector<double> dk;  // (total_k, kv_heads, head_dim)
  std::vector<double> dv;
};

// `o` and `lse` are the forward outputs the backward kernel is given (bf16 O,
// fp32 LSE), so the CPU and GPU references see identical inputs.
CpuBackwardResult CpuBackward(const JaggedShape& shape, std::span<const uint16_t> q,
                              std::span<const uint16_t> k, std::span<const uint16_t> v,
                              std::span<const uint16_t> o, std::span<const float> lse,
                              std::span<const uint16_t> dout);

}  // namespace kforge::reference
