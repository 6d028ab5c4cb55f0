// Part of the Hopper templates (kernels/notes/parts.md): fwd_sm90's consumer
// mainloop steps, for one warpgroup's 64 query rows of a tile.
//
// Q (64 x D) comes in by cp.async from the warpgroup itself into swizzled
// smem (named barrier 1 + warpgroup). Per key block: S = Q K^T with wgmma SS
// (both K-major), masks only where needed (blocks run last-first, so only
// the first one or two are masked), the online softmax (softmax.cuh), P
// packed to bf16 in registers and O += P V with wgmma RS (V is the MN-major
// B operand). A stage is released (one arrival per warp) once the wgmma that
// read it has completed.
//
// The schedule that strings the steps together (fwd_sm90.cuh, consumer
// branch) overlaps inside the warpgroup: QK^T of block j and PV of block
// j - 1 are issued back to back and the softmax of block j runs while the PV
// is in flight:
//   qk(0) wait release_k(0) softmax(0) pack
//   for j >= 1: qk(j) pv(j-1) wait<1> release_k(j) softmax(j) wait<0>
//               release_v(j-1) rescale(O) pack
//   pv(last) wait release_v(last)
// It stays in the kernel body, and softmax() is an out-of-line function with
// reference parameters, because that is the shape the code had as lambdas:
// NVVM simplifies every function before inlining it, so wrapping the
// schedule in a function (or passing these values by value) changes the
// cubin (kernels/notes/parts.md, "Byte-identical cubins").
#include "kforge/attn_params.h"

namespace kfh {

template <int D, int BM, int BN, int S>
struct FwdConsumer {
  FwdSmem m;
  int lane;
  int cg;              // consumer warpgroup 0 / 1: rows 64 cg .. 64 cg + 63 of the tile
  int ctid;            // thread within the warpgroup
  u32 sQg;             // this warpgroup's Q tile
  float sl2;           // softmax scale * log2(e)
  long long ldq;       // Q / O global row stride (elements)
  u64 descQ0;
  int r_lo;            // this thread's rows within the 64: r_lo and r_lo + 8 ...
  int cq;              // ... and first column of each 8-column group

  __device__ __forceinline__ FwdConsumer(const KfAttnParams& p, const FwdSmem& smem, int tid,
                                         int wg, int warp, int lane_) {
    constexpr KfFwdSm90Layout L = kf_fwd_sm90_layout(D, BM, BN, S);
    m = smem;
    lane = lane_;
    cg = wg - 1;
    ctid = tid - 128 * wg;
    sQg = m.q + cg * L.q_wg_bytes;
    sl2 = p.softmax_scale_log2;
    ldq = (long long)p.heads * D;
    descQ0 = make_desc(sQg, 16, 1024);
    r_lo = 16 * warp + (lane >> 2);
    cq = 2 * (lane & 3);
  }

