// kforge "bwd_sm90": Hopper (sm_90a) jagged flash-attention backward, one launch.
//
// Notes, versions and measurements: kernels/notes/bwd.md (v1 .. v12).
// The backward contract (key-major tile list, dq_accum, delta, the dq
// counters in the workspace) is bwd_mma's: kernels/CONTRACT.md "Backward".
//
// Structure (FA3-style warp specialisation; Q and dO by TMA with KF_TMA):
//   * 384 threads = 3 warpgroups. A CTA takes key-major tiles
//     {b, kv head g, n_block, qbase} from p.tiles: its first is blockIdx.x
//     (KF_HELP: from the counter too), then the producer's thread 0 takes
//     the next from p.tile_counter and
//     passes each index to the consumers through two smem slots (tile_full /
//     tile_empty mbarriers), so a CTA that drew light tiles takes more.
//   * WG0, the producer (setmaxnreg.dec): per step (one query head of the
//     group x one query block of BLOCK_M rows that sees a key of the block)
//     it fills a stage of a KF_STAGES ring (full / empty mbarriers) with Q
//     and dO (KF_TMA: a whole query block by TMA, completing on the stage's
//     land barrier; a tail block, or KF_TMA 0, by cp.async with the rows past
//     the sequence zero-filled), LSE * log2(e)
//     (+inf where P must be 0) and delta = rowsum(dO * O): the first key
//     block to visit a query block claims it in the block's workspace
//     counter, computes delta (O staged in smem like dO, one round trip)
//     and publishes it in p.delta; the others read it. Per tile it loads
//     the key block's K and V (BLOCK_N = 128 rows) once into 128B-swizzled smem (kv_full / kv_empty), after the tile's
//     first stage is issued, so those loads fly while it waits for the
//     consumers to finish the previous tile.
//   * WG1 / WG2, the consumers (setmaxnreg.inc): consumer w owns keys
//     64w .. 64w+63 of the block and keeps their dK and dV (64 x D fp32) in
//     registers over the whole tile. Per step, with wgmma:
//        S^T  = K_w Q^T     (SS, M = 64 keys, N = BLOCK_M queries, K = D)
//        dP^T = V_w dO^T    (SS, its own group: P^T is computed while it runs)
//        P^T  = exp2(S^T * scale_log2 - LSE_2), dS^T = P^T (dP^T - delta),
//               masked only on tail / diagonal blocks
//        dV  += P^T dO      (RS: P^T packed to bf16 from the accumulators;
//                            dO is the MN-major B operand, trans-b = 1)
//        dK  += dS^T Q      (RS, likewise)
//        dS^T is also stored (bf16, 16-bit stores) as dS = [query][key] in a
//        K-major 128B-swizzled tile (double-buffered), fence.proxy.async,
//        consumer barrier; then a 64 x 64 slice of dQ = dS K per consumer
//        (SS, K the MN-major B operand), staged in smem and added into
//        dq_accum by one bulk reduce-add (cp.reduce.async.bulk) per slice:
//          BLOCK_M = 128 (D = 64): consumer w takes query rows 64w.., all keys;
//          BLOCK_M = 64, D = 128:  consumer w takes head dims 64w.., all keys;
//          BLOCK_M = 64, D = 64:   consumer w adds its own 64 keys' share.
//   * dQ conversion: after the last query block of a head, the consumers
//     bump the workspace counter of each of the head's visited query blocks
//     (one fence); the key block that completes a count (TileKeyBlocks)
//     converts those dq_accum rows to bf16 dQ. Query blocks that see no key
//     have tiles of their own (n_block < 0) that write dQ = 0.
//   * Packed runs (manifest pack_short, tiles {b, g, 0, -n}): n consecutive
//     short sequences share one key block and are run as one sequence; the
//     consumers build each row's window of its own sequence's keys once per
//     tile, and mask every element by it. Nothing else visits their rows,
//     so delta is computed and kept, and dQ is converted without counting.
//
// Knobs (prepended #defines): KF_HEAD_DIM (64|128), KF_BLOCK_M (64|128; 128
// only with D = 64), KF_BLOCK_N (128), KF_STAGES (1|2; the space has 2),
// KF_ORDER, KF_SPLIT, KF_DQ_DIRECT, KF_CSKIP, KF_TMA, KF_KVFIRST, KF_DQW, KF_DQZ,
// KF_HELP, KF_KVSTORE, KF_DET (below).
// The shared-memory layout is kf_bwd_sm90_layout()
// (templates/bwd_sm90_layout.h, prepended).
// Entry point: extern "C" __global__ kf_attn_bwd(const __grid_constant__ KfAttnParams p),
// with KF_TMA a second parameter, the tensor maps of q and dout
// (kernels/CONTRACT.md "Tensor maps").
#include "kforge/attn_params.h"

#ifndef KF_HEAD_DIM
#define KF_HEAD_DIM 128
#endif
#ifndef KF_BLOCK_M
#define KF_BLOCK_M 64
#endif
#ifndef KF_BLOCK_N
#define KF_BLOCK_N 128
#endif
#ifndef KF_STAGES
#define KF_STAGES 2
#endif
// Every consumer thread arrives on the "empty" barriers of a stage and of the
// K/V tiles: an arrive releases only its own thread's earlier reads (PTX
// memory model), so one elected lane per warp would leave the other lanes'
// LSE/delta reads unordered before the producer's refill. racecheck on the
// H200 flagged exactly that form (v1, notes/bwd.md) and passes this one.
#define KF9_EMPTY_ARRIVALS 256
// Tile order and visiting order (notes/bwd.md, v4, v5): 0 = the tile list
// longest first, each key block visits its query blocks in order; 1 = the
// host groups the key blocks of a (sequence, kv head) together (manifest
// tile_order "grouped") so that they run side by side and share Q, dO and
// dq_accum rows in L2, and without a causal mask key block n starts at query
// block n * BLOCK_N / BLOCK_M (its diagonal) and wraps around, so the key
// blocks running together are at different query blocks (their first
// visits, which compute delta, and their dq_accum adds do not collide).
#ifndef KF_ORDER
#define KF_ORDER 1
#endif
// KF_SPLIT = 1 (with ORDER = 1): the host may split the heaviest key tiles
// in two halves by steps (manifest split_slot_bytes; SplitHeavyKeyTiles in
// kernels/schedule.h): each half runs on its own CTA, and the half that
// finishes second adds the other's fp32 dK/dV partial before storing them.
#ifndef KF_SPLIT
#define KF_SPLIT 0
#endif
// KF_DQ_DIRECT = 1: where a tile's keys fit its one key block (T.lk <=
// BLOCK_N: a sequence of at most BLOCK_N keys, or a packed run), no other key
// block adds into its query blocks, so each step's dQ slice is the whole sum:
// it is stored as bf16 straight from the staging buffer, with no bulk
// reduce-add into dq_accum, no counting and no conversion at the head's end,
// and the producer computes delta without claiming or publishing it
// (long queries over short keys: notes/bwd.md v9). A knob, not the default
// everywhere: a branch of this kind in the step loop cost the plain shapes
// 10-13% when ptxas rescheduled the loop (v8).
#ifndef KF_DQ_DIRECT
#define KF_DQ_DIRECT 0
#endif
// KF_CSKIP = 1: consumer 1 skips a step whose 64 keys are all masked (past
// the sequence, in a tail key block of at most 64 keys, or under a causal
// mask after the step's last query: the diagonal step of every key block).
// Its S^T, dP^T, dV and dK wgmmas and the dS math are left out, and both
// consumers' dQ leave out its 64 keys (a zero half of dS): the tensor cores,
// which the two warpgroups share, then run consumer 0's alone. Consumer 0
// always has a visible key in a visited step (the tile's first visited query
// block sees key n0). Not for packed runs (their windows mask per row).
#ifndef KF_CSKIP
#define KF_CSKIP 0
#endif
// KF_TMA = 1: a step's Q and dO tiles come by TMA (two boxes each at D =
// 128) through the maps the host passes as the second kernel parameter
// (manifest tensor_maps q, dout; CONTRACT.md "Tensor maps"), issued by one
// producer thread and completing on the stage's land barrier, instead of
// 16 cp.async a producer thread. A tail block (rows past the sequence, which
// TMA would fill from the next sequence) keeps the cp.async copy and its
// zero fill, so every tile the consumers read is what it was. (The producer
// on 24 registers and the consumers on 240 measured 0.87-0.99x of this: the
// producer spills, the consumers spill nothing at 232; notes/bwd.md v10.)
#ifndef KF_TMA
#define KF_TMA 0
#endif
// KF_KVFIRST = 1: a tile's K and V are issued right after its first stage's
// Q and dO, before that stage's LSE / delta work (the claim, and for a first
// visit O and the dot products), so those round trips overlap the K/V load
// instead of preceding it. Tiles of one or two steps (heavy-tailed batches
// of short sequences: powerlaw_short 1.007-1.023x) gain; where tiles are
// long it cost 0.5-2.4% (notes/bwd.md v11).
#ifndef KF_KVFIRST
#define KF_KVFIRST 0
#endif
// KF_DQW = 1: dq_accum needs no zeroing (manifest zero_dq_accum false). The
// key block that claims a query block (the delta claim, its first visit)
// stores its dQ slices there with a bulk copy instead of adding them, and
// each consumer w raises bit kDqReady << w of the block's workspace int once
// its copy is complete (while its next step's S^T and dP^T run, or at its
// head's end); a later visitor adds only after it sees that bit (the
// producer's claim returns it, else the consumer reads the int again before
// its add). Every dq_accum element a variant reads was first written by its
// claimer, so the host's 1 GB memset (238 us of hstu_prod_causal's 12.7 ms,
// notes/bwd.md v11) goes. Not with BLOCK_M 64 at head dim 64, where both
// consumers add into the same slice. The default only for SPLIT=1's class:
// 1.065x on powerlaw_short, 4-12% slower on the long shapes (v12).
#ifndef KF_DQW
#define KF_DQW 0
#endif
// KF_DQZ = 1 (manifest restores_dq_accum): the key block that converts a
// query block's dq_accum rows to dQ zeroes them again, so every element is
// zero when the kernel completes, as the host gave it, and the host zeroes
// dq_accum once per scratch instead of before every launch (the 1 GB memset
// of hstu_prod_causal, 2-3% of its time). The zeros go out with the
// conversion's stores, while other CTAs compute (notes/bwd.md v13). Not with
// DQW, which needs no zeroing at all.
#ifndef KF_DQZ
#define KF_DQZ 0
#endif
#if (KF_DQZ != 0) && (KF_DQZ != 1)
#error "bwd_sm90: KF_DQZ must be 0 or 1"
#endif
// KF_HELP = 1 (manifest fixed workspace bytes: the help queue,
// kf_bwd_sm90_help_bytes): once every tile has been handed out, a head's end
// queues the query blocks it completed (three to an item) instead of
// converting them itself, and a CTA left without tiles takes items from the
// queue and converts them until every tile is finished and the queue is
// empty. With the grouped order the key blocks of a head end together and
// the last one completes every count: alone it converted the head's blocks
// one round trip at a time while the SMs its siblings left sat idle, the
// launch's tail (notes/bwd.md v15, v16).
#ifndef KF_HELP
#define KF_HELP 0
#endif
// KF_HELP = 2: as 1, and a head's end that completed KF9_HELP_MANY blocks or
// more queues them even while tiles are left (they wait for the first CTA
// without tiles): in a heavy-tailed batch the long sequence's tiles end
// while short ones are still handed out, and the last key block of each of
// its heads then converted the head's blocks one round trip each after
// every other CTA was done (notes/bwd.md v17).
#if (KF_HELP != 0) && (KF_HELP != 1) && (KF_HELP != 2)
#error "bwd_sm90: KF_HELP must be 0, 1 or 2"
#endif
// KF_KVSTORE = 1 (with KF_TMA; manifest tensor maps dk, dv after q, dout): a
// consumer whose 64 keys all lie in the sequence stages its dK and dV as
// 128B-swizzled panels and one thread stores them by TMA, where otherwise
// every thread copies its rows from the staging buffer to global memory,
// 16 bytes a store (the tile's end, on the consumers' path: ~2 us of a
// long tile, ~3.5 of a packed run's 17, notes/bwd.md v15, v17). A half
// with keys past the sequence keeps the copy: a box past the end would
// overwrite the next sequence's rows.
#ifndef KF_KVSTORE
#define KF_KVSTORE 0
#endif
#if (KF_KVSTORE != 0) && (KF_KVSTORE != 1)
#error "bwd_sm90: KF_KVSTORE must be 0 or 1"
#endif
#if KF_KVSTORE && !KF_TMA
#error "bwd_sm90: KF_KVSTORE stores through the tensor maps KF_TMA passes"
#endif
#if KF_DQZ && KF_DQW
#error "bwd_sm90: KF_DQZ restores the zeros KF_DQW does not need"
#endif
// KF_DET = 1 (manifest deterministic): dQ bitwise the same in every launch.
// The key blocks of a sequence add their dQ slices into query block m of head
// h last key block first: key block j adds only after key blocks j+1..J(m)
// have added theirs (J(m) the last one that sees m: the key blocks that see m
// are a prefix 0..J(m) under both masks, kfh::key_blocks_into), so each
// dq_accum element is summed in one order. Key block j waits until 2 (J(m) -
// j) consumer adds into (m, h) are complete (two consumers a key block, each
// its own slice: their order between them does not matter). Last first, not
// first first: under a causal mask key block j + 1 reaches query block m two
// steps after key block j (its first query block is two further on), so
// started together, as the grouped list starts them, no key block waits for
// the one after it; in key order j would need j - 1 a few steps ahead of it
// all the way (notes/bwd.md v23). Each add is published, once its bulk group
// is complete, by a release add into the count field of (m, h)'s counter
// word (kDetAdd), while the next step's S^T and dP^T run, or at the head's
// end. Free of deadlock because every tile is drawn from the tile counter
// (a tile is only held by a CTA that runs, even with other kernels on the
// GPU) and the host's "levels" list puts key block j + 1 of a (sequence, kv
// head) before key block j: every wait is for a tile drawn earlier, which
// waits only for tiles drawn earlier still. Not with SPLIT (a half's steps
// of one key block on two CTAs), DQW (its first visitor copies instead of
// adding) or BLOCK_M 64 at head dim 64 (both consumers add into one slice).
// Design and costs: notes/bwd.md "Determinism", v21, v23.
#ifndef KF_DET
#define KF_DET 0
#endif
#if (KF_DET != 0) && (KF_DET != 1)
#error "bwd_sm90: KF_DET must be 0 or 1"
#endif
#if KF_DET && (KF_SPLIT || KF_DQW)
#error "bwd_sm90: KF_DET orders whole key blocks' adds (not with KF_SPLIT or KF_DQW)"
#endif
#if KF_DET && (KF_BLOCK_M == 64) && (KF_HEAD_DIM == 64)
#error "bwd_sm90: KF_DET needs each consumer's own dQ slice (BLOCK_M 128 at D = 64)"
#endif
#ifndef KF_PRODUCER_REGS
#define KF_PRODUCER_REGS 40
#endif
#define KF_CONSUMER_REGS (((504 - KF_PRODUCER_REGS) / 2) / 8 * 8)

