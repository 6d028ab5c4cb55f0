#include "kernels/catalog.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <fmt/format.h>

#include "kernels/check.h"

namespace kforge {
namespace {

TEST(CatalogTest, ListsThePortableTemplate) {
  auto list = ListTemplates();
  auto it = std::find_if(list.begin(), list.end(),
                         [](const TemplateInfo& t) { return t.name == "fwd_mma"; });
  ASSERT_NE(it, list.end());
  EXPECT_FALSE(it->knobs.empty());
  for (const auto& k : it->knobs) {
    EXPECT_NE(std::find(k.values.begin(), k.values.end(), k.default_value), k.values.end())
        << k.name;
  }
}

TEST(CatalogTest, InstantiateFillsDefaultsAndManifest) {
  auto v = Instantiate("fwd_mma", {{"BLOCK_N", 32}}, 128);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->knobs.at("BLOCK_N"), 32);
  EXPECT_EQ(v->knobs.size(), ListTemplates()[0].knobs.size());
  EXPECT_EQ(v->entry_point, "kf_attn_fwd");
  EXPECT_EQ(v->manifest.tile_n, 32);
  EXPECT_NE(v->source.find("#define KF_BLOCK_N 32"), std::string::npos);
  EXPECT_NE(v->source.find("#define KF_HEAD_DIM 128"), std::string::npos);
  auto parsed = ParseManifest(v->manifest_json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->dynamic_smem_bytes, v->manifest.dynamic_smem_bytes);
}

TEST(CatalogTest, ImpossibleKnobsAreRejectedWithReason) {
  auto s = ValidateKnobs("fwd_mma", {{"BLOCK_M", 128}, {"WARPS", 4}}, 128);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("16*WARPS"), std::string::npos) << s.message();
  s = ValidateKnobs("fwd_mma", {{"BLOCK_N", 48}}, 128);
  EXPECT_NE(s.message().find("BLOCK_N=48"), std::string::npos) << s.message();
  s = ValidateKnobs("fwd_mma", {{"TILE", 1}}, 128);
  EXPECT_NE(s.message().find("unknown knob"), std::string::npos) << s.message();
  s = ValidateKnobs("fwd_mma", {}, 96);
  EXPECT_NE(s.message().find("head_dim 96"), std::string::npos) << s.message();
  EXPECT_EQ(ValidateKnobs("nope", {}, 128).code(), absl::StatusCode::kNotFound);
}

ShapeKey Shape(int d, const std::string& arch, int64_t max_q) {
  ShapeKey s;
  s.head_dim = d;
  s.heads = s.kv_heads = 4;
  s.arch = arch;
  s.batch = 128;
  s.max_len_q = s.max_len_k = max_q;
  s.total_q = s.total_k = max_q * 64;
  return s;
}

TEST(CatalogTest, DefaultVariantPassesStaticChecksOnEveryArch) {
  for (const char* arch : {"sm_80", "sm_90a", "sm_100a"}) {
    for (int d : {64, 128}) {
      for (int64_t max_q : {16, 1024, 8192}) {
        ShapeKey s = Shape(d, arch, max_q);
        auto v = DefaultVariant(s);
        ASSERT_TRUE(v.ok()) << arch << " d" << d << ": " << v.status();
        auto c = CheckVariant(v->source, v->manifest, arch, s);
        EXPECT_TRUE(c.ok()) << arch << " d" << d << " " << v->template_name << ": " << c;
      }
    }
  }
}

// bwd_sm90 with TMA (a second kernel parameter of tensor maps, manifest
// tensor_maps and the feature "tma") and without passes the static checks
// on sm_90a.
TEST(CatalogTest, BwdSm90TmaVariantPassesStaticChecks) {
  for (int d : {64, 128}) {
    for (int tma : {0, 1}) {
      ShapeKey s = Shape(d, "sm_90a", 1024);
      s.op = Op::kBackward;
      auto v = Instantiate("bwd_sm90", {{"BLOCK_M", d == 64 ? 128 : 64}, {"TMA", tma}, {"CSKIP", 1}}, d);
      ASSERT_TRUE(v.ok()) << v.status();
      EXPECT_EQ(v->manifest.tensor_maps.size(), tma ? 2u : 0u);
      EXPECT_EQ(std::count(v->manifest.features.begin(), v->manifest.features.end(), "tma"), tma);
      auto c = CheckVariant(v->source, v->manifest, "sm_90a", s);
      EXPECT_TRUE(c.ok()) << "d" << d << " TMA=" << tma << ": " << c;
    }
  }
}

