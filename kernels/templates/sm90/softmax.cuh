// Part of the Hopper templates (kernels/notes/parts.md): the online softmax
// over wgmma m64 accumulators, in registers, with exp2.
//
// Accumulator layout (wgmma m64nN, fp32, one warpgroup): thread `lane` of
// warp w holds rows r_lo = 16 w + lane / 4 and r_hi = r_lo + 8; its element
// i (of N / 2) is row ((i >> 1) & 1 ? r_hi : r_lo), column
// 8 (i >> 2) + 2 (lane & 3) + (i & 1). A row's values live in the 4 threads
// of a quad, so row reductions are two xor-shuffles.
//
// Scores are raw Q K^T; scale_log2 = softmax scale * log2(e) is applied
// inside exp2, so the running max m is in raw score units. Reads no knob.

namespace kfh {

// Scores in columns >= the row's limit to -inf (n0: the block's first key;
// cq = 2 (lane & 3)).
template <int N>
__device__ __forceinline__ void mask_cols(float* s, int n0, int cq, int lim_lo, int lim_hi) {
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const int col = n0 + 8 * (i >> 2) + cq + (i & 1);
    const int lim = ((i >> 1) & 1) ? lim_hi : lim_lo;
    if (col >= lim) s[i] = neg_inf();
  }
}

// Packed tiles: scores outside each row's window (lo | hi << 16, from
// sm90/packed_rows.cuh; w_lo for row r_lo, w_hi for r_hi) to -inf.
template <int N>
__device__ __forceinline__ void mask_window(float* s, int n0, int cq, int w_lo, int w_hi) {
  const int lo_lo = w_lo & 0xffff, hi_lo = w_lo >> 16, lo_hi = w_hi & 0xffff, hi_hi = w_hi >> 16;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const int col = n0 + 8 * (i >> 2) + cq + (i & 1);
    const bool hi_row = (i >> 1) & 1;
    const int lo = hi_row ? lo_hi : lo_lo, hi = hi_row ? hi_hi : hi_lo;
    if (col < lo || col >= hi) s[i] = neg_inf();
  }
}

// Running max and sum of this thread's two rows.
struct OnlineSoftmax {
  float m_lo, m_hi;  // max raw score so far (-inf: none)
  float l_lo, l_hi;  // this thread's share of sum exp2((s - m) scale_log2)

  __device__ __forceinline__ void init() {
    m_lo = neg_inf();
    m_hi = neg_inf();
    l_lo = 0.f;
    l_hi = 0.f;
  }

  // Scores s (N columns) -> probabilities exp2(s scale_log2 - max), in
  // place; updates max and sums. sc_lo / sc_hi: the factors that rescale
  // what was accumulated under the old max (apply with rescale()).
  template <int N>
  __device__ __forceinline__ void update(float* s, float scale_log2, float& sc_lo, float& sc_hi) {
    const float sl2 = scale_log2;
    float mx_lo = m_lo, mx_hi = m_hi;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      if ((i >> 1) & 1) mx_hi = fmaxf(mx_hi, s[i]);
      else mx_lo = fmaxf(mx_lo, s[i]);
    }
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
    // a row that has seen no key yet keeps exponent offset 0 (all its p are 0)
    const float mu_lo = (mx_lo == neg_inf()) ? 0.f : mx_lo * sl2;
    const float mu_hi = (mx_hi == neg_inf()) ? 0.f : mx_hi * sl2;
    sc_lo = ex2(m_lo * sl2 - mu_lo);
    sc_hi = ex2(m_hi * sl2 - mu_hi);
    m_lo = mx_lo;
    m_hi = mx_hi;
    float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      if ((i >> 1) & 1) {
        s[i] = ex2(fmaf(s[i], sl2, -mu_hi));
        sum_hi += s[i];
      } else {
        s[i] = ex2(fmaf(s[i], sl2, -mu_lo));
        sum_lo += s[i];
      }
    }
    l_lo = l_lo * sc_lo + sum_lo;
    l_hi = l_hi * sc_hi + sum_hi;
  }

  // An accumulator of N columns (e.g. O) times the factors from update().
  template <int N>
  __device__ __forceinline__ static void rescale(float* acc, float sc_lo, float sc_hi) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[i] *= ((i >> 1) & 1) ? sc_hi : sc_lo;
  }

  // After the last block: the quad's shares summed, so l_lo / l_hi are the
  // rows' full sums.
  __device__ __forceinline__ void finish() {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
  }
  // 1 / sum, or 0 for a row without keys (its O is then 0).
  __device__ __forceinline__ static float inverse(float l) { return l > 0.f ? 1.f / l : 0.f; }
  // Natural-log LSE of a row, -inf for a row without keys (after finish()).
  __device__ __forceinline__ static float lse(float m, float l, float scale_log2) {
    return l > 0.f ? (m * scale_log2 + lg2(l)) * 0.69314718055994531f : neg_inf();
  }
};

}  // namespace kfh