#if (KF_HEAD_DIM != 64) && (KF_HEAD_DIM != 128)
#error "bwd_sm90: KF_HEAD_DIM must be 64 or 128"
#endif
#if KF_BLOCK_N != 128
#error "bwd_sm90: KF_BLOCK_N must be 128 (two consumer warpgroups of 64 keys)"
#endif
#if (KF_BLOCK_M != 64) && (KF_BLOCK_M != 128)
#error "bwd_sm90: KF_BLOCK_M must be 64 or 128"
#endif
#if (KF_BLOCK_M == 128) && (KF_HEAD_DIM == 128)
#error "bwd_sm90: BLOCK_M 128 with head dim 128 needs 256 accumulator registers per thread"
#endif
#if (KF_STAGES < 1) || (KF_STAGES > 2)
#error "bwd_sm90: KF_STAGES must be 1 or 2"
#endif
#if (KF_ORDER != 0) && (KF_ORDER != 1)
#error "bwd_sm90: KF_ORDER must be 0 or 1"
#endif
#if KF_DQ_DIRECT && (KF_BLOCK_M == 64) && (KF_HEAD_DIM == 64)
#error "bwd_sm90: KF_DQ_DIRECT needs a dQ slice summed over all keys (BLOCK_M 128 at D = 64)"
#endif
#if (KF_TMA != 0) && (KF_TMA != 1)
#error "bwd_sm90: KF_TMA must be 0 or 1"
#endif
#if (KF_KVFIRST != 0) && (KF_KVFIRST != 1)
#error "bwd_sm90: KF_KVFIRST must be 0 or 1"
#endif
// CSKIP as compiled: not with BLOCK_M 64 at head dim 64, where each consumer
// adds its own keys' dQ share and a skipped one's zeros, a divergent path,
// made ptxas serialise every wgmma (C7520, notes/bwd.md v11).
#define KF9_CSKIP (KF_CSKIP && !(KF_BLOCK_M == 64 && KF_HEAD_DIM == 64))
#if (KF_DQW != 0) && (KF_DQW != 1)
#error "bwd_sm90: KF_DQW must be 0 or 1"
#endif
#if KF_DQW && (KF_BLOCK_M == 64) && (KF_HEAD_DIM == 64)
#error "bwd_sm90: KF_DQW needs each consumer's own dQ slice (BLOCK_M 128 at D = 64)"
#endif
#if KF_SPLIT && !KF_ORDER
#error "bwd_sm90: KF_SPLIT needs KF_ORDER 1 (a half counts the query blocks its steps visit)"
#endif
// A tile's steps: all of them, or a split half's (KeyTile i0, i1, in the
// half's own order: key_tile_step). Step u of KF9_STEPS is step KF9_STEP(u).
#define KF9_KEY_TILE kfh::key_tile<kBM, kBN, KF_SPLIT == 1>
#if KF_SPLIT
#define KF9_STEPS (T.i1 - T.i0)
#define KF9_STEP(u) kfh::key_tile_step(T, u)
#else
#define KF9_STEPS T.steps
#define KF9_STEP(u) (u)
#endif


