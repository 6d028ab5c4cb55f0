// TemplateDef of the portable mma.sync forward (templates/fwd_mma.cuh).
#include <fmt/format.h>

#include "core/arch.h"
#include "kernels/template_def.h"

namespace kforge::embedded {
extern const char fwd_mma_cuh[];
extern const char mma_common_cuh[];
}

namespace kforge::templates {
namespace {

int Knob(const std::map<std::string, int>& k, const char* name) { return k.at(name); }

// Must match the shared-memory carve-up at the top of fwd_mma.cuh.
int SmemBytes(const std::map<std::string, int>& k, int d) {
  const int q = Knob(k, "BLOCK_M") * d * 2;
  const int kv = Knob(k, "STAGES") * 2 * Knob(k, "BLOCK_N") * d * 2;
  return q + kv;
}

bool IsSm100(const std::string& arch) {
  const absl::StatusOr<Arch> a = ParseArch(arch);
  return a.ok() && a->number() == 100;
}

}  // namespace

TemplateDef FwdMmaTemplate() {
  TemplateDef def;
  def.info.name = "fwd_mma";
  def.info.archs = {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100a"};
  def.info.ops = {"fwd"};
  // 256 compiles (with 30-600 B of spills, see notes/portable.md) but has not
  // been verified on a GPU yet, so it is not offered.
  def.info.head_dims = {64, 128};
  def.info.knobs = {
      {"BLOCK_M", {64, 128}, 128},
      {"BLOCK_N", {32, 64, 128}, 64},
      {"WARPS", {4, 8}, 8},
      {"STAGES", {1, 2}, 2},
      {"PERSISTENT", {0, 1}, 1},
      {"MIN_BLOCKS", {1, 2, 3, 4}, 1},
      {"PACK", {0, 1}, 1},
      {"ORDER", {0, 1}, 0},  // persistent tile list: 0 longest-first, 1 grouped by sequence
  };
  def.info.description =
      "FlashAttention-2-style forward on mma.sync m16n8k16 bf16: 16 query rows per warp with Q in "
      "registers, cp.async K/V ring of STAGES, online exp2 softmax, per-tile or persistent LPT grid";
  def.validate = [](const std::map<std::string, int>& k, int d) -> absl::Status {
    if (Knob(k, "BLOCK_M") != 16 * Knob(k, "WARPS")) {
      return absl::InvalidArgumentError(fmt::format(
          "fwd_mma: BLOCK_M={} with WARPS={}: each warp owns 16 query rows, so BLOCK_M must equal "
          "16*WARPS",
          Knob(k, "BLOCK_M"), Knob(k, "WARPS")));
    }
    if (d == 256 && Knob(k, "BLOCK_N") > 64) {
      return absl::InvalidArgumentError(fmt::format(
          "fwd_mma: head_dim 256 with BLOCK_N={} needs more than 255 registers per thread; use "
          "BLOCK_N <= 64",
          Knob(k, "BLOCK_N")));
    }
    if (SmemBytes(k, d) > 232448) {
      return absl::InvalidArgumentError(fmt::format(
          "fwd_mma: {} B of shared memory (BLOCK_M={}, BLOCK_N={}, STAGES={}, head_dim={}) exceeds "
          "every arch's 232448 B limit",
          SmemBytes(k, d), Knob(k, "BLOCK_M"), Knob(k, "BLOCK_N"), Knob(k, "STAGES"), d));
    }
    return absl::OkStatus();
  };
  def.build = [archs = def.info.archs](const std::map<std::string, int>& k,
                                       int d) -> absl::StatusOr<Variant> {
    Variant v;
    v.source = KnobPrelude(k, d) + embedded::mma_common_cuh + embedded::fwd_mma_cuh;
    Manifest& m = v.manifest;
    m.entry_point = "kf_attn_fwd";
    m.threads = 32 * Knob(k, "WARPS");
    m.dynamic_smem_bytes = SmemBytes(k, d);
    m.grid = Knob(k, "PERSISTENT") ? GridPolicy::kPersistent : GridPolicy::kPerTile;
    m.tile_m = Knob(k, "BLOCK_M");
    m.tile_n = Knob(k, "BLOCK_N");
    m.archs = archs;
    m.features = {"cp_async", "mma_sync", "ldmatrix"};
    m.head_dims = {d};
    m.ops = {"fwd"};
    m.causal = m.noncausal = m.gqa = true;
    m.ctas_per_sm = Knob(k, "MIN_BLOCKS") > 1 ? Knob(k, "MIN_BLOCKS") : 0;
    // Packed tiles come from the host's tile list: PACK is ignored per_tile.
    m.pack_short = Knob(k, "PACK") == 1 && Knob(k, "PERSISTENT") == 1;
    m.tile_order = Knob(k, "ORDER") == 1 ? TileOrder::kGrouped : TileOrder::kLongestFirst;
    return v;
  };
  // Defaults from the H200 sweep (kernels/notes/portable.md, bench/RESULTS.md).
  def.default_knobs = [](const ShapeKey& s) -> std::map<std::string, int> {
    std::map<std::string, int> k = {{"BLOCK_M", 128}, {"WARPS", 8}, {"BLOCK_N", 128},
                                    {"STAGES", 2}, {"PERSISTENT", 1}, {"MIN_BLOCKS", 1},
                                    {"PACK", 1}};
    const int64_t mean_q = s.batch > 0 ? s.total_q / s.batch : s.max_len_q;
    if (s.head_dim == 64) {
      // 168 registers, 3 CTAs of 4 warps per SM: best mma variant on both D=64 shapes.
      k = {{"BLOCK_M", 64}, {"WARPS", 4}, {"BLOCK_N", 64}, {"STAGES", 2},
           {"PERSISTENT", 1}, {"MIN_BLOCKS", 3}, {"PACK", 1}};
    } else if (mean_q <= 256 || (s.max_len_q > 0 && s.max_len_q <= 256)) {
      // Short sequences: small tiles, packed (powerlaw_short 53 us vs 62 us at BM=128).
      k["BLOCK_M"] = 64;
      k["WARPS"] = 4;
      k["BLOCK_N"] = 64;
    }
    // sm_100a's ptxas spills BLOCK_N=128 with two stages (8-16 B); one stage fits.
    if (s.head_dim == 128 && k["BLOCK_N"] == 128 && IsSm100(s.arch)) {
      k["STAGES"] = 1;
    }
    return k;
  };
  // Batches of mostly tiny sequences are won by packed tiles, which this
  // template has on every arch; on sm_90a fwd_sm90's packed tiles rank above
  // it where a long tail exists (HeavyTailedShort, template_def.h); elsewhere
  // an arch-specific template should win when one exists.
  def.preference = [](const ShapeKey& s) {
    const int64_t mean_q = s.batch > 0 ? s.total_q / s.batch : s.max_len_q;
    if (s.batch >= 64 && mean_q > 0 && mean_q <= 64) return 30;
    return 10;
  };
  return def;
}

}  // namespace kforge::templates
