// The launch manifest: the machine-readable half of a kernel variant.
//
// Every variant is CUDA source plus a small JSON manifest telling the host how
// to launch it (block size, dynamic shared memory, grid policy, tile size,
// workspace) and where it may run (archs, features, head dims, ops, masks).
// The JSON form is what is stored and served; `Manifest` is its parsed form.
// Field reference: kernels/CONTRACT.md.
//
// Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor_map.h"

namespace kforge {

enum class GridPolicy {
  // grid = (ceil(max_seqlen_q / tile_m), heads, batch); blockIdx.x is the
  // query tile, blockIdx.y the head, blockIdx.z the sequence. Empty tiles
  // must exit early.
  kPerTile,
  // grid = min(num_tiles, SMs * CTAs per SM); CTAs take tiles from
  // KfAttnParams::tiles through atomicAdd on *tile_counter.
  kPersistent,
};

std::string_view GridPolicyName(GridPolicy g);  // "per_tile" | "persistent"

enum class TileOrder { kLongestFirst, kGrouped, kBalanced, kKeyLevels };
// "lpt" | "grouped" | "balanced" | "levels"
std::string_view TileOrderName(TileOrder o);

struct Manifest {
  int contract_version = 1;
  std::string entry_point = "kf_attn_fwd";
  int threads = 0;             // block size, 1-D; multiple of 32, <= 1024
  int dynamic_smem_bytes = 0;  // host sets the opt-in attribute above 48 KB
  GridPolicy grid = GridPolicy::kPerTile;
  int tile_m = 0;  // query rows per tile (also the tile list's m_block unit)
  int tile_n = 0;  // key rows per inner step (informational; scheduler cost)
  // Scratch the host allocates and zeroes before every launch:
  // workspace_fixed_bytes + workspace_per_tile_bytes * num_tiles.
  int64_t workspace_fixed_bytes = 0;
  int64_t workspace_per_tile_bytes = 0;
  std::vector<std::string> archs;     // e.g. {"sm_80", "sm_90a", "sm_100a"}
  std::vector<std::string> features;  // arch-specific instructions: "wgmma", "tma", "setmaxnreg", ...
  std::vector<int> head_dims;         // supported head dims
  std::vector<std::string> ops = {"fwd"};  // later "bwd"
  bool causal = true;     // supports causal (bottom-right) masks
  bool noncausal = true;  // supports no mask
  bool gqa = true;        // supports kv_heads < heads
  // CTAs resident per SM the persistent grid should assume; 0 = the host
  // estimates it from threads and shared memory (EstimateCtasPerSm).
  int ctas_per_sm = 0;
  // The variant handles packed tiles (persistent grid only): a tile entry
  // {b, h, 0, n} with n >= 1 holds the n consecutive short sequences
  // b .. b+n-1 in one tile (their query rows and keys are contiguous), each
  // row attending only to its own sequence's keys. See schedule.h.
  bool pack_short = false;
  // Order of the persistent tile list: kLongestFirst sorts every tile by
  // descending work; kGrouped keeps the tiles of one (sequence, head)
  // adjacent (descending work inside) and orders the groups by descending
  // work, so concurrently running CTAs share K/V in L2. kBalanced (forward
  // kernels with a static round-robin, not key_major): the host deals the
  // tiles, longest first, each to the CTA with the least work so far, and
  // lays the lists out so that entry t * grid + c is CTA c's t-th tile; an
  // entry {-1, 0, 0, 0} ends a CTA's list (the kernel must stop there).
  // kKeyLevels (key_major only): the (sequence, kv head) groups, heaviest
  // first, each group's key blocks last first, dealt a few groups at a time
  // key block by key block (one at a time under a causal mask with tile_n >=
  // 2 tile_m), so
  // key block j of a group comes after key block j + 1 (ordered dQ adds:
  // `deterministic`, CONTRACT.md "Backward"; schedule.cc SortKeyLevels).
  TileOrder tile_order = TileOrder::kLongestFirst;
  // Backward variants only (persistent grid): the tile list is key-major
  // (BuildKeyTiles in schedule.h): entries are key blocks of tile_n keys per
  // kv head, plus entries for query blocks that see no key; the host sizes
  // the workspace with one int per (query block, head) on top of the fixed
  // bytes. See CONTRACT.md, "Backward".
  bool key_major = false;
  // Key-major variants only: > 0 means the variant takes split key tiles
  // (halves of one key block's steps run by two CTAs that sum their dK/dV
  // partials; CONTRACT.md "Backward"), and each split pair needs this many
  // bytes of workspace for the partial the first half leaves.
  int64_t split_slot_bytes = 0;
  // Backward only: false means the host leaves dq_accum as the last launch
  // left it (no zeroing, about 2% of a long backward's time): the variant
  // writes every dq_accum element before reading it. The evaluator leaves
  // NaN there, random values or the last launch's leftovers, in turn, so a
  // variant that reads what it did not write fails. CONTRACT.md "Backward".
  bool zero_dq_accum = true;
  // Backward only, with zero_dq_accum: true means the variant leaves every
  // dq_accum element zero again when it completes (it zeroes what it read),
  // so the host zeroes dq_accum once, while the scratch is new or after a
  // launch that does not restore it, not before every launch. The evaluator
  // checks that every element is zero after every launch. CONTRACT.md
  // "Backward".
  bool restores_dq_accum = false;
  // Backward only: the variant writes bitwise the same dQ, dK and dV in
  // every launch on the same inputs (forward variants must always). The
  // evaluator fails a variant that says so and differs between launches;
  // clients that need reproducible training ask for such variants.
  bool deterministic = false;
  // TMA: one 2-D tensor map per entry, which the host encodes for every
  // launch and passes as the kernel's second parameter, after KfAttnParams
  // (CONTRACT.md "Tensor maps"). Needs the feature "tma".
  std::vector<TensorMapRequest> tensor_maps;
};

// Parses and validates the field types and ranges (not arch limits: see
// CheckVariant). Unknown keys are rejected so typos do not pass silently.
absl::StatusOr<Manifest> ParseManifest(std::string_view json);
std::string ManifestToJson(const Manifest& m);

// Features that exist only on an arch-specific target, and which targets have
// them: wgmma/setmaxnreg -> sm_90a; tma/mbarrier_tx -> sm_90+; tcgen05 -> sm_100a.
bool ArchHasFeature(std::string_view arch, std::string_view feature);

// Largest dynamic shared memory per block (opt-in) and per SM for an arch,
// e.g. sm_90*: 232448 / 233472 B; sm_80: 166912 / 167936 B. 0 = unknown arch.
int MaxSmemPerBlock(std::string_view arch);
int SmemPerSm(std::string_view arch);

// CTAs of this manifest that fit on one SM by threads and shared memory alone
// (registers are not known before compiling; a host with a driver should ask
// the occupancy API instead). At least 1.
int EstimateCtasPerSm(const Manifest& m, std::string_view arch);

}  // namespace kforge