namespace kf9 {

constexpr int kD = KF_HEAD_DIM;
constexpr int kBM = KF_BLOCK_M;
constexpr int kBN = KF_BLOCK_N;
constexpr int kS = KF_STAGES;
// dQ work split between the two consumers: the dQ part's rule
// (sm90/bwd_dq.cuh, dq_split_rows / dq_split_cols), which add_dq follows.
constexpr int kDqSplitM = kfh::dq_split_rows<kD, kBM>();  // rows 64w.., all keys
constexpr int kDqSplitN = kfh::dq_split_cols<kD, kBM>();  // head dims 64w.., all keys
// otherwise (kBM == 64, kD == 64): own keys, all rows and head dims
// The workspace int of a query block and head counts the key blocks that have
// added into its dq_accum rows (low bits); the first key block to visit it
// sets kDeltaClaim, computes delta and publishes it in p.delta. Counts stay
// far below 2^30.
constexpr int kDeltaClaim = 1 << 30;
#if KF_DQW
// bits 28 (consumer 0) and 29 (consumer 1): the claimer's dQ slice is in dq_accum
constexpr int kDqReady = 1 << 28;
constexpr int kCountMask = kDqReady - 1;
#elif KF_DET
// bits 0..13 count the key blocks done (a sequence has at most 2^20 / 128 =
// 8192: core/shape.h kMaxSeqLen), bits 14..28 the consumer adds complete
// (2 per key block)
constexpr int kDetAdd = 1 << 14;
constexpr int kCountMask = kDetAdd - 1;
#else
constexpr int kCountMask = kDeltaClaim - 1;
#endif
// The workspace's counter area comes after the help queue (KF_HELP), the
// manifest's fixed bytes (kernels/CONTRACT.md: counters after the fixed bytes).
// (KF_HELP = 2) completed blocks that are queued whatever the tile counter
// says: where converting them here would take ~14 round trips.
#define KF9_HELP_MANY 14
#define KF9_HELP_BYTES (KF_HELP ? kf_bwd_sm90_help_bytes() : 0)
// Tiles not drawn from the counter: each CTA's first is blockIdx.x, except
// with the help queue, where every tile is drawn (see the producer's loop).
// (KF_DET: the order of its adds is deadlock-free only so)
#define KF9_FIRST_TAKEN ((KF_HELP || KF_DET) ? 0 : (int)gridDim.x)
#define KF9_COUNTERS ((int*)((char*)p.workspace + KF9_HELP_BYTES))
// p.delta holds each published row's delta as its bits XOR kDeltaTag, with
// -0 stored as +0 (the sign of a zero delta changes
// nothing), so the zero the host leaves there reads as "not published" and
// any other word is the row's delta: a 32-bit word is never seen
// half-written, so no ready bit and no fence order it.
constexpr unsigned kDeltaTag = 0x80000000u;

// The PTX primitives are the Hopper parts' (sm90/ptx.cuh, sm90/wgmma_ops.cuh),
// and so are the backward's tiles (sm90/bwd_tiles.cuh) and dQ path
// (sm90/bwd_dq.cuh), all prepended by build(); the rest is here.
using kfh::u32;
using kfh::u64;
using kfh::bf16;
using kfh::neg_inf;
using kfh::smem_u32;
using kfh::ld_shared_v4;
using kfh::mbar_init;
using kfh::mbar_arrive;
using kfh::mbar_wait;
using kfh::cp_async16;
using kfh::cp_async_wait_all;
using kfh::fence_proxy_async;
using kfh::wgmma_fence;
using kfh::wgmma_commit;
using kfh::wgmma_wait;
using kfh::reg_fence;
using kfh::ex2;
using kfh::pack_bf16;
using kfh::make_desc;
using kfh::KeyTile;
using kfh::bulk_wait_read;
using kfh::bulk_wait_all;

__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

__device__ __forceinline__ void consumer_sync() {  // the 256 consumer threads, barrier 1
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
}
// Barrier of one warpgroup's 128 threads: id 2, 3 for the consumers, 4 for
// the producer (0 is __syncthreads, 1 consumer_sync).
__device__ __forceinline__ void wg_sync(int id) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory");
}
// wg_sync that also returns whether `v` holds in every one of the 128 threads.
__device__ __forceinline__ bool wg_sync_and(int id, bool v) {
  u32 r;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 q, %2, 0;\nbar.red.and.pred p, %1, 128, q;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(r)
      : "r"(id), "r"((u32)v)
      : "memory");
  return r != 0u;
}
// Like reg_fence, for packed A fragments: keeps them live (unreused) up to a wait.
template <int N>
__device__ __forceinline__ void reg_fence_u(u32* r) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
__device__ __forceinline__ float bf16_lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(u32 w) { return __uint_as_float(w & 0xffff0000u); }
// The low half of w to shared address a_lo, the high half to a_hi.
__device__ __forceinline__ void st_shared_b16x2(u32 a_lo, u32 a_hi, u32 w) {
  asm volatile(
      "{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %2;\n"
      "st.shared.b16 [%0], lo;\nst.shared.b16 [%1], hi;\n}\n" ::"r"(a_lo),
      "r"(a_hi), "r"(w)
      : "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_ss_t0(float* d, u64 a, u64 b, int scale_d) {
  kfh::wgmma_ss<N, 0>(d, a, b, scale_d);
}
template <int N>
__device__ __forceinline__ void wgmma_rs_t1(float* d, const u32* a, u64 b) {
  kfh::wgmma_rs<N>(d, a[0], a[1], a[2], a[3], b);
}

// ROWS x kD bf16 (global rows `stride` elements apart) into a 128B-swizzled
// tile of kD/64 panels of ROWS rows x 128 B (panel p at + p * ROWS * 128), by
// the 128 producer threads; rows >= valid are zero-filled (src not read).
// The K/V copy (once a tile); the per-step Q/dO copy is the parts'
// load_tile, unrolled (notes/bwd.md, v5: 1.02-1.05x on every shape). This
// loop, rolled, keeps the producer's registers for the step.
template <int ROWS>
__device__ __forceinline__ void load_tile(u32 dst, const bf16* src, long long stride, int valid,
                                          int t, const bf16* safe) {
  constexpr int kCpr = kD / 8;       // 16-byte chunks per row
  constexpr int kRpi = 128 / kCpr;   // rows per iteration
  static_assert(ROWS % kRpi == 0, "tile rows must divide among the producer threads");
  const int ch = t % kCpr;
  const int cc = ch & 7;
  int r = t / kCpr;
  dst += (ch >> 3) * (ROWS * 128);
#pragma unroll 1
  for (int i = 0; i < ROWS / kRpi; ++i) {
    const bool ok = r < valid;
    cp_async16(dst + r * 128 + ((cc ^ (r & 7)) << 4), ok ? src + (long long)r * stride + ch * 8 : safe,
               ok ? 16 : 0);
    r += kRpi;
  }
}

// (a plain function around the part's template, as write_dq was before the
// dQ path became a part: the template alone is implicitly inline, and NVVM
// then compiled this kernel to other cubins than the pinned, GPU-tested ones)
__device__ void write_dq(const KfAttnParams& p, int q0, int lq, int m0, int h, bool zero, int ct) {
  kfh::write_dq<kD, kBM, KF_DQZ != 0>(p, q0, lq, m0, h, zero, ct);
}
#if KF_HELP
// The help queue (templates/bwd_sm90_layout.h): ints 0 (items reserved),
// 1 (tickets taken), 32 (tiles finished), items from int 64.
__device__ __forceinline__ int* help_queue(const KfAttnParams& p) { return (int*)p.workspace; }
__device__ __forceinline__ void st_release(int* a, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(a), "r"(v) : "memory");
}
__device__ __forceinline__ void red_add_release(int* a, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(a), "r"(v) : "memory");
}
// The consumers' barrier 5: how many of the 256 threads pass `v`.
__device__ __forceinline__ int consumer_sync_count(bool v) {
  int n;
  asm volatile(
      "{\n.reg .pred q;\nsetp.ne.u32 q, %1, 0;\nbar.red.popc.u32 %0, 5, 256, q;\n}\n"
      : "=r"(n)
      : "r"((u32)v)
      : "memory");
  return n;
}
// Item `slot`: rows m0a, m0b, m0c (-1: none) of head h of the sequence (or
// packed run) at q0, lq rows. One thread writes it; lq (> 0) goes last, with
// release: the counts that completed these blocks, acquired by this CTA's
// counter atomics and fences, precede it, so a helper that reads the tag
// reads the blocks' finished sums.
__device__ __forceinline__ void help_push(const KfAttnParams& p, int slot, int q0, int lq,
                                          int h, int m0a, int m0b, int m0c) {
  int* const it = help_queue(p) + 64 + 8 * slot;
  it[1] = q0;
  it[2] = h;
  it[3] = m0a;
  it[4] = m0b;
  it[5] = m0c;
  st_release(it, lq);
}
// A CTA without tiles: takes tickets, one item each, and converts the item's
// blocks, until a ticket has no item and every tile is finished (every push
// comes before its tile's finish count, so none can come after). A ticket's
// item may still be on its way (reserved, not yet written): waited for.
// (Inline with HELP=2, a call with HELP=1: the forms measured. Inline, HELP=1
// cost hstu_prod_causal and gdpa_dense 11-16% on an H100, as a call 0-3%;
// HELP=2's 7.8% gain on powerlaw_short is the inline form's; notes/bwd.md v17.)
#if KF_HELP == 2
#define KF9_HELP_CONVERT_INLINE __forceinline__
#else
#define KF9_HELP_CONVERT_INLINE __noinline__
#endif
__device__ KF9_HELP_CONVERT_INLINE void help_convert(const KfAttnParams& p, int ct, int* flags) {
  int* const q = help_queue(p);
  for (;;) {
    if (ct == 0) {
      const int t = atomicAdd(q + 1, 1);
      int lq = 0;
      if (t < kf_bwd_sm90_help_items()) {
        int* const it = q + 64 + 8 * t;
        for (;;) {
          lq = kfh::ld_acquire(it);
          if (lq) break;
          if (kfh::ld_acquire(q + 32) >= p.num_tiles) {
            lq = kfh::ld_acquire(it);
            break;
          }
          __nanosleep(128);
        }
        if (lq) {
#pragma unroll
          for (int j = 1; j < 6; ++j) flags[j] = __ldcg(it + j);
        }
      }
      flags[0] = lq;
    }
    consumer_sync();
    const int lq = flags[0], q0 = flags[1], h = flags[2];
    const int m0a = flags[3], m0b = flags[4], m0c = flags[5];
    consumer_sync();  // flags[] read by all before thread 0 writes the next item
    if (!lq) return;
    write_dq(p, q0, lq, m0a, h, false, ct);
    if (m0b >= 0) write_dq(p, q0, lq, m0b, h, false, ct);
    if (m0c >= 0) write_dq(p, q0, lq, m0c, h, false, ct);
  }
}
#endif

}  // namespace kf9

#if KF_TMA
// The kernel's second parameter: the manifest's tensor_maps, in its order.
struct KfBwdSm90Maps {
  kfh::TmaMap q, dout;
#if KF_KVSTORE
  kfh::TmaMap dk, dv;
#endif
};
#define KF9_MAPS_PARAM , const __grid_constant__ KfBwdSm90Maps maps
#else
#define KF9_MAPS_PARAM
#endif

