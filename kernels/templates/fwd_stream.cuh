// kforge "fwd_stream": jagged attention forward for long query sequences over
// short key sequences (sm_80 and later).
//
// With a few keys per sequence (cross attention of 1-2k queries over 1-16
// keys, say) a query row costs a few hundred FLOPs against 512 bytes of Q in
// and O out: the forward is a memory stream with a little tensor-core work
// inside, and it runs as fast as the loads kept in flight allow. So:
//   * a persistent CTA takes its tiles of the host's list with a static
//     stride (tile c, c + grid, c + 2 grid, ...): every thread knows its next
//     tiles without the tile counter and loads their list entries and
//     sequence offsets into registers one and two tiles ahead, so no load
//     waits on a chain of dependent reads;
//   * KF_STAGES stages, each holding one query tile (KF_BLOCK_M rows) and the
//     tile's first key block (KF_BLOCK_N keys of K and of V): while a tile
//     computes, the loads of the next KF_STAGES - 1 tiles are in flight;
//   * a warp owns 16 query rows of a tile: S = Q K^T and O += P V on mma.sync
//     m16n8k16, Q fragments read from shared memory for every key block (with
//     one block per tile, registers would buy nothing), online exp2 softmax,
//     the mask applied to every block (a block is a handful of keys: the
//     compares cost less than a second copy of the loop);
//   * a tile that sees more than KF_BLOCK_N keys loads its other key blocks
//     one by one into its stage: right for every length, fast only for short
//     keys (fwd_mma and fwd_sm90 own the rest);
//   * the epilogue stages normalised O in the warp's own Q rows and writes
//     whole 256-byte rows (D = 128) with 16-byte stores.
// (Q in and O out by 1-D cp.async.bulk on sm_90 ran at half the speed of
// this cp.async form on the H200: kernels/notes/stream.md.)
// Knobs arrive as #defines prepended by the catalog: KF_BLOCK_M (16 rows per
// warp), KF_BLOCK_N, KF_STAGES, KF_MIN_BLOCKS (__launch_bounds__ residency),
// KF_HEAD_DIM.
#include "kforge/attn_params.h"

#ifndef KF_HEAD_DIM
#define KF_HEAD_DIM 128
#endif
#ifndef KF_BLOCK_M
#define KF_BLOCK_M 64
#endif
#ifndef KF_BLOCK_N
#define KF_BLOCK_N 16
#endif
#ifndef KF_STAGES
#define KF_STAGES 3
#endif
#ifndef KF_MIN_BLOCKS
#define KF_MIN_BLOCKS 1
#endif

namespace kfs {
using namespace kfm;  // mma_common.cuh, prepended by the catalog

constexpr int kD = KF_HEAD_DIM;
constexpr int kBM = KF_BLOCK_M;
constexpr int kBN = KF_BLOCK_N;
constexpr int kStages = KF_STAGES;
constexpr int kWarps = kBM / 16;
constexpr int kThreads = 32 * kWarps;
constexpr int kChunks = kD / 8;  // 16-byte chunks per row
constexpr int kRowBytes = kD * 2;
static_assert(kBM % 16 == 0, "each warp owns 16 query rows");
static_assert(kD % 64 == 0, "head dim must be a multiple of 64 (swizzle over 8 chunks)");
static_assert(kBN % 16 == 0, "BLOCK_N must be a multiple of 16");
static_assert(kStages >= 2, "a stage computes while the others load");

// One stage: the Q tile, then K and V of one key block, all swizzled alike.
constexpr int kQBytes = kBM * kRowBytes;
constexpr int kKVBytes = kBN * kRowBytes;
constexpr int kStageBytes = kQBytes + 2 * kKVBytes;
constexpr int kSmemBytes = kStages * kStageBytes;
static_assert(kStageBytes % 128 == 0, "stages stay 128-byte aligned");
static_assert(kSmemBytes <= 232448, "shared memory over every arch limit");

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

// Byte offset of 16-byte chunk c of row r in a Q, K or V tile (XOR swizzle:
// ldmatrix and cp.async free of bank conflicts).
__device__ __forceinline__ unsigned swz(int r, int c) { return swz_tile<kD>(r, c); }



// What a stage needs to know about its tile (all zero past this CTA's last tile).
struct Geom {
  int valid;
  int h, kv_head;
  int q_row;     // packed row of the tile's first query
  int rows;      // query rows in the tile, 1..kBM
  int k_row;     // packed row of the sequence's first key
  int lk;        // keys of the sequence
  int diag;      // causal: tile row r sees keys j <= r + diag (bottom-right aligned)
  int n_blocks;  // key blocks of kBN the tile visits
};

// This CTA's tiles in order (static stride over the list), with the list
// entry of the next tile and its sequence offsets already in registers and
// the entry after it on its way: take() never waits on a dependent load
// chain, only on loads issued one tile earlier.
struct TileFeed {
  int next;    // list index of the tile take() describes next
  int e[4];    // its entry {b, h, m_block, pack}
  int cu[4];   // its offsets: cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
  int e2[4];   // the entry of the tile after it

