// kforge's GPU reference for jagged attention, compiled with NVRTC.
//
// Written to be obviously right, not fast: one warp per (query row, head) or
// (key row, kv head), every sum in fp32, the softmax in two plain passes
// (max, then sum and weighted sum), no shared memory, no tiling. Lane l owns
// the head dimensions l, l+32, ..., so head_dim may be any multiple of 8 up to
// 256. bf16 values are read as raw bits, so no toolkit header is needed.
//
// The parameters are the kforge contract's KfAttnParams with these reference
// conventions (the reference never writes memory a candidate can see):
//   forward : in q, k, v (bf16); out o (fp32!), lse (fp32).
//   backward: in q, k, v, o, dout (bf16), lse (fp32); scratch delta (fp32,
//             heads x total_q); out dq, dk, dv (fp32!).
// Launch: blockDim 128 (4 warps); forward, delta and dq use
// grid (ceil(total_q / 4), heads); dk/dv uses grid (ceil(total_k / 4), kv_heads).
#include "kforge/attn_params.h"

#define KF_WARPS_PER_BLOCK 4
#define KF_PER_LANE 8  // 256 / 32

__device__ __forceinline__ float kf_bf16(const void* base, long long index) {
  unsigned short bits = static_cast<const unsigned short*>(base)[index];
  return __uint_as_float(static_cast<unsigned int>(bits) << 16);
}

__device__ __forceinline__ float kf_warp_sum(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// The sequence holding packed row `row`: the largest b with cu[b] <= row.
// Empty sequences share their offset with the next one and are skipped.
__device__ int kf_find_sequence(const int* cu, int batch, int row) {
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (cu[mid] <= row) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Number of keys query i (of lq) sees among lk keys: all of them, or with the
// bottom-right aligned causal mask those j <= i + (lk - lq).
__device__ int kf_visible_keys(int i, int lq, int lk, int causal) {
  if (!causal) return lk;
  int n = i + (lk - lq) + 1;
  return n < 0 ? 0 : (n > lk ? lk : n);
}

__device__ void kf_load_row(float* dst, const void* base, long long offset, int head_dim, int lane) {
  for (int t = 0; t < KF_PER_LANE; ++t) {
    int d = lane + 32 * t;
    dst[t] = d < head_dim ? kf_bf16(base, offset + d) : 0.0f;
  }
}

__device__ float kf_dot(const float* a, const void* base, long long offset, int head_dim, int lane) {
  float partial = 0.0f;
  for (int t = 0; t < KF_PER_LANE; ++t) {
    int d = lane + 32 * t;
    if (d < head_dim) partial += a[t] * kf_bf16(base, offset + d);
  }
  return kf_warp_sum(partial);
}

extern "C" __global__ void kf_ref_fwd(const __grid_constant__ KfAttnParams p) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * KF_WARPS_PER_BLOCK + threadIdx.x / 32;
  const int h = blockIdx.y;
  if (row >= p.total_q) return;
  const int D = p.head_dim;
  const int g = h / (p.heads / p.kv_heads);
  const int b = kf_find_sequence(p.cu_seqlens_q, p.batch, row);
  const int i = row - p.cu_seqlens_q[b];
  const int lq = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
  const int k0 = p.cu_seqlens_k[b];
  const int lk = p.cu_seqlens_k[b + 1] - k0;
  const int nk = kf_visible_keys(i, lq, lk, p.causal);

  float q[KF_PER_LANE];
  kf_load_row(q, p.q, ((long long)row * p.heads + h) * D, D, lane);

  float m = -__int_as_float(0x7f800000);  // -inf
  for (int j = 0; j < nk; ++j) {
    float s = kf_dot(q, p.k, ((long long)(k0 + j) * p.kv_heads + g) * D, D, lane) * p.softmax_scale;
    m = fmaxf(m, s);
  }
  float l = 0.0f;
  float acc[KF_PER_LANE] = {};
  for (int j = 0; j < nk; ++j) {
    const long long kv = ((long long)(k0 + j) * p.kv_heads + g) * D;
    float s = kf_dot(q, p.k, kv, D, lane) * p.softmax_scale;
    float w = expf(s - m);
    l += w;
    for (int t = 0; t < KF_PER_LANE; ++t) {
      int d = lane + 32 * t;
      if (d < D) acc[t] += w * kf_bf16(p.v, kv + d);
    }
  }
  float* o = static_cast<float*>(p.o) + ((long long)row * p.heads + h) * D;
  for (int t = 0; t < KF_PER_LANE; ++t) {
    int d = lane + 32 * t;
    if (d < D) o[d] = nk > 0 ? acc[t] / l : 0.0f;
  }
  if (lane == 0) {
    p.lse[(long long)h * p.total_q + row] = nk > 0 ? m + logf(l) : m;
  }
}

extern "C" __global__ void kf_ref_bwd_delta(const __grid_constant__ KfAttnParams p) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * KF_WARPS_PER_BLOCK + threadIdx.x / 32;
  const int h = blockIdx.y;
  if (row >= p.total_q) return;
  float o[KF_PER_LANE];
  const long long offset = ((long long)row * p.heads + h) * p.head_dim;
  kf_load_row(o, p.o, offset, p.head_dim, lane);
  float delta = kf_dot(o, p.dout, offset, p.head_dim, lane);
  if (lane == 0) p.delta[(long long)h * p.total_q + row] = delta;
}

