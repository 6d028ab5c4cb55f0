// Shared-memory layout of the Hopper backward (templates/bwd_sm90.cuh): the
// one definition that both the kernel source and the host-side size
// computation (templates/bwd_sm90.cc) evaluate, so there is no second
// "must match" formula. Plain C++17 constexpr, no includes: the catalog
// prepends this file to the kernel source (after the knob #defines) and
// bwd_sm90.cc includes it.
//
// Byte offsets from a 1024-byte-aligned base (128B-swizzled tiles must start
// on a 1024-byte boundary); dynamic_bytes adds the 1024 bytes the kernel may
// skip to align the base.
#pragma once

struct KfBwdSm90Layout {
  int k;            // K tile, BLOCK_N x D bf16: D/64 panels of BLOCK_N rows x 128 B
  int v;            // V tile, same shape
  int stage;        // stage 0: Q tile then dO tile (BLOCK_M x D each, same panel layout)
  int stage_bytes;  // stage s starts at stage + s * stage_bytes
  int tile_q_bytes; // one BLOCK_M x D tile (dO = Q + tile_q_bytes)
  int ds;           // two dS buffers, BLOCK_M rows x BLOCK_N keys bf16, K-major
  int ds_bytes;     //   (BLOCK_N/64 panels of BLOCK_M rows x 128 B); buffer b at ds + b * ds_bytes
  int dq;           // per consumer warpgroup a 64 x 64 fp32 dQ staging buffer (rows of
  int dq_bytes;     //   256 B, in dq_accum's layout); consumer w at dq + w * dq_bytes
  int o;            // the producer's O tile for delta (BLOCK_M x D bf16, laid out like Q)
  int lse;          // per stage: BLOCK_M floats LSE*log2(e) (+inf where P = 0) ...
  int delta;        // ... and BLOCK_M floats delta; stage s at + s * 4 * BLOCK_M
  int flags;        // 256 ints (dq completion flags of the consumer warpgroups), then
                    //   8 ints for the producer: 256-257 the delta claim it broadcasts,
                    //   258-259 the tile index it passes on, 260-261 the next one,
                    //   262-263 the stage's claim word (DQW)
  int win;          // the consumers': a packed tile's row windows (BLOCK_N ints, lo | hi << 16)
  int pack;         //   and its members' query and key offsets (2 x kf_bwd_sm90_pack_entries())
  int bars;         // mbarriers (8 B each): full[S], empty[S], kv_full, kv_empty,
                    //   tile_full[2], tile_empty[2], land[S] (TMA: a stage's Q and dO in)
  int help;         // 4 ints for the consumers (KF_HELP): 0 the first help-queue slot of a
                    //   head's end, 1 whether this tile pushed any item. Last, so that
                    //   every other offset is the same with and without the knob.
  int total;        // bytes used from the aligned base
  int dynamic_bytes;// dynamic shared memory to request
};

// Entries of each packed-run table (query and key offsets): a run of up to
// 128 sequences has 129 offsets, rounded up to keep the next table aligned.
// (A function, not a constant: under -default-device a namespace-scope
// constant becomes device memory.) BuildKeyTiles' kMaxKeyPack must fit.
constexpr int kf_bwd_sm90_pack_entries() { return 132; }

// The help queue (KF_HELP = 1 or 2, kernels/notes/bwd.md v16, v17): the manifest's fixed
// workspace bytes, before the counters. Ints 0 and 1: items reserved,
// tickets taken; int 32: tiles finished (the helpers poll it, so it sits in
// another 128-byte line than the two atomics); items of 8 ints each from int
// 64 ({lq, q0, head, up to three query-block row offsets}, lq written last as
// the item's tag).
constexpr int kf_bwd_sm90_help_items() { return 2048; }
constexpr int kf_bwd_sm90_help_bytes() { return 256 + 32 * kf_bwd_sm90_help_items(); }

constexpr KfBwdSm90Layout kf_bwd_sm90_layout(int d, int block_m, int block_n, int stages) {
  KfBwdSm90Layout l{};
  const int kv_bytes = block_n * d * 2;
  l.tile_q_bytes = block_m * d * 2;
  l.k = 0;
  l.v = l.k + kv_bytes;
  l.stage = l.v + kv_bytes;
  l.stage_bytes = 2 * l.tile_q_bytes;
  l.ds = l.stage + stages * l.stage_bytes;
  l.ds_bytes = block_m * block_n * 2;
  // (1024-aligned, like every tile before it: the staging addresses permute
  // bits 5-7 by XOR, which needs each 256-byte row on a 256-byte boundary)
  l.dq = l.ds + 2 * l.ds_bytes;
  l.dq_bytes = 64 * 256;
  l.o = l.dq + 2 * l.dq_bytes;
  l.lse = l.o + l.tile_q_bytes;
  l.delta = l.lse + stages * block_m * 4;
  l.flags = l.delta + stages * block_m * 4;
  l.win = l.flags + 264 * 4;
  l.pack = l.win + block_n * 4;
  l.bars = l.pack + 2 * kf_bwd_sm90_pack_entries() * 4;
  l.help = l.bars + (3 * stages + 6) * 8;
  l.total = l.help + 4 * 4;
  l.dynamic_bytes = l.total + 1024;
  return l;
}
