// kforge "fwd_mma": portable jagged flash-attention forward (sm_80 and later).
//
// FlashAttention-2 structure on the warp-level tensor core instruction
// mma.sync.m16n8k16 (bf16 in, fp32 accumulate):
//   * a CTA owns one query tile of KF_BLOCK_M rows of one (sequence, head);
//     each of its KF_WARPS warps owns 16 rows, holds their Q fragments in
//     registers for the whole tile and accumulates O in registers;
//   * K/V tiles of KF_BLOCK_N keys stream through shared memory with cp.async
//     (KF_STAGES = 1: K and V in separate single buffers, loads of one
//     overlapping compute on the other; KF_STAGES = 2: a two-deep ring);
//     shared memory rows are XOR-swizzled by 16-byte chunk so ldmatrix and
//     cp.async are free of bank conflicts;
//   * online softmax in base 2 (scores scaled by softmax_scale_log2), the row
//     sums reduced across the 4 threads of a row only once, at the end;
//   * key blocks are visited from the last to the first, so the blocks that
//     need a mask (the sequence tail, the causal diagonal) come first and the
//     rest run through an unmasked copy of the loop body;
//   * KF_PERSISTENT = 1: a grid of about one wave of CTAs takes tiles from the
//     host's longest-first list with an atomic counter; 0: one CTA per tile.
//     Thread 0 fetches the next tile's entry and offsets while the current
//     tile runs, so a tile starts with its loads already known;
//   * KF_PACK = 1 (persistent only): a tile entry {b, h, 0, n>0} packs the n
//     consecutive short sequences b..b+n-1 into one tile; every row masks
//     keys outside its own sequence (per-row key bounds [lo, hi), which also
//     express the causal limit of plain tiles).
// Knobs arrive as #defines (KF_BLOCK_M, KF_BLOCK_N, KF_WARPS, KF_STAGES,
// KF_PERSISTENT, KF_MIN_BLOCKS, KF_HEAD_DIM) prepended by the catalog. KF_MIN_BLOCKS is the
// __launch_bounds__ residency target (2 caps registers at 65536 / (2 * threads)).
#include "kforge/attn_params.h"

#ifndef KF_HEAD_DIM
#define KF_HEAD_DIM 128
#endif
#ifndef KF_BLOCK_N
#define KF_BLOCK_N 64
#endif
#ifndef KF_WARPS
#define KF_WARPS 8
#endif
#ifndef KF_BLOCK_M
#define KF_BLOCK_M (16 * KF_WARPS)
#endif
#ifndef KF_STAGES
#define KF_STAGES 2
#endif
#ifndef KF_PERSISTENT
#define KF_PERSISTENT 1
#endif
#ifndef KF_MIN_BLOCKS
#define KF_MIN_BLOCKS 1
#endif
#ifndef KF_PACK
#define KF_PACK 0
#endif
#if !KF_PERSISTENT
#undef KF_PACK
#define KF_PACK 0  // packed tiles exist only in the persistent tile list
#endif

