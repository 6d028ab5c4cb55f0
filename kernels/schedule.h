// Host-side launch planning for jagged batches: the tile list of the
// persistent grid policy and the grid of either policy.
//
// A tile is one (sequence, head, query block of tile_m rows). Tiles of empty
// query sequences are skipped; tiles whose rows see no key (Lk = 0, or a
// causal mask with Lq > Lk) are kept because their output rows must still be
// written (zeros, LSE = -inf). Tiles are ordered longest work first (LPT),
// work = key blocks of tile_n the tile visits under the mask, + 1 for the
// prologue/epilogue; ties keep (sequence, query block, head) order so tiles
// sharing K/V run close together.
//
// Packing (variants whose manifest says pack_short): runs of consecutive
// sequences with 1 <= Lq <= tile_m and Lk <= tile_m whose summed query rows
// and summed keys both stay within tile_m become one tile {b, h, 0, n}: rows
// of different sequences share the tile and each attends only to its own
// keys. Sequences with Lq = 0 and Lk = 0 are absorbed; any other sequence
// ends the run, and so does reaching kMaxQueryPack sequences (absorbed ones
// included). A run of one sequence stays a plain tile (n = 0). This turns
// thousands of tiny tiles (heavy-tailed batches) into a few dense ones.
//
// Thread-safe: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/manifest.h"

