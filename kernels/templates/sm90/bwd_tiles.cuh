// Part of the Hopper templates (kernels/notes/parts.md): the backward's
// key-major tiles as the kernel sees them (the host builds them with
// BuildKeyTiles, kernels/schedule.h; kernels/CONTRACT.md "Backward"), the
// query blocks a tile visits, and how many key blocks add into a query block.
// BM query rows a step, BN keys a tile.
#include "kforge/attn_params.h"

namespace kfh {

// One key-major tile: {b, g, block, qbase} from the list (split halves:
// kernels/schedule.h, SplitHeavyKeyTiles), the sequence's
// offsets and lengths, and the steps (query head of the group x visited
// query block) it takes. block < 0 is a query block that sees no key (its
// dQ is zero): it has no steps. qbase < 0 is a packed run of pack = -qbase
// sequences b.. (manifest pack_short): q0, lq, k0, lk then span the whole
// run, block is 0, and every query block is visited (the row windows mask
// the keys of other sequences).
struct KeyTile {
  int b, g, block, qbase;
  int q0, lq, k0, lk, shift, pack;
  int group, m_first, m_blocks, visited, steps;
  // kSplit: a split key tile's half (0: the whole tile, 1, 2), its pair's
  // slot, and the steps [i0, i1) this half takes (the whole tile: 0, steps).
  int half, slot, i0, i1;
};

// Entry idx of p.tiles into T; false when the list has no such entry.
template <int BM, int BN, bool kSplit = false>
__device__ __forceinline__ bool key_tile(const KfAttnParams& p, int idx, KeyTile& T) {
  if (idx >= p.num_tiles) return false;
  const int* e = p.tiles + 4 * idx;
  T.b = e[0];
  // split halves carry half << 16 | slot << 18 above the kv head
  T.g = kSplit ? (e[1] & 0xffff) : e[1];
  T.half = kSplit ? (e[1] >> 16) & 3 : 0;
  T.slot = kSplit ? e[1] >> 18 : 0;
  T.block = e[2];
  T.qbase = e[3];
  T.pack = T.qbase < 0 ? -T.qbase : 0;
  const int end = T.b + (T.pack ? T.pack : 1);
  T.q0 = p.cu_seqlens_q[T.b];
  T.lq = p.cu_seqlens_q[end] - T.q0;
  T.k0 = p.cu_seqlens_k[T.b];
  T.lk = p.cu_seqlens_k[end] - T.k0;
  T.shift = T.lk - T.lq;
  T.group = p.heads / p.kv_heads;
  T.m_blocks = (T.lq + BM - 1) / BM;
  T.m_first = T.m_blocks;
  T.visited = 0;
  T.steps = 0;
  if (T.block >= 0) {
    // Query rows i see key n0 when i >= n0 - shift (causal); all otherwise.
    const int n0 = T.block * BN;
    const int first_row = p.causal && !T.pack ? (n0 - T.shift > 0 ? n0 - T.shift : 0) : 0;
    T.m_first = first_row >= T.lq ? T.m_blocks : first_row / BM;
    T.visited = T.m_blocks - T.m_first;
    T.steps = T.group * T.visited;
  }
  T.i0 = T.half == 2 ? T.steps / 2 : 0;
  T.i1 = T.half == 1 ? T.steps / 2 : T.steps;
  return true;
}

// Step u (0 <= u < i1 - i0) of a tile or split half, as a step index i in
// [i0, i1). Half 2 walks its steps backwards: with the staggered order the
// key blocks of a sequence are walkers at distinct query blocks moving
// together, and a second half started mid-way runs beside another key
// block's first half (both add into the same dq_accum rows and race for
// the same delta claims at every step); walking the other way it crosses
// the walkers it meets in one step (notes/bwd.md, v8).
__device__ __forceinline__ int key_tile_step(const KeyTile& T, int u) {
  return T.half == 2 ? T.i1 - 1 - u : T.i0 + u;
}

// Whether step i is the last, in this tile's (or half's) order, of its
// query head's steps here; [lo, hi) are those steps, whose query blocks
// the tile counts itself into at that step (kernels/CONTRACT.md
// "Backward": each (query block, head) counts each key block once).
__device__ __forceinline__ bool head_steps_end(const KeyTile& T, int i, int& lo, int& hi) {
  const int first = i - i % T.visited;  // the head's first step in the whole tile
  lo = first > T.i0 ? first : T.i0;
  hi = first + T.visited < T.i1 ? first + T.visited : T.i1;
  return T.half == 2 ? i == lo : i == hi - 1;
}

// The query block of step i of a tile (i counts query heads, then blocks).
// kStaggered: without a causal mask key block n starts at its diagonal query
// block n * BN / BM and wraps around, so the key blocks of one sequence that
// run side by side (the grouped tile order) are at different query blocks.
template <int BM, int BN, bool kStaggered>
__device__ __forceinline__ int key_tile_block(const KfAttnParams& p, const KeyTile& T, int i) {
  if constexpr (kStaggered) {
    const int j = i % T.visited;
    if (p.causal) return T.m_first + j;
    const int r = j + T.block * (BN / BM) % T.visited;
    return T.m_first + (r >= T.visited ? r - T.visited : r);
  } else {
    return T.m_first + i % T.visited;
  }
}

// The keys that query row r (from T.q0) of a packed tile may see, as
// tile-local indices lo | hi << 16 (lo <= key - T.k0 < hi; the rule:
// member_key_window, sm90/packed_rows.cuh).
// tab_q / tab_k hold the members' query and key offsets from T.q0 / T.k0
// (T.pack + 1 entries each, in shared memory).
__device__ __forceinline__ int packed_key_window(const KfAttnParams& p, const KeyTile& T, int r,
                                                 const int* tab_q, const int* tab_k) {
  // The member holding row r: the last one that starts at or before it
  // (empty members start where the next one does, so they are skipped).
  int lo = 0, up = T.pack;
  while (up - lo > 1) {
    const int mid = (lo + up) >> 1;
    if (tab_q[mid] <= r) lo = mid; else up = mid;
  }
  const int i = r - tab_q[lo], lqs = tab_q[lo + 1] - tab_q[lo];
  const int ks = tab_k[lo];
  return member_key_window(p.causal != 0, i, lqs, ks, tab_k[lo + 1] - ks);
}

// Key blocks that add into query block m (bwd_mma's rule; the host's
// TileKeyBlocks gives the same count).
template <int BM, int BN>
__device__ __forceinline__ int key_blocks_into(int lq, int lk, int m, bool causal) {
  int n_end = lk;
  if (causal) {
    const int last = (lq < (m + 1) * BM ? lq : (m + 1) * BM) - 1;
    n_end = last + 1 + (lk - lq);
    n_end = n_end < 0 ? 0 : (n_end > lk ? lk : n_end);
  }
  return (n_end + BN - 1) / BN;
}

}  // namespace kfh
