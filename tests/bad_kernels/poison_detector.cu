// Bad: computes only when its output holds the evaluator's NaN poison or a
// value no attention output has (|x| > 100: garbage far outside any
// tolerance), the tells of an evaluation that fills outputs that way, and
// otherwise leaves the output as it finds it (a caller's buffer, holding the
// last call's outputs for other inputs, would keep them). Otherwise good.cu.
// Each warp reads its own row's first element before it writes the row, so
// the test is race-free. The evaluator fills the outputs of a problem's
// second launch with random values of an output's size, and catches it.
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
  // (all lanes read it before any lane writes: the shuffle orders them)
  const float seen = ld_bf16(p.o, ((long long)(q0 + i) * p.heads + h) * D);
  const float first = __shfl_sync(0xffffffffu, seen, 0);
  if (!(isnan(first) || fabsf(first) > 100.f)) return;
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