TEST(CatalogTest, DefaultVariantNotFoundForUnsupportedShape) {
  ShapeKey s = Shape(96, "sm_90a", 1024);
  EXPECT_EQ(DefaultVariant(s).status().code(), absl::StatusCode::kNotFound);
  s = Shape(96, "sm_90a", 1024);
  s.op = Op::kBackward;
  EXPECT_FALSE(DefaultVariant(s).ok());
}

TEST(CatalogTest, BackwardShapesGetTheKeyMajorBackwardTemplate) {
  // On sm_90a the wgmma backward where sequences average 64 keys or more,
  // are short enough to pack or have their keys in one key block, bwd_mma
  // for long queries over a few hundred keys
  // (bwd_sm90.cc, preference); bwd_mma on other archs.
  ShapeKey s = Shape(128, "sm_90a", 1024);  // 512 keys on average
  s.op = Op::kBackward;
  EXPECT_EQ(DefaultVariant(s)->template_name, "bwd_sm90");
  s = Shape(64, "sm_90a", 128);  // 64
  s.op = Op::kBackward;
  EXPECT_EQ(DefaultVariant(s)->template_name, "bwd_sm90");
  s = Shape(128, "sm_90a", 16);  // 8 keys, 8 queries: packed
  s.op = Op::kBackward;
  EXPECT_EQ(DefaultVariant(s)->template_name, "bwd_sm90");
  s.cross = true;  // 1024 queries over 8 keys on average: one key block each
  s.max_len_q = 2048;
  s.total_q = s.batch * 1024;
  EXPECT_EQ(DefaultVariant(s)->template_name, "bwd_sm90");
  s.max_len_k = 300;  // over 40 keys on average, up to 300
  s.total_k = s.batch * 40;
  EXPECT_EQ(DefaultVariant(s)->template_name, "bwd_mma");
  s = Shape(128, "sm_80", 1024);
  s.op = Op::kBackward;
  auto v = DefaultVariant(s);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->template_name, "bwd_mma");
  EXPECT_EQ(v->manifest.entry_point, "kf_attn_bwd");
  EXPECT_EQ(v->manifest.ops, std::vector<std::string>{"bwd"});
  EXPECT_TRUE(v->manifest.key_major);
  EXPECT_EQ(v->manifest.grid, GridPolicy::kPersistent);
  // And forward shapes never get it.
  s.op = Op::kForward;
  auto f = DefaultVariant(s);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_NE(f->template_name, "bwd_mma");
}

// bwd_sm90 splits heavy key tiles (SPLIT=1) only where a tail of long
// sequences stands over many short ones (powerlaw_short's class); elsewhere
// SPLIT=1's code would cost 1-2% with nothing to split (notes/bwd.md, v8).
TEST(CatalogTest, HeavyTailedBackwardBatchesSplitTheirHeavyKeyTiles) {
  ShapeKey s = Shape(128, "sm_90a", 16);
  s.op = Op::kBackward;
  s.batch = 4096;
  s.total_q = s.total_k = 4096 * 5;  // 5 keys on average
  s.max_len_q = s.max_len_k = 1929;
  auto v = DefaultVariant(s);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->template_name, "bwd_sm90");
  EXPECT_EQ(v->knobs.at("SPLIT"), 1);
  EXPECT_GT(v->manifest.split_slot_bytes, 0);
  // and the claimer's dQ copy (DQW=1, no dq_accum memset: 1.067x on
  // powerlaw_short, H100, notes/bwd.md v12)
  EXPECT_EQ(v->knobs.at("DQW"), 1);
  EXPECT_FALSE(v->manifest.zero_dq_accum);
  EXPECT_FALSE(v->manifest.restores_dq_accum);
  s.max_len_q = s.max_len_k = 300;  // no long tail
  EXPECT_EQ(DefaultVariant(s)->knobs.at("SPLIT"), 0);
  s = Shape(128, "sm_90a", 1024);  // long sequences: DQW=1 lost 0.6-14% there
  s.op = Op::kBackward;
  v = DefaultVariant(s);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->knobs.at("SPLIT"), 0);
  EXPECT_EQ(v->manifest.split_slot_bytes, 0);
  EXPECT_EQ(v->knobs.at("DQW"), 0);
  EXPECT_TRUE(v->manifest.zero_dq_accum);
  // there the converting key block gives dq_accum back zeroed instead (DQZ=1:
  // the host zeroes it once per scratch; 0-6% on the other public shapes,
  // notes/bwd.md v13)
  EXPECT_EQ(v->knobs.at("DQZ"), 1);
  EXPECT_TRUE(v->manifest.restores_dq_accum);
}

