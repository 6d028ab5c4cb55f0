// kforge "bwd_mma": portable jagged flash-attention backward (sm_80 and later),
// one launch, on mma.sync.m16n8k16 (bf16 in, fp32 accumulate).
//
// FlashAttention-2's backward, key-major, on the host's key-major tile list
// (schedule.h, BuildKeyTiles):
//   * a CTA owns one block of KF_BLOCK_N keys of one kv head: K and V stay in
//     shared memory, and each of its KF_BLOCK_N / 16 warps accumulates dK and
//     dV of 16 keys in registers over every query head of the kv head's group
//     and every query block (KF_BLOCK_M rows) that sees one of its keys;
//   * per query block: S^T = K Q^T and P^T = exp2(S^T * scale_log2 - LSE_2)
//     (LSE from the forward), dP^T = V dO^T, dS^T = P^T (dP^T - delta) with
//     delta = rowsum(dO * O) recomputed by each visitor, dV += P^T dO,
//     dK += dS^T Q;
//     dS^T goes through shared memory to give dQ = dS K, which is added into
//     the fp32 dq_accum with atomics;
//   * each (query block, head) counts the key blocks that have added into it
//     (an int per block in the workspace); the CTA that completes the count
//     converts the block's dq_accum rows to bf16 dQ. Query blocks that see no
//     key get tiles of their own that write dQ = 0.
//   * the next query block's Q and dO are loaded (cp.async, two buffers)
//     while the current one is computed; LSE and delta = rowsum(dO * O) are
//     read by every thread at once; the dq counters of a head are bumped once
//     after all its query blocks, behind one fence (kernels/notes/bwd.md, v2).
//   * KF_DET = 1 (manifest deterministic, tile order "levels"): dQ bitwise the
//     same in every launch. Each dq_accum element gets one add per key block
//     (one thread's), so it is summed in a fixed order when the key blocks add
//     in one: last key block first, key block j into query block m only after
//     key blocks j+1 .. J(m) (the last that sees m), as bwd_sm90 DET=1 does
//     (its header has the why). A key block's adds into (m, h) are published
//     once every thread's are complete (each thread's fence, the step's
//     barrier, then one release add into the count's upper field); each warp
//     that adds waits for J(m) - j published key blocks first. Free of
//     deadlock because every tile, the first too, is drawn from the tile
//     counter and the "levels" list puts key block j + 1 before key block j.
// Knobs arrive as #defines (KF_BLOCK_M, KF_BLOCK_N, KF_MIN_BLOCKS, KF_HEAD_DIM,
// KF_DET).
#include "kforge/attn_params.h"

#ifndef KF_HEAD_DIM
#define KF_HEAD_DIM 128
#endif
#ifndef KF_BLOCK_M
#define KF_BLOCK_M 64
#endif
#ifndef KF_BLOCK_N
#define KF_BLOCK_N 64
#endif
#ifndef KF_MIN_BLOCKS
#define KF_MIN_BLOCKS 1
#endif
#ifndef KF_DET
#define KF_DET 0
#endif
#if (KF_DET != 0) && (KF_DET != 1)
#error "bwd_mma: KF_DET must be 0 or 1"
#endif