namespace kforge {

inline constexpr int kMaxQueryPack = 128;  // sequences in one packed query tile

struct TileWork {
  int32_t batch = 0;
  int32_t head = 0;
  int32_t m_block = 0;
  int64_t work = 0;  // key blocks visited + 1
  int32_t pack = 0;  // sequences packed into this tile (0: a plain tile)
};

// Key blocks (of tile_n) that query block m_block of a sequence with lq
// queries and lk keys visits; causal masks are bottom-right aligned.
int64_t TileKeyBlocks(int64_t lq, int64_t lk, int64_t m_block, int tile_m, int tile_n,
                      bool causal);

// All non-empty tiles, longest work first. cu_seqlens_k empty = self-attention.
absl::StatusOr<std::vector<TileWork>> BuildTiles(std::span<const int32_t> cu_seqlens_q,
                                                 std::span<const int32_t> cu_seqlens_k,
                                                 int heads, int tile_m, int tile_n,
                                                 bool causal, bool pack_short = false,
                                                 TileOrder order = TileOrder::kLongestFirst);

// Key-major tiles for backward variants (manifest key_major), built so that
// a CTA owns the dK/dV of one key block and adds its dQ contributions into
// dq_accum:
//   {b, g, n_block, qbase}: keys [n_block * tile_n, +tile_n) of sequence b,
//     kv head g; the kernel visits every query head of g's group and every
//     query block (tile_m rows) that sees one of the keys. Sequences with
//     keys but no queries get these tiles too (their dK, dV are zeros).
//   {b, h, -1 - m_block, qbase}: query block m_block of sequence b, head h,
//     sees no key at all: the kernel writes its dQ rows as zeros.
//   {b, g, 0, -n} (pack_short only): the n >= 2 consecutive short sequences
//     b .. b+n-1 share one key block, at most tile_n queries and tile_n keys
//     in all (kMaxKeyPack sequences at most, absorbed empty ones included):
//     keys cu_k[b] .. cu_k[b+n]-1, query rows cu_q[b] .. cu_q[b+n]-1 visited
//     in blocks of tile_m, each row attending to its own sequence's keys. The
//     tile is the only one that sees these rows, so it writes their dQ (no
//     counters, no zero-dQ tiles for them).
// qbase is the number of query blocks of the sequences before b, so query
// block m of sequence b, head h owns workspace int (qbase + m) * heads + h:
// the count of key blocks that have added into its dq_accum rows. The CTA
// that brings it to TileKeyBlocks(lq, lk, m, ...) converts the rows to dQ.
// Work = (query blocks visited x heads of the group) + 1; longest first, or
// with TileOrder::kGrouped the key blocks of one (sequence, kv head) adjacent
// (descending work inside, groups by descending total work, the zero-dQ
// tiles last): a persistent grid then runs a group's key blocks side by side,
// so the Q, dO and dq_accum rows they all visit stay in L2. Given the grid
// (`ctas` > 0), the last few groups (at most 12, as many as one round of the
// grid takes) may go out longest tile first instead, where a model of the
// tile counter says the list then ends sooner.
inline constexpr int kMaxKeyPack = 128;  // sequences in one packed key tile
struct KeyMajorTiles {
  std::vector<TileWork> tiles;  // m_block holds n_block (or -1 - m_block), pack holds qbase (or -n)
  int64_t query_blocks = 0;     // over the whole batch
};

// Split key tiles (manifest split_slot_bytes > 0): when the heaviest plain
// key tiles (work at least half the heaviest's) are at most half as many as
// the CTAs, and take 8 steps or more, a CTA of their own each would still
// leave them the critical path while other SMs idle. Each becomes two
// halves, in place: head g | half << 16 | slot << 18 (half 1: the first
// steps / 2 steps, half 2: the rest; slot: the pair's index, < kMaxSplits).
// The two halves visit disjoint query blocks, so each query block is still
// added into (and counted) once by its key block; the half that finishes
// second sums the other's dK/dV partial. And only where that shortens the
// list: a model of the tile counter (each tile, in list order, to the CTA
// that frees first; a half's step at 1.3 of a whole tile's, as measured)
// must finish sooner with the halves. Returns the pairs made.
inline constexpr int kMaxSplits = 8192;
int SplitHeavyKeyTiles(std::vector<TileWork>& tiles, int ctas);

// Where the split pairs' workspace begins (bytes from the workspace start):
// after the fixed bytes and a counter area sized for any batch of this many
// queries and sequences (4 * heads * (total_q / tile_m + batch + 1) bytes, at
// least the exact count, rounded up to 256), so the kernel finds it from
// KfAttnParams alone. Pair s's 8 bytes of flags (arrivals, ready) are at
// base + s * (256 + slot_bytes), its partial 256 bytes further.
int64_t SplitAreaOffset(int64_t fixed_bytes, int64_t total_q, int64_t batch, int heads,
                        int tile_m);
absl::StatusOr<KeyMajorTiles> BuildKeyTiles(std::span<const int32_t> cu_seqlens_q,
                                            std::span<const int32_t> cu_seqlens_k, int heads,
                                            int kv_heads, int tile_m, int tile_n, bool causal,
                                            TileOrder order = TileOrder::kLongestFirst,
                                            bool pack_short = false, int ctas = 0);

// TileOrder::kBalanced: the tiles (longest first, as BuildTiles orders
// them) dealt to `lists` CTAs, each to the one with the least work so far
// (ties: the lower index), and laid out for a static round-robin: entry
// t * lists + c is CTA c's t-th tile, and a stop entry {-1, 0, 0, 0} (work 0)
// ends a list shorter than the longest. A CTA that draws a long tile then
// takes no short ones after it, which the plain round-robin would give it.
inline constexpr TileWork kStopTile = {-1, 0, 0, 0, 0};
std::vector<TileWork> BalanceTiles(std::span<const TileWork> tiles, int lists);

// Flattens tiles into the int4 {b, h, m_block, pack} array KfAttnParams::tiles points to.
std::vector<int32_t> PackTiles(std::span<const TileWork> tiles);

struct LaunchPlan {
  std::array<unsigned, 3> grid = {1, 1, 1};
  unsigned threads = 0;
  int dynamic_smem_bytes = 0;
  std::vector<int32_t> tiles;  // packed int4s; empty for per_tile
  int num_tiles = 0;           // tiles of the batch (both policies)
  int64_t workspace_bytes = 0; // to allocate and zero before the launch
  int64_t total_work = 0;      // sum of TileWork::work (for cost models)
  bool empty = false;          // nothing to launch (no query rows at all)
};

// Plans one launch. ctas_per_sm <= 0 uses manifest.ctas_per_sm, else
// EstimateCtasPerSm(manifest, arch). Errors name the offending input
// (offsets not starting at 0 / decreasing, batch > 65535 with per_tile, ...).
// kv_heads <= 0 means kv_heads = heads (used by key-major plans only).
absl::StatusOr<LaunchPlan> PlanLaunch(const Manifest& manifest,
                                      std::span<const int32_t> cu_seqlens_q,
                                      std::span<const int32_t> cu_seqlens_k, int heads,
                                      bool causal, std::string_view arch, int num_sms,
                                      int ctas_per_sm = 0, int kv_heads = 0);

}  // namespace kforge
