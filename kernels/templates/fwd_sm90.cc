// TemplateDef of the Hopper wgmma forward (templates/fwd_sm90.cuh on the
// shared parts in templates/sm90/), owned by sm90.
// Notes and measurements: kernels/notes/sm90.md, kernels/notes/parts.md.
#include <algorithm>

#include <fmt/format.h>

#include "kernels/template_def.h"
#include "kernels/templates/sm90/layout.h"
#include "kernels/templates/sm90/parts.h"
#include "kernels/schedule.h"

namespace kforge::templates {
namespace {

// The kernel's member-offset tables hold a packed run's kMaxQueryPack + 1 offsets.
static_assert(kf_fwd_sm90_pack_entries() >= kMaxQueryPack + 1,
              "fwd_sm90's packed-run tables are smaller than BuildTiles' runs");

int Knob(const std::map<std::string, int>& k, const char* name) { return k.at(name); }

// The kernel's own layout (templates/sm90/layout.h), evaluated here.
int SmemBytes(const std::map<std::string, int>& k, int d) {
  return kf_fwd_sm90_layout(d, Knob(k, "BLOCK_M"), Knob(k, "BLOCK_N"), Knob(k, "STAGES"),
                            Knob(k, "PACK"), Knob(k, "QAHEAD") == 2 ? 2 : 1)
      .dynamic_bytes;
}

}  // namespace

TemplateDef FwdSm90Template() {
  TemplateDef def;
  def.info.name = "fwd_sm90";
  def.info.archs = {"sm_90a"};
  def.info.ops = {"fwd"};
  def.info.head_dims = {64, 128};
  def.info.knobs = {
      {"BLOCK_M", {128}, 128},
      {"BLOCK_N", {64, 96, 128, 176, 192}, 128},
      {"STAGES", {2, 3, 4}, 2},
      {"PERSISTENT", {0, 1}, 1},
      {"ORDER", {0, 1, 2}, 0},
      {"PACK", {0, 1}, 0},
      {"QAHEAD", {0, 1, 2}, 0},
  };
  def.info.description =
      "Hopper forward: 1 producer warpgroup (cp.async K/V into a 128B-swizzled mbarrier ring) + 2 "
      "consumer warpgroups (wgmma SS for QK^T, RS for PV with P in registers, intra-warpgroup "
      "softmax/QK^T overlap), setmaxnreg 40/232/232, per-tile or persistent grid (static "
      "round-robin over the longest-first list, ORDER=1 a host-balanced list, ORDER=2 the list "
      "grouped by (sequence, head)), PACK=1 packs runs of short sequences "
      "into one tile, QAHEAD=1 requests the next tile's Q early, QAHEAD=2 chains tiles (two Q "
      "buffers, the next tile's first QK^T beside this one's last PV)";
  def.validate = [](const std::map<std::string, int>& k, int d) -> absl::Status {
    if (d == 128 && Knob(k, "BLOCK_N") > 176) {
      return absl::InvalidArgumentError(fmt::format(
          "fwd_sm90: head_dim 128 with BLOCK_N={} serialises wgmma and spills (232 registers per "
          "consumer thread); use BLOCK_N <= 176",
          Knob(k, "BLOCK_N")));
    }
    if (Knob(k, "PACK") == 1 && (Knob(k, "PERSISTENT") != 1 || Knob(k, "BLOCK_N") < 128)) {
      return absl::InvalidArgumentError(fmt::format(
          "fwd_sm90: PACK=1 needs PERSISTENT=1 (packed tiles exist only in the tile list) and "
          "BLOCK_N >= 128 (a packed tile's up to 128 keys in one block); got PERSISTENT={} "
          "BLOCK_N={}",
          Knob(k, "PERSISTENT"), Knob(k, "BLOCK_N")));
    }
    if (Knob(k, "PACK") == 1 && d == 128 && Knob(k, "BLOCK_N") > 128) {
      return absl::InvalidArgumentError(fmt::format(
          "fwd_sm90: PACK=1 at head_dim 128 with BLOCK_N={} spills (the packed path's row "
          "windows and lookahead do not fit beside 176 score columns); use BLOCK_N=128",
          Knob(k, "BLOCK_N")));
    }
    if (Knob(k, "QAHEAD") >= 1 && Knob(k, "PERSISTENT") != 1) {
      return absl::InvalidArgumentError(fmt::format(
          "fwd_sm90: QAHEAD={} (the next tile's Q requested early) needs PERSISTENT=1 (a CTA's "
          "next tile is known only in the tile list)",
          Knob(k, "QAHEAD")));
    }
    if (Knob(k, "QAHEAD") >= 1 && d == 128 && Knob(k, "BLOCK_N") > 128) {
      return absl::InvalidArgumentError(fmt::format(
          "fwd_sm90: QAHEAD={} at head_dim 128 with BLOCK_N={} spills (the next tile's entry and "
          "geometry do not fit beside 176 score columns); use BLOCK_N <= 128",
          Knob(k, "QAHEAD"), Knob(k, "BLOCK_N")));
    }
    if (Knob(k, "QAHEAD") == 2 && Knob(k, "PACK") == 1) {
      return absl::InvalidArgumentError(
          "fwd_sm90: QAHEAD=2 (tiles chained through two Q buffers) is for plain tiles; packed "
          "tiles (PACK=1) request their Q with QAHEAD=0 or 1");
    }
    if (Knob(k, "ORDER") >= 1 && Knob(k, "PERSISTENT") != 1) {
      return absl::InvalidArgumentError(fmt::format(
          "fwd_sm90: ORDER={} (a host-ordered tile list) needs PERSISTENT=1", Knob(k, "ORDER")));
    }
    if (Knob(k, "ORDER") == 2 && Knob(k, "PACK") == 1) {
      return absl::InvalidArgumentError(
          "fwd_sm90: ORDER=2 (the grouped tile list) is for plain tiles; packed runs (PACK=1) "
          "take ORDER=1, the balanced list");
    }
    if (SmemBytes(k, d) > 232448) {
      return absl::InvalidArgumentError(fmt::format(
          "fwd_sm90: {} B of shared memory (BLOCK_N={}, STAGES={}, head_dim={}) exceeds sm_90a's "
          "232448 B limit",
          SmemBytes(k, d), Knob(k, "BLOCK_N"), Knob(k, "STAGES"), d));
    }
    return absl::OkStatus();
  };
  def.build = [archs = def.info.archs](const std::map<std::string, int>& k,
                                       int d) -> absl::StatusOr<Variant> {
    Variant v;
    v.source = KnobPrelude(k, d) + sm90::Assemble(sm90::FwdSm90Parts());
    Manifest& m = v.manifest;
    m.entry_point = "kf_attn_fwd";
    m.threads = 384;
    m.dynamic_smem_bytes = SmemBytes(k, d);
    m.grid = Knob(k, "PERSISTENT") ? GridPolicy::kPersistent : GridPolicy::kPerTile;
    m.tile_m = 128;
    m.tile_n = Knob(k, "BLOCK_N");
    m.archs = archs;
    m.features = {"wgmma", "setmaxnreg", "cp_async"};
    m.head_dims = {d};
    m.ops = {"fwd"};
    m.causal = m.noncausal = m.gqa = true;
    m.ctas_per_sm = 1;
    m.pack_short = Knob(k, "PACK") == 1;
    // ORDER=2: the tiles of one (sequence, head) side by side, so that the CTAs
    // running together share K/V in L2 (H100 2026-12-06, notes/sm90.md: 855-859
    // us against 886-889 on hstu_imbal_causal in two runs, 0.94x on
    // d64_self_causal: a search option, not a default). The kernel walks it as
    // it walks ORDER=0's list.
    m.tile_order = Knob(k, "ORDER") == 1   ? TileOrder::kBalanced
                   : Knob(k, "ORDER") == 2 ? TileOrder::kGrouped
                                           : TileOrder::kLongestFirst;
    return v;
  };
  def.default_knobs = [](const ShapeKey& s) -> std::map<std::string, int> {
    std::map<std::string, int> k = {
        {"BLOCK_M", 128}, {"BLOCK_N", 128}, {"STAGES", 2}, {"PERSISTENT", 1}};
    // Long sequences: the per-tile grid keeps the CTAs of one (sequence, head)
    // together, so K/V stay in L2 (measured 462 vs 374 TFLOP/s on
    // hstu_prod_causal with an LPT tile list that interleaves sequences).
    if (s.max_len_q >= 2048) k["PERSISTENT"] = 0;
    // Long queries over short keys (a mean of at most 128 keys, 512 queries
    // or more; fwd_stream takes those of at most 32): a tile has one or two
    // key blocks, so 64-key blocks waste less of the last one and a third
    // stage keeps loads in flight; persistent (1068 us against 1166 for the
    // defaults and 1283 per tile on 512 sequences of 1024-2048 queries over
    // 1-200 keys, H200 2026-12-02, kernels/notes/coverage.md).
    if (MeanKeys(s) <= 128 && MeanQueries(s) >= 512) {
      k["BLOCK_N"] = 64;
      k["STAGES"] = 3;
      k["PERSISTENT"] = 1;
    }
    // Heavy-tailed batches of short sequences: packed runs in a host-balanced
    // list, so the long sequences' tiles each get a CTA of their own.
    if (HeavyTailedShort(s, /*keys=*/false)) {
      k["PERSISTENT"] = 1;
      k["ORDER"] = 1;
      k["PACK"] = 1;
    } else if (k["PERSISTENT"] == 1 && s.heads < 8 * s.kv_heads) {
      // A plain persistent tile requests the next tile's Q once its last QK^T
      // has read its own (H200, 2026-12-02, kernels/notes/sm90.md: 1003 us
      // against 1068 on long queries over 1-200 keys, 1-8% on the public
      // persistent shapes). Not with packed runs (they request their own, 1%
      // slower), nor with 8 or more query heads a kv head (2837 us against
      // 2773 on 16 heads over 2, head dim 64).
      k["QAHEAD"] = 1;
      // With the next tile's Q requested early the K/V ring is what a tile
      // waits for next: a third stage (H100, 2026-12-06 notes/sm90.md: 909 us
      // against 950 on hstu_imbal_causal, 2166 against 2374 on gdpa_self,
      // 1568 against 1638 on d64_self_causal; it fits at head dim 128 with
      // BLOCK_N 128 by 2 KB).
      k["STAGES"] = std::max(k["STAGES"], 3);
    }
    return k;
  };
  def.preference = [](const ShapeKey& s) {
    if (s.arch != "sm_90a") return 0;
    if (s.head_dim != 64 && s.head_dim != 128) return 0;
    // Above fwd_mma's packed tiles (30) where a long tail exists: the long
    // sequences' tiles run on wgmma (powerlaw_short, H200: 61.8 us against
    // 79.6 for fwd_mma; its 1929-query sequence alone 42 against 67 us).
    // Batches of tiny sequences only stay with fwd_mma (equal there, and it
    // runs several CTAs per SM).
    if (HeavyTailedShort(s, /*keys=*/false)) return 35;
    return 20;
  };
  return def;
}

}  // namespace kforge::templates