namespace kf {
using namespace kfm;  // mma_common.cuh, prepended by the catalog

constexpr int kD = KF_HEAD_DIM;
constexpr int kBM = KF_BLOCK_M;
constexpr int kBN = KF_BLOCK_N;
constexpr int kWarps = KF_WARPS;
constexpr int kStages = KF_STAGES;
constexpr int kThreads = 32 * kWarps;
constexpr int kChunks = kD / 8;  // 16-byte chunks per row
static_assert(kBM == 16 * kWarps, "each warp owns 16 query rows");
static_assert(kD % 64 == 0, "head dim must be a multiple of 64 (swizzle over 8 chunks)");
static_assert(kBN % 16 == 0, "BLOCK_N must be a multiple of 16");
static_assert(kStages == 1 || kStages == 2, "STAGES is 1 or 2");

// Shared memory: Q tile, then per stage a K tile and a V tile.
constexpr int kQBytes = kBM * kD * 2;
constexpr int kKVBytes = kBN * kD * 2;
constexpr int kSmemBytes = kQBytes + kStages * 2 * kKVBytes;
static_assert(kSmemBytes <= 232448, "shared memory over every arch limit");

template <bool B>
struct Flag {
  static constexpr bool value = B;
};

// Byte offset of 16-byte chunk c of row r in a swizzled [rows][kD] bf16 tile.
__device__ __forceinline__ unsigned swz(int r, int c) {
  return (unsigned)(r * (kD * 2) + ((c ^ (r & 7)) << 4));
}


// Copies rows [0, kRows) of a tile whose row r lives at base + r * stride
// (elements) into swizzled shared memory; rows >= valid are zero-filled.
// (mma_common.cuh's load_tile_swz and pv_mma, which fwd_stream and bwd_mma
// use, are this kernel's copy and P V code; through them it compiles to other
// cubins, and these are the ones measured on the GPU, so it keeps its own
// until a GPU run. Its softmax is online_softmax_block: the same cubins at
// all 768 settings.)
template <int kRows>
__device__ __forceinline__ void load_tile(unsigned dst, const unsigned short* base,
                                          long long stride, int valid, int tid) {
#pragma unroll
  for (int i = tid; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks;
    const int c = i % kChunks;
    const bool ok = r < valid;
    const unsigned short* src = ok ? base + r * stride + c * 8 : base;
    cp_async16(dst + swz(r, c), src, ok);
  }
}

// One tile and its sequence offsets (packed tiles: the first and last
// sequence's bounds; q/k ranges cover all members).
struct Tile {
  int b, h, m_block, pack;
  int q_start, q_end, k_start, k_end;
};

__device__ __forceinline__ Tile make_tile(const KfAttnParams& p, int b, int h, int m_block,
                                          int pack) {
  const int last = b + (pack > 0 ? pack : 1);
  return Tile{b, h, m_block, pack, p.cu_seqlens_q[b], p.cu_seqlens_q[last], p.cu_seqlens_k[b],
              p.cu_seqlens_k[last]};
}

__device__ __forceinline__ void run_tile(const KfAttnParams& p, Tile t, unsigned char* smem,
                                         int tid) {
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;  // row within the 8-row group
  const int tq = lane & 3;  // thread within the row quad

  const int q_start = t.q_start;
  const int lq = t.q_end - q_start;
  const int k_start = t.k_start;
  const int lk = t.k_end - k_start;
  const int m0 = t.m_block * kBM;
  if (m0 >= lq) return;  // uniform across the CTA
  const int shift = lk - lq;
  const int kv_head = t.h / (p.heads / p.kv_heads);
  const bool packed = KF_PACK && t.pack > 0;

  int n_end = lk;
  if (p.causal && !packed) {
    const int last_row = (m0 + kBM < lq ? m0 + kBM : lq) - 1;
    n_end = last_row + 1 + shift;
    n_end = n_end < 0 ? 0 : (n_end > lk ? lk : n_end);
  }
  const int n_blocks = (n_end + kBN - 1) / kBN;

  const long long q_stride = (long long)p.heads * kD;
  const long long kv_stride = (long long)p.kv_heads * kD;
  const unsigned short* qg =
      (const unsigned short*)p.q + ((long long)(q_start + m0) * p.heads + t.h) * kD;
  const unsigned short* kg =
      (const unsigned short*)p.k + ((long long)k_start * p.kv_heads + kv_head) * kD;
  const unsigned short* vg =
      (const unsigned short*)p.v + ((long long)k_start * p.kv_heads + kv_head) * kD;

  const unsigned s_q = smem_u32(smem);
  const unsigned s_kv = s_q + kQBytes;
  // Stage s: K at s_kv + (2s) * kKVBytes, V at s_kv + (2s + 1) * kKVBytes.

  load_tile<kBM>(s_q, qg, q_stride, lq - m0, tid);
  cp_commit();

  auto issue_k = [&](int n_block, int stage) {
    const int n0 = n_block * kBN;
    load_tile<kBN>(s_kv + (2 * stage) * kKVBytes, kg + n0 * kv_stride, kv_stride, lk - n0, tid);
  };
  auto issue_v = [&](int n_block, int stage) {
    const int n0 = n_block * kBN;
    load_tile<kBN>(s_kv + (2 * stage + 1) * kKVBytes, vg + n0 * kv_stride, kv_stride, lk - n0,
                   tid);
  };

  // Prologue: the first (highest) key block.
  if (n_blocks > 0) {
    issue_k(n_blocks - 1, 0);
#if KF_STAGES == 2
    issue_v(n_blocks - 1, 0);
#endif
  }
  cp_commit();
  cp_wait<1>();  // Q has landed
  __syncthreads();

  unsigned qf[kD / 16][4];
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    ldsm_x4(s_q + swz(warp * 16 + (lane & 15), 2 * kk + (lane >> 4)), qf[kk][0], qf[kk][1],
            qf[kk][2], qf[kk][3]);
  }