// KF_TRACE = 1 (development only, never in the knob space: kforge-bench-attn
// --trace-dir prepends it; kernels/dev/trace_bwd.py reads the result): one thread of each warpgroup stamps %globaltimer and %clock at the
// points of a tile's life named below, into the buffer kf_trace points to.
// Where the time of a batch goes (waits between tiles, a step, a tile's end)
// is a latency question that stall samples do not answer. The host sets
// kf_trace for one launch and clears it again; with ptr null nothing is
// written.
#ifndef KF_TRACE
#define KF_TRACE 0
#endif
#if KF_TRACE
struct KfTrace {
  unsigned long long* ptr;  // [CTA][role: producer, consumer 0, consumer 1][cap][2 words]
  unsigned long long cap;   // events per role and CTA
};
__device__ KfTrace kf_trace;
__shared__ int kf9_trace_count[3];
// Event ids (kernels/dev/trace_bwd.py has the same table).
enum : int {
  kTrProdTile = 1,    // producer: the tile index handed on (arg: index)
  kTrProdEmpty = 2,   // producer: a stage free (arg: step)
  kTrProdKvEmpty = 3, // producer: K/V buffers free (the previous tile's last dQ wgmma)
  kTrProdFull = 4,    // producer: a stage's LSE/delta done, arriving on full (arg: step)
  kTrProdNext = 5,    // producer: the next tile index fetched
  kTrConsTile = 10,   // consumer: tile index taken (arg: index)
  kTrConsKv = 11,     // consumer: K/V in (arg: steps)
  kTrConsFull = 12,   // consumer: a stage in (arg: step)
  kTrConsSync = 13,   // consumer: past the dS barrier (arg: step)
  kTrConsAdd = 14,    // consumer: dQ slice issued (arg: step)
  kTrConsHead = 15,   // consumer: a head's counting and conversions done
  kTrConsEnd = 16,    // consumer: dK/dV stored
};
__device__ __forceinline__ void kf9_trace(int role, int ev, int arg) {
  const KfTrace tr = kf_trace;
  if (tr.ptr == nullptr) return;
  const int n = atomicAdd(&kf9_trace_count[role], 1);
  if ((unsigned long long)n >= tr.cap) return;
  unsigned long long g;
  unsigned c;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(g));
  asm volatile("mov.u32 %0, %%clock;\n" : "=r"(c));
  unsigned long long* e = tr.ptr + 2 * ((blockIdx.x * 3ull + role) * tr.cap + n);
  e[0] = g;
  e[1] = ((unsigned long long)ev << 56) | ((unsigned long long)(arg & 0xffffff) << 32) | c;
}
// The producer's thread 0, and thread 0 of consumer w.
#define KF9_TRP(ev, arg) \
  if (t == 0) kf9_trace(0, ev, arg)
#define KF9_TRC(ev, arg) \
  if ((tid & 127) == 0) kf9_trace(1 + w, ev, arg)
#else
#define KF9_TRP(ev, arg) ((void)0)
#define KF9_TRC(ev, arg) ((void)0)
#endif

