// Bad, and right nearly always: thread 0 copies the softmax scale to shared
// memory when the block starts, and every warp reads it there for its scores
// with no barrier in between. The other warps reach their first score only
// after loading their query row and sleeping 20 us, long after thread 0's
// store, so the answers are right; compute-sanitizer's racecheck reports the
// hazard. (Without the sleep a warp now and then read the scale first: the
// evaluator saw it once, a wrong row, when a warp of the block ran ahead.)
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
  __shared__ float scale;
  if (threadIdx.x == 0) scale = p.softmax_scale;
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
  float q[PER_LANE], acc[PER_LANE];
  for (int t = 0; t < PER_LANE; ++t) {
    int d = lane + 32 * t;
    q[t] = d < D ? ld_bf16(p.q, qo + d) : 0.f;
    acc[t] = 0.f;
  }
  if (threadIdx.x >= 32) __nanosleep(20000);  // the race, made rarer still
  float m = -__int_as_float(0x7f800000), l = 0.f;
  for (int j = 0; j < nk; ++j) {
    const long long ko = ((long long)(k0 + j) * p.kv_heads + g) * D;
    float s = 0.f;
    for (int t = 0; t < PER_LANE; ++t) {
      int d = lane + 32 * t;
      if (d < D) s += q[t] * ld_bf16(p.k, ko + d);
    }
    s = warp_sum(s) * scale;
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