  float acc[kD / 8][4];
#pragma unroll
  for (int j = 0; j < kD / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  float row_max[2] = {-__int_as_float(0x7f800000), -__int_as_float(0x7f800000)};
  float row_sum[2] = {0.f, 0.f};
  const float sl2 = p.softmax_scale_log2;
  const int row0 = m0 + warp * 16 + g;  // this thread's rows: row0 and row0 + 8

  // Keys row r may see: [key_lo[r], key_hi[r]) in tile-local key indices.
  int key_lo[2], key_hi[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    key_lo[r] = 0;
    key_hi[r] = lk;
    if (p.causal) {
      const int lim = row + shift + 1;
      key_hi[r] = lim < 0 ? 0 : (lim > lk ? lk : lim);
    }
#if KF_PACK
    if (packed) {
      // The member sequence holding this row: largest s with cu_q[s] <= token.
      const int token = q_start + row;
      int lo = t.b, hi = t.b + t.pack - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (p.cu_seqlens_q[mid] <= token) lo = mid; else hi = mid - 1;
      }
      const int sq0 = p.cu_seqlens_q[lo], sq1 = p.cu_seqlens_q[lo + 1];
      const int sk0 = p.cu_seqlens_k[lo] - k_start, sk1 = p.cu_seqlens_k[lo + 1] - k_start;
      key_lo[r] = sk0;
      key_hi[r] = sk1;
      if (p.causal) {
        const int lim = sk0 + (token - sq0) + ((sk1 - sk0) - (sq1 - sq0)) + 1;
        key_hi[r] = lim < sk0 ? sk0 : (lim > sk1 ? sk1 : lim);
      }
      if (row >= lq) key_hi[r] = key_lo[r];
    }
#endif
  }

  auto step = [&](int it, auto masked) {
    const int n_block = n_blocks - 1 - it;
    const int n0 = n_block * kBN;
#if KF_STAGES == 1
    const int stage = 0;
    cp_wait<0>();  // K(n_block) landed
    __syncthreads();  // ... for every thread; PV of the previous block is done
    issue_v(n_block, 0);
    cp_commit();
#else
    const int stage = it & 1;
    if (it + 1 < n_blocks) {  // prefetch the next block into the other stage
      issue_k(n_block - 1, stage ^ 1);
      issue_v(n_block - 1, stage ^ 1);
    }
    cp_commit();
    cp_wait<1>();
    __syncthreads();
#endif
    const unsigned s_k = s_kv + (2 * stage) * kKVBytes;
    const unsigned s_v = s_kv + (2 * stage + 1) * kKVBytes;

    float s[kBN / 8][4];
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
#pragma unroll
      for (int j = 0; j < kBN / 8; j += 2) {
        unsigned b0, b1, b2, b3;
        ldsm_x4(s_k + swz(j * 8 + (lane & 7) + ((lane >> 4) << 3), 2 * kk + ((lane >> 3) & 1)), b0,
                b1, b2, b3);
        mma(s[j], qf[kk], b0, b1);
        mma(s[j + 1], qf[kk], b2, b3);
      }
    }

    if constexpr (decltype(masked)::value) {
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = n0 + j * 8 + 2 * tq + (e & 1);
          if (key < key_lo[e >> 1] || key >= key_hi[e >> 1]) s[j][e] = -__int_as_float(0x7f800000);
        }
      }
    }

#if KF_STAGES == 1
    cp_wait<0>();  // V(n_block) landed
    __syncthreads();  // every warp is done reading K
    if (it + 1 < n_blocks) issue_k(n_block - 1, 0);
    cp_commit();
