// TemplateDef of the query-streaming forward (templates/fwd_stream.cuh; notes/stream.md): long
// query sequences over short key sequences, where the forward is a memory
// stream (read Q, write O) rather than a matrix multiply.
#include <fmt/format.h>

#include "kernels/template_def.h"

namespace kforge::embedded {
extern const char fwd_stream_cuh[];
extern const char mma_common_cuh[];
}  // namespace kforge::embedded

namespace kforge::templates {
namespace {

int Knob(const std::map<std::string, int>& k, const char* name) { return k.at(name); }

// Must match the stage layout at the top of fwd_stream.cuh: per stage the Q
// tile and one key block of K and of V.
int SmemBytes(const std::map<std::string, int>& k, int d) {
  const int stage = (Knob(k, "BLOCK_M") + 2 * Knob(k, "BLOCK_N")) * d * 2;
  return Knob(k, "STAGES") * stage;
}

}  // namespace

TemplateDef FwdStreamTemplate() {
  TemplateDef def;
  def.info.name = "fwd_stream";
  def.info.archs = {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100a"};
  def.info.ops = {"fwd"};
  def.info.head_dims = {64, 128};
  def.info.knobs = {
      {"BLOCK_M", {64, 128}, 64},       // query rows per tile, 16 per warp
      {"BLOCK_N", {16, 32, 64}, 16},    // keys per block; a stage holds one block
      {"STAGES", {2, 3, 4}, 3},         // query tiles per CTA: one computing, the rest loading
      {"MIN_BLOCKS", {1, 2, 3, 4}, 1},  // __launch_bounds__ residency
  };
  def.info.description =
      "Query-streaming forward for long queries over short keys, on mma.sync m16n8k16 bf16: a "
      "persistent CTA (static stride over the tiles) keeps STAGES query tiles, each with its key "
      "block, loading by cp.async while it computes one; memory-bound shapes";
  def.validate = [](const std::map<std::string, int>& k, int d) -> absl::Status {
    if (SmemBytes(k, d) > 232448) {
      return absl::InvalidArgumentError(fmt::format(
          "fwd_stream: {} B of shared memory (BLOCK_M={}, BLOCK_N={}, STAGES={}, head_dim={}) "
          "exceeds every arch's 232448 B limit",
          SmemBytes(k, d), Knob(k, "BLOCK_M"), Knob(k, "BLOCK_N"), Knob(k, "STAGES"), d));
    }
    const int threads = 2 * Knob(k, "BLOCK_M");
    if (Knob(k, "MIN_BLOCKS") * threads > 512) {
      // 128 registers (4 CTAs of 4 warps) is the tightest cap that compiles
      // without spills at head_dim 128 (notes/stream.md).
      return absl::InvalidArgumentError(fmt::format(
          "fwd_stream: MIN_BLOCKS={} with BLOCK_M={} caps registers at {} per thread, fewer than "
          "a warp's 16 rows of accumulators and addresses need; use MIN_BLOCKS * BLOCK_M <= 256",
          Knob(k, "MIN_BLOCKS"), Knob(k, "BLOCK_M"), 65536 / (Knob(k, "MIN_BLOCKS") * threads)));
    }
    return absl::OkStatus();
  };
  def.build = [archs = def.info.archs](const std::map<std::string, int>& k,
                                       int d) -> absl::StatusOr<Variant> {
    Variant v;
    v.source = KnobPrelude(k, d) + embedded::mma_common_cuh + embedded::fwd_stream_cuh;
    Manifest& m = v.manifest;
    m.entry_point = "kf_attn_fwd";
    m.threads = 2 * Knob(k, "BLOCK_M");
    m.dynamic_smem_bytes = SmemBytes(k, d);
    m.grid = GridPolicy::kPersistent;  // static stride over the list: the counter is unused
    m.tile_m = Knob(k, "BLOCK_M");
    m.tile_n = Knob(k, "BLOCK_N");
    m.archs = archs;
    m.features = {"cp_async", "mma_sync", "ldmatrix"};
    m.head_dims = {d};
    m.ops = {"fwd"};
    m.causal = m.noncausal = m.gqa = true;
    // A CTA takes a fixed share of the tiles, so the grid must be what really
    // fits at once: the host asks the occupancy calculator (0 here).
    m.ctas_per_sm = 0;
    return v;
  };
  def.default_knobs = [](const ShapeKey& s) -> std::map<std::string, int> {
    // Three CTAs of 4 warps per SM, each with two tiles loading while one
    // computes: 96 KB of Q in flight per SM. MIN_BLOCKS=3 holds sm_100a's
    // ptxas to 168 registers (222 uncapped), where sm_80 and sm_90a use ~150.
    std::map<std::string, int> k = {{"BLOCK_M", 64}, {"BLOCK_N", 16}, {"STAGES", 3},
                                    {"MIN_BLOCKS", 3}};
    // One key block per tile is the fast path: the smallest block that holds
    // the longest key sequence. Bigger blocks make bigger stages (two CTAs
    // per SM) and more registers (MIN_BLOCKS=3's 168 spill at D=128).
    const int64_t keys = s.cross ? s.max_len_k : s.max_len_q;
    if (keys > 16) {
      k["BLOCK_N"] = 32;
      k["MIN_BLOCKS"] = 2;
    }
    if (keys > 32) {
      k["BLOCK_N"] = 64;
      k["STAGES"] = 2;
    }
    return k;
  };
  // Memory-bound batches: every sequence's keys fit one block of at most 32
  // while its queries fill many tiles (the other templates spend a whole
  // 64-128-key block and one tile's latency per tile there). Above fwd_sm90
  // (20) and fwd_mma's packed tiles (30); never chosen by default elsewhere.
  def.preference = [](const ShapeKey& s) {
    if (s.head_dim != 64 && s.head_dim != 128) return 0;
    const int64_t max_keys = s.cross ? s.max_len_k : s.max_len_q;
    if (max_keys <= 32 && MeanKeys(s) <= 32 && MeanQueries(s) >= 256) return 40;
    return 0;
  };
  return def;
}

}  // namespace kforge::templates