// (launch bounds through a macro: kernels/check.cc's entry regex stops at '(')
#define KF_LAUNCH_BOUNDS __launch_bounds__(384, 1)
extern "C" __global__ void KF_LAUNCH_BOUNDS kf_attn_bwd(const __grid_constant__ KfAttnParams p KF9_MAPS_PARAM) {
  using namespace kf9;
  constexpr KfBwdSm90Layout L = kf_bwd_sm90_layout(kD, kBM, kBN, kS);
  static_assert(L.dynamic_bytes <= 232448, "bwd_sm90: shared memory over sm_90a's limit");
  static_assert(L.k % 1024 == 0 && L.v % 1024 == 0 && L.stage % 1024 == 0 &&
                    L.stage_bytes % 1024 == 0 && L.tile_q_bytes % 1024 == 0 &&
                    L.ds % 1024 == 0 && L.ds_bytes % 1024 == 0 && L.dq % 1024 == 0 &&
                    L.bars % 8 == 0,
                "bwd_sm90: swizzled tiles (and the dQ staging rows) must be 1024-byte aligned");
  extern __shared__ __align__(1024) unsigned char kf_smem_raw[];
  // Addresses are recomputed inside each role (after setmaxnreg), so no value
  // has to stay live across the register reallocation.
#define KF9_SMEM_ADDRESSES                                                          \
  const u32 base = (smem_u32(kf_smem_raw) + 1023u) & ~1023u;                        \
  unsigned char* const base_ptr = kf_smem_raw + (base - smem_u32(kf_smem_raw));     \
  const u32 sK = base + L.k;                                                        \
  const u32 sV = base + L.v;                                                        \
  const u32 bar_full = base + L.bars;                                               \
  const u32 bar_empty = bar_full + 8 * kS;                                          \
  const u32 bar_kv_full = bar_empty + 8 * kS;                                       \
  const u32 bar_kv_empty = bar_kv_full + 8;                                         \
  const u32 bar_tile_full = bar_kv_empty + 8;                                       \
  const u32 bar_tile_empty = bar_tile_full + 16;                                    \
  const u32 bar_land = bar_tile_empty + 16;                                         \
  float* const lse_s = (float*)(base_ptr + L.lse);                                  \
  float* const delta_s = (float*)(base_ptr + L.delta);                              \
  int* const win_s = (int*)(base_ptr + L.win);                                      \
  int* const flags = (int*)(base_ptr + L.flags);                                    \
  int* const help_s = (int*)(base_ptr + L.help);                                    \
  (void)sK; (void)sV; (void)bar_full; (void)bar_empty; (void)bar_kv_full;           \
  (void)bar_kv_empty; (void)bar_tile_full; (void)bar_tile_empty; (void)bar_land; \
  (void)lse_s;                                                                      \
  (void)delta_s; (void)win_s; (void)flags; (void)help_s

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const float log2e = 1.4426950408889634f;

  if (tid == 0) {
    KF9_SMEM_ADDRESSES;
    for (int s = 0; s < kS; ++s) {
      mbar_init(bar_full + 8 * s, 128);  // every producer thread arrives
      mbar_init(bar_empty + 8 * s, KF9_EMPTY_ARRIVALS);
    }
    mbar_init(bar_kv_full, 128);
    mbar_init(bar_kv_empty, KF9_EMPTY_ARRIVALS);
    for (int s = 0; s < 2; ++s) {
      mbar_init(bar_tile_full + 8 * s, 1);  // the producer's thread 0
      mbar_init(bar_tile_empty + 8 * s, 256);  // every consumer thread
    }
#if KF_TMA
    // thread 0's arrival (with the TMA bytes, or alone for a cp.async step)
    for (int s = 0; s < kS; ++s) mbar_init(bar_land + 8 * s, 1);
#endif
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#if KF_TRACE
    kf9_trace_count[0] = kf9_trace_count[1] = kf9_trace_count[2] = 0;
#endif
  }
  __syncthreads();

  if (wg == 0) {
    // ------------------------------------------------------------ producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(KF_PRODUCER_REGS));
    KF9_SMEM_ADDRESSES;
    const int t = tid;  // 0..127
    // (tensor pointers and strides are re-read from the parameter space where
    // used: this warpgroup runs on KF_PRODUCER_REGS registers)
#define KF9_LDQ ((long long)p.heads * kD)
#define KF9_LDK ((long long)p.kv_heads * kD)
// The tile's K and V into sK, sV (cp.async; waited for before kv_full),
// once the consumers have released the previous tile's.
#define KF9_ISSUE_KV()                                                                        \
  {                                                                                           \
    mbar_wait(bar_kv_empty, (kt & 1) ^ 1);                                                    \
    KF9_TRP(kTrProdKvEmpty, 0);                                                               \
    const long long off = ((long long)(T.k0 + n0) * p.kv_heads + T.g) * kD;                   \
    load_tile<kBN>(sK, (const bf16*)p.k + off, KF9_LDK, T.lk - n0, t, (const bf16*)p.k);      \
    load_tile<kBN>(sV, (const bf16*)p.v + off, KF9_LDK, T.lk - n0, t, (const bf16*)p.v);      \
  }
    int it = 0, kt = 0;
    KeyTile T;
    // Tile ti's index goes to the consumers through slot ti & 1; the next
    // index is fetched after this tile's loads are issued (the producer runs
    // up to KF_STAGES steps ahead, which hides the round trip) and passed to
    // the other producer threads through flags[260 + (ti & 1)]. (Fetching it
    // at the tile's first step, beside the delta claim, measured 2-4% slower
    // on the causal shapes: notes/bwd.md v6.)
#if KF_HELP || KF_DET
    // With the help queue the first tile comes from the counter too: helpers
    // wait until every tile is finished, so every tile handed out must be
    // held by a CTA that runs. Tile blockIdx.x would belong to a CTA not yet
    // resident (another launch holding SMs) and the helpers would wait for
    // it while holding the SMs it needs. (KF_DET's ordered adds: likewise.)
    if (t == 0) flags[261] = atomicAdd(p.tile_counter, 1);
    wg_sync(4);
    int idx = flags[261];  // (next written at tile 1's end, after tile 0's barrier)
#else
    int idx = blockIdx.x;
#endif
    for (int ti = 0;; ++ti) {
      if (t == 0) {
        mbar_wait(bar_tile_empty + 8 * (ti & 1), ((ti >> 1) & 1) ^ 1);
        flags[258 + (ti & 1)] = idx;
        mbar_arrive(bar_tile_full + 8 * (ti & 1));
      }
      KF9_TRP(kTrProdTile, idx);
      if (!KF9_KEY_TILE(p, idx, T)) break;
      // (zero-dQ tiles and key blocks no query sees have no steps: they are
      // the consumers' alone)
      const int n0 = T.block * kBN;
      for (int u = 0; u < KF9_STEPS; ++u, ++it) {
        const int i = KF9_STEP(u);
        const int h = T.g * T.group + i / T.visited;
        const int m0 = kfh::key_tile_block<kBM, kBN, KF_ORDER == 1>(p, T, i) * kBM;
        const int s = it % kS;
        mbar_wait(bar_empty + 8 * s, ((it / kS) & 1) ^ 1);
        KF9_TRP(kTrProdEmpty, u);
        const u32 sQ = base + L.stage + s * L.stage_bytes;
        const long long row0 = ((long long)(T.q0 + m0) * p.heads + h) * kD;
#if KF_TMA
        // A whole block by TMA (thread 0: the bytes on the land barrier, then
        // the boxes); a tail block by cp.async with its rows past the
        // sequence zero-filled, thread 0 completing the land phase at once.
        const bool by_tma = m0 + kBM <= T.lq;
        if (by_tma) {
          if (t == 0) {
            kfh::mbar_arrive_expect_tx(bar_land + 8 * s, 2 * L.tile_q_bytes);
#pragma unroll
            for (int pn = 0; pn < kD / 64; ++pn) {
              kfh::tma_load_2d(sQ + pn * (kBM * 128), &maps.q, h * kD + 64 * pn, T.q0 + m0,
                               bar_land + 8 * s);
              kfh::tma_load_2d(sQ + L.tile_q_bytes + pn * (kBM * 128), &maps.dout,
                               h * kD + 64 * pn, T.q0 + m0, bar_land + 8 * s);
            }
          }
        } else
#endif
        {
          kfh::load_tile<kD, kBM, 128, kBM * kD / 1024>(sQ, (const bf16*)p.q + row0, KF9_LDQ,
                                                        T.lq - m0, t, (const bf16*)p.q);
          kfh::load_tile<kD, kBM, 128, kBM * kD / 1024>(sQ + L.tile_q_bytes,
                                                        (const bf16*)p.dout + row0, KF9_LDQ,
                                                        T.lq - m0, t, (const bf16*)p.dout);
#if KF_TMA
          if (t == 0) mbar_arrive(bar_land + 8 * s);
#endif
        }
#if KF_KVFIRST
        if (u == 0) KF9_ISSUE_KV();
#endif
        // delta (notes/bwd.md, v3, v4b): thread 0 claims the query block in
        // its workspace counter; the first visitor publishes each row as a
        // tagged word (kDeltaTag), so the words are loaded beside the claim
        // and the LSE (one round trip) and a word that is not 0 is the row's
        // delta whatever the claim says. One barrier, which also tells
        // whether every row was there. The claim's slot alternates between
        // two ints: thread 0 rewrites one only after every thread has passed
        // the next step's barrier.
        // A packed run's rows (qbase < 0: pack, in a register the producer
        // holds anyway) have no other visitor: its tile computes their delta
        // and keeps it (no claim, nothing published, so the words read
        // below are the host's zeros: "missing").
#if KF_DQW
        // (the claim's old word also goes to the consumers, through the
        // stage's flags[262 + s]: 0 where this tile owns the rows alone, a
        // packed run's, or adds nothing into dq_accum, a direct one's; the
        // atomic acquires the claimer's ready bits for this CTA's adds)
        if (t == 0) {
          const bool alone = T.qbase < 0 || (KF_DQ_DIRECT && T.lk <= kBN);
          const int c =
              alone ? kDeltaClaim
                    : kfh::atom_or_acquire(
                          KF9_COUNTERS + (long long)(T.qbase + m0 / kBM) * p.heads + h,
                          kDeltaClaim);
          flags[256 + (it & 1)] = c;
          flags[262 + s] = alone ? 0 : c;
        }
#else
        if (t == 0) {
          flags[256 + (it & 1)] =
              T.qbase < 0 || (KF_DQ_DIRECT && T.lk <= kBN)
                  ? kDeltaClaim
                  : atomicOr(KF9_COUNTERS + (long long)(T.qbase + m0 / kBM) * p.heads + h,
                                     kDeltaClaim);
        }
#endif
        unsigned word = kDeltaTag;  // rows past the end: delta 0
        if (t < kBM) {
          float l2 = pos_inf();
          if (m0 + t < T.lq) {
            const long long row = (long long)h * p.total_q + T.q0 + m0 + t;
            const float l = p.lse[row];
            if (l > neg_inf()) l2 = l * log2e;
            word = __ldcg((const unsigned*)p.delta + row);
          }
          lse_s[s * kBM + t] = l2;
        }
        if (wg_sync_and(4, word != 0u)) {
          if (t < kBM) delta_s[s * kBM + t] = __uint_as_float(word ^ kDeltaTag);
        } else {
          // A row is missing: compute them all from O and dO, and publish
          // them if this key block made the claim (a visitor that finds the
          // block claimed but a row not yet there computes it too: nobody
          // waits for another CTA, so a persistent grid cannot deadlock).
          // O comes into the scratch tile the way dO came into the stage
          // (the parts' load_tile: every chunk by the same thread), so after
          // this thread's cp.async wait both are there for it, behind one
          // round trip instead of one per row group (v6, notes/bwd.md).
          const u32 sO = base + L.o;
          kfh::load_tile<kD, kBM, 128, 1>(sO, (const bf16*)p.o + row0, KF9_LDQ, T.lq - m0, t,
                                          (const bf16*)p.o);
          cp_async_wait_all();
#if KF_TMA
          // (a TMA-loaded dO: every thread reads chunks the copy engine wrote)
          if (by_tma) mbar_wait(bar_land + 8 * s, (it / kS) & 1);
#endif
          constexpr int kCpr = kD / 8;
          constexpr int kRpp = 128 / kCpr;
          const int c = t % kCpr;
          const u32 sdO = sQ + L.tile_q_bytes;
#pragma unroll 1
          for (int r = t / kCpr; r < kBM; r += kRpp) {
            // (rows past the sequence were zero-filled in both tiles)
            const u32 at = (c >> 3) * (kBM * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
            const uint4 a = ld_shared_v4(sO + at);
            const uint4 b = ld_shared_v4(sdO + at);
            float v = bf16_lo(a.x) * bf16_lo(b.x) + bf16_hi(a.x) * bf16_hi(b.x) +
                      bf16_lo(a.y) * bf16_lo(b.y) + bf16_hi(a.y) * bf16_hi(b.y) +
                      bf16_lo(a.z) * bf16_lo(b.z) + bf16_hi(a.z) * bf16_hi(b.z) +
                      bf16_lo(a.w) * bf16_lo(b.w) + bf16_hi(a.w) * bf16_hi(b.w);
#pragma unroll
            for (int o = kCpr / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (c == 0) {
              delta_s[s * kBM + r] = v;
              if (!(flags[256 + (it & 1)] & kDeltaClaim) && m0 + r < T.lq) {
                ((unsigned*)p.delta)[(long long)h * p.total_q + T.q0 + m0 + r] =
                    __float_as_uint(v == 0.f ? 0.f : v) ^ kDeltaTag;
              }
            }
          }
        }
        // The tile's K and V go after its first stage (which waits only for a
        // free stage; K/V wait for the consumers to finish the previous
        // tile), so the stage's loads are in flight during that wait; with
        // KF_KVFIRST they were issued above, before the delta work.
#if KF_KVFIRST
        if (u == 0) {
          cp_async_wait_all();
          fence_proxy_async();
          mbar_arrive(bar_kv_full);
        }
#else
        if (u == 0) {
          KF9_ISSUE_KV();
          cp_async_wait_all();
          fence_proxy_async();
          mbar_arrive(bar_kv_full);
        }
#endif
        cp_async_wait_all();
        fence_proxy_async();
        KF9_TRP(kTrProdFull, u);
        mbar_arrive(bar_full + 8 * s);
      }
      if (KF9_STEPS > 0) ++kt;
      if (t == 0) flags[260 + (ti & 1)] = atomicAdd(p.tile_counter, 1) + KF9_FIRST_TAKEN;
      wg_sync(4);
      idx = flags[260 + (ti & 1)];
      KF9_TRP(kTrProdNext, idx);
    }
#undef KF9_LDQ
#undef KF9_LDK
#undef KF9_ISSUE_KV
    return;
  }

  // -------------------------------------------------------------- consumers
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(KF_CONSUMER_REGS));
  KF9_SMEM_ADDRESSES;
  const int warp = (tid / 32) & 3;  // warp within its warpgroup
  const int lane = tid & 31;
  const int w = wg - 1;           // consumer 0/1: keys 64w .. 64w+63 of the block
  const int ct = tid - 128;       // 0..255 over both consumers
  const int r0 = 16 * warp + (lane >> 2);  // accumulator rows r0 and r0 + 8
  const int cq = 2 * (lane & 3);           // accumulator columns 8j + cq, +1
  const float sl2 = p.softmax_scale_log2;
  const float scale = p.softmax_scale;
  // K-major descriptors of this consumer's 64 rows of K and V (A of S^T, dP^T).
  const u64 descKw = make_desc(sK + w * 64 * 128, 16, 1024);
  const u64 descVw = make_desc(sV + w * 64 * 128, 16, 1024);
  const u32 sDq = base + L.dq + w * L.dq_bytes;  // this consumer's dQ staging buffer

  int it = 0, kt = 0;
  KeyTile T;
#if KF_DQW
  // The workspace int whose ready bit this consumer owes (its last copy's
  // query block), or -1; raised before the next step's barrier or at the
  // head's end, once the copy is complete.
  int owed = -1;
#endif
#if KF_DET
  // The counter word whose add count this consumer owes its last add, or
  // -1; raised as DQW's ready bit is, once the add is complete.
  int det_owed = -1;
#endif
  for (int ti = 0;; ++ti) {
#if KF_HELP
    // The previous tile is finished and its items pushed (by this thread):
    // with release where it pushed any (a helper that sees every tile
    // finished sees their tags), relaxed elsewhere (a release here waits for
    // the tile's dK and dV stores, a microsecond a tile).
    if (ct == 0) {
      if (ti > 0 && help_s[1]) {
        red_add_release(help_queue(p) + 32, 1);
      } else if (ti > 0) {
        atomicAdd(help_queue(p) + 32, 1);
      }
      help_s[1] = 0;
    }
#endif
    mbar_wait(bar_tile_full + 8 * (ti & 1), (ti >> 1) & 1);
    const int idx = flags[258 + (ti & 1)];
    mbar_arrive(bar_tile_empty + 8 * (ti & 1));
    KF9_TRC(kTrConsTile, idx);
    if (!KF9_KEY_TILE(p, idx, T)) break;
    if (T.block < 0) {  // a query block that sees no key: dQ = 0
      const int m0 = (-1 - T.block) * kBM;
      write_dq(p, T.q0, T.lq, m0, T.g, true, ct);
      continue;
    }
    const int n0 = T.block * kBN;
    if (T.pack) {
      // A packed run (at most BLOCK_N rows and keys): each row's window of
      // keys, from the members' offsets, once for the tile while the
      // producer loads K and V. (The previous tile's last reads of both
      // tables were before its last step's barrier.)
      int* const tab_q = (int*)(base_ptr + L.pack);
      int* const tab_k = tab_q + kf_bwd_sm90_pack_entries();
      if (ct <= T.pack) {
        tab_q[ct] = p.cu_seqlens_q[T.b + ct] - T.q0;
        tab_k[ct] = p.cu_seqlens_k[T.b + ct] - T.k0;
      }
      consumer_sync();
      if (ct < T.lq) win_s[ct] = kfh::packed_key_window(p, T, ct, tab_q, tab_k);
      consumer_sync();
    }
    float dk[kD / 2], dv[kD / 2];
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) dk[i] = dv[i] = 0.f;

    if (KF9_STEPS > 0) {
      mbar_wait(bar_kv_full, kt & 1);
      KF9_TRC(kTrConsKv, KF9_STEPS);
      for (int u = 0; u < KF9_STEPS; ++u, ++it) {
        const int i = KF9_STEP(u);
        const int h = T.g * T.group + i / T.visited;
        const int m = kfh::key_tile_block<kBM, kBN, KF_ORDER == 1>(p, T, i);
        const int m0 = m * kBM;
        const int s = it % kS;
        const u32 sQ = base + L.stage + s * L.stage_bytes;
        const u32 sdO = sQ + L.tile_q_bytes;
        const u32 sdS = base + L.ds + (it & 1) * L.ds_bytes;
        mbar_wait(bar_full + 8 * s, (it / kS) & 1);
#if KF_TMA
        mbar_wait(bar_land + 8 * s, (it / kS) & 1);
#endif
        KF9_TRC(kTrConsFull, u);
#if KF9_CSKIP
        // Consumer 1's keys n0 + 64 .. n0 + 127 all masked in this step (the
        // same answer in both consumers: the dQ below depends on it).
        const int q_last = (m0 + kBM < T.lq ? m0 + kBM : T.lq) - 1;
        const bool skip1 = !T.pack && (n0 + 64 >= T.lk || (p.causal && n0 + 64 > q_last + T.shift));
        const bool live = w == 0 || !skip1;
        u32 pa[kBM / 4], da[kBM / 4];
        if (live) {
#endif

        // S^T = K_w Q^T and dP^T = V_w dO^T (A and B both K-major).
        float sacc[kBM / 2], dpacc[kBM / 2];
        {
          const u64 dQ = make_desc(sQ, 16, 1024);
          const u64 ddO = make_desc(sdO, 16, 1024);
          wgmma_fence();
#pragma unroll
          for (int ks = 0; ks < kD / 16; ++ks) {
            const int panel = ks >> 2, kk = ks & 3;
            wgmma_ss_t0<kBM>(sacc, descKw + (u64)(panel * (kBN * 128 / 16) + 2 * kk),
                             dQ + (u64)(panel * (kBM * 128 / 16) + 2 * kk), ks > 0 ? 1 : 0);
          }
          wgmma_commit();  // group: S^T
#pragma unroll
          for (int ks = 0; ks < kD / 16; ++ks) {
            const int panel = ks >> 2, kk = ks & 3;
            wgmma_ss_t0<kBM>(dpacc, descVw + (u64)(panel * (kBN * 128 / 16) + 2 * kk),
                             ddO + (u64)(panel * (kBM * 128 / 16) + 2 * kk), ks > 0 ? 1 : 0);
          }
          wgmma_commit();  // group: dP^T
#if KF_DQW
          // The ready bit of the previous step's copy (this consumer claimed
          // that query block) is raised here, while S^T and dP^T run: the
          // copy, issued at that step's end, is done or nearly, and a visitor
          // waiting for it waits half a step less than for the barrier below.
          if (owed >= 0) {
            if ((tid & 127) == 0) {
              bulk_wait_all();
              kfh::publish_dq_ready(KF9_COUNTERS + owed, kDqReady << w);
            }
            owed = -1;
          }
#endif
#if KF_DET
          // The previous step's add is published here likewise.
          if (det_owed >= 0) {
            if ((tid & 127) == 0) {
              bulk_wait_all();
              kfh::publish_dq_added(KF9_COUNTERS + det_owed, kDetAdd);
            }
            det_owed = -1;
          }
#endif
          wgmma_wait<1>();  // S^T complete, dP^T may run
          reg_fence<kBM / 2>(sacc);
        }

        // wgmma groups per step (notes/bwd.md, v2, v11): S^T (wait 1: P^T is
        // computed while dP^T runs) | dP^T (wait 0, then dS^T) | dV
        // (issued before the dS store) | dK (issued before the consumer
        // barrier; wait 1 there retires dV) | dQ (wait 1 retires dK and frees
        // the stage, wait 0 before the dq_accum reduction). A-fragment
        // registers (pa, da) are not touched between the wgmma that reads
        // them and the wait_group that completes it, and are kept live
        // (reg_fence_u) until then; accumulators are read only after the wait
        // that completes their group.
        const float* lse2 = lse_s + s * kBM;
        const float* dl = delta_s + s * kBM;
        const bool need_mask = n0 + kBN > T.lk || m0 + kBM > T.lq ||
                               (p.causal && n0 + kBN - 1 > m0 + T.shift);
        const int key_lo = n0 + 64 * w + r0;  // key of the rows with (i>>1)&1 == 0
        // P^T in place while dP^T runs (FA3's order; v2 found it spilling at
        // D = 128, v11 found it spill-free and 1.005-1.07x faster), then
        // dS^T in place once dP^T is done. Register i: key
        // row r0 + 8*((i>>1)&1) of this consumer's 64, query column
        // 8*(i>>2) + cq + (i&1). A packed run masks every element by its
        // row's window; its loop is a copy of the plain one rather than a
        // branch inside it: the branch cost the plain tiles 6% (ptxas
        // scheduled the loop differently, measured on the H200, notes/bwd.md v6).
        if (T.pack) {
#pragma unroll
          for (int j = 0; j < kBM / 8; ++j) {
            const int c = 8 * j + cq;
            const float2 lv = *(const float2*)(lse2 + c);
            const int2 wv = *(const int2*)(win_s + m0 + c);  // lo | hi << 16
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int i = 4 * j + e;
              const int key = key_lo + 8 * (e >> 1);  // n0 = 0
              const int wn = (e & 1) ? wv.y : wv.x;
              const float prob = ex2(sacc[i] * sl2 - ((e & 1) ? lv.y : lv.x));
              sacc[i] = key >= (wn & 0xffff) && key < (wn >> 16) ? prob : 0.f;
            }
          }
        } else {
#pragma unroll
          for (int j = 0; j < kBM / 8; ++j) {
            const int c = 8 * j + cq;
            const float2 lv = *(const float2*)(lse2 + c);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int i = 4 * j + e;
              float prob = ex2(sacc[i] * sl2 - ((e & 1) ? lv.y : lv.x));
              if (need_mask) {
                const int key = key_lo + 8 * (e >> 1);
                const int q = m0 + c + (e & 1);
                const bool ok = key < T.lk && q < T.lq && (!p.causal || key <= q + T.shift);
                prob = ok ? prob : 0.f;
              }
              sacc[i] = prob;
            }
          }
        }
        // dS^T = P^T (dP^T - delta) once dP^T completes.
        wgmma_wait<0>();
        reg_fence<kBM / 2>(dpacc);
#pragma unroll
        for (int j = 0; j < kBM / 8; ++j) {
          const float2 dd = *(const float2*)(dl + 8 * j + cq);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = 4 * j + e;
            dpacc[i] = sacc[i] * (dpacc[i] - ((e & 1) ? dd.y : dd.x));
          }
        }
#if !KF9_CSKIP
        u32 pa[kBM / 4], da[kBM / 4];
#endif
#pragma unroll
        for (int k = 0; k < kBM / 4; ++k) {
          pa[k] = pack_bf16(sacc[2 * k], sacc[2 * k + 1]);
          da[k] = pack_bf16(dpacc[2 * k], dpacc[2 * k + 1]);
        }
        // dV += P^T dO (RS) runs while dS is stored and the consumers meet.
        wgmma_fence();
        {
          const u64 bdO = make_desc(sdO, kBM * 128, 1024);
#pragma unroll
          for (int kk = 0; kk < kBM / 16; ++kk)
            wgmma_rs_t1<kD>(dv, pa + 4 * kk, bdO + (u64)(kk * (16 * 128 / 16)));
        }
        wgmma_commit();  // group: dV
        // dS = (dS^T)^T into the K-major [query][key] tile, from da before
        // the dK wgmma that reads da is issued: key panel w, row = query,
        // byte ((key%64 / 8) ^ (q & 7)) * 16 + (key % 8) * 2. (stmatrix
        // .trans would take 4 instructions instead of 32 stores, but the
        // registers it needs made ptxas serialise the wgmmas, C7512: v5.)
        {
          const u32 panel = sdS + w * (kBM * 128);
#pragma unroll
          for (int k = 0; k < kBM / 4; ++k) {
            const int kin = r0 + 8 * (k & 1);
            const int q = 8 * (k >> 1) + cq;
            const u32 a_lo = panel + q * 128 + ((((kin >> 3) ^ (q & 7))) << 4) + (kin & 7) * 2;
            const u32 a_hi =
                panel + (q + 1) * 128 + ((((kin >> 3) ^ ((q + 1) & 7))) << 4) + (kin & 7) * 2;
            st_shared_b16x2(a_lo, a_hi, da[k]);
          }
        }
        // dK += dS^T Q (RS): needs only this consumer's registers, so it is
        // issued before the barrier.
        wgmma_fence();
        {
          const u64 bQ = make_desc(sQ, kBM * 128, 1024);
#pragma unroll
          for (int kk = 0; kk < kBM / 16; ++kk)
            wgmma_rs_t1<kD>(dk, da + 4 * kk, bQ + (u64)(kk * (16 * 128 / 16)));
        }
        wgmma_commit();  // group: dK
        // dV complete (dK may still run): pa is free before dq goes live (the
        // register budget).
        wgmma_wait<1>();
        reg_fence_u<kBM / 4>(pa);
#if KF9_CSKIP
        }  // live
#endif
        fence_proxy_async();
        // The previous step's bulk read of the dQ staging buffer is done
        // before the barrier, so every thread may rewrite it after.
#if KF_DQW
        // (and a copy owed a ready bit is complete: raised here, before this
        // step's own wait for another claimer's bit, so no two CTAs wait
        // for each other)
        if ((tid & 127) == 0) {
          if (owed >= 0) {
            bulk_wait_all();
            kfh::publish_dq_ready(KF9_COUNTERS + owed, kDqReady << w);
          } else {
            bulk_wait_read();
          }
        }
        owed = -1;
#elif KF_DET
        // (a consumer that skipped this step's S^T under CSKIP publishes here)
        if ((tid & 127) == 0) {
          if (det_owed >= 0) {
            bulk_wait_all();
            kfh::publish_dq_added(KF9_COUNTERS + det_owed, kDetAdd);
          } else {
            bulk_wait_read();
          }
        }
        det_owed = -1;
#else
        if ((tid & 127) == 0) bulk_wait_read();
#endif
        consumer_sync();  // both halves of dS are in place (and the other buffer is free)
        KF9_TRC(kTrConsSync, u);
        // A 64 x 64 slice of dQ = dS K: A = dS (K-major, key panels kBM * 128 B
        // apart), B = K (MN-major: head-dim panels kBN * 128 B apart, 16 key
        // rows = 2048 B per k-step).
        float dq[32];
        wgmma_fence();
        {
          const u32 a_off = kDqSplitM ? w * 64 * 128 : 0;
          const u32 b_off = kDqSplitN ? w * kBN * 128 : 0;
          const int ks0 = (kDqSplitM || kDqSplitN) ? 0 : 4 * w;
          const int nks = (kDqSplitM || kDqSplitN) ? kBN / 16 : 4;
          const u64 aS = make_desc(sdS + a_off, 16, 1024);
          const u64 bK = make_desc(sK + b_off, kBN * 128, 1024);
#pragma unroll
          for (int x = 0; x < kBN / 16; ++x) {
#if KF9_CSKIP
            // consumer 1's keys (k-steps 4..7) left out of dQ when skipped
            // (the dQ slice is split by rows or head dims wherever CSKIP is)
            if (x < nks && !(skip1 && ks0 + x >= 4)) {
#else
            if (x < nks) {
#endif
              const int ks = ks0 + x;
              kfh::wgmma_ss<64, 1>(dq, aS + (u64)((ks >> 2) * (kBM * 128 / 16) + 2 * (ks & 3)),
                            bK + (u64)(ks * (16 * 128 / 16)), x > 0 ? 1 : 0);
            }
          }
        }
        wgmma_commit();  // group: dQ
        // dK complete (dQ may still run): da and this stage's Q, dO, LSE and
        // delta are free.
        wgmma_wait<1>();
#if KF9_CSKIP
        if (live) reg_fence_u<kBM / 4>(da);
#else
        reg_fence_u<kBM / 4>(da);
#endif
#if KF_DQW
        // The claim's word (read before the stage is released): 0 or no
        // claim bit, this tile's copy; else the claimer's ready bits as the
        // claim saw them. Not yet ready: the int is read again now, and at
        // the add only waited for if still not ready.
        const int dq_claim = flags[262 + s];
        const bool own = !(dq_claim & kDeltaClaim);
        const bool unseen = !own && !(dq_claim & (kDqReady << w));
        int* const dq_flag = KF9_COUNTERS + (long long)(T.qbase + m) * p.heads + h;
        int seen = 0;
        if ((tid & 127) == 0 && unseen) seen = kfh::ld_relaxed(dq_flag);
#endif
#if KF_DET
        // The key blocks after this one that see this query block (T.block+1
        // .. J, J the last) add into it first: their count is read now, while
        // the dQ wgmma runs, and waited for below. (A packed run's rows, and a
        // key block alone with its rows, get no other adds; J is first.)
        int* const det_word = KF9_COUNTERS + (long long)(T.qbase + m) * p.heads + h;
        const int det_want =
            T.qbase >= 0 ? 2 * (kfh::key_blocks_into<kBM, kBN>(T.lq, T.lk, m, p.causal) - 1 - T.block) : 0;
        const bool det_wait = det_want > 0;
        int det_seen = 0;
        if ((tid & 127) == 0 && det_wait) det_seen = kfh::ld_relaxed(det_word);
#endif
        mbar_arrive(bar_empty + 8 * s);
        wgmma_wait<0>();
        reg_fence<32>(dq);
        // The tile's last read of K and V (its last dQ wgmma) is done: the
        // producer may load the next tile's while this one's dQ slice, head
        // counters, conversions and dK/dV stores still run.
        if (u == KF9_STEPS - 1) mbar_arrive(bar_kv_empty);
#if KF_DQ_DIRECT
        const bool direct = T.lk <= kBN;
#else
        constexpr bool direct = false;
#endif
#if KF_DQW
        // (not for a tile alone with its rows: the producer left it 0, own)
        // A visitor's add comes after the claimer's copy: acquired by the
        // claim (through the stage's barrier) or here, then ordered before
        // the bulk add (async proxy) by the proxy fence.
        if ((tid & 127) == 0 && !own) {
          if (unseen && (seen & (kDqReady << w))) {
            asm volatile("fence.acq_rel.gpu;\n" ::: "memory");  // the relaxed load's acquire
          } else if (unseen) {
            while (!(kfh::ld_acquire(dq_flag) & (kDqReady << w))) __nanosleep(64);
          }
          asm volatile("fence.proxy.async.global;\n" ::: "memory");
        }
#else
        constexpr bool own = false;  // every slice is added
#endif
#if KF_DET
        if ((tid & 127) == 0 && det_wait && !direct) {
          if ((det_seen & ~kDeltaClaim) / kDetAdd >= det_want) {
            asm volatile("fence.acq_rel.gpu;\n" ::: "memory");  // the relaxed load's acquire
          } else {
            while ((kfh::ld_acquire(det_word) & ~kDeltaClaim) / kDetAdd < det_want) __nanosleep(64);
          }
          asm volatile("fence.proxy.async.global;\n" ::: "memory");
        }
#endif
        kfh::add_dq<kD, kBM, KF_DQ_DIRECT != 0>(p, dq, T.q0, T.lq, m0, h, w, warp, lane, sDq,
                                                direct, own);
        KF9_TRC(kTrConsAdd, u);
#if KF_DQW
        if (own && !direct && T.qbase >= 0) owed = (int)(dq_flag - KF9_COUNTERS);
#endif
#if KF_DET
        if (!direct && T.qbase >= 0) det_owed = (int)(det_word - KF9_COUNTERS);
#endif

#if KF_SPLIT
        int j_lo, j_hi;  // this tile's (or half's) steps of head h
        if (!direct && kfh::head_steps_end(T, i, j_lo, j_hi)) {  // the head's last step here
#elif KF_ORDER
        if (!direct && i % T.visited == T.visited - 1) {  // the head's last step
#else
        if (!direct && m == T.m_blocks - 1) {
#endif
          // Head h is done: count this key block into each of its query
          // blocks behind one fence; the key block completing a count
          // converts. A packed run's rows get no other key block's adds:
          // its tile converts them all, without counting.
          // (the bulk reduce-adds of this warpgroup complete first, and are
          // ordered, async proxy to generic, before the fence)
#if KF_HELP
          // Whether every tile has been handed out (then CTAs without tiles
          // will be there to convert): read here, used after the counts,
          // whose round trips hide its own.
          const int handed = ct == 0 ? kfh::ld_relaxed(p.tile_counter) : 0;
#endif
#if KF_DQW
          if ((tid & 127) == 0) {
            bulk_wait_all();
            if (owed >= 0) kfh::publish_dq_ready(KF9_COUNTERS + owed, kDqReady << w);
          }
          owed = -1;
#elif KF_DET
          if ((tid & 127) == 0) {
            bulk_wait_all();
            if (det_owed >= 0) kfh::publish_dq_added(KF9_COUNTERS + det_owed, kDetAdd);
          }
          det_owed = -1;
#else
          if ((tid & 127) == 0) bulk_wait_all();
#endif
          __threadfence();
          consumer_sync();
          // Counted here: a split half, the query blocks its own steps of
          // head h visited (steps [j_lo, j_hi); the other half counts the
          // rest); a whole tile, every query block it visits.
// This pass's completed blocks (flags[j]), converted here one round trip each.
#define KF9_CONVERT_COMPLETED()                                                               \
  for (int j = 0; j < 256 && b0 + j < c_hi; ++j) {                                            \
    if (flags[j]) write_dq(p, T.q0, T.lq, KF9_COUNTED(b0 + j) * kBM, h, false, ct);            \
  }
#if KF_SPLIT
          const int c_lo = j_lo, c_hi = j_hi;
#define KF9_COUNTED(j) kfh::key_tile_block<kBM, kBN, true>(p, T, j)
#define KF9_COUNTED_MM(b) (b + ct < c_hi ? KF9_COUNTED(b + ct) : T.m_blocks)
#else
          const int c_lo = T.m_first, c_hi = T.m_blocks;
#define KF9_COUNTED(j) (j)
#define KF9_COUNTED_MM(b) (b + ct)
#endif
          for (int b0 = c_lo; b0 < c_hi; b0 += 256) {
            const int mm = KF9_COUNTED_MM(b0);
            int done = 0;
            if (mm < T.m_blocks && T.pack) {
              done = 1;
            } else if (mm < T.m_blocks) {
              int* counter = KF9_COUNTERS + (long long)(T.qbase + mm) * p.heads + h;
              done = ((atomicAdd(counter, 1) + 1) & kCountMask) ==
                     kfh::key_blocks_into<kBM, kBN>(T.lq, T.lk, mm, p.causal);
              __threadfence();
            }
            flags[ct] = done;
#if KF_HELP
            // Every tile handed out: the completed blocks go to the help
            // queue, three to an item, in slots reserved at once (a full
            // queue: converted here as before).
            const int n_done = consumer_sync_count(done);
            if (ct == 0) {
              int first = -1;
              if (n_done > 0 && (handed >= p.num_tiles || (KF_HELP == 2 && n_done >= KF9_HELP_MANY))) {
                const int items = (n_done + 2) / 3;
                const int r = atomicAdd(help_queue(p), items);
                first = r + items <= kf_bwd_sm90_help_items() ? r : -1;
              }
              help_s[0] = first;
            }
            consumer_sync();
            if (help_s[0] >= 0) {
              // (thread 0 alone: the items name the blocks, three to an item)
              if (ct == 0) {
                int slot = help_s[0], pa = -1, pb = -1;
                for (int j = 0; j < 256 && b0 + j < c_hi; ++j) {
                  if (!flags[j]) continue;
                  const int mc = KF9_COUNTED(b0 + j) * kBM;
                  if (pa < 0) {
                    pa = mc;
                  } else if (pb < 0) {
                    pb = mc;
                  } else {
                    help_push(p, slot++, T.q0, T.lq, h, pa, pb, mc);
                    pa = pb = -1;
                  }
                }
                if (pa >= 0) help_push(p, slot, T.q0, T.lq, h, pa, pb, -1);
                help_s[1] = 1;
              }
            } else {
              KF9_CONVERT_COMPLETED();
            }
#else
            consumer_sync();
            KF9_CONVERT_COMPLETED();
#endif
            consumer_sync();
          }
#undef KF9_COUNTED
#undef KF9_COUNTED_MM
#undef KF9_CONVERT_COMPLETED
          KF9_TRC(kTrConsHead, 0);
        }
      }
      ++kt;
    }
    reg_fence<kD / 2>(dk);
    reg_fence<kD / 2>(dv);
#if KF_SPLIT
    if (T.half) {
      // A split half: the first to finish leaves its fp32 partial in the
      // pair's workspace slot and raises the ready flag; the second waits for
      // the flag (the first is past its last step, so it never waits for
      // anything), adds the partial and stores dK and dV. One fp32 add per
      // element, so the sum does not depend on which half came first. The
      // slot's place: kernels/schedule.h, SplitAreaOffset (the counters'
      // area for any batch of p.total_q queries in p.batch sequences).
      constexpr int kSlotBytes = 256 * kD * 4;  // 256 consumer threads x (dK, dV) of kD / 2
      const long long area =
          (4ll * p.heads * (p.total_q / kBM + p.batch + 1) + 255) / 256 * 256;
      char* const pair = (char*)KF9_COUNTERS + area + (long long)T.slot * (256 + kSlotBytes);
      float4* const mine = (float4*)(pair + 256) + ct * (kD / 4);
      consumer_sync();  // every thread is done with flags[] of the last step
      if (ct == 0) flags[0] = atomicAdd((int*)pair, 1);
      consumer_sync();
      if (flags[0] == 0) {
#pragma unroll
        for (int i = 0; i < kD / 8; ++i) {
          mine[i] = make_float4(dk[4 * i], dk[4 * i + 1], dk[4 * i + 2], dk[4 * i + 3]);
          mine[kD / 8 + i] = make_float4(dv[4 * i], dv[4 * i + 1], dv[4 * i + 2], dv[4 * i + 3]);
        }
        __threadfence();
        consumer_sync();
        if (ct == 0) atomicExch((int*)pair + 1, 1);
        continue;  // the other half stores this key block's dK and dV
      }
      if (ct == 0) {
        while (*(volatile int*)((int*)pair + 1) == 0) __nanosleep(64);
        __threadfence();
      }
      consumer_sync();
#pragma unroll
      for (int i = 0; i < kD / 8; ++i) {
        const float4 a = __ldcg(mine + i), b = __ldcg(mine + kD / 8 + i);
        dk[4 * i] += a.x;
        dk[4 * i + 1] += a.y;
        dk[4 * i + 2] += a.z;
        dk[4 * i + 3] += a.w;
        dv[4 * i] += b.x;
        dv[4 * i + 1] += b.y;
        dv[4 * i + 2] += b.z;
        dv[4 * i + 3] += b.w;
      }
    }
#endif

    // dK (scaled) and dV of this consumer's keys (zeros when no query sees
    // them), staged in this consumer's dQ staging buffer, then stored.
    //
    // The buffer is free: the tile's last step waited for every bulk
    // reduce-add to have read it, and a step's consumer barrier (its dS
    // barrier, or a packed run's window barriers) follows the previous
    // tile's epilogue. A tile without steps (keys no query sees, such as a
    // cross-attention sequence without queries) passes no such barrier, so
    // it waits here for the other threads' copies of the previous tile's dV
    // and, under KVSTORE, for the TMA stores' reads (notes/bwd.md v19-v20).
    if (KF9_STEPS == 0) {
#if KF_KVSTORE
      if ((tid & 127) == 0) bulk_wait_read();
#endif
      wg_sync(2 + w);
    }
    {
      // The staging layout is 128B-swizzled panels of 64 rows x 64 head dims,
      // the layout a TMA box of the dk and dv maps reads: 16-byte chunk c of
      // row r at chunk c ^ (r % 8). A warp's 32-bit stores (8 rows x 4 column
      // pairs) fall in 32 distinct banks, and a quarter warp's 16-byte reads
      // of one row in 8 distinct chunks. The stores are 16 bytes a thread as
      // whole rows: the 32-bit stores straight from the accumulators
      // throttled the LSU (v6 profile). Every thread stages whatever the
      // keys: a branch around the accumulators' reads made ptxas serialise
      // the wgmmas (C7520, v19).
      auto stage = [&](const float* acc, float sc, u32 buf) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int row = r0 + 8 * e;
          // (an opaque move: ptxas keeps no loop-invariant addresses live
          // over the tile, add_dq's reason too)
          u32 a = buf + row * 128 + cq * 2;
          asm volatile("mov.b32 %0, %0;\n" : "+r"(a));
#pragma unroll
          for (int j = 0; j < kD / 8; ++j) {
            const u32 at = a + (u32)((j >> 3) * (64 * 128)) + (u32)((((j & 7) ^ (row & 7))) << 4);
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at),
                         "r"(pack_bf16(acc[4 * j + 2 * e] * sc, acc[4 * j + 2 * e + 1] * sc))
                         : "memory");
          }
        }
      };
      const int row0 = T.k0 + n0 + 64 * w;