namespace kfb {
using namespace kfm;  // mma_common.cuh, prepended by the catalog

constexpr int kD = KF_HEAD_DIM;
constexpr int kBM = KF_BLOCK_M;  // query rows per step
constexpr int kBN = KF_BLOCK_N;  // keys per CTA
constexpr int kWarps = kBN / 16;
constexpr int kThreads = 32 * kWarps;
constexpr int kChunks = kD / 8;      // 16-byte chunks per row of a [rows][kD] tile
constexpr int kSChunks = kBM / 8;    // ... of the [kBN][kBM] dS tile
constexpr int kSMask = kSChunks >= 8 ? 7 : kSChunks - 1;
static_assert(kD % 64 == 0, "head dim must be a multiple of 64 (swizzle over 8 chunks)");
static_assert(kBN % 16 == 0 && kBM % 16 == 0, "blocks are multiples of 16");
static_assert(kBM >= 32, "BLOCK_M >= 32 (the dS tile swizzle needs 4 chunks)");

// Shared memory: K, V (kBN rows), two buffers of Q and dO (kBM rows), dS^T,
// then LSE_2, delta and the completion flags of the dq counters.
constexpr int kKBytes = kBN * kD * 2;
constexpr int kQBytes = kBM * kD * 2;
constexpr int kSBytes = kBN * kBM * 2;
constexpr int kSmemBytes = 2 * kKBytes + 4 * kQBytes + kSBytes + 2 * kBM * 4 + kThreads * 4;
static_assert(kSmemBytes <= 232448, "shared memory over every arch limit");

// Byte offset of 16-byte chunk c of row r in a swizzled [rows][kD] tile.
__device__ __forceinline__ unsigned swz(int r, int c) { return swz_tile<kD>(r, c); }
// ... in the swizzled [kBN][kBM] dS^T tile.
__device__ __forceinline__ unsigned swz_s(int r, int c) {
  return (unsigned)(r * (kBM * 2) + ((c ^ (r & kSMask)) << 4));
}

#if KF_DET
// A (query block, head) workspace int: bits 0..14 count the key blocks that
// are done with it (the conversion's count: a sequence has at most
// 2^20 / 64 = 2^14 key blocks, core/shape.h kMaxSeqLen, BLOCK_N >= 64 with
// KF_DET), bits 15..29 the key blocks whose adds into it are complete.
static_assert(!KF_DET || KF_BLOCK_N >= 64, "bwd_mma: KF_DET needs BLOCK_N >= 64 (the count's bits)");
constexpr int kDetAdd = 1 << 15;
constexpr int kCountMask = kDetAdd - 1;
__device__ __forceinline__ int ld_acquire_gpu(const int* a) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(a) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_gpu(int* a, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(a), "r"(v) : "memory");
}
#endif

__device__ __forceinline__ float bf16_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }


// Key blocks that add into query block m (the count its dQ waits for); the
// host's TileKeyBlocks, which builds the tiles, gives the same number.
__device__ __forceinline__ int contributors(int lq, int lk, int m, bool causal) {
  int n_end = lk;
  if (causal) {
    const int last = (lq < (m + 1) * kBM ? lq : (m + 1) * kBM) - 1;
    n_end = last + 1 + (lk - lq);
    n_end = n_end < 0 ? 0 : (n_end > lk ? lk : n_end);
  }
  return (n_end + kBN - 1) / kBN;
}

// dQ rows [m0, m0 + kBM) of head h (clamped to the sequence) from dq_accum,
// or zeros; dq_accum holds the scaled sums already.
__device__ void write_dq(const KfAttnParams& p, int q_start, int lq, int m0, int h, bool zero,
                         int tid) {
  const int rows = (lq - m0 < kBM ? lq - m0 : kBM);
  for (int i = tid; i < rows * (kD / 8); i += kThreads) {
    const int r = i / (kD / 8);
    const int c = (i % (kD / 8)) * 8;
    const long long off = ((long long)(q_start + m0 + r) * p.heads + h) * kD + c;
    uint4 out = make_uint4(0u, 0u, 0u, 0u);
    if (!zero) {
      const float4 a = __ldcg((const float4*)(p.dq_accum + off));
      const float4 b = __ldcg((const float4*)(p.dq_accum + off + 4));
      out = make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w), pack_bf16(b.x, b.y),
                       pack_bf16(b.z, b.w));
    }
    *(uint4*)((unsigned short*)p.dq + off) = out;
  }
}

