// A correct (slow) jagged attention backward in one launch, for evaluator
// tests: grid policy "persistent" used as a plain grid-stride loop (the tile
// list is ignored). Warps first take query rows (dQ), then key rows (dK, dV);
// delta = rowsum(dO * O) is recomputed where needed. fp32 sums, bf16 outputs.
#include "kforge/attn_params.h"

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

__device__ float dot_rows(const void* a, long long ao, const void* b, long long bo, int D, int lane) {
  float s = 0.f;
  for (int t = 0; t < PER_LANE; ++t) {
    int d = lane + 32 * t;
    if (d < D) s += ld_bf16(a, ao + d) * ld_bf16(b, bo + d);
  }
  return warp_sum(s);
}

__device__ int find_seq(const int* cu, int batch, int row) {
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (cu[mid] <= row) lo = mid; else hi = mid - 1;
  }
  return lo;
}

extern "C" __global__ void kf_attn_bwd(const __grid_constant__ KfAttnParams p) {
  const int lane = threadIdx.x % 32;
  const long long warps = (long long)gridDim.x * (blockDim.x / 32);
  const int D = p.head_dim, group = p.heads / p.kv_heads;
  const long long q_items = (long long)p.total_q * p.heads;
  const long long k_items = (long long)p.total_k * p.kv_heads;
  for (long long w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; w < q_items + k_items;
       w += warps) {
    if (w < q_items) {
      const int row = (int)(w / p.heads), h = (int)(w % p.heads), g = h / group;
      const int b = find_seq(p.cu_seqlens_q, p.batch, row);
      const int i = row - p.cu_seqlens_q[b], lq = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
      const int k0 = p.cu_seqlens_k[b], lk = p.cu_seqlens_k[b + 1] - k0;
      int nk = lk;
      if (p.causal) {
        nk = i + (lk - lq) + 1;
        nk = nk < 0 ? 0 : (nk > lk ? lk : nk);
      }
      const long long qo = ((long long)row * p.heads + h) * D;
      const float lse = p.lse[(long long)h * p.total_q + row];
      const float delta = dot_rows(p.dout, qo, p.o, qo, D, lane);
      float acc[PER_LANE] = {};
      for (int j = 0; j < nk; ++j) {
        const long long ko = ((long long)(k0 + j) * p.kv_heads + g) * D;
        float prob = expf(dot_rows(p.q, qo, p.k, ko, D, lane) * p.softmax_scale - lse);
        float ds = prob * (dot_rows(p.dout, qo, p.v, ko, D, lane) - delta);
        for (int t = 0; t < PER_LANE; ++t) {
          int d = lane + 32 * t;
          if (d < D) acc[t] += ds * ld_bf16(p.k, ko + d);
        }
      }
      for (int t = 0; t < PER_LANE; ++t) {
        int d = lane + 32 * t;
        if (d < D) ((unsigned short*)p.dq)[qo + d] = to_bf16(acc[t] * p.softmax_scale);
      }
    } else {
      const long long kw = w - q_items;
      const int key = (int)(kw / p.kv_heads), g = (int)(kw % p.kv_heads);
      const int b = find_seq(p.cu_seqlens_k, p.batch, key);
      const int j = key - p.cu_seqlens_k[b], lk = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
      const int q0 = p.cu_seqlens_q[b], lq = p.cu_seqlens_q[b + 1] - q0;
      int first = p.causal ? j - (lk - lq) : 0;
      if (first < 0) first = 0;
      const long long ko = ((long long)key * p.kv_heads + g) * D;
      float dk[PER_LANE] = {}, dv[PER_LANE] = {};
      for (int h = g * group; h < (g + 1) * group; ++h) {
        for (int i = first; i < lq; ++i) {
          const long long qo = ((long long)(q0 + i) * p.heads + h) * D;
          const float lse = p.lse[(long long)h * p.total_q + q0 + i];
          const float delta = dot_rows(p.dout, qo, p.o, qo, D, lane);
          float prob = expf(dot_rows(p.q, qo, p.k, ko, D, lane) * p.softmax_scale - lse);
          float ds = prob * (dot_rows(p.dout, qo, p.v, ko, D, lane) - delta);
          for (int t = 0; t < PER_LANE; ++t) {
            int d = lane + 32 * t;
            if (d < D) {
              dv[t] += prob * ld_bf16(p.dout, qo + d);
              dk[t] += ds * ld_bf16(p.q, qo + d);
            }
          }
        }
      }
      for (int t = 0; t < PER_LANE; ++t) {
        int d = lane + 32 * t;
        if (d < D) {
          ((unsigned short*)p.dk)[ko + d] = to_bf16(dk[t] * p.softmax_scale);
          ((unsigned short*)p.dv)[ko + d] = to_bf16(dv[t]);
        }
      }
    }
  }
}