// bwd_sm90 stores dQ straight (DQ_DIRECT=1) where every sequence's keys fit
// one 128-key block, and takes its tiles longest first over every group
// (ORDER=0) for a causal batch of at most 32 (sequence, kv head) groups
// (notes/bwd.md, v9).
TEST(CatalogTest, BwdSm90DefaultsForShortKeysAndFewLongCausalSequences) {
  ShapeKey s = Shape(128, "sm_90a", 2048);
  s.op = Op::kBackward;
  s.cross = true;
  s.batch = 512;
  s.total_q = 512 * 1536;
  s.max_len_k = 16;  // long queries over a few keys
  s.total_k = 512 * 8;
  auto v = DefaultVariant(s);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->template_name, "bwd_sm90");  // (bwd_mma before DQ_DIRECT)
  EXPECT_EQ(v->knobs.at("DQ_DIRECT"), 1);
  s.max_len_k = 129;  // a second key block for a few: most still fit one
  EXPECT_EQ(DefaultKnobs("bwd_sm90", s).at("DQ_DIRECT"), 1);
  s.max_len_k = 200;  // most sequences' keys in one block (a mean of 100)
  s.total_k = 512 * 100;
  EXPECT_EQ(DefaultKnobs("bwd_sm90", s).at("DQ_DIRECT"), 1);
  s.op = Op::kForward;  // and the forward's 64-key blocks, three stages, persistent
  v = DefaultVariant(s);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->template_name, "fwd_sm90");
  EXPECT_EQ(v->knobs.at("BLOCK_N"), 64);
  EXPECT_EQ(v->knobs.at("STAGES"), 3);
  EXPECT_EQ(v->knobs.at("PERSISTENT"), 1);
  s.op = Op::kBackward;
  s.total_k = 512 * 180;  // a mean of 180: most need two
  EXPECT_EQ(DefaultKnobs("bwd_sm90", s).at("DQ_DIRECT"), 0);
  s.cross = false;  // self attention of 1-256 (mean 128): the short ones fit, the rest weigh more
  s.max_len_q = s.max_len_k = 256;
  s.total_q = s.total_k = 512 * 128;
  EXPECT_EQ(DefaultKnobs("bwd_sm90", s).at("DQ_DIRECT"), 0);
  s = Shape(64, "sm_90a", 16);  // tiny self attention: packed runs
  s.op = Op::kBackward;
  s.batch = 4096;
  s.total_q = s.total_k = 4096 * 8;
  v = DefaultVariant(s);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->knobs.at("DQ_DIRECT"), 1);
  EXPECT_EQ(v->knobs.at("BLOCK_M"), 128);  // (DQ_DIRECT needs it at head dim 64)

  s = Shape(128, "sm_90a", 32768);  // one long causal sequence, 8 heads
  s.op = Op::kBackward;
  s.causal = true;
  s.batch = 1;
  s.heads = s.kv_heads = 8;
  s.total_q = s.total_k = 32768;
  v = DefaultVariant(s);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->knobs.at("ORDER"), 0);
  EXPECT_EQ(v->knobs.at("SPLIT"), 0);
  s.causal = false;
  EXPECT_EQ(DefaultVariant(s)->knobs.at("ORDER"), 1);
  s.causal = true;
  s.batch = 8;  // 64 groups
  s.total_q = s.total_k = 8 * 4096;
  s.max_len_q = s.max_len_k = 4096;
  EXPECT_EQ(DefaultVariant(s)->knobs.at("ORDER"), 1);
}