// Adds a warp's 16 x 64 dQ slab (scaled) into dq_accum. On sm_90 and later
// one 16-byte vector reduction replaces four scalar ones: lanes tq and tq ^ 1
// swap halves so the even lane holds 4 consecutive columns of row g and the
// odd lane 4 of row g + 8 (fewer reductions is what the dQ path waits on,
// notes/bwd.md).
__device__ __forceinline__ void add_dq(const KfAttnParams& p, float (&acc)[8][4], int q_start,
                                       int row0, int lq, int h, int dh, int g, int tq) {
  const float sc = p.softmax_scale;
#if __CUDA_ARCH__ >= 900
  const bool odd = tq & 1;
  const int qrow = row0 + g + (odd ? 8 : 0);
  const int col0 = 2 * (tq & ~1);
  float* dst = p.dq_accum + ((long long)(q_start + qrow) * p.heads + h) * kD + dh * 64 + col0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    // Even lanes keep row g and send row g + 8; odd lanes the reverse.
    const float send0 = odd ? acc[j][0] : acc[j][2];
    const float send1 = odd ? acc[j][1] : acc[j][3];
    const float got0 = __shfl_xor_sync(0xffffffffu, send0, 1);
    const float got1 = __shfl_xor_sync(0xffffffffu, send1, 1);
    float v0, v1, v2, v3;
    if (odd) {
      v0 = got0; v1 = got1; v2 = acc[j][2]; v3 = acc[j][3];
    } else {
      v0 = acc[j][0]; v1 = acc[j][1]; v2 = got0; v3 = got1;
    }
    if (qrow < lq) {
      asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n"
                   :: "l"(dst + j * 8), "f"(v0 * sc), "f"(v1 * sc), "f"(v2 * sc), "f"(v3 * sc)
                   : "memory");
    }
  }
#else
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qrow = row0 + g + 8 * r;
    if (qrow < lq) {
      float* dst = p.dq_accum + ((long long)(q_start + qrow) * p.heads + h) * kD + dh * 64;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        atomicAdd(dst + j * 8 + 2 * tq, acc[j][2 * r] * sc);
        atomicAdd(dst + j * 8 + 2 * tq + 1, acc[j][2 * r + 1] * sc);
      }
    }
  }
#endif
}

struct Tile {
  int b, head, block, qbase;
};