  __device__ __forceinline__ static void load_entry(const KfAttnParams& p, int i, int (&out)[4]) {
    const bool ok = i < p.num_tiles;
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = ok ? p.tiles[4 * i + k] : 0;
  }
  __device__ __forceinline__ void load_offsets(const KfAttnParams& p, bool ok) {
    const int b = e[0];
    cu[0] = ok ? p.cu_seqlens_q[b] : 0;
    cu[1] = ok ? p.cu_seqlens_q[b + 1] : 0;
    cu[2] = ok ? p.cu_seqlens_k[b] : 0;
    cu[3] = ok ? p.cu_seqlens_k[b + 1] : 0;
  }
  __device__ __forceinline__ void start(const KfAttnParams& p) {
    next = blockIdx.x;
    load_entry(p, next, e);
    load_offsets(p, next < p.num_tiles);
    load_entry(p, next + (int)gridDim.x, e2);
  }
  __device__ __forceinline__ Geom take(const KfAttnParams& p) {
    Geom g;
    g.valid = next < p.num_tiles;
    const int lq = cu[1] - cu[0];
    const int m0 = e[2] * kBM;
    g.h = e[1];
    g.kv_head = e[1] / (p.heads / p.kv_heads);
    g.q_row = cu[0] + m0;
    g.rows = lq - m0 < kBM ? lq - m0 : kBM;
    g.k_row = cu[2];
    g.lk = cu[3] - cu[2];
    g.diag = m0 + g.lk - lq;
    int n_end = g.lk;
    if (p.causal) {
      n_end = g.rows + g.diag;  // the last row's limit
      n_end = n_end < 0 ? 0 : (n_end > g.lk ? g.lk : n_end);
    }
    g.n_blocks = g.valid ? (n_end + kBN - 1) / kBN : 0;
    if (!g.valid) g.rows = 0;
    // Advance: the offsets of the tile after this one, the entry after that.
    next += (int)gridDim.x;
#pragma unroll
    for (int k = 0; k < 4; ++k) e[k] = e2[k];
    load_offsets(p, next < p.num_tiles);
    load_entry(p, next + (int)gridDim.x, e2);
    return g;
  }
};

// Stage s: Q at base + s * kStageBytes, then K, then V.
struct StageAddr {
  unsigned q, k, v;
};
__device__ __forceinline__ StageAddr stage_addr(unsigned base, int s) {
  const unsigned q = base + (unsigned)(s * kStageBytes);
  return StageAddr{q, q + kQBytes, q + kQBytes + kKVBytes};
}

__device__ __forceinline__ void issue_kv(const KfAttnParams& p, const Geom& g, int n_block,
                                         StageAddr st, int tid) {
  const long long stride = (long long)p.kv_heads * kD;
  const int n0 = n_block * kBN;
  const long long first = ((long long)(g.k_row + n0) * p.kv_heads + g.kv_head) * kD;
  load_tile_swz<kD, kBN, kThreads>(st.k, (const unsigned short*)p.k + first, stride, g.lk - n0,
                                   tid);
  load_tile_swz<kD, kBN, kThreads>(st.v, (const unsigned short*)p.v + first, stride, g.lk - n0,
                                   tid);
}

// Starts every load of a tile into its stage: Q, and the first key block
// it visits (the highest: the one that may need the tail or causal mask).
__device__ __forceinline__ void issue_tile(const KfAttnParams& p, const Geom& g, StageAddr st,
                                           int tid) {
  const long long q_stride = (long long)p.heads * kD;
  const unsigned short* qg = (const unsigned short*)p.q + ((long long)g.q_row * p.heads + g.h) * kD;
#pragma unroll
  for (int i = tid; i < kBM * kChunks; i += kThreads) {
    const int r = i / kChunks;
    const int c = i % kChunks;
    const bool ok = r < g.rows;
    cp_async16(st.q + swz(r, c), ok ? qg + r * q_stride + c * 8 : qg, ok);
  }
  if (g.n_blocks > 0) issue_kv(p, g, g.n_blocks - 1, st, tid);
}

// The online-softmax state of a thread's two rows (row0 and row0 + 8 of its warp).
struct RowState {
  float acc[kD / 8][4];
  float max[2];
  float sum[2];
};

// One key block of a tile: S = Q K^T, mask, online softmax, O += P V.
__device__ __forceinline__ void attend_block(const KfAttnParams& p, const Geom& g, int n_block,
                                             StageAddr st, int warp, int lane, RowState& rs) {
  const int gr = lane >> 2;  // row within the 8-row group
  const int tq = lane & 3;   // thread within the row quad
  const int n0 = n_block * kBN;

  float s[kBN / 8][4];
#pragma unroll
  for (int j = 0; j < kBN / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
  // Four k-steps at a time: fully unrolled, ptxas hoists the fragments of all
  // eight (D = 128) ahead and needs ~30 more registers for nothing (the loads
  // hit shared memory; the kernel waits on global memory, not on these).
#pragma unroll 4
  for (int kk = 0; kk < kD / 16; ++kk) {
    unsigned a[4];
    ldsm_x4(st.q + swz(warp * 16 + (lane & 15), 2 * kk + (lane >> 4)), a[0], a[1], a[2], a[3]);
#pragma unroll
    for (int j = 0; j < kBN / 8; j += 2) {
      unsigned b0, b1, b2, b3;
      ldsm_x4(st.k + swz(j * 8 + (lane & 7) + ((lane >> 4) << 3), 2 * kk + ((lane >> 3) & 1)),
              b0, b1, b2, b3);
      mma(s[j], a, b0, b1);
      mma(s[j + 1], a, b2, b3);
    }
  }

  // Keys past the sequence (zero-filled) and, causal, past each row's diagonal.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    int hi = g.lk;
    if (p.causal) {
      const int lim = warp * 16 + gr + 8 * r + g.diag + 1;
      hi = lim < 0 ? 0 : (lim > g.lk ? g.lk : lim);
    }
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) {
      const int key = n0 + j * 8 + 2 * tq;
      if (key >= hi) s[j][2 * r] = neg_inf();
      if (key + 1 >= hi) s[j][2 * r + 1] = neg_inf();
    }
  }