// fwd_sm90's search options beside the defaults: ORDER=2 walks the host's
// list grouped by (sequence, head), QAHEAD=2 chains tiles through a second Q
// buffer; both need the persistent grid and plain (unpacked) tiles.
TEST(CatalogTest, FwdSm90GroupedOrderAndChainedTiles) {
  bool listed = false;
  for (const auto& t : ListTemplates()) listed = listed || t.name == "fwd_sm90";
  if (!listed) GTEST_SKIP() << "fwd_sm90 is not in this build";
  const std::map<std::string, int> base = {
      {"BLOCK_M", 128}, {"BLOCK_N", 128}, {"STAGES", 2}, {"PERSISTENT", 1}};
  auto with = [&](std::map<std::string, int> extra) {
    std::map<std::string, int> k = base;
    for (const auto& [name, value] : extra) k[name] = value;
    return k;
  };
  auto v = Instantiate("fwd_sm90", with({{"ORDER", 2}}), 128);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->manifest.tile_order, TileOrder::kGrouped);
  EXPECT_EQ(v->manifest.grid, GridPolicy::kPersistent);
  EXPECT_EQ(Instantiate("fwd_sm90", with({{"ORDER", 1}}), 128)->manifest.tile_order,
            TileOrder::kBalanced);
  EXPECT_EQ(Instantiate("fwd_sm90", with({{"ORDER", 0}}), 128)->manifest.tile_order,
            TileOrder::kLongestFirst);
  auto refused = Instantiate("fwd_sm90", with({{"ORDER", 2}, {"PERSISTENT", 0}}), 128);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("ORDER=2"), std::string::npos);
  refused = Instantiate("fwd_sm90", with({{"ORDER", 2}, {"PACK", 1}}), 128);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("PACK=1"), std::string::npos);

  // QAHEAD=2: a second Q tile of shared memory, so at head dim 128 BLOCK_N 128
  // fits two stages and not three.
  v = Instantiate("fwd_sm90", with({{"QAHEAD", 2}}), 128);
  ASSERT_TRUE(v.ok()) << v.status();
  auto one_q = Instantiate("fwd_sm90", with({{"QAHEAD", 1}}), 128);
  ASSERT_TRUE(one_q.ok()) << one_q.status();
  EXPECT_EQ(v->manifest.dynamic_smem_bytes, one_q->manifest.dynamic_smem_bytes + 128 * 128 * 2);
  refused = Instantiate("fwd_sm90", with({{"QAHEAD", 2}, {"STAGES", 3}}), 128);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("shared memory"), std::string::npos);
  EXPECT_TRUE(Instantiate("fwd_sm90", with({{"QAHEAD", 2}, {"STAGES", 4}}), 64).ok());
  refused = Instantiate("fwd_sm90", with({{"QAHEAD", 2}, {"PACK", 1}}), 128);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("QAHEAD=2"), std::string::npos);
}

TEST(CatalogTest, DefaultKnobsAreValidForEveryHeadDim) {
  for (const auto& t : ListTemplates()) {
    for (int d : t.head_dims) {
      for (const auto& arch : t.archs) {
        auto k = DefaultKnobs(t.name, Shape(d, arch, 1024));
        EXPECT_TRUE(ValidateKnobs(t.name, k, d).ok()) << t.name << " d" << d << " " << arch;
      }
    }
  }
}

}  // namespace
}  // namespace kforge

