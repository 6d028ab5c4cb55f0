// TemplateDef of the Hopper wgmma forward (templates/fwd_sm90.cuh on the
// shared parts in templates/sm90/), owned by sm90.
// Notes and measurements: kernels/notes/sm90.md, kernels/notes/parts.md.
#include <fmt/format.h>

#include "kernels/template_def.h"
#include "kernels/templates/sm90/layout.h"
#include "kernels/templates/sm90/parts.h"

namespace kforge::templates {
namespace {

int Knob(const std::map<std::string, int>& k, const char* name) { return k.at(name); }

// The kernel's own layout (templates/sm90/layout.h), evaluated here.
int SmemBytes(const std::map<std::string, int>& k, int d) {
  return kf_fwd_sm90_layout(d, Knob(k, "BLOCK_M"), Knob(k, "BLOCK_N"), Knob(k, "STAGES"))
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
  };
  def.info.description =
      "Hopper forward: 1 producer warpgroup (cp.async K/V into a 128B-swizzled mbarrier ring) + 2 "
      "consumer warpgroups (wgmma SS for QK^T, RS for PV with P in registers, intra-warpgroup "
      "softmax/QK^T overlap), setmaxnreg 40/232/232, per-tile or persistent grid";
  def.validate = [](const std::map<std::string, int>& k, int d) -> absl::Status {
    if (d == 128 && Knob(k, "BLOCK_N") > 176) {
      return absl::InvalidArgumentError(fmt::format(
          "fwd_sm90: head_dim 128 with BLOCK_N={} serialises wgmma and spills (232 registers per "
          "consumer thread); use BLOCK_N <= 176",
          Knob(k, "BLOCK_N")));
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
    return v;
  };
  def.default_knobs = [](const ShapeKey& s) -> std::map<std::string, int> {
    std::map<std::string, int> k = {
        {"BLOCK_M", 128}, {"BLOCK_N", 128}, {"STAGES", 2}, {"PERSISTENT", 1}};
    // Long sequences: the per-tile grid keeps the CTAs of one (sequence, head)
    // together, so K/V stay in L2 (measured 462 vs 374 TFLOP/s on
    // hstu_prod_causal with an LPT tile list that interleaves sequences).
    if (s.max_len_q >= 2048) k["PERSISTENT"] = 0;
    return k;
  };
  def.preference = [](const ShapeKey& s) {
    if (s.arch != "sm_90a") return 0;
    if (s.head_dim != 64 && s.head_dim != 128) return 0;
    return 20;
  };
  return def;
}

}  // namespace kforge::templates