#if KF_KVSTORE
      // KVSTORE: where all 64 keys of this consumer lie in the sequence, one
      // thread stores the panels through the dk and dv maps. A half with
      // keys past the sequence keeps the copy: a box past its end would
      // overwrite the next sequence's rows.
      const bool full = n0 + 64 * w + 64 <= T.lk;
      const bool lead = (tid & 127) == 0;
      const kfh::TmaMap* const dk_map = &maps.dk;
      const kfh::TmaMap* const dv_map = &maps.dv;
#else
      const kfh::TmaMap* const dk_map = nullptr;  // (no maps; the copy alone)
      const kfh::TmaMap* const dv_map = nullptr;
#endif
      // the panels at buf to this consumer's rows of out (by TMA through
      // `map` where the half is full under KVSTORE)
      auto store = [&](const kfh::TmaMap* map, bf16* out, u32 buf) {
#if KF_KVSTORE
        if (full) {
          if (lead) {
#pragma unroll
            for (int pn = 0; pn < kD / 64; ++pn) {
              kfh::tma_store_2d(map, T.g * kD + 64 * pn, row0, buf + pn * (64 * 128));
            }
            kfh::bulk_commit();
          }
          return;
        }
#endif
        // every thread copies its share of the rows inside the sequence
#pragma unroll 1
        for (int i = tid & 127; i < 64 * (kD / 8); i += 128) {
          const int row = i / (kD / 8), c = i % (kD / 8);
          if (n0 + 64 * w + row < T.lk) {
            const uint4 v =
                ld_shared_v4(buf + (c >> 3) * (64 * 128) + row * 128 + (((c & 7) ^ (row & 7)) << 4));
            *(uint4*)(out + ((long long)(row0 + row) * p.kv_heads + T.g) * kD + c * 8) = v;
          }
        }
      };
      // the panels' writes, before the TMA stores read them (async proxy)
      auto staged = [&]() {
#if KF_KVSTORE
        fence_proxy_async();
#endif
        wg_sync(2 + w);
      };