namespace kforge {
namespace {
TEST(CatalogTest, TinySequenceBatchesGetThePackedPortableKernel) {
  // Tiny sequences only (at most 16 queries): fwd_mma's packed tiles on every arch.
  for (const char* arch : {"sm_80", "sm_90a"}) {
    ShapeKey s = Shape(128, arch, 16);
    s.batch = 4096;
    s.total_q = s.total_k = 4096 * 8;
    auto v = DefaultVariant(s);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->template_name, "fwd_mma") << arch;
    EXPECT_TRUE(v->manifest.pack_short);
    EXPECT_EQ(v->manifest.grid, GridPolicy::kPersistent);
  }
}

TEST(CatalogTest, HeavyTailedShortBatchesGetPackedWgmmaTilesOnHopper) {
  // powerlaw_short's statistics: 4096 sequences, 4.2 queries on average, one of 993.
  ShapeKey s = Shape(128, "sm_90a", 993);
  s.batch = 4096;
  s.total_q = s.total_k = 17306;
  auto v = DefaultVariant(s);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->template_name, "fwd_sm90");
  EXPECT_TRUE(v->manifest.pack_short);
  EXPECT_EQ(v->manifest.tile_order, TileOrder::kBalanced);
  EXPECT_EQ(v->manifest.grid, GridPolicy::kPersistent);
  // Without wgmma the portable packed kernel.
  s.arch = "sm_80";
  EXPECT_EQ(DefaultVariant(s)->template_name, "fwd_mma");
}
}  // namespace
}  // namespace kforge

namespace kforge {
namespace {
// bench/shapes_wide.json's longq_shortk_cross: 512 sequences of 1024-2048
// queries over 1-16 keys.
ShapeKey LongQueriesShortKeys(const std::string& arch, int64_t max_keys) {
  ShapeKey s = Shape(128, arch, 2048);
  s.cross = true;
  s.batch = 512;
  s.total_q = 512 * 1536;
  s.max_len_k = max_keys;
  s.total_k = 512 * (max_keys + 1) / 2;
  return s;
}

TEST(CatalogTest, LongQueriesOverShortKeysGetTheStreamingKernel) {
  for (const char* arch : {"sm_80", "sm_90a", "sm_100a"}) {
    auto v = DefaultVariant(LongQueriesShortKeys(arch, 16));
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->template_name, "fwd_stream") << arch;
    EXPECT_EQ(v->knobs.at("BLOCK_N"), 16) << "one key block holds every sequence's keys";
    EXPECT_EQ(v->manifest.grid, GridPolicy::kPersistent);
    EXPECT_TRUE(CheckVariant(v->source, v->manifest, arch, LongQueriesShortKeys(arch, 16)).ok());
  }
  EXPECT_EQ(DefaultVariant(LongQueriesShortKeys("sm_90a", 32))->knobs.at("BLOCK_N"), 32);
}

TEST(CatalogTest, TheStreamingKernelIsNotServedWhereKeysFillBlocks) {
  // Self-attention of long sequences, cross attention over a few hundred
  // keys (pffn_cross_d64), tiny sequences (powerlaw_short): other templates.
  ShapeKey self = Shape(128, "sm_90a", 2048);
  EXPECT_NE(DefaultVariant(self)->template_name, "fwd_stream");
  ShapeKey pffn = LongQueriesShortKeys("sm_90a", 256);
  pffn.head_dim = 64;
  pffn.total_k = 512 * 256;
  EXPECT_NE(DefaultVariant(pffn)->template_name, "fwd_stream");
  ShapeKey tiny = Shape(128, "sm_90a", 16);
  EXPECT_NE(DefaultVariant(tiny)->template_name, "fwd_stream");
  // Short keys but short query sequences too: packing (fwd_mma) wins there.
  ShapeKey few_queries = LongQueriesShortKeys("sm_90a", 16);
  few_queries.total_q = 512 * 40;
  EXPECT_NE(DefaultVariant(few_queries)->template_name, "fwd_stream");
}

TEST(CatalogTest, StreamingSettingsThatCannotWorkAreRejectedWithReason) {
  auto s = ValidateKnobs("fwd_stream", {{"BLOCK_M", 128}, {"BLOCK_N", 64}, {"STAGES", 4}}, 128);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("shared memory"), std::string::npos) << s.message();
  s = ValidateKnobs("fwd_stream", {{"BLOCK_M", 128}, {"MIN_BLOCKS", 3}}, 128);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("MIN_BLOCKS=3"), std::string::npos) << s.message();
  EXPECT_TRUE(ValidateKnobs("fwd_stream", {{"BLOCK_M", 64}, {"MIN_BLOCKS", 4}}, 128).ok());
}
}  // namespace
// bwd_sm90 DQW=1: the host zeroes no dq_accum (manifest zero_dq_accum
// false); refused where both consumers add into one dQ slice (BLOCK_M=64
// at head dim 64), with the reason.
TEST(CatalogTest, BwdSm90DqwAsksTheHostNotToZeroDqAccum) {
  auto v = Instantiate("bwd_sm90", {{"BLOCK_M", 64}, {"DQW", 1}}, 128);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE(v->manifest.zero_dq_accum);
  v = Instantiate("bwd_sm90", {{"BLOCK_M", 128}, {"DQW", 1}}, 64);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE(v->manifest.zero_dq_accum);
  v = Instantiate("bwd_sm90", {{"BLOCK_M", 64}, {"DQW", 0}}, 128);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->manifest.zero_dq_accum);
  v = Instantiate("bwd_sm90", {{"BLOCK_M", 64}, {"DQW", 1}}, 64);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("DQW=1"), std::string::npos) << v.status();
}

