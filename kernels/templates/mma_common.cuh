// Warp-level helpers of the portable templates (fwd_mma, bwd_mma, fwd_stream):
// cp.async, the swizzled tile layout and its copy, ldmatrix, mma.sync
// m16n8k16 bf16 and conversions, as inline PTX. The
// catalog prepends this file to those templates' sources (after the knob
// #defines), so every variant is still one self-contained source.

namespace kfm {

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  unsigned r;
  asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }"
               : "=r"(r) : "l"(p));
  return r;
}

// 16 bytes global -> shared, or 16 zero bytes when !valid (src is not read).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

// Byte offset of 16-byte chunk c of row r in a [rows][D] bf16 tile with the
// XOR swizzle (ldmatrix and cp.async free of bank conflicts).
template <int D>
__device__ __forceinline__ unsigned swz_tile(int r, int c) {
  return (unsigned)(r * (D * 2) + ((c ^ (r & 7)) << 4));
}

// Rows [0, ROWS) of a [rows][D] tile whose row r is at base + r * stride
// (elements) into swizzled shared memory at dst, by THREADS threads (this
// one is tid); rows >= valid are zero-filled.
template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void load_tile_swz(unsigned dst, const unsigned short* base,
                                              long long stride, int valid, int tid) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
#pragma unroll
  for (int i = tid; i < ROWS * kChunks; i += THREADS) {
    const int r = i / kChunks;
    const int c = i % kChunks;
    const bool ok = r < valid;
    cp_async16(dst + swz_tile<D>(r, c), ok ? base + r * stride + c * 8 : base, ok);
  }
}

__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2,
                                        unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2,
                                          unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// d += a * b for one m16n8k16 tile (bf16 inputs, fp32 accumulators).
__device__ __forceinline__ void mma(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats to bf16x2: `lo` lands in the low half (the lower column).
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ float ex2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float lg2(float x) {
  float r;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

// Max and sum over the 4 lanes of a quad (the lanes that hold one row of an
// mma.sync accumulator).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Online softmax over one key block of a warp's 16-row tile: the thread's
// rows r = 0 (s[j][0..1]) and r = 1 (s[j][2..3]). s (the scores, masked keys
// -inf) becomes P = exp2(s * sl2 - max * sl2); the rows' max and sum are
// updated and acc (O so far) rescaled. A row with every key so far masked
// keeps max -inf, and exponents of 0 give it P = 0.
template <int BN, int D>
__device__ __forceinline__ void online_softmax_block(float (&s)[BN / 8][4], float* row_max,
                                                     float* row_sum, float (&acc)[D / 8][4],
                                                     float sl2) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = row_max[r];
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
    mx = quad_max(mx);
    const float m_scaled = mx == -__int_as_float(0x7f800000) ? 0.f : mx * sl2;
    const float corr = ex2(row_max[r] * sl2 - m_scaled);
    row_max[r] = mx;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      s[j][2 * r] = ex2(s[j][2 * r] * sl2 - m_scaled);
      s[j][2 * r + 1] = ex2(s[j][2 * r + 1] * sl2 - m_scaled);
      sum += s[j][2 * r] + s[j][2 * r + 1];
    }
    row_sum[r] = row_sum[r] * corr + sum;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      acc[j][2 * r] *= corr;
      acc[j][2 * r + 1] *= corr;
    }
  }
}

// acc += P V for one key block: P in s (the accumulator layout of S is the
// A-operand layout of this mma), V the swizzled [BN][D] tile at v.
template <int BN, int D>
__device__ __forceinline__ void pv_mma(const float (&s)[BN / 8][4], float (&acc)[D / 8][4],
                                       unsigned v, int lane) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    unsigned a[4];
    a[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
    a[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
    a[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
    for (int j = 0; j < D / 8; j += 2) {
      unsigned b0, b1, b2, b3;
      ldsm_x4_t(v + swz_tile<D>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), j + (lane >> 4)),
                b0, b1, b2, b3);
      mma(acc[j], a, b0, b1);
      mma(acc[j + 1], a, b2, b3);
    }
  }
}

}  // namespace kfm
