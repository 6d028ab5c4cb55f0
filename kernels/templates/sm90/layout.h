// Part of the Hopper templates (kernels/notes/parts.md): shared-memory
// layouts, the one definition that both the kernel and the host-side size
// (the manifest's dynamic_smem_bytes) evaluate, so there is no second
// "must match" formula. Plain C++17 constexpr, no includes: a template's
// build() prepends this file to the kernel source and its .cc includes it.
//
// Offsets are bytes from a 1024-byte-aligned base (128B-swizzled tiles must
// start on a 1024-byte boundary); dynamic_bytes adds the 1024 bytes a kernel
// may skip to align the base.
#pragma once

// Hands out regions one after another, each aligned as asked.
struct KfSmemCarver {
  int end;
  constexpr int take(int bytes, int align) {
    end = (end + align - 1) / align * align;
    const int at = end;
    end += bytes;
    return at;
  }
};

// fwd_sm90 with packed tiles (PACK=1): entries of one member-offset table,
// the run's cu_seqlens_q (or _k) from its first sequence to one past its
// last. BuildTiles' kMaxQueryPack sequences + 1, rounded up to 16 bytes.
constexpr int kf_fwd_sm90_pack_entries() { return 132; }

// fwd_sm90: Q (one tile, or two with QAHEAD=2), a ring of K tiles, a ring of V
// tiles, then the ring's mbarriers (and with PACK=1 the member-offset tables).
struct KfFwdSm90Layout {
  int q;            // Q tile, block_m x d bf16: one block of 64 rows per consumer warpgroup,
  int q_wg_bytes;   //   each d/64 panels of 64 rows x 128 B; warpgroup w at q + w * q_wg_bytes,
  int q_bytes;      //   buffer b (of q_bufs) at + b * q_bytes
  int kv_bytes;     // one K or V tile, block_n x d bf16 (d/64 panels of block_n rows x 128 B)
  int k;            // K stage s at k + s * kv_bytes
  int v;            // V stage s at v + s * kv_bytes
  int full_k;       // mbarriers, 8 B each, stage s at + 8 * s: K tile landed (32 arrivals) ...
  int full_v;       // ... V tile landed (32) ...
  int empty_k;      // ... K stage free again (8: one per consumer warp) ...
  int empty_v;      // ... V stage free again (8)
  int tabs;         // PACK=1: per consumer warpgroup w and buffer i (2 each), a q then a k table
                    //   of kf_fwd_sm90_pack_entries() ints at tabs + ((2 w + i) * 2 + kq) * entries * 4
  int total;        // bytes used from the aligned base
  int dynamic_bytes;// dynamic shared memory to request
};

constexpr KfFwdSm90Layout kf_fwd_sm90_layout(int d, int block_m, int block_n, int stages,
                                             int pack = 0, int q_bufs = 1) {
  KfFwdSm90Layout l{};
  KfSmemCarver c{0};
  l.q_wg_bytes = 64 * d * 2;
  l.q_bytes = block_m * d * 2;
  l.kv_bytes = block_n * d * 2;
  l.q = c.take(q_bufs * l.q_bytes, 1024);
  l.k = c.take(stages * l.kv_bytes, 1024);
  l.v = c.take(stages * l.kv_bytes, 1024);
  l.full_k = c.take(8 * stages, 8);
  l.full_v = c.take(8 * stages, 8);
  l.empty_k = c.take(8 * stages, 8);
  l.empty_v = c.take(8 * stages, 8);
  if (pack) l.tabs = c.take(2 * 2 * 2 * kf_fwd_sm90_pack_entries() * 4, 16);
  l.total = c.end;
  l.dynamic_bytes = l.total + 1024;
  return l;
}
