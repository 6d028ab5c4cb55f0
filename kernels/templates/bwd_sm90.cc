// TemplateDef of the Hopper wgmma backward (templates/bwd_sm90.cuh).
// Notes and measurements: kernels/notes/bwd.md ("bwd_sm90 v1").
#include <fmt/format.h>

#include "kernels/schedule.h"
#include "kernels/template_def.h"
#include "kernels/templates/bwd_sm90_layout.h"
#include "kernels/templates/sm90/parts.h"

namespace kforge::templates {
namespace {

int Knob(const std::map<std::string, int>& k, const char* name) { return k.at(name); }

// The kernel's packed-run tables hold kMaxKeyPack members' offsets (+1).
static_assert(kf_bwd_sm90_pack_entries() >= kMaxKeyPack + 1,
              "bwd_sm90: the packed-run tables are smaller than BuildKeyTiles' runs");

// The kernel's own layout function (bwd_sm90_layout.h), evaluated here.
KfBwdSm90Layout Layout(const std::map<std::string, int>& k, int d) {
  return kf_bwd_sm90_layout(d, Knob(k, "BLOCK_M"), Knob(k, "BLOCK_N"), Knob(k, "STAGES"));
}

// Every sequence's keys fit one 128-key block (self attention: its
// queries), so no query block has a second key block: DQ_DIRECT's case.
bool KeysFitOneBlock(const ShapeKey& s) {
  const int64_t longest = s.cross ? s.max_len_k : s.max_len_q;
  return longest <= 128;
}

// DQ_DIRECT=1 also pays in cross attention where most sequences' keys fit
// one key block (a mean of at most 128), whatever their queries: long queries
// over 1-200 keys (mean 100) 3479 us against 3878. Not in self attention,
// where the sequences that fit one block are also the ones with the fewest
// query blocks (1-256 keys, mean 128: 1638 against 1594), nor for
// heavy-tailed batches of short sequences (powerlaw_short: 185.3 against
// 184.0), which keep the split default (notes/bwd.md v9).
bool MostKeysFitOneBlock(const ShapeKey& s) {
  return KeysFitOneBlock(s) ||
         (s.cross && MeanKeys(s) <= 128 && !HeavyTailedShort(s, /*keys=*/true));
}

// A causal batch of few (sequence, kv head) groups, at most 32: ORDER=0
// (tiles longest first over every group) then runs the same key blocks of
// every group side by side, each group's near its diagonal, so the query
// rows in flight stay few; ORDER=1 runs one group's key blocks together,
// which a causal mask spreads over a long sequence's whole length
// (one_long_causal: 1.19x with ORDER=0; 8 sequences of 4096 keys, 64
// groups: 0.99x, and 0.81x on hstu_prod_causal's 512; notes/bwd.md v9).
bool FewCausalGroups(const ShapeKey& s) {
  return s.causal && s.batch * s.kv_heads <= 32;
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
      // Q/dO/LSE/delta ring depth. (1 is gone from the space: since v5 every
      // setting fits 2 stages, and 1 measured 0.78-0.86x of 2 and spills
      // 88-136 B, notes/bwd.md v5.)
      {"STAGES", {2}, 2},
      // 1 = a (sequence, kv head)'s key blocks adjacent in the tile list (run
      // side by side: their Q, dO and dq_accum rows stay in L2), and without
      // a causal mask each starts at its own diagonal query block; 0 = tiles
      // longest first, query blocks visited in order.
      {"ORDER", {0, 1}, 1},
      // 1: the host may split the heaviest key tiles in two halves on two
      // CTAs when they are few (notes/bwd.md v8); needs ORDER=1.
      {"SPLIT", {0, 1}, 0},
      // 1: tiles whose keys fit their one key block store each step's dQ
      // slice as bf16 (no dq_accum round trip, no conversion); long queries
      // over short keys (notes/bwd.md v9). Not with BLOCK_M=64 at head dim 64.
      {"DQ_DIRECT", {0, 1}, 0},
      // 1: consumer 1 skips the steps whose 64 keys are all masked (causal
      // diagonal steps, tail key blocks of at most 64 keys), and dQ leaves
      // its keys out (notes/bwd.md v10). No effect with BLOCK_M=64 at head
      // dim 64, where ptxas serialised it (v11).
      {"CSKIP", {0, 1}, 1},
      // 1: Q and dO of whole query blocks by TMA (the host's tensor maps).
      {"TMA", {0, 1}, 1},
      // 1: a tile's K and V issued before its first stage's delta work (tiles
      // of one or two steps gain; notes/bwd.md v11).
      {"KVFIRST", {0, 1}, 0},
      // 1: a query block's first visitor copies its dQ slices into dq_accum
      // (and flags them ready) where the others add, so the host zeroes no
      // dq_accum (manifest zero_dq_accum false; notes/bwd.md v12). Not with
      // BLOCK_M=64 at head dim 64.
      {"DQW", {0, 1}, 0},
      // 1: the key block that converts a query block's dq_accum rows zeroes
      // them again, so the host zeroes dq_accum once per scratch, not before
      // every launch (manifest restores_dq_accum; notes/bwd.md v13). Not
      // with DQW=1.
      {"DQZ", {0, 1}, 0},
      // 1: once every tile is handed out, a head's end queues the query blocks
      // it completed, and CTAs left without tiles convert them (manifest
      // workspace fixed_bytes: the queue; notes/bwd.md v16). 2: as 1, and a
      // head's end that completed 14 blocks or more queues them while tiles
      // are left too (v17).
      {"HELP", {0, 1, 2}, 0},
      // 1 (with TMA=1): a consumer whose 64 keys all lie in the sequence
      // stores its dK and dV by TMA from 128B-swizzled panels (manifest
      // tensor maps dk, dv) instead of a copy by every thread (notes/bwd.md
      // v19).
      {"KVSTORE", {0, 1}, 0},
      // 1: deterministic (manifest deterministic): key block j adds its dQ
      // slice into a query block after the key blocks j+1.. that see it, the
      // tiles in the "levels" order (notes/bwd.md "Determinism"). Needs
      // ORDER=0, SPLIT=0, DQW=0, and not BLOCK_M=64 at head dim 64. For clients
      // that ask for deterministic kernels; slower, so not otherwise a default.
      {"DET", {0, 1}, 0},
  };
  def.info.deterministic_knobs = {{"DET", 1}, {"ORDER", 0}, {"SPLIT", 0}, {"DQW", 0}};
  def.info.description =
      "Hopper backward (FA3-style): a CTA per key block of 128 keys (runs of short sequences "
      "packed into one block, each row masked to its own sequence), tiles taken from a counter, "
      "1 producer warpgroup (Q/dO per query block by TMA, tail blocks by cp.async, LSE/delta, "
      "through an mbarrier ring, "
      "K/V once a tile; delta computed by the first visitor and published) + 2 consumer "
      "warpgroups of 64 keys each (wgmma SS for S^T and dP^T, RS for dV and dK with P^T/dS^T in "
      "registers, SS for dQ from dS staged in smem), dQ by one bulk reduce-add per warpgroup and "
      "step into dq_accum, converted by the last key block; setmaxnreg 40/232/232";
  def.validate = [](const std::map<std::string, int>& k, int d) -> absl::Status {
    const int bm = Knob(k, "BLOCK_M");
    if (bm == 128 && d == 128) {
      return absl::InvalidArgumentError(
          "bwd_sm90: BLOCK_M=128 with head_dim 128 needs 256 fp32 accumulator registers per "
          "consumer thread (S^T, dP^T, dK, dV); use BLOCK_M=64");
    }
    if (Knob(k, "SPLIT") == 1 && Knob(k, "ORDER") != 1) {
      return absl::InvalidArgumentError(
          "bwd_sm90: SPLIT=1 needs ORDER=1 (a split half counts the query blocks its own steps "
          "visit, in the staggered order)");
    }
    if (Knob(k, "DQ_DIRECT") == 1 && bm == 64 && d == 64) {
      return absl::InvalidArgumentError(
          "bwd_sm90: DQ_DIRECT=1 needs each consumer's dQ slice summed over all keys; with "
          "BLOCK_M=64 at head_dim 64 both consumers add their own keys' share (use BLOCK_M=128)");
    }
    if (Knob(k, "DQW") == 1 && bm == 64 && d == 64) {
      return absl::InvalidArgumentError(
          "bwd_sm90: DQW=1 needs each consumer's own dQ slice (its copy is the slice's first "
          "write); with BLOCK_M=64 at head_dim 64 both consumers add into one (use BLOCK_M=128)");
    }
    if (Knob(k, "KVSTORE") == 1 && Knob(k, "TMA") == 0) {
      return absl::InvalidArgumentError(
          "bwd_sm90: KVSTORE=1 stores dK and dV through tensor maps, which only TMA=1 passes");
    }
    if (Knob(k, "DET") != 0 &&
        (Knob(k, "ORDER") != 0 || Knob(k, "SPLIT") != 0 || Knob(k, "DQW") != 0 || (bm == 64 && d == 64))) {
      return absl::InvalidArgumentError(fmt::format(
          "bwd_sm90: DET={} sums each dQ element in one key block order, which needs ORDER=0 (the "
          "tiles in key block levels), SPLIT=0 and DQW=0 (whole key blocks that add), and each "
          "consumer's own dQ slice (not BLOCK_M=64 at head_dim 64)",
          Knob(k, "DET")));
    }
    if (Knob(k, "DQZ") == 1 && Knob(k, "DQW") == 1) {
      return absl::InvalidArgumentError(
          "bwd_sm90: DQZ=1 restores dq_accum's zeros for the next launch; DQW=1 needs none "
          "(choose one)");
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
    // Runs of short sequences share a key block (BuildKeyTiles' packed
    // tiles), each row masked to its own sequence's keys.
    m.pack_short = true;
    m.tile_m = Knob(k, "BLOCK_M");
    m.tile_n = Knob(k, "BLOCK_N");
    m.archs = archs;
    m.features = {"wgmma", "setmaxnreg", "cp_async"};
    if (Knob(k, "TMA") > 0) {
      // the kernel's second parameter: maps of q and dout, boxes of one query block
      m.features.push_back("tma");
      m.tensor_maps = {{"q", Knob(k, "BLOCK_M")}, {"dout", Knob(k, "BLOCK_M")}};
      // (KVSTORE: boxes of one consumer's 64 keys, in the kernel's map order)
      if (Knob(k, "KVSTORE") > 0) m.tensor_maps.insert(m.tensor_maps.end(), {{"dk", 64}, {"dv", 64}});
    }
    m.head_dims = {d};
    m.ops = {"bwd"};
    m.causal = m.noncausal = m.gqa = true;
    m.ctas_per_sm = 1;
    m.tile_order = Knob(k, "ORDER")  ? TileOrder::kGrouped
                   : Knob(k, "DET") ? TileOrder::kKeyLevels
                                    : TileOrder::kLongestFirst;
    m.deterministic = Knob(k, "DET") != 0;
    // a split pair's partial: 256 consumer threads' dK and dV (d / 2 fp32 each)
    m.split_slot_bytes = Knob(k, "SPLIT") ? 256 * d * 4 : 0;
    m.zero_dq_accum = Knob(k, "DQW") == 0;
    m.restores_dq_accum = Knob(k, "DQZ") == 1;
    m.workspace_fixed_bytes = Knob(k, "HELP") ? kf_bwd_sm90_help_bytes() : 0;
    return v;
  };
  // D=64: BLOCK_M=128 (dQ split by rows: one reduction per element and key
  // block; BLOCK_M=64 measured 0.89-0.92x of it, notes/bwd.md v5); D=128:
  // BLOCK_M=64 (the only setting that fits). ORDER=1 at both masks now that
  // tiles come from a counter (v5: 1.05-1.17x on the causal shapes).
  // SPLIT=1 for heavy-tailed batches of short sequences (HeavyTailedShort
  // on keys): the few heavy key tiles of the tail are split where that
  // shortens the tile list (SplitHeavyKeyTiles' model): a lone 1929-key
  // sequence 147 -> 100 us; not powerlaw_short itself any more, whose other
  // long sequences and packed runs keep the SMs busy meanwhile (v8, v14).
  // Elsewhere SPLIT=1's code costs 1-2% with nothing to split (v8).
  // DQ_DIRECT=1 where every sequence's keys fit one 128-key block, or in
  // cross attention most do (v9).
  // CSKIP=1 and TMA=1 everywhere: together 1.005-1.015x on every public
  // shape (H200, one call against CSKIP=0 TMA=0; v10). KVFIRST=1 with
  // SPLIT=1's class (powerlaw_short 1.007-1.023x; 0.976-0.998x on the long
  // shapes, v11).
  // DQW=1 (the claimer copies its dQ slices, no dq_accum memset) with
  // SPLIT=1's class too: powerlaw_short 191.7 -> 179.6 us; on the long shapes
  // the visitors' waits for the claimer's copy cost 0.6-14% (H100, v12).
  // DQZ=1 everywhere else (the converting key block zeroes dq_accum's rows
  // again, so the host zeroes it once per scratch): 0-6% on the other
  // public shapes (hstu_prod_causal and gdpa_dense 1.001-1.004x in a fair
  // A/B), most where dq_accum is large next to the work
  // (pffn_cross_d64 1.05-1.06x, d64_self_causal 1.04x); powerlaw_short keeps
  // DQW=1, 3-4% faster there (H100, notes/bwd.md v13).
  // HELP=2 for SPLIT=1's class (the long sequences' last head ends queue
  // their conversions for the CTAs that run out of tiles), with CSKIP=0 at
  // head dim 128: powerlaw_short 180.3 -> 157.8 us on an H100 (HELP=2 alone
  // 164.4), at head dim 64 (CSKIP=1) 110.8 -> 102.3; HELP=2 gained on every
  // batch of the class measured, CSKIP=0 only at head dim 128 on
  // powerlaw_short's lengths (v17, v18). Both passed all four sanitizer
  // gates on an H100 (WorkerGpuSequence.BwdSm90Help2PassesEveryGate).
  // Elsewhere HELP stays 0 (its inline conversion loop cost HELP=1 11-16% on
  // the long shapes, v17) and CSKIP 1.
  // KVSTORE=1 everywhere (TMA=1 is): with the one epilogue of v20, the TMA
  // store of dK and dV beat the threads' copy on all 7 public shapes in one
  // A/B (1.001-1.038x; hstu_prod_causal 397.2 -> 399.8 TFLOP/s; H100,
  // notes/bwd.md v20).
  // ORDER=0 for a causal batch of at most 32 (sequence, kv head) groups
  // (one_long_causal, 32768 keys: 12827 us against ORDER=1's 15233; v9).
  // A deterministic shape: DET=1 with what it needs (ORDER=0, SPLIT=0,
  // DQW=0, hence DQZ=1), everything else as the shape's class has it
  // (HELP=2 for the heavy-tailed short class). Measured in the dealt
  // "levels" order (H200, notes/bwd.md v21): 1.37-1.65x the served kernels,
  // of which the ordered adds are 1.10-1.17x.
  def.default_knobs = [](const ShapeKey& s) -> std::map<std::string, int> {
    const int order = FewCausalGroups(s) ? 0 : 1;
    const bool heavy_short = order == 1 && HeavyTailedShort(s, /*keys=*/true);
    const bool cskip0 = heavy_short && s.head_dim == 128;
    std::map<std::string, int> knobs = {
        {"BLOCK_M", s.head_dim == 64 ? 128 : 64}, {"BLOCK_N", 128}, {"STAGES", 2},
        {"ORDER", order}, {"SPLIT", heavy_short ? 1 : 0},
        {"DQ_DIRECT", MostKeysFitOneBlock(s) ? 1 : 0}, {"CSKIP", cskip0 ? 0 : 1}, {"TMA", 1},
        {"KVFIRST", heavy_short ? 1 : 0}, {"DQW", heavy_short ? 1 : 0},
        {"DQZ", heavy_short ? 0 : 1}, {"HELP", heavy_short ? 2 : 0}, {"KVSTORE", 1}, {"DET", 0}};
    if (s.deterministic) {
      knobs["DET"] = 1;
      knobs["ORDER"] = 0;
      knobs["SPLIT"] = 0;
      knobs["DQW"] = 0;
      knobs["DQZ"] = 1;
    }
    return knobs;
  };
  def.preference = [](const ShapeKey& s) {
    if (s.op != Op::kBackward || s.arch != "sm_90a") return 0;
    if (s.head_dim != 64 && s.head_dim != 128) return 0;
    // Measured on the H200 (notes/bwd.md): 1.06-1.64x bwd_mma wherever
    // sequences fill a good part of its 128-key blocks, and since v6 (runs
    // of short sequences packed into one key block) 4.0x on powerlaw_short
    // (4 keys on average: 195 us against 778); it passes every sanitizer
    // gate (WorkerGpuSequence.BwdSm90PassesEveryGate). So above bwd_mma (10)
    // from a mean of 64 keys per sequence, or where the sequences are short
    // enough to pack (a mean of at most 128 queries), or where every
    // sequence's keys fit one key block (long queries over 1-16 keys: 3372
    // us against bwd_mma's 4437 before DQ_DIRECT, notes/bwd.md v9); below it
    // for long queries over a few hundred keys, which neither packs nor fills
    // a key block (not measured).
    const int64_t keys = s.cross ? s.total_k : s.total_q;  // self: keys are the queries
    const int64_t mean_keys = s.batch > 0 ? keys / s.batch : 0;
    const int64_t mean_queries = s.batch > 0 ? s.total_q / s.batch : 0;
    // (A deterministic shape compares the same way: both have a DET=1.)
    return mean_keys >= 64 || mean_queries <= 128 || KeysFitOneBlock(s) ? 11 : 9;
  };
  return def;
}

}  // namespace kforge::templates
