// Bad: assumes its tensors start on a 32-byte boundary (cuMemAlloc's are on
// 256, and a kernel wanting 32-byte vector accesses might round q's address
// down to one), where the contract promises 16. Right wherever q is 32-byte
// aligned, so an evaluator that gives it cuMemAlloc's own alignment verifies
// it; a caller's view 16 bytes off gets every row's elements from 8 elements
// earlier. The tensors of the evaluator's check problems start 16 bytes
// past a 256-byte boundary, and catch it. Otherwise good.cu.
#include "kforge/attn_params.h"

#define ROWS 4
#define PER_LANE 8

__device__ __forceinline__ float ld_bf16(const void* base, long long i) {
  return __uint_as_float(((unsigned)((const unsigned short*)base)[i]) << 16);
}

__device__ __forceinline__ unsigned short to_bf16(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc1;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

extern "C" __global__ void kf_attn_fwd(const __grid_constant__ KfAttnParams p) {
  const int b = blockIdx.z, h = blockIdx.y, lane = threadIdx.x % 32;
  const int q0 = p.cu_seqlens_q[b], lq = p.cu_seqlens_q[b + 1] - q0;
  const int k0 = p.cu_seqlens_k[b], lk = p.cu_seqlens_k[b + 1] - k0;
  const int i = blockIdx.x * ROWS + threadIdx.x / 32;
  if (i >= lq) return;
  const int D = p.head_dim, g = h / (p.heads / p.kv_heads);
  int nk = lk;
  if (p.causal) {
    nk = i + (lk - lq) + 1;
    nk = nk < 0 ? 0 : (nk > lk ? lk : nk);
  }
  const long long qo = ((long long)(q0 + i) * p.heads + h) * D;
  const void* q32 = (const void*)((unsigned long long)p.q & ~31ull);
  float q[PER_LANE], acc[PER_LANE];
  for (int t = 0; t < PER_LANE; ++t) {
    int d = lane + 32 * t;
    q[t] = d < D ? ld_bf16(q32, qo + d) : 0.f;
    acc[t] = 0.f;
  }
  float m = -__int_as_float(0x7f800000), l = 0.f;
  for (int j = 0; j < nk; ++j) {
    const long long ko = ((long long)(k0 + j) * p.kv_heads + g) * D;
    float s = 0.f;
    for (int t = 0; t < PER_LANE; ++t) {
      int d = lane + 32 * t;
      if (d < D) s += q[t] * ld_bf16(p.k, ko + d);
    }
    s = warp_sum(s) * p.softmax_scale;
    float m_new = fmaxf(m, s);
    float corr = expf(m - m_new), w = expf(s - m_new);
    l = l * corr + w;
    for (int t = 0; t < PER_LANE; ++t) {
      int d = lane + 32 * t;
      if (d < D) acc[t] = acc[t] * corr + w * ld_bf16(p.v, ko + d);
    }
    m = m_new;
  }
  unsigned short* o = (unsigned short*)p.o;
  for (int t = 0; t < PER_LANE; ++t) {
    int d = lane + 32 * t;
    if (d < D) o[qo + d] = to_bf16(nk > 0 ? acc[t] / l : 0.f);
  }
  if (lane == 0) p.lse[(long long)h * p.total_q + q0 + i] = nk > 0 ? m + logf(l) : m;
}