// bwd_sm90 DQZ=1: dq_accum given back zeroed (manifest restores_dq_accum),
// at both head dims and BLOCK_M; refused beside DQW=1, which needs no zeros.
TEST(CatalogTest, BwdSm90DqzGivesDqAccumBackZeroed) {
  for (auto [bm, d] : {std::pair{64, 128}, std::pair{64, 64}, std::pair{128, 64}}) {
    auto v = Instantiate("bwd_sm90", {{"BLOCK_M", bm}, {"DQZ", 1}}, d);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_TRUE(v->manifest.restores_dq_accum);
    EXPECT_TRUE(v->manifest.zero_dq_accum);
    v = Instantiate("bwd_sm90", {{"BLOCK_M", bm}, {"DQZ", 0}}, d);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_FALSE(v->manifest.restores_dq_accum);
  }
  auto v = Instantiate("bwd_sm90", {{"BLOCK_M", 64}, {"DQZ", 1}, {"DQW", 1}}, 128);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("DQZ=1"), std::string::npos) << v.status();
}


// bwd_sm90 DET=1: a deterministic variant (manifest deterministic) whose
// tiles come in the "levels" order; refused with the settings whose adds it
// cannot order (ORDER=1, SPLIT=1, DQW=1, BLOCK_M=64 at head dim 64), each
// refusal naming DET=1. Plain variants claim nothing.
TEST(CatalogTest, BwdSm90DetIsDeterministicInKeyBlockLevels) {
  for (auto [bm, d] : {std::pair{64, 128}, std::pair{128, 64}}) {
    auto v = Instantiate("bwd_sm90", {{"BLOCK_M", bm}, {"ORDER", 0}, {"DET", 1}}, d);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_TRUE(v->manifest.deterministic);
    EXPECT_EQ(v->manifest.tile_order, TileOrder::kKeyLevels);
    EXPECT_NE(v->source.find("#define KF_DET 1"), std::string::npos);
    v = Instantiate("bwd_sm90", {{"BLOCK_M", bm}}, d);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_FALSE(v->manifest.deterministic);
  }
  const std::vector<std::pair<std::map<std::string, int>, int>> refused = {
      {{{"BLOCK_M", 64}, {"ORDER", 1}, {"DET", 1}}, 128},
      {{{"BLOCK_M", 64}, {"ORDER", 1}, {"SPLIT", 1}, {"DET", 1}}, 128},
      {{{"BLOCK_M", 64}, {"ORDER", 0}, {"DQW", 1}, {"DQZ", 0}, {"DET", 1}}, 128},
      {{{"BLOCK_M", 64}, {"ORDER", 0}, {"DET", 1}}, 64},
  };
  for (const auto& [knobs, d] : refused) {
    auto v = Instantiate("bwd_sm90", knobs, d);
    ASSERT_FALSE(v.ok());
    EXPECT_NE(v.status().message().find("DET=1"), std::string::npos) << v.status();
  }
}

