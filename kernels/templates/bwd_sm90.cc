// TemplateDef of the Hopper wgmma backward (templates/bwd_sm90.cuh).
// Notes and measurements: kernels/notes/bwd.md ("bwd_sm90 v1").
#include <fmt/format.h>

#include "kernels/template_def.h"
#include "kernels/templates/bwd_sm90_layout.h"
#include "kernels/templates/sm90/parts.h"

namespace kforge::templates {
namespace {

int Knob(const std::map<std::string, int>& k, const char* name) { return k.at(name); }

// The kernel's own layout function (bwd_sm90_layout.h), evaluated here.
KfBwdSm90Layout Layout(const std::map<std::string, int>& k, int d) {
  return kf_bwd_sm90_layout(d, Knob(k, "BLOCK_M"), Knob(k, "BLOCK_N"), Knob(k, "STAGES"),
                            Knob(k, "DQ"));
}

}  // namespace

TemplateDef BwdSm90Template() {
  TemplateDef def;
  def.info.name = "bwd_sm90";
  def.info.archs = {"sm_90a"};
  def.info.ops = {"bwd"};
  def.info.head_dims = {64, 128};
  def.info.knobs = {
      {"BLOCK_M", {64, 128}, 64},  // query rows per step (128: head dim 64 only)
      {"BLOCK_N", {128}, 128},     // keys per CTA: 64 per consumer warpgroup
      {"STAGES", {1, 2}, 2},       // Q/dO/LSE/delta ring depth
      // v2 (notes/bwd.md "bwd_sm90 v2"): 1 = dV issued before the dS store, dK
      // before the consumer barrier, dQ while dK completes, the stage freed
      // before the dQ wait. 0 = v1's step, compiled byte for byte as validated.
      {"OVERLAP", {0, 1}, 0},
      // How dQ reaches dq_accum (notes/bwd.md, v3): 0 = red.global.add.v4 from
      // the accumulators; 1 = staged in shared memory, then bulk asynchronous
      // reduce-adds (cp.reduce.async.bulk) issued by one thread per warpgroup.
      {"DQ", {0, 1}, 0},
      // delta = rowsum(dO * O): 0 = recomputed by every key block that visits
      // a query block; 1 = computed by the first visitor, which publishes it
      // in p.delta (a claim bit and a ready bit in the query block's counter)
      // for the others to read; 2 = the same claim, the rows published as
      // tagged words (no ready bit): read beside the claim, one round trip.
      {"DELTA", {0, 1, 2}, 0},
      // 0 = tiles longest first, query blocks visited in order; 1 = a
      // (sequence, kv head)'s key blocks adjacent in the tile list (run side
      // by side: their Q, dO and dq_accum rows stay in L2), and without a
      // causal mask each starts at its own diagonal query block.
      {"ORDER", {0, 1}, 0},
  };
  def.info.description =
      "Hopper backward (FA3-style): a CTA per key block of 128 keys, 1 producer warpgroup "
      "(cp.async K/V once, Q/dO/LSE/delta per query block through an mbarrier ring) + 2 consumer "
      "warpgroups of 64 keys each (wgmma SS for S^T and dP^T, RS for dV and dK with P^T/dS^T in "
      "registers, SS for dQ from dS staged in smem), dQ by red.global.add.v4 into dq_accum, "
      "converted by the last key block; setmaxnreg 40/232/232";
  def.validate = [](const std::map<std::string, int>& k, int d) -> absl::Status {
    const int bm = Knob(k, "BLOCK_M");
    if (bm == 128 && d == 128) {
      return absl::InvalidArgumentError(
          "bwd_sm90: BLOCK_M=128 with head_dim 128 needs 256 fp32 accumulator registers per "
          "consumer thread (S^T, dP^T, dK, dV); use BLOCK_M=64");
    }
    if (bm == 128 && Knob(k, "STAGES") == 1) {
      return absl::InvalidArgumentError(
          "bwd_sm90: BLOCK_M=128 with STAGES=1 spills (12 B, ptxas 13.0); use STAGES=2");
    }
    // (OVERLAP=1 with BLOCK_M=128 and STAGES=1 spills too: refused above.)
    if (d == 64 && bm == 128 && Knob(k, "OVERLAP") == 0) {
      return absl::InvalidArgumentError(
          "bwd_sm90: head_dim 64 with BLOCK_M=128 and OVERLAP=0 spills (4 B, ptxas 13.0); use "
          "OVERLAP=1");
    }
    if (Knob(k, "ORDER") == 1 && Knob(k, "DELTA") == 0) {  // (DELTA 1 and 2 do not)
      return absl::InvalidArgumentError(
          "bwd_sm90: ORDER=1 with DELTA=0 spills in the producer (4 B, ptxas 13.0); use DELTA=1");
    }
    const int bytes = Layout(k, d).dynamic_bytes;
    if (bytes > 232448) {
      return absl::InvalidArgumentError(fmt::format(
          "bwd_sm90: {} B of shared memory (BLOCK_M={}, STAGES={}, head_dim={}) exceeds sm_90a's "
          "232448 B limit",
          bytes, bm, Knob(k, "STAGES"), d));
    }
    return absl::OkStatus();
  };
  def.build = [archs = def.info.archs](const std::map<std::string, int>& k,
                                       int d) -> absl::StatusOr<Variant> {
    Variant v;
    v.source = KnobPrelude(k, d) + sm90::Assemble(sm90::BwdSm90Parts());
    Manifest& m = v.manifest;
    m.entry_point = "kf_attn_bwd";
    m.threads = 384;
    m.dynamic_smem_bytes = Layout(k, d).dynamic_bytes;
    m.grid = GridPolicy::kPersistent;
    m.key_major = true;
    m.tile_m = Knob(k, "BLOCK_M");
    m.tile_n = Knob(k, "BLOCK_N");
    m.archs = archs;
    m.features = {"wgmma", "setmaxnreg", "cp_async"};
    m.head_dims = {d};
    m.ops = {"bwd"};
    m.causal = m.noncausal = m.gqa = true;
    m.ctas_per_sm = 1;
    m.tile_order = Knob(k, "ORDER") ? TileOrder::kGrouped : TileOrder::kLongestFirst;
    return v;
  };
  // D=64: BLOCK_M=128 (dQ split by rows: one dq_accum reduction per element
  // and key block); D=128: BLOCK_M=64 (the only setting that fits). OVERLAP=1
  // at both: 0.3-1% faster on every shape (notes/bwd.md, v2), and at D=64
  // with BLOCK_M=128 the only setting that does not spill. DELTA=1: 1.2-1.6x
  // faster on every public shape but powerlaw_short, DQ=1 slower on all but
  // that one (notes/bwd.md, v3). ORDER=1 without a causal mask: 1.28x on
  // gdpa_self, 1.01-1.06x on gdpa_dense, pffn_cross_d64, powerlaw_short; with
  // one, 0.88-0.90x on the causal shapes (notes/bwd.md, v4). DELTA=2: 1.01-1.07x
  // DELTA=1 on every public shape, its 28-32 B of producer spills included
  // (notes/bwd.md, v4b).
  def.default_knobs = [](const ShapeKey& s) -> std::map<std::string, int> {
    return {{"BLOCK_M", s.head_dim == 64 ? 128 : 64}, {"BLOCK_N", 128}, {"STAGES", 2},
            {"OVERLAP", 1}, {"DQ", 0}, {"DELTA", 2}, {"ORDER", s.causal ? 0 : 1}};
  };
  def.preference = [](const ShapeKey& s) {
    if (s.op != Op::kBackward || s.arch != "sm_90a") return 0;
    if (s.head_dim != 64 && s.head_dim != 128) return 0;
    // Measured on the H200 (notes/bwd.md): 1.06-1.64x bwd_mma wherever
    // sequences fill a good part of its 128-key blocks, 0.48x on
    // powerlaw_short (8 keys on average, most of each block masked); and the
    // defaults pass every sanitizer gate since every consumer thread releases
    // the stages (WorkerGpuSequence.BwdSm90ArrivePassesEveryGate). So above
    // bwd_mma (10) from a mean of 64 keys per sequence, below it under that.
    const int64_t keys = s.cross ? s.total_k : s.total_q;  // self: keys are the queries
    const int64_t mean_keys = s.batch > 0 ? keys / s.batch : 0;
    return mean_keys >= 64 ? 11 : 9;
  };
  return def;
}

}  // namespace kforge::templates
