// kforge "fwd_sm90": Hopper (sm_90a) jagged flash-attention forward.
//
// Owner: sm90 engineer. Notes, versions and measurements: kernels/notes/sm90.md;
// the parts it is assembled from: kernels/notes/parts.md.
//
// This file is the kernel: knobs, roles and tile loops. The work is in the
// shared Hopper parts under templates/sm90/, which fwd_sm90.cc prepends (in
// this order, after the knob #defines) so that a variant stays one
// self-contained source:
//   ptx.cuh            mbarrier, cp.async, fences, wgmma sync, descriptor, tile copy
//   wgmma_ops.cuh      the wgmma instructions (generated)
//   layout.h           KfFwdSm90Layout: shared memory, also evaluated by fwd_sm90.cc
//   tile_scheduler.cuh per-tile grid / persistent static round-robin, tile geometry
//   packed_rows.cuh    the keys each row of a packed tile sees
//   softmax.cuh        online softmax on wgmma accumulators
//   fwd_ring.cuh       smem addresses and the K/V ring protocol
//   fwd_producer.cuh   producer mainloop (K/V ring fill)
//   fwd_consumer.cuh   consumer mainloop (Q load, QK^T, softmax, PV)
//   fwd_epilogue.cuh   O and LSE stores
//
// Structure (FA3-style warp specialisation, no TMA descriptors needed):
//   * 384 threads = 3 warpgroups. WG0 = producer (setmaxnreg.dec), WG1/WG2 =
//     consumers (setmaxnreg.inc), each consumer owns 64 query rows of the
//     128-row tile (KF_BLOCK_M = 128).
//   * The producer fills a KF_STAGES-deep K ring and V ring (fwd_producer.cuh);
//     the consumers run QK^T / softmax / PV over them (fwd_consumer.cuh) and
//     store O and LSE (fwd_epilogue.cuh).
//   * KV blocks are visited from the last (masked) one down to block 0, so
//     only the first one or two iterations need masks.
//   * Scheduling (tile_scheduler.cuh): KF_PERSISTENT=0 -> grid
//     (ceil(max_seqlen_q/128), heads, batch), empty tiles exit. KF_PERSISTENT=1
//     -> grid = min(num_tiles, SMs) and CTA c takes tiles c, c+grid, ... of
//     p.tiles (host LPT order), a static round-robin (p.tile_counter unused).
//
//   * KF_ORDER=1 (persistent): the host deals the tiles to the CTAs itself,
//     longest first to the least loaded (tile_order "balanced"), so that a
//     CTA holding a long tile takes no short ones after it; a stop entry
//     ends each CTA's list.
//   * KF_PACK=1 (persistent, BLOCK_N >= 128): runs of short sequences come
//     as one tile (manifest pack_short); each row sees its own sequence's
//     keys only (sm90/packed_rows.cuh), one key block per tile.
//
// Knobs (prepended #defines): KF_HEAD_DIM (64|128), KF_BLOCK_N (64..192, /16),
// KF_STAGES (2|3|4), KF_PERSISTENT (0|1), KF_ORDER (0|1|2; 2: the host's list
// grouped by (sequence, head), walked like 0's), KF_PACK (0|1),
// KF_PRODUCER_REGS (24|32|40|56).
// Entry point: extern "C" __global__ kf_attn_fwd(const __grid_constant__ KfAttnParams p).
// Needs sm_90a (wgmma, setmaxnreg). No toolkit headers.
#include "kforge/attn_params.h"

