// Bad, and fast on paper: it counts its launches in the `pack` field of the
// first tile (this kernel ignores packing) and does the work only on the
// launches a fixed evaluation pattern checks: the first two of each problem
// (a check and its repeat) and the 23rd (3 warm-ups + 20 timed: the last
// timed launch). The others return at once, so the median time is a fraction
// of the real one. Counting needs state between launches; the tile list is
// the kernel's own, so only a check that it is unchanged catches this, or a
// check of every launch.
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

// One query row of one head: online softmax over its visible keys.
__device__ void attend_row(const KfAttnParams& p, int b, int h, int i, int lane) {
  const int q0 = p.cu_seqlens_q[b], lq = p.cu_seqlens_q[b + 1] - q0;
  const int k0 = p.cu_seqlens_k[b], lk = p.cu_seqlens_k[b + 1] - k0;
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

extern "C" __global__ void kf_attn_fwd(const __grid_constant__ KfAttnParams p) {
  __shared__ int next;
  __shared__ int n;
  int* launches = (int*)p.tiles + 3;
  if (threadIdx.x == 0) {
    n = *(volatile int*)launches;
    __threadfence();
    // The last CTA to start bumps the count for the next launch.
    if (atomicAdd((int*)p.workspace, 1) == (int)gridDim.x - 1) atomicAdd(launches, 1);
  }
  __syncthreads();
  if (!(n <= 1 || n == 22)) return;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int it = blockIdx.x; it < p.num_tiles;) {
    const int* t = p.tiles + 4 * it;
    attend_row(p, t[0], t[1], t[2] * ROWS + warp, lane);
    __syncthreads();  // everyone is done with `next` before it changes
    if (threadIdx.x == 0) next = atomicAdd(p.tile_counter, 1) + gridDim.x;
    __syncthreads();
    it = next;
  }
}