// dQ_i = scale * sum_j P_ij (dP_ij - delta_i) K_j, P_ij = exp(scale q_i.k_j - lse_i),
// dP_ij = dO_i . V_j.
extern "C" __global__ void kf_ref_bwd_dq(const __grid_constant__ KfAttnParams p) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * KF_WARPS_PER_BLOCK + threadIdx.x / 32;
  const int h = blockIdx.y;
  if (row >= p.total_q) return;
  const int D = p.head_dim;
  const int g = h / (p.heads / p.kv_heads);
  const int b = kf_find_sequence(p.cu_seqlens_q, p.batch, row);
  const int i = row - p.cu_seqlens_q[b];
  const int lq = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
  const int k0 = p.cu_seqlens_k[b];
  const int lk = p.cu_seqlens_k[b + 1] - k0;
  const int nk = kf_visible_keys(i, lq, lk, p.causal);

  const long long qo = ((long long)row * p.heads + h) * D;
  float q[KF_PER_LANE], dout[KF_PER_LANE], acc[KF_PER_LANE] = {};
  kf_load_row(q, p.q, qo, D, lane);
  kf_load_row(dout, p.dout, qo, D, lane);
  const float lse = p.lse[(long long)h * p.total_q + row];
  const float delta = p.delta[(long long)h * p.total_q + row];
  for (int j = 0; j < nk; ++j) {
    const long long kv = ((long long)(k0 + j) * p.kv_heads + g) * D;
    float s = kf_dot(q, p.k, kv, D, lane) * p.softmax_scale;
    float prob = expf(s - lse);
    float dp = kf_dot(dout, p.v, kv, D, lane);
    float ds = prob * (dp - delta);
    for (int t = 0; t < KF_PER_LANE; ++t) {
      int d = lane + 32 * t;
      if (d < D) acc[t] += ds * kf_bf16(p.k, kv + d);
    }
  }
  float* dq = static_cast<float*>(p.dq);
  for (int t = 0; t < KF_PER_LANE; ++t) {
    int d = lane + 32 * t;
    if (d < D) dq[qo + d] = acc[t] * p.softmax_scale;
  }
}

// For key j of kv head g, over the query heads of its group and the queries
// that see it: dV_j = sum P_ij dO_i, dK_j = scale * sum P_ij (dP_ij - delta_i) Q_i.
extern "C" __global__ void kf_ref_bwd_dkdv(const __grid_constant__ KfAttnParams p) {
  const int lane = threadIdx.x % 32;
  const int key = blockIdx.x * KF_WARPS_PER_BLOCK + threadIdx.x / 32;
  const int g = blockIdx.y;
  if (key >= p.total_k) return;
  const int D = p.head_dim;
  const int group = p.heads / p.kv_heads;
  const int b = kf_find_sequence(p.cu_seqlens_k, p.batch, key);
  const int j = key - p.cu_seqlens_k[b];
  const int q0 = p.cu_seqlens_q[b];
  const int lq = p.cu_seqlens_q[b + 1] - q0;
  const int lk = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
  // Query i sees key j when j <= i + (lk - lq).
  int first = p.causal ? j - (lk - lq) : 0;
  if (first < 0) first = 0;

  const long long kv = ((long long)key * p.kv_heads + g) * D;
  float k[KF_PER_LANE], v[KF_PER_LANE], dk[KF_PER_LANE] = {}, dv[KF_PER_LANE] = {};
  kf_load_row(k, p.k, kv, D, lane);
  kf_load_row(v, p.v, kv, D, lane);
  for (int h = g * group; h < (g + 1) * group; ++h) {
    for (int i = first; i < lq; ++i) {
      const int row = q0 + i;
      const long long qo = ((long long)row * p.heads + h) * D;
      float s = kf_dot(k, p.q, qo, D, lane) * p.softmax_scale;
      float prob = expf(s - p.lse[(long long)h * p.total_q + row]);
      float dp = kf_dot(v, p.dout, qo, D, lane);
      float ds = prob * (dp - p.delta[(long long)h * p.total_q + row]);
      for (int t = 0; t < KF_PER_LANE; ++t) {
        int d = lane + 32 * t;
        if (d < D) {
          dv[t] += prob * kf_bf16(p.dout, qo + d);
          dk[t] += ds * kf_bf16(p.q, qo + d);
        }
      }
    }
  }
  float* dkp = static_cast<float*>(p.dk);
  float* dvp = static_cast<float*>(p.dv);
  for (int t = 0; t < KF_PER_LANE; ++t) {
    int d = lane + 32 * t;
    if (d < D) {
      dkp[kv + d] = dk[t] * p.softmax_scale;
      dvp[kv + d] = dv[t];
    }
  }
}
