// TemplateDef of the portable mma.sync backward (templates/bwd_mma.cuh).
#include <fmt/format.h>

#include "kernels/template_def.h"

namespace kforge::embedded {
extern const char bwd_mma_cuh[];
extern const char mma_common_cuh[];
}

namespace kforge::templates {
namespace {

int Knob(const std::map<std::string, int>& k, const char* name) { return k.at(name); }

// Must match the shared-memory carve-up at the top of bwd_mma.cuh.
int SmemBytes(const std::map<std::string, int>& k, int d) {
  const int bm = Knob(k, "BLOCK_M"), bn = Knob(k, "BLOCK_N");
  return 2 * bn * d * 2 + 4 * bm * d * 2 + bn * bm * 2 + 2 * bm * 4 + 32 * (bn / 16) * 4;
}

}  // namespace

TemplateDef BwdMmaTemplate() {
  TemplateDef def;
  def.info.name = "bwd_mma";
  def.info.archs = {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100a"};
  def.info.ops = {"bwd"};
  def.info.head_dims = {64, 128};
  def.info.knobs = {
      {"BLOCK_M", {32, 64}, 32},      // query rows per step
      {"BLOCK_N", {32, 64, 128}, 64},  // keys per CTA (BLOCK_N / 16 warps)
      {"MIN_BLOCKS", {1, 2}, 1},
      // 1: deterministic (manifest deterministic): each dQ element summed
      // last key block first, the tiles in the "levels" order (bwd_mma.cuh's
      // header). Needs BLOCK_N >= 64. For clients that ask for a deterministic
      // backward where bwd_sm90 cannot run (sm_80, sm_100a, ...).
      {"DET", {0, 1}, 0},
  };
  def.info.deterministic_knobs = {{"DET", 1}};
  def.info.description =
      "FlashAttention-2-style backward on mma.sync m16n8k16 bf16, one launch: a CTA per key block "
      "keeps dK/dV in registers over the query blocks that see it, dQ through fp32 atomics into "
      "dq_accum, converted by the last key block of each query block";
  def.validate = [](const std::map<std::string, int>& k, int d) -> absl::Status {
    if (SmemBytes(k, d) > 232448) {
      return absl::InvalidArgumentError(fmt::format(
          "bwd_mma: {} B of shared memory (BLOCK_M={}, BLOCK_N={}, head_dim={}) exceeds every "
          "arch's 232448 B limit",
          SmemBytes(k, d), Knob(k, "BLOCK_M"), Knob(k, "BLOCK_N"), d));
    }
    if (Knob(k, "DET") == 1 && Knob(k, "BLOCK_N") < 64) {
      return absl::InvalidArgumentError(
          "bwd_mma: DET=1 counts key blocks and their ordered adds in one int per query block, "
          "which needs BLOCK_N >= 64");
    }
    return absl::OkStatus();
  };
  def.build = [archs = def.info.archs](const std::map<std::string, int>& k,
                                       int d) -> absl::StatusOr<Variant> {
    Variant v;
    v.source = KnobPrelude(k, d) + embedded::mma_common_cuh + embedded::bwd_mma_cuh;
    Manifest& m = v.manifest;
    m.entry_point = "kf_attn_bwd";
    m.threads = 32 * (Knob(k, "BLOCK_N") / 16);
    m.dynamic_smem_bytes = SmemBytes(k, d);
    m.grid = GridPolicy::kPersistent;
    m.key_major = true;
    m.tile_m = Knob(k, "BLOCK_M");
    m.tile_n = Knob(k, "BLOCK_N");
    m.archs = archs;
    m.features = {"cp_async", "mma_sync", "ldmatrix"};
    m.head_dims = {d};
    m.ops = {"bwd"};
    m.causal = m.noncausal = m.gqa = true;
    m.ctas_per_sm = Knob(k, "MIN_BLOCKS") > 1 ? Knob(k, "MIN_BLOCKS") : 0;
    m.deterministic = Knob(k, "DET") == 1;
    if (m.deterministic) m.tile_order = TileOrder::kKeyLevels;
    return v;
  };
  // The settings with the fewest spills (notes/bwd.md): at D=128, BLOCK_M=64
  // spills ~156 B next to dK and dV's 128 accumulator registers.
  def.default_knobs = [](const ShapeKey& s) -> std::map<std::string, int> {
    return {{"BLOCK_M", s.head_dim > 64 ? 32 : 64}, {"BLOCK_N", 64}, {"MIN_BLOCKS", 1},
            {"DET", s.deterministic ? 1 : 0}};
  };
  // The portable backward: the default for every backward shape, deterministic
  // ones included (DET=1), where bwd_sm90 does not prefer itself (sm_90a).
  def.preference = [](const ShapeKey& s) { return s.op == Op::kBackward ? 10 : 0; };
  return def;
}

}  // namespace kforge::templates