  online_softmax_block<kBN, kD>(s, rs.max, rs.sum, rs.acc, p.softmax_scale_log2);

  pv_mma<kBN, kD>(s, rs.acc, st.v, lane);
}

// Normalises the warp's 16 rows, writes their LSE, stages O in the warp's
// own Q rows (read by this warp alone) and writes the valid rows out.
__device__ __forceinline__ void store_rows(const KfAttnParams& p, const Geom& g, StageAddr st,
                                           unsigned char* smem, unsigned smem_base, int warp,
                                           int lane, RowState& rs) {
  const int gr = lane >> 2;
  const int tq = lane & 3;
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = quad_sum(rs.sum[r]);
    inv[r] = l > 0.f ? 1.f / l : 0.f;
    const int row = warp * 16 + gr + 8 * r;
    if (tq == 0 && row < g.rows) {
      p.lse[(long long)g.h * p.total_q + g.q_row + row] =
          l > 0.f ? rs.max[r] * p.softmax_scale + lg2(l) * 0.69314718055994531f : neg_inf();
    }
  }
  unsigned char* sq = smem + (st.q - smem_base);
  // Every lane of the warp is done reading its Q fragments (ldmatrix) before
  // any lane overwrites those rows; with no key block to visit nothing else
  // orders them.
  __syncwarp();