#if KF_DQ_DIRECT
      // (the last step's direct dQ stores read this buffer, other threads' rows)
      if (T.lk <= kBN) wg_sync(2 + w);
#endif
      if constexpr (kD == 128) {
        // one 16 KB pass each
        stage(dk, scale, sDq);
        staged();
        store(dk_map, (bf16*)p.dk, sDq);
#if KF_KVSTORE
        if (lead) bulk_wait_read();
#endif
        wg_sync(2 + w);  // the dV panels rewrite the buffer once it has been read
        stage(dv, 1.f, sDq);
        staged();
        store(dv_map, (bf16*)p.dv, sDq);
      } else {
        // dK and dV in one pass (two 8 KB halves)
        stage(dk, scale, sDq);
        stage(dv, 1.f, sDq + 64 * 128);
        staged();
        store(dk_map, (bf16*)p.dk, sDq);
        store(dv_map, (bf16*)p.dv, sDq + 64 * 128);
      }
      // (under KVSTORE the buffer's next writer waits for the stores' reads:
      // the lead thread's bulk_wait_read before the next step's consumer
      // barrier, or the wait above for a tile without steps)
      KF9_TRC(kTrConsEnd, 0);
    }
  }
#if KF_KVSTORE
  // The last TMA stores have written dK and dV before the CTA (and its
  // shared memory) goes.
  if ((tid & 127) == 0) bulk_wait_all();
#endif
#if KF_HELP
  help_convert(p, ct, flags);
#endif
}
