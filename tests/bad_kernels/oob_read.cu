// Bad, quietly: right answers, but every launch reads one bf16 just past the
// end of K. The read lands inside the allocation's page, so nothing faults and
// every check passes; only compute-sanitizer's memcheck sees it. The worker's
// sanitizer gate (kforge-worker --sanitizer-gate) exists for kernels like this
// one: its expected outcome is "verified" without the gate and "crashed" with
// it ("gate" in expected.json).
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
  if (blockIdx.x == 0 && b == 0 && h == 0 && threadIdx.x == 0) {
    // The value is never used (batch is never negative), but the compiler
    // cannot know that, so the read stays.
    const long long end = (long long)p.total_k * p.kv_heads * p.head_dim;
    if (((const unsigned short*)p.k)[end] == 0x7fbf && p.batch < 0) ((unsigned short*)p.o)[0] = 0;
  }
  if (i >= lq) return;
  const int D = p.head_dim, g = h / (p.heads / p.kv_heads);
  int nk = lk;
  if (p.causal) {
    nk = i + (lk - lq) + 1;
    nk = nk < 0 ? 0 : (nk > lk ? lk : nk);
  }
  const long long qo = ((long long)(q0 + i) * p.heads + h) * D;
  float q[PER_LANE], acc[PER_LANE];
  for (int t = 0; t < PER_LANE; ++t) {
    int d = lane + 32 * t;
    q[t] = d < D ? ld_bf16(p.q, qo + d) : 0.f;
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