#ifndef KF_HEAD_DIM
#define KF_HEAD_DIM 128
#endif
#ifndef KF_BLOCK_M
#define KF_BLOCK_M 128
#endif
#ifndef KF_BLOCK_N
#define KF_BLOCK_N 128
#endif
#ifndef KF_STAGES
#define KF_STAGES 2
#endif
#ifndef KF_PERSISTENT
#define KF_PERSISTENT 1
#endif
#ifndef KF_PRODUCER_REGS
#define KF_PRODUCER_REGS 40
#endif
#ifndef KF_ORDER
#define KF_ORDER 0
#endif
#ifndef KF_PACK
#define KF_PACK 0
#endif
// KF_QAHEAD = 1 (persistent): a plain tile requests the next tile's Q as soon
// as its last QK^T has read its own, so that the load flies during the
// tile's last softmax, PV and O stores. Tiles of one or two key blocks
// (long queries over short keys) otherwise spend most of their time waiting
// for their Q (kernels/notes/sm90.md, QAHEAD).
// KF_QAHEAD = 2 (persistent, not packed): two Q buffers; the next tile's Q is
// requested at the top of this one, and the next tile's first QK^T is issued
// before this tile's last PV, its softmax running while that PV is in
// flight: the boundary between two tiles becomes one more mainloop step,
// and only the epilogue is left outside the overlap (notes/sm90.md, XTILE).
#ifndef KF_QAHEAD
#define KF_QAHEAD 0
#endif
#define KF_CONSUMER_REGS (((504 - KF_PRODUCER_REGS) / 2) / 8 * 8)

#if KF_BLOCK_M != 128
#error "fwd_sm90: KF_BLOCK_M must be 128 (two consumer warpgroups of 64 rows)"
#endif
#if (KF_HEAD_DIM != 64) && (KF_HEAD_DIM != 128)
#error "fwd_sm90: KF_HEAD_DIM must be 64 or 128"
#endif
#if (KF_BLOCK_N % 16) != 0 || KF_BLOCK_N < 64 || KF_BLOCK_N > 192
#error "fwd_sm90: KF_BLOCK_N must be a multiple of 16 in [64, 192]"
#endif

#if KF_PACK && (!KF_PERSISTENT || KF_BLOCK_N < 128)
#error "fwd_sm90: KF_PACK needs the persistent grid and KF_BLOCK_N >= 128 (one key block a packed tile)"
#endif
#if KF_ORDER && !KF_PERSISTENT
#error "fwd_sm90: KF_ORDER (a host-ordered list) needs the persistent grid"
#endif
#if KF_QAHEAD && !KF_PERSISTENT
#error "fwd_sm90: KF_QAHEAD (the next tile's Q early) needs the persistent grid"
#endif
#if KF_QAHEAD == 2 && KF_PACK
#error "fwd_sm90: KF_QAHEAD=2 (tiles chained) is for plain tiles, not with KF_PACK"
#endif
#define KF9_QBUFS (KF_QAHEAD == 2 ? 2 : 1)
// The consumers look one tile ahead (the next tile's entry and geometry).
#define KF9_AHEAD (KF_PACK || KF_QAHEAD)
#define KF9_NEXT_TILE next_tile<KF_PERSISTENT != 0, KF_ORDER == 1, KF_PACK == 1>
#define KF9_TILE_GEOM query_tile_geom<BM, BN, KF_PACK == 1>