__device__ void run_tile(const KfAttnParams& p, Tile t, unsigned char* smem, int tid) {
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int tq = lane & 3;
  const int q_start = p.cu_seqlens_q[t.b];
  const int lq = p.cu_seqlens_q[t.b + 1] - q_start;
  const int k_start = p.cu_seqlens_k[t.b];
  const int lk = p.cu_seqlens_k[t.b + 1] - k_start;
  const int shift = lk - lq;

  if (t.block < 0) {  // a query block that sees no key: dQ = 0
    write_dq(p, q_start, lq, (-1 - t.block) * kBM, t.head, true, tid);
    return;
  }

  const int kv = t.head;
  const int group = p.heads / p.kv_heads;
  const int n0 = t.block * kBN;
  const long long q_stride = (long long)p.heads * kD;
  const long long kv_stride = (long long)p.kv_heads * kD;
  const unsigned short* kg =
      (const unsigned short*)p.k + ((long long)(k_start + n0) * p.kv_heads + kv) * kD;
  const unsigned short* vg =
      (const unsigned short*)p.v + ((long long)(k_start + n0) * p.kv_heads + kv) * kD;

  const unsigned s_k = smem_u32(smem);
  const unsigned s_v = s_k + kKBytes;
  const unsigned s_qd = s_v + kKBytes;  // buffer b: Q at + 2b kQBytes, dO at + (2b + 1) kQBytes
  const unsigned s_ds = s_qd + 4 * kQBytes;
  unsigned char* ds_ptr = smem + 2 * kKBytes + 4 * kQBytes;
  float* lse2 = (float*)(ds_ptr + kSBytes);
  float* delta = lse2 + kBM;
  int* flags = (int*)(delta + kBM);

  // Query blocks m_first .. m_blocks - 1 of every head of the group see keys
  // of this block: step i is head kv * group + i / visited, block
  // m_first + i % visited.
  const int first_row = p.causal ? (n0 - shift > 0 ? n0 - shift : 0) : 0;
  const int m_blocks = (lq + kBM - 1) / kBM;
  const int m_first = first_row >= lq ? m_blocks : first_row / kBM;
  const int visited = m_blocks - m_first;
  const int steps = group * visited;
  auto rows_of = [&](const void* base, int i) {
    const int h = kv * group + i / visited;
    const int m0 = (m_first + i % visited) * kBM;
    return (const unsigned short*)base + ((long long)(q_start + m0) * p.heads + h) * kD;
  };
  auto issue = [&](int i, int buf) {
    const int m0 = (m_first + i % visited) * kBM;
    load_tile_swz<kD, kBM, kThreads>(s_qd + 2 * buf * kQBytes, rows_of(p.q, i), q_stride, lq - m0,
                                     tid);
    load_tile_swz<kD, kBM, kThreads>(s_qd + (2 * buf + 1) * kQBytes, rows_of(p.dout, i), q_stride,
                                     lq - m0, tid);
  };

  load_tile_swz<kD, kBN, kThreads>(s_k, kg, kv_stride, lk - n0, tid);
  load_tile_swz<kD, kBN, kThreads>(s_v, vg, kv_stride, lk - n0, tid);
  if (steps > 0) issue(0, 0);
  cp_commit();

  float dk[kD / 8][4], dv[kD / 8][4];
#pragma unroll
  for (int j = 0; j < kD / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.f;
  }
  const float sl2 = p.softmax_scale_log2;
  const float log2e = 1.4426950408889634f;

  for (int i = 0; i < steps; ++i) {
    const int buf = i & 1;
    const int h = kv * group + i / visited;
    const int m = m_first + i % visited;
    const int m0 = m * kBM;
    const unsigned s_q = s_qd + 2 * buf * kQBytes;
    const unsigned s_do = s_q + kQBytes;
    if (i + 1 < steps) issue(i + 1, buf ^ 1);
    cp_commit();

    // LSE in base 2 (+inf where P must be 0) and delta = rowsum(dO * O):
    // kChunks consecutive threads share a row, one 16-byte chunk each.
    if (tid < kBM) {
      float l2 = __int_as_float(0x7f800000);
      if (m0 + tid < lq) {
        const float l = p.lse[(long long)h * p.total_q + q_start + m0 + tid];
        if (l > -__int_as_float(0x7f800000)) l2 = l * log2e;
      }
      lse2[tid] = l2;
    }
    const unsigned short* og = rows_of(p.o, i);
    const unsigned short* dog = rows_of(p.dout, i);
#pragma unroll 4
    for (int e = tid; e < kBM * kChunks; e += kThreads) {
      const int r = e / kChunks;
      const int c = e % kChunks;
      float v = 0.f;
      if (m0 + r < lq) {
        const uint4 a = *(const uint4*)(og + r * q_stride + c * 8);
        const uint4 b = *(const uint4*)(dog + r * q_stride + c * 8);
        v = bf16_lo(a.x) * bf16_lo(b.x) + bf16_hi(a.x) * bf16_hi(b.x) +
            bf16_lo(a.y) * bf16_lo(b.y) + bf16_hi(a.y) * bf16_hi(b.y) +
            bf16_lo(a.z) * bf16_lo(b.z) + bf16_hi(a.z) * bf16_hi(b.z) +
            bf16_lo(a.w) * bf16_lo(b.w) + bf16_hi(a.w) * bf16_hi(b.w);
      }
#pragma unroll
      for (int off = kChunks / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (c == 0) delta[r] = v;
    }
    cp_wait<1>();  // this step's Q and dO (and K, V) have landed
    __syncthreads();

    // S^T (16 keys x kBM queries per warp) = K Q^T and dP^T = V dO^T.
    float s[kBM / 8][4], dp[kBM / 8][4];
#pragma unroll
    for (int j = 0; j < kBM / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      unsigned ka[4], va[4];
      ldsm_x4(s_k + swz(warp * 16 + (lane & 15), 2 * kk + (lane >> 4)), ka[0], ka[1], ka[2], ka[3]);
      ldsm_x4(s_v + swz(warp * 16 + (lane & 15), 2 * kk + (lane >> 4)), va[0], va[1], va[2], va[3]);
#pragma unroll
      for (int j = 0; j < kBM / 8; j += 2) {
        const int row = j * 8 + (lane & 7) + ((lane >> 4) << 3);
        const int chunk = 2 * kk + ((lane >> 3) & 1);
        unsigned b0, b1, b2, b3;
        ldsm_x4(s_q + swz(row, chunk), b0, b1, b2, b3);
        mma(s[j], ka, b0, b1);
        mma(s[j + 1], ka, b2, b3);
        ldsm_x4(s_do + swz(row, chunk), b0, b1, b2, b3);
        mma(dp[j], va, b0, b1);
        mma(dp[j + 1], va, b2, b3);
      }
    }

    // P^T and dS^T in place (s becomes P, dp becomes dS), masked.
#pragma unroll
    for (int j = 0; j < kBM / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = n0 + warp * 16 + g + 8 * (e >> 1);
        const int col = j * 8 + 2 * tq + (e & 1);
        const int q = m0 + col;
        const bool ok = key < lk && q < lq && (!p.causal || key <= q + shift);
        const float prob = ok ? ex2(s[j][e] * sl2 - lse2[col]) : 0.f;
        s[j][e] = prob;
        dp[j][e] = prob * (dp[j][e] - delta[col]);
      }
    }

    // dV += P^T dO and dK += dS^T Q (k = queries).
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk) {
      unsigned pa[4], sa[4];
      pa[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      sa[0] = pack_bf16(dp[2 * kk][0], dp[2 * kk][1]);
      sa[1] = pack_bf16(dp[2 * kk][2], dp[2 * kk][3]);
      sa[2] = pack_bf16(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
      sa[3] = pack_bf16(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
      const int row = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
      for (int j = 0; j < kD / 8; j += 2) {
        unsigned b0, b1, b2, b3;
        ldsm_x4_t(s_do + swz(row, j + (lane >> 4)), b0, b1, b2, b3);
        mma(dv[j], pa, b0, b1);
        mma(dv[j + 1], pa, b2, b3);
        ldsm_x4_t(s_q + swz(row, j + (lane >> 4)), b0, b1, b2, b3);
        mma(dk[j], sa, b0, b1);
        mma(dk[j + 1], sa, b2, b3);
      }
    }

    // dS^T to shared memory ([key][query]) for dQ = dS K.
#pragma unroll
    for (int j = 0; j < kBM / 8; ++j) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = warp * 16 + g + 8 * r;
        *(unsigned*)(ds_ptr + swz_s(row, j) + tq * 4) = pack_bf16(dp[j][2 * r], dp[j][2 * r + 1]);
      }
    }
    __syncthreads();

    // dQ for 16-row slabs of the query block, 64 head dims at a time,
    // added into dq_accum (scaled).
#if KF_DET
    // (KF_DET) Key blocks t.block + 1 .. J(m) add into (m, h) first: waited
    // for by each warp that adds, before its first add of the step.
    int* const det_word = (int*)p.workspace + (long long)(t.qbase + m) * p.heads + h;
    const int det_want = contributors(lq, lk, m, p.causal) - 1 - t.block;
    bool det_waited = det_want <= 0;
#endif
    for (int slab = warp; slab < kBM / 16; slab += kWarps) {
#pragma unroll
      for (int dh = 0; dh < kD / 64; ++dh) {
        float acc[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < kBN / 16; ++kk) {
          unsigned a[4];
          ldsm_x4_t(s_ds + swz_s(kk * 16 + (lane & 7) + ((lane >> 4) << 3),
                                 2 * slab + ((lane >> 3) & 1)),
                    a[0], a[1], a[2], a[3]);
          const int row = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
          for (int j = 0; j < 8; j += 2) {
            unsigned b0, b1, b2, b3;
            ldsm_x4_t(s_k + swz(row, dh * 8 + j + (lane >> 4)), b0, b1, b2, b3);
            mma(acc[j], a, b0, b1);
            mma(acc[j + 1], a, b2, b3);
          }
        }
#if KF_DET
        if (!det_waited) {
          if (lane == 0) {
            while (ld_acquire_gpu(det_word) / kDetAdd < det_want) __nanosleep(64);
          }
          __syncwarp();
          det_waited = true;
        }
#endif
        add_dq(p, acc, q_start, m0 + slab * 16, lq, h, dh, g, tq);
      }
    }

    if (m == m_blocks - 1) {
      // Head h is done: count this key block into each of its query blocks
      // behind one fence; the key block that completes a count converts.
      __threadfence();
      __syncthreads();
      for (int base = m_first; base < m_blocks; base += kThreads) {
        const int mm = base + tid;
        int done = 0;
        if (mm < m_blocks) {
          int* counter = (int*)p.workspace + (long long)(t.qbase + mm) * p.heads + h;
#if KF_DET
          done = ((atomicAdd(counter, 1) + 1) & kCountMask) == contributors(lq, lk, mm, p.causal);
#else
          done = atomicAdd(counter, 1) + 1 == contributors(lq, lk, mm, p.causal);
#endif
          __threadfence();
        }
        flags[tid] = done;
        __syncthreads();
        for (int j = 0; j < kThreads && base + j < m_blocks; ++j) {
          if (flags[j]) write_dq(p, q_start, lq, (base + j) * kBM, h, false, tid);
        }
        __syncthreads();
      }
    }
#if KF_DET
    // This step's adds, every thread's complete, then published by one
    // release add (the barrier orders the fences before it).
    __threadfence();
    __syncthreads();  // this buffer, dS, LSE and delta are refilled by later steps
    if (tid == 0) red_release_gpu(det_word, kDetAdd);
#else
    __syncthreads();  // this buffer, dS, LSE and delta are refilled by later steps
#endif
  }
  cp_wait<0>();  // K and V, when no query block was visited

  // dK (scaled) and dV of this warp's 16 keys.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = n0 + warp * 16 + g + 8 * r;
    if (key < lk) {
      const long long off = ((long long)(k_start + key) * p.kv_heads + kv) * kD;
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        const int c = j * 8 + 2 * tq;
        *(unsigned*)((unsigned short*)p.dk + off + c) =
            pack_bf16(dk[j][2 * r] * p.softmax_scale, dk[j][2 * r + 1] * p.softmax_scale);
        *(unsigned*)((unsigned short*)p.dv + off + c) = pack_bf16(dv[j][2 * r], dv[j][2 * r + 1]);
      }
    }
  }
}

}  // namespace kfb

extern "C" __global__ void __launch_bounds__(kfb::kThreads, KF_MIN_BLOCKS)
    kf_attn_bwd(const __grid_constant__ KfAttnParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int next_index;
  const int tid = threadIdx.x;
#if KF_DET
  // Every tile from the counter, the first too: a tile is then only held by
  // a CTA that runs, which the ordered adds need (a CTA not yet resident
  // would hold tile blockIdx.x while the ones that wait for it hold the SMs).
  if (tid == 0) next_index = atomicAdd(p.tile_counter, 1);
  __syncthreads();
  int tile = next_index;
  __syncthreads();
  constexpr int kTaken = 0;
#else
  int tile = blockIdx.x;
  const int kTaken = (int)gridDim.x;
#endif
  while (tile < p.num_tiles) {
    const int* e = p.tiles + 4 * tile;
    kfb::run_tile(p, kfb::Tile{e[0], e[1], e[2], e[3]}, smem, tid);
    if (tid == 0) next_index = atomicAdd(p.tile_counter, 1) + kTaken;
    __syncthreads();
    tile = next_index;
    __syncthreads();  // next_index is rewritten after the next tile
  }
}