#endif

    // Online softmax over this block, rows row0 (e = 0, 1) and row0 + 8 (e = 2, 3).
    online_softmax_block<kBN, kD>(s, row_max, row_sum, acc, sl2);

    // O += P V; P's accumulator layout is the A-operand layout of the next mma.
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      unsigned a[4];
      a[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
      a[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      a[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int j = 0; j < kD / 8; j += 2) {
        unsigned b0, b1, b2, b3;
        ldsm_x4_t(s_v + swz(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), j + (lane >> 4)), b0,
                  b1, b2, b3);
        mma(acc[j], a, b0, b1);
        mma(acc[j + 1], a, b2, b3);
      }
    }
#if KF_STAGES == 2
    __syncthreads();  // the stage may be refilled by the next iteration
#endif
  };

  int it = 0;
  // Masked blocks first: the sequence tail and those crossing the causal diagonal.
  for (; it < n_blocks; ++it) {
    const int n0 = (n_blocks - 1 - it) * kBN;
    const bool need_mask =
        packed || n0 + kBN > lk || (p.causal && n0 + kBN - 1 > m0 + shift);
    if (!need_mask) break;
    step(it, Flag<true>{});
  }
  for (; it < n_blocks; ++it) step(it, Flag<false>{});
  cp_wait<0>();

  // Epilogue: normalise, stage the warp's 16 rows in its own Q rows, store 16 B per lane.
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = quad_sum(row_sum[r]);
    inv[r] = l > 0.f ? 1.f / l : 0.f;
    const int row = row0 + 8 * r;
    if (tq == 0 && row < lq) {
      const float lse = l > 0.f ? row_max[r] * p.softmax_scale + lg2(l) * 0.69314718055994531f
                                : -__int_as_float(0x7f800000);
      p.lse[(long long)t.h * p.total_q + q_start + row] = lse;
    }
  }
  unsigned char* sq = smem;
  // The warp's Q fragments came from these rows (ldmatrix); with no key
  // block to visit (lk = 0) no __syncthreads lies between that read and
  // these writes, and the lanes of a warp are not ordered without one.
  __syncwarp();
#pragma unroll
  for (int j = 0; j < kD / 8; ++j) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int srow = warp * 16 + g + 8 * r;
      *(unsigned*)(sq + swz(srow, j) + tq * 4) =
          pack_bf16(acc[j][2 * r] * inv[r], acc[j][2 * r + 1] * inv[r]);
    }
  }
  __syncwarp();
  unsigned short* og = (unsigned short*)p.o + ((long long)(q_start + m0) * p.heads + t.h) * kD;
#pragma unroll
  for (int i = lane; i < 16 * kChunks; i += 32) {
    const int r = i / kChunks;
    const int c = i % kChunks;
    const int row = warp * 16 + r;
    if (m0 + row < lq) {
      *(uint4*)(og + row * q_stride + c * 8) = *(const uint4*)(sq + swz(row, c));
    }
  }
}

}  // namespace kf

extern "C" __global__ void __launch_bounds__(kf::kThreads, KF_MIN_BLOCKS)
    kf_attn_fwd(const __grid_constant__ KfAttnParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x;
#if KF_PERSISTENT
  // next[parity]: the tile after the current one, fetched by thread 0 while
  // the current tile runs (double-buffered: a slot is rewritten only after
  // at least one more __syncthreads).
  __shared__ kf::Tile next[2];
  __shared__ int next_index[2];
  int tile = blockIdx.x;
  if (tile >= p.num_tiles) return;
  const int* e0 = p.tiles + 4 * tile;
  kf::Tile cur = kf::make_tile(p, e0[0], e0[1], e0[2], e0[3]);
  int parity = 0;
  while (true) {
    if (tid == 0) {
      const int n = atomicAdd(p.tile_counter, 1) + (int)gridDim.x;
      next_index[parity] = n;
      if (n < p.num_tiles) {
        const int* e = p.tiles + 4 * n;
        next[parity] = kf::make_tile(p, e[0], e[1], e[2], e[3]);
      }
    }
    kf::run_tile(p, cur, smem, tid);
    __syncthreads();  // shared memory is reused by the next tile; next[] is visible
    tile = next_index[parity];
    if (tile >= p.num_tiles) break;
    cur = next[parity];
    parity ^= 1;
  }
#else
  kf::run_tile(p,
               kf::make_tile(p, (int)blockIdx.z, (int)blockIdx.y,
                             (int)(gridDim.x - 1 - blockIdx.x), 0),
               smem, tid);
#endif
}