// (launch bounds through a macro: kernels/check.cc's entry regex stops at '(')
#define KF_LAUNCH_BOUNDS __launch_bounds__(384, 1)
extern "C" __global__ void KF_LAUNCH_BOUNDS kf_attn_fwd(const __grid_constant__ KfAttnParams p) {
  using namespace kfh;
  constexpr int D = KF_HEAD_DIM, BM = KF_BLOCK_M, BN = KF_BLOCK_N, S = KF_STAGES;
  constexpr KfFwdSm90Layout L = kf_fwd_sm90_layout(D, BM, BN, S, KF_PACK, KF9_QBUFS);
  static_assert(L.dynamic_bytes <= 232448, "fwd_sm90: shared memory over sm_90a's limit");
  static_assert(L.q % 1024 == 0 && L.q_wg_bytes % 1024 == 0 && L.k % 1024 == 0 &&
                    L.v % 1024 == 0 && L.kv_bytes % 1024 == 0,
                "fwd_sm90: swizzled tiles must be 1024-byte aligned");
  extern __shared__ __align__(1024) unsigned char kf_smem_raw[];
  const FwdSmem smem = fwd_smem<D, BM, BN, S, KF9_QBUFS>((smem_u32(kf_smem_raw) + 1023u) & ~1023u);

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int warp = (tid / 32) & 3;  // warp within warpgroup
  const int lane = tid & 31;

  if (tid == 0) fwd_ring_init<S>(smem);
  __syncthreads();

  if (wg == 0) {
    // ------------------------------------------------------------ producer
    setmaxnreg_dec<KF_PRODUCER_REGS>();
    const FwdProducer<D, BM, BN, S> producer(p, smem, warp);
    int it = 0;  // global item index of the tile's first item
    Tile tile;
    for (int t = 0; KF9_NEXT_TILE(p, t, tile); ++t) {
      QueryTileGeom g;
      KF9_TILE_GEOM(p, tile, g);
      producer.load(p, g, it, lane);
      it += g.nb;
    }
    return;
  }

  // -------------------------------------------------------------- consumers
  setmaxnreg_inc<KF_CONSUMER_REGS>();
  const FwdConsumer<D, BM, BN, S> consumer(p, smem, tid, wg, warp, lane);
  int it = 0;
  Tile tile;
#if KF_QAHEAD == 2
  // Tiles chained (see KF_QAHEAD above). The Q buffer alternates with every
  // tile that has keys. A tile that is `chained` into starts with its Q in,
  // its first QK^T done, softmaxed into sm and packed into pr, and o zeroed.
  // Buffer safety: the next tile's Q goes into the buffer of the tile before
  // this one once finish_q's warpgroup barrier (at this tile's top, or in the
  // tail of the tile before) has passed, and every warp reaches that barrier
  // only after its wait for that tile's last QK^T.
  Tile nxt;
  QueryTileGeom gn;
  bool more = KF9_NEXT_TILE(p, 0, nxt);
  if (more) KF9_TILE_GEOM(p, nxt, gn);
  int qb = 0;
  bool chained = false;
  float o[D / 2];
  float s[BN / 2];  // S, then P (fp32)
  u32 pr[BN / 4];   // P as bf16x2 A fragments
  OnlineSoftmax sm;
  for (int t = 1; more; ++t) {
    tile = nxt;
    const QueryTileGeom g = gn;
    more = KF9_NEXT_TILE(p, t, nxt);
    if (more) KF9_TILE_GEOM(p, nxt, gn);
    const int row0 = g.m0 + 64 * consumer.cg;
    const int off = g.Lk - g.Lq;
    if (g.m0 >= g.Lq) continue;  // (never chained into: see `chain`)
    // whether the next tile's first QK^T goes in before this tile's last PV
    const bool chain = g.nb > 0 && more && gn.nb > 0 && gn.m0 < gn.Lq;
    if (!chained) {
#pragma unroll
      for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
      sm.init();
    }
    if (g.nb > 0) {
      if (!chained) {
        consumer.issue_q(p, g, tile, row0, qb);
        consumer.finish_q();
      }
      if (chain) consumer.issue_q(p, gn, nxt, gn.m0 + 64 * consumer.cg, qb ^ 1);
      if (!chained) {
        consumer.issue_qk(s, it, qb);
        wgmma_wait<0>();
        reg_fence<BN / 2>(s);
        consumer.release(smem.empty_k, it);
        float sc_lo, sc_hi;
        consumer.softmax(p, g, row0, off, 0, s, sm, sc_lo, sc_hi);
        consumer.pack_p(pr, s);
      }
      for (int j = 1; j < g.nb; ++j) {
        const int gi = it + j;
        consumer.issue_qk(s, gi, qb);
        consumer.issue_pv(o, pr, gi - 1);
        wgmma_wait<1>();
        reg_fence<BN / 2>(s);
        consumer.release(smem.empty_k, gi);
        float sc_lo, sc_hi;
        consumer.softmax(p, g, row0, off, j, s, sm, sc_lo, sc_hi);
        wgmma_wait<0>();
        reg_fence<D / 2>(o);
        consumer.release(smem.empty_v, gi - 1);
        OnlineSoftmax::rescale<D>(o, sc_lo, sc_hi);
        consumer.pack_p(pr, s);
      }
      const int last = it + g.nb - 1;
      it += g.nb;
      if (chain) {
        // the next tile's Q has landed, and every warp is past this tile's QK^Ts
        consumer.finish_q();
        consumer.issue_qk(s, it, qb ^ 1);
        consumer.issue_pv(o, pr, last);
        wgmma_wait<1>();
        reg_fence<BN / 2>(s);
        consumer.release(smem.empty_k, it);
        OnlineSoftmax smn;
        smn.init();
        {
          const int row0n = gn.m0 + 64 * consumer.cg;
          const int offn = gn.Lk - gn.Lq;
          float sc_lo, sc_hi;
          consumer.softmax(p, gn, row0n, offn, 0, s, smn, sc_lo, sc_hi);
        }
        wgmma_wait<0>();
        reg_fence<D / 2>(o);
        consumer.release(smem.empty_v, last);
        fwd_epilogue<D>(p, g, tile, row0, consumer.r_lo, consumer.cq, lane, consumer.sl2, o, sm);
#pragma unroll
        for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
        sm = smn;
        consumer.pack_p(pr, s);
        chained = true;
      } else {
        consumer.issue_pv(o, pr, last);
        wgmma_wait<0>();
        reg_fence<D / 2>(o);
        consumer.release(smem.empty_v, last);
        fwd_epilogue<D>(p, g, tile, row0, consumer.r_lo, consumer.cq, lane, consumer.sl2, o, sm);
        chained = false;
      }
      qb ^= 1;
    } else {
      // rows without keys: O = 0, LSE = -inf
      fwd_epilogue<D>(p, g, tile, row0, consumer.r_lo, consumer.cq, lane, consumer.sl2, o, sm);
      chained = false;
    }
  }
#else
#if KF9_AHEAD
#if KF_PACK
  // One tile ahead: the next tile's entry and offsets are read at the top of
  // this one, and when both are packed the next one's Q and member table are
  // requested as soon as this one's QK^T has read Q (a tiny tile's time is
  // mostly these latencies). The tables alternate between two buffers per
  // warpgroup: one is searched while the other fills.
  constexpr int E = kf_fwd_sm90_pack_entries();
  const u32 tabs =
      ((smem_u32(kf_smem_raw) + 1023u) & ~1023u) + L.tabs + consumer.cg * 2 * 2 * E * 4;
  const int* tabs_ptr = (const int*)(kf_smem_raw + (tabs - smem_u32(kf_smem_raw)));
#endif
  Tile nxt;
  QueryTileGeom gn;
  bool more = KF9_NEXT_TILE(p, 0, nxt);
  if (more) KF9_TILE_GEOM(p, nxt, gn);
  bool q_early = false;  // the next tile's Q (and table) are in flight
#if KF_PACK
  int tb = 0;            // the table buffer of the next packed tile
#endif
  for (int t = 1; more; ++t) {
    tile = nxt;
    const QueryTileGeom g = gn;
    const bool q_here = q_early;
    q_early = false;
    more = KF9_NEXT_TILE(p, t, nxt);
    if (more) KF9_TILE_GEOM(p, nxt, gn);
#else
  for (int t = 0; KF9_NEXT_TILE(p, t, tile); ++t) {
    QueryTileGeom g;
    KF9_TILE_GEOM(p, tile, g);
#endif
    const int row0 = g.m0 + 64 * consumer.cg;  // first tile row (sequence-local) of this warpgroup
    const int off = g.Lk - g.Lq;
    if (g.m0 >= g.Lq) continue;  // empty tile (per-tile grid); nb == 0 too

    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
    OnlineSoftmax sm;
    sm.init();
#if KF_PACK
    if (tile.pack > 0) {
      // A packed run: its keys are one block (BLOCK_N >= 128 >= the run's
      // keys, nb <= 1), every score masked by its row's window.
      if (g.nb > 0) {
        const u32 tq = tabs + tb * 2 * E * 4;
        if (!q_here) consumer.issue_q_packed(p, g, tile, row0, tq, tq + E * 4);
        consumer.finish_q();
        const int* tab_q = tabs_ptr + tb * 2 * E;
        const int w_lo = packed_row_window(p.causal != 0, tile.pack, row0 + consumer.r_lo, tab_q,
                                           tab_q + E);
        const int w_hi = packed_row_window(p.causal != 0, tile.pack, row0 + consumer.r_lo + 8,
                                           tab_q, tab_q + E);
        tb ^= 1;
        float s[BN / 2];
        u32 pr[BN / 4];
        consumer.issue_qk(s, it);
        wgmma_wait<0>();
        reg_fence<BN / 2>(s);
        consumer.release(smem.empty_k, it);
        // Q has been read: the next packed tile's Q and table may come in.
        if (more && nxt.pack > 0 && gn.nb > 0) {
          const u32 nq = tabs + tb * 2 * E * 4;
          consumer.issue_q_packed(p, gn, nxt, gn.m0 + 64 * consumer.cg, nq, nq + E * 4);
          q_early = true;
        }
        mask_window<BN>(s, 0, consumer.cq, w_lo, w_hi);
        float sc_lo, sc_hi;
        sm.update<BN>(s, consumer.sl2, sc_lo, sc_hi);
        consumer.pack_p(pr, s);
        consumer.issue_pv(o, pr, it);
        wgmma_wait<0>();
        reg_fence<D / 2>(o);
        consumer.release(smem.empty_v, it);
        it += g.nb;
      }
      fwd_epilogue<D>(p, g, tile, row0, consumer.r_lo, consumer.cq, lane, consumer.sl2, o, sm);
      continue;
    }
#endif
    if (g.nb > 0) {
      // the consumer mainloop (steps and schedule: sm90/fwd_consumer.cuh)
#if KF_QAHEAD
      if (!q_here) consumer.issue_q(p, g, tile, row0);
      consumer.finish_q();
      // The next tile's Q may come in once this tile's last QK^T is done:
      // a plain tile with keys (a packed one requests its table with it).
      const bool q_next = more && !(KF_PACK && nxt.pack > 0) && gn.nb > 0;
#else
      consumer.load_q(p, g, tile, row0);
#endif
      float s[BN / 2];  // S, then P (fp32)
      u32 pr[BN / 4];   // P as bf16x2 A fragments
      // ---- first block
      consumer.issue_qk(s, it);
      wgmma_wait<0>();
      reg_fence<BN / 2>(s);
      consumer.release(smem.empty_k, it);
#if KF_QAHEAD
      if (g.nb == 1 && q_next) {
        consumer.issue_q_next(p, gn, nxt);
        q_early = true;
      }
#endif
      {
        float sc_lo, sc_hi;
        consumer.softmax(p, g, row0, off, 0, s, sm, sc_lo, sc_hi);
      }
      consumer.pack_p(pr, s);
      // ---- main loop
      for (int j = 1; j < g.nb; ++j) {
        const int gi = it + j;
        consumer.issue_qk(s, gi);
        consumer.issue_pv(o, pr, gi - 1);
        wgmma_wait<1>();
        reg_fence<BN / 2>(s);
        consumer.release(smem.empty_k, gi);
#if KF_QAHEAD
        if (j == g.nb - 1 && q_next) {
          consumer.issue_q_next(p, gn, nxt);
          q_early = true;
        }
#endif
        float sc_lo, sc_hi;
        consumer.softmax(p, g, row0, off, j, s, sm, sc_lo, sc_hi);
        wgmma_wait<0>();
        reg_fence<D / 2>(o);
        consumer.release(smem.empty_v, gi - 1);
        OnlineSoftmax::rescale<D>(o, sc_lo, sc_hi);
        consumer.pack_p(pr, s);
      }
      consumer.issue_pv(o, pr, it + g.nb - 1);
      wgmma_wait<0>();
      reg_fence<D / 2>(o);
      consumer.release(smem.empty_v, it + g.nb - 1);
      it += g.nb;
    }
    fwd_epilogue<D>(p, g, tile, row0, consumer.r_lo, consumer.cq, lane, consumer.sl2, o, sm);
  }
#endif  // KF_QAHEAD == 2
}