  // This warpgroup's 64 Q rows -> swizzled smem, visible to its wgmma.
  __device__ __forceinline__ void load_q(const KfAttnParams& p, const QueryTileGeom& g,
                                         const Tile& tile, int row0) const {
    issue_q(p, g, tile, row0);
    finish_q();
  }
  // The two halves of load_q: the copies, then the wait that makes them
  // visible to the warpgroup (packed tiles request Q early, between them).
  // qb: the Q buffer (QAHEAD=2 has two; every other setting one, qb = 0).
  __device__ __forceinline__ void issue_q(const KfAttnParams& p, const QueryTileGeom& g,
                                          const Tile& tile, int row0, int qb = 0) const {
    constexpr KfFwdSm90Layout L = kf_fwd_sm90_layout(D, BM, BN, S);
    const bf16* src = (const bf16*)p.q + ((long long)(g.q0 + row0) * p.heads + tile.h) * D;
    load_tile<D, 64, 128, 8>(sQg + qb * L.q_bytes, src, ldq, g.Lq - row0, ctid,
                             (const bf16*)p.q);
  }
  __device__ __forceinline__ void finish_q() const {
    cp_async_wait_all();
    fence_proxy_async();
    named_bar_sync(1 + cg, 128);
  }
  // QAHEAD=1: the next tile's Q, once this tile's last QK^T has completed in
  // this thread's warp. The barrier first: a thread's copies land in rows
  // that other warps' wgmma read, and each warp knows only its own wait.
  __device__ __forceinline__ void issue_q_next(const KfAttnParams& p, const QueryTileGeom& gn,
                                               const Tile& nxt) const {
    named_bar_sync(1 + cg, 128);
    issue_q(p, gn, nxt, gn.m0 + 64 * cg);
  }
  // Packed tiles (PACK=1), so that a tile's Q can be requested while the
  // tile before it finishes: issue_q plus the run's member offsets (tab_q /
  // tab_k: the tile's entries of cu_seqlens_q / _k, packed_rows.cuh), all by
  // cp.async; finish_q then waits for both.
  __device__ __forceinline__ void issue_q_packed(const KfAttnParams& p, const QueryTileGeom& g,
                                                 const Tile& tile, int row0, u32 tab_q,
                                                 u32 tab_k) const {
    issue_q(p, g, tile, row0);
    for (int j = ctid; j <= tile.pack; j += 128) {
      cp_async4(tab_q + 4 * j, p.cu_seqlens_q + tile.b + j);
      cp_async4(tab_k + 4 * j, p.cu_seqlens_k + tile.b + j);
    }
  }
  // S = Q K^T for item gi into s[] (issued, not waited for), Q from buffer qb
  __device__ __forceinline__ void issue_qk(float* s, int gi, int qb = 0) const {
    constexpr KfFwdSm90Layout L = kf_fwd_sm90_layout(D, BM, BN, S);
    const int stage = ring_stage<S>(gi);
    mbar_wait(m.full_k + 8 * stage, ring_phase<S>(gi));
    const u64 dK = make_desc(m.k + stage * L.kv_bytes, 16, 1024);
    const u64 dQ = descQ0 + (u64)(qb * (L.q_bytes / 16));
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const int panel = ks >> 2, kk = ks & 3;
      wgmma_ss<BN, 0>(s, dQ + (u64)(panel * (64 * 128 / 16) + 2 * kk),
                      dK + (u64)(panel * (BN * 128 / 16) + 2 * kk), ks > 0 ? 1 : 0);
    }
    wgmma_commit();
  }
  // O += P V for item gi (issued, not waited for)
  __device__ __forceinline__ void issue_pv(float* o, const u32* pr, int gi) const {
    constexpr KfFwdSm90Layout L = kf_fwd_sm90_layout(D, BM, BN, S);
    const int stage = ring_stage<S>(gi);
    mbar_wait(m.full_v + 8 * stage, ring_phase<S>(gi));
    const u64 dV = make_desc(m.v + stage * L.kv_bytes, BN * 128, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      wgmma_rs<D>(o, pr[4 * kk], pr[4 * kk + 1], pr[4 * kk + 2], pr[4 * kk + 3],
                  dV + (u64)(kk * (16 * 128 / 16)));
    }
    wgmma_commit();
  }
  // one arrival per warp on stage (gi % S) of an empty barrier
  __device__ __forceinline__ void release(u32 bar, int gi) const {
    if (lane == 0) mbar_arrive(bar + 8 * ring_stage<S>(gi));
  }
  // masks (causal bottom-right, sequence end) + online softmax of s[] for key
  // block j (off = Lk - Lq); sc_*: the factors that rescale O. Not forced
  // inline, references on purpose (see the top of this file).
  __device__ void softmax(const KfAttnParams& p, const QueryTileGeom& g, const int& row0,
                                          const int& off, int j, float* s, OnlineSoftmax& sm, float& sc_lo,
                                          float& sc_hi) const {
    const int n0 = (g.nb - 1 - j) * BN;
    const bool need_mask = (n0 + BN > g.Lk) || (p.causal && n0 + BN - 1 > row0 + off);
    if (need_mask) {
      const int lim_lo = p.causal ? min(g.Lk, row0 + r_lo + off + 1) : g.Lk;
      const int lim_hi = p.causal ? min(g.Lk, row0 + r_lo + 8 + off + 1) : g.Lk;
      mask_cols<BN>(s, n0, cq, lim_lo, lim_hi);
    }
    sm.update<BN>(s, sl2, sc_lo, sc_hi);
  }
  // P (probabilities in s[]) -> bf16x2 A fragments of the PV wgmma
  __device__ __forceinline__ static void pack_p(u32* pr, const float* s) {
#pragma unroll
    for (int i = 0; i < BN / 4; ++i) pr[i] = pack_bf16(s[2 * i], s[2 * i + 1]);
  }
};

}  // namespace kfh