#pragma unroll
  for (int j = 0; j < kD / 8; ++j) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      *(unsigned*)(sq + swz(warp * 16 + gr + 8 * r, j) + tq * 4) =
          pack_bf16(rs.acc[j][2 * r] * inv[r], rs.acc[j][2 * r + 1] * inv[r]);
    }
  }
  const long long q_stride = (long long)p.heads * kD;
  unsigned short* og = (unsigned short*)p.o + ((long long)g.q_row * p.heads + g.h) * kD;
  __syncwarp();
#pragma unroll
  for (int i = lane; i < 16 * kChunks; i += 32) {
    const int row = warp * 16 + i / kChunks;
    const int c = i % kChunks;
    if (row < g.rows) {
      *(uint4*)(og + row * q_stride + c * 8) = *(const uint4*)(sq + swz(row, c));
    }
  }
}

// One tile, its first key block already in its stage: the rest of its key
// blocks (loaded here, one at a time), then the epilogue. The block count is
// the same in every thread, so the barriers of the extra blocks are uniform.
__device__ __forceinline__ void run_tile(const KfAttnParams& p, const Geom& g, StageAddr st,
                                         unsigned char* smem, unsigned smem_base, int tid) {
  const int warp = tid >> 5;
  const int lane = tid & 31;
  RowState rs;
#pragma unroll
  for (int j = 0; j < kD / 8; ++j) rs.acc[j][0] = rs.acc[j][1] = rs.acc[j][2] = rs.acc[j][3] = 0.f;
  rs.max[0] = rs.max[1] = neg_inf();
  rs.sum[0] = rs.sum[1] = 0.f;
  for (int n_block = g.n_blocks - 1; n_block >= 0; --n_block) {
    if (n_block != g.n_blocks - 1) {
      __syncthreads();  // every warp is done with the previous block's K/V
      issue_kv(p, g, n_block, st, tid);
      cp_commit();
      cp_wait<0>();  // (also waits for the next tiles' loads: this path is not the fast one)
      __syncthreads();
    }
    attend_block(p, g, n_block, st, warp, lane, rs);
  }
  store_rows(p, g, st, smem, smem_base, warp, lane, rs);
}

}  // namespace kfs

extern "C" __global__ void __launch_bounds__(kfs::kThreads, KF_MIN_BLOCKS)
    kf_attn_fwd(const __grid_constant__ KfAttnParams p) {
  using namespace kfs;
  extern __shared__ __align__(128) unsigned char smem[];
  // What each stage holds, for the threads that compute it (written by thread
  // 0 when the stage's loads are issued, read after the barrier that precedes
  // the compute; rewritten only after the next top-of-loop barrier).
  __shared__ Geom stage_tile[kStages];
  const int tid = threadIdx.x;
  if ((int)blockIdx.x >= p.num_tiles) return;
  const unsigned base = smem_u32(smem);

  TileFeed feed;
  feed.start(p);
  // Prologue: the first kStages - 1 tiles in flight, one cp.async group each.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    const Geom g = feed.take(p);
    if (g.valid) issue_tile(p, g, stage_addr(base, s), tid);
    if (tid == 0) stage_tile[s] = g;
    cp_commit();
  }

  for (int i = 0;; ++i) {
    const int s = i % kStages;
    const int refill = (i + kStages - 1) % kStages;  // the stage tile i - 1 used
    __syncthreads();  // every warp is done with stage `refill`
    {
      const Geom g = feed.take(p);
      if (g.valid) issue_tile(p, g, stage_addr(base, refill), tid);
      if (tid == 0) stage_tile[refill] = g;
      cp_commit();  // empty past the last tile: the group count stays one per tile
    }
    cp_wait<kStages - 1>();  // this thread's copies of tile i have landed
    __syncthreads();         // ... and every thread's; stage_tile[s] is visible
    const Geom g = stage_tile[s];
    if (!g.valid) break;  // the same in every thread
    run_tile(p, g, stage_addr(base, s), smem, base, tid);
  }
  cp_wait<0>();
}