// A deterministic backward shape gets a deterministic variant: on sm_90a
// bwd_sm90 with DET=1 and the knobs it needs (ORDER=0, SPLIT=0, DQW=0,
// DQZ=1), the rest as the shape's class has them (the heavy-tailed short
// class keeps HELP=2), whichever template the plain shape would get; it
// passes the static checks, which refuse a non-deterministic variant for
// it. Where bwd_mma is the shape's template, and on other archs, bwd_mma
// DET=1; a head dim no backward template has, a clear NOT_FOUND.
TEST(CatalogTest, DeterministicBackwardShapesGetADeterministicVariantOrAClearError) {
  ShapeKey heavy = Shape(128, "sm_90a", 16);
  heavy.batch = 4096;
  heavy.total_q = heavy.total_k = 4096 * 5;
  heavy.max_len_q = heavy.max_len_k = 1929;
  ShapeKey few_keys = Shape(128, "sm_90a", 4096);  // long queries over a few hundred keys
  few_keys.cross = true;
  few_keys.max_len_k = 400;
  few_keys.total_k = 128 * 40;
  for (ShapeKey s : {Shape(128, "sm_90a", 1024), Shape(64, "sm_90a", 1024), heavy, few_keys}) {
    s.op = Op::kBackward;
    auto plain = DefaultVariant(s);
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_FALSE(plain->manifest.deterministic);
    s.deterministic = true;
    auto v = DefaultVariant(s);
    ASSERT_TRUE(v.ok()) << "d" << s.head_dim << ": " << v.status();
    EXPECT_EQ(v->template_name, plain->template_name);
    EXPECT_TRUE(v->manifest.deterministic);
    EXPECT_EQ(v->manifest.tile_order, TileOrder::kKeyLevels);
    EXPECT_EQ(v->knobs.at("DET"), 1);
    if (v->template_name == "bwd_sm90") {
      EXPECT_EQ(v->knobs.at("ORDER"), 0);
      EXPECT_EQ(v->knobs.at("SPLIT"), 0);
      EXPECT_EQ(v->knobs.at("DQW"), 0);
      EXPECT_EQ(v->knobs.at("DQZ"), 1);
      EXPECT_EQ(v->knobs.at("HELP"), plain->knobs.at("HELP"));
    }
    EXPECT_TRUE(CheckVariant(v->source, v->manifest, "sm_90a", s).ok());
    auto c = CheckVariant(plain->source, plain->manifest, "sm_90a", s);
    EXPECT_NE(c.message().find("deterministic"), std::string::npos) << c;
  }
  heavy.op = Op::kBackward;
  heavy.deterministic = true;
  EXPECT_EQ(DefaultVariant(heavy)->knobs.at("HELP"), 2);
  // Elsewhere bwd_mma DET=1; a head dim no backward template serves, a clear
  // NOT_FOUND.
  for (const char* arch : {"sm_80", "sm_100a"}) {
    ShapeKey s = Shape(128, arch, 1024);
    s.op = Op::kBackward;
    s.deterministic = true;
    auto v = DefaultVariant(s);
    ASSERT_TRUE(v.ok()) << arch << ": " << v.status();
    EXPECT_EQ(v->template_name, "bwd_mma");
    EXPECT_TRUE(v->manifest.deterministic);
    EXPECT_EQ(v->manifest.tile_order, TileOrder::kKeyLevels);
    EXPECT_TRUE(CheckVariant(v->source, v->manifest, arch, s).ok());
    s.head_dim = 96;
    v = DefaultVariant(s);
    ASSERT_FALSE(v.ok()) << arch;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kNotFound);
    EXPECT_NE(v.status().message().find(fmt::format("no deterministic backward kernel for {}", arch)),
              std::string::npos)
        << v.status();
  }
  // Which knobs make a template's variants deterministic.
  for (const TemplateInfo& t : ListTemplates()) {
    if (t.name != "bwd_sm90" && t.name != "bwd_mma") {
      EXPECT_TRUE(t.deterministic_knobs.empty()) << t.name;
      continue;
    }
    EXPECT_EQ(t.deterministic_knobs.at("DET"), 1);
    auto v = Instantiate(t.name, t.deterministic_knobs, 128);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_TRUE(v->manifest.deterministic);
  }
  // bwd_mma DET=1 needs key blocks of 64 keys or more (its count's bits).
  auto narrow = Instantiate("bwd_mma", {{"BLOCK_N", 32}, {"DET", 1}}, 64);
  ASSERT_FALSE(narrow.ok());
  EXPECT_NE(narrow.status().message().find("BLOCK_N >= 64"), std::string::npos) << narrow.status();
}

}  // namespace kforge
