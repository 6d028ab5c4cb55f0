// Part of the Hopper templates (kernels/notes/parts.md): which query tiles a
// CTA works on, and what one tile covers. Every warp of the CTA walks the
// same sequence independently (no communication), so producer and consumers
// agree on the tile order and on the global K/V item index.
//
//   per-tile grid (kPersistent = false): grid (ceil(max_seqlen_q / BLOCK_M),
//     heads, batch); CTA (x, y, z) takes query block x of head y of sequence z,
//     which may be past the sequence's end (the tile is then empty).
//   persistent (kPersistent = true): grid = min(num_tiles, SMs); CTA c takes
//     entries c, c + grid, c + 2 grid, ... of p.tiles (the host's LPT order,
//     longest first): a static round-robin, p.tile_counter is not used.
//     kStops (tile_order "balanced"): the host has dealt the tiles to the
//     CTAs itself, so that entry t * grid + c is CTA c's t-th tile, and an
//     entry with b < 0 ends CTA c's list.
//   Packed tiles (kPack, manifest pack_short): {b, h, 0, n > 0} holds the n
//     sequences b .. b + n - 1 as one (at most 128 queries and 128 keys in
//     all); the geometry spans the whole run, and each row's keys are its
//     own member's (sm90/packed_rows.cuh).
#include "kforge/attn_params.h"

namespace kfh {

struct Tile {
  int b, h, mb;  // sequence, query head, query block
  int pack;      // sequences in a packed tile (kPack only; 0: a plain tile)
};

// The CTA's t-th tile (t = 0, 1, ...): false once there is none.
template <bool kPersistent, bool kStops = false, bool kPack = false>
__device__ __forceinline__ bool next_tile(const KfAttnParams& p, int t, Tile& tile) {
  tile.pack = 0;
  if constexpr (kPersistent) {
    int idx = blockIdx.x + t * gridDim.x;
    if (idx >= p.num_tiles) return false;
    const int* e = p.tiles + 4 * idx;
    tile.b = e[0];
    if (kStops && tile.b < 0) return false;
    tile.h = e[1];
    tile.mb = e[2];
    if (kPack) tile.pack = e[3];
    return true;
  } else {
    if (t > 0) return false;
    tile.b = blockIdx.z;
    tile.h = blockIdx.y;
    tile.mb = blockIdx.x;
    return true;
  }
}

// A query tile's rows and the key blocks it visits (forward).
struct QueryTileGeom {
  int q0, k0;  // the sequence's first query / key token
  int Lq, Lk;  // its query / key length
  int m0;      // first (sequence-local) query row of the tile
  int nb;      // key blocks of BN keys the tile sees (0: nothing to do)
  int hk;      // K/V head of the tile's query head (GQA)
};
template <int BM, int BN, bool kPack = false>
__device__ __forceinline__ void query_tile_geom(const KfAttnParams& p, const Tile& t, QueryTileGeom& g) {
  // a packed tile spans its members (the masks keep them apart)
  const int end = t.b + (kPack && t.pack > 0 ? t.pack : 1);
  g.q0 = p.cu_seqlens_q[t.b];
  g.Lq = p.cu_seqlens_q[end] - g.q0;
  g.k0 = p.cu_seqlens_k[t.b];
  g.Lk = p.cu_seqlens_k[end] - g.k0;
  g.m0 = t.mb * BM;
  g.hk = t.h / (p.heads / p.kv_heads);
  int n_end = g.Lk;
  if (p.causal && !(kPack && t.pack > 0)) {
    int last_row = min(g.m0 + BM, g.Lq);  // exclusive
    n_end = min(n_end, last_row + (g.Lk - g.Lq));
  }
  g.nb = (g.m0 < g.Lq && n_end > 0) ? (n_end + BN - 1) / BN : 0;
}

}  // namespace kfh
