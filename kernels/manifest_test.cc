#include "kernels/manifest.h"

#include <gtest/gtest.h>

namespace kforge {
namespace {

constexpr const char* kGood = R"({"entry_point":"kf_attn_fwd","threads":256,
  "dynamic_smem_bytes":98304,"grid":"persistent","tile_m":128,"tile_n":64,
  "workspace":{"fixed_bytes":0,"per_tile_bytes":16},"archs":["sm_80","sm_90a"],
  "features":["wgmma"],"head_dims":[64,128],"ops":["fwd"],"causal":true})";

TEST(ManifestTest, ParsesEveryField) {
  auto m = ParseManifest(kGood);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->threads, 256);
  EXPECT_EQ(m->grid, GridPolicy::kPersistent);
  EXPECT_EQ(m->workspace_per_tile_bytes, 16);
  EXPECT_EQ(m->archs, (std::vector<std::string>{"sm_80", "sm_90a"}));
  EXPECT_EQ(m->head_dims, (std::vector<int>{64, 128}));
  EXPECT_TRUE(m->noncausal);
}

TEST(ManifestTest, RoundTrips) {
  auto m = ParseManifest(kGood);
  ASSERT_TRUE(m.ok());
  auto again = ParseManifest(ManifestToJson(*m));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(ManifestToJson(*again), ManifestToJson(*m));
}

// The host-balanced list (stop entries, a static stride) is for persistent
// forward grids only: a per-tile or key-major manifest asking for it is refused.
TEST(ManifestTest, BalancedTileOrderRoundTripsAndNeedsAPersistentForwardGrid) {
  std::string j = kGood;
  j.insert(j.size() - 1, R"(,"tile_order":"balanced")");
  auto m = ParseManifest(j);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->tile_order, TileOrder::kBalanced);
  EXPECT_NE(ManifestToJson(*m).find(R"("tile_order":"balanced")"), std::string::npos);
  std::string per_tile = j;
  per_tile.replace(per_tile.find(R"("persistent")"), 12, R"("per_tile")");
  auto bad = ParseManifest(per_tile);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("balanced"), std::string::npos) << bad.status();
  bad = ParseManifest(R"({"entry_point":"kf_attn_bwd","threads":256,"tile_m":64,"tile_n":128,
      "grid":"persistent","archs":["sm_90a"],"head_dims":[128],"ops":["bwd"],
      "key_major":true,"tile_order":"balanced"})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("balanced"), std::string::npos) << bad.status();
  bad = ParseManifest(R"({"entry_point":"x","threads":256,"tile_m":1,"tile_n":1,
      "archs":["sm_80"],"head_dims":[64],"tile_order":"fair"})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("\"balanced\""), std::string::npos) << bad.status();
}

TEST(ManifestTest, RejectsWithReason) {
  auto bad = ParseManifest(R"({"entry_point":"x","threads":256,"tile_m":1,"tile_n":1,
      "archs":["sm_80"],"head_dims":[64],"grid":"sometimes"})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("grid"), std::string::npos);
  bad = ParseManifest(R"({"entry_point":"x","threads":256,"tile_m":1,"tile_n":1,
      "archs":["sm_80"],"head_dims":[64],"smem":5})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown key \"smem\""), std::string::npos);
  EXPECT_FALSE(ParseManifest("{").ok());
  EXPECT_FALSE(ParseManifest(R"({"entry_point":"x"})").ok());
}

// Tensor maps (CONTRACT.md "Tensor maps"): the list round-trips in order,
// and a map of an unknown tensor, a box out of range, a malformed entry or a
// variant without the feature "tma" is refused with the reason.
TEST(ManifestTest, TensorMapsRoundTripAndAreChecked) {
  const std::string bwd = R"({"entry_point":"kf_attn_bwd","threads":384,"tile_m":64,
      "tile_n":128,"grid":"persistent","archs":["sm_90a"],"head_dims":[128],"ops":["bwd"],
      "key_major":true,"features":["wgmma","tma"],"tensor_maps":)";
  auto m = ParseManifest(bwd + R"([{"tensor":"q","box_rows":64},{"tensor":"dout","box_rows":64}]})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->tensor_maps, (std::vector<TensorMapRequest>{{"q", 64}, {"dout", 64}}));
  auto again = ParseManifest(ManifestToJson(*m));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->tensor_maps, m->tensor_maps);
  // none asked for: the key is left out, as before the field existed
  auto plain = ParseManifest(kGood);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(ManifestToJson(*plain).find("tensor_maps"), std::string::npos);

  const std::pair<std::string, std::string> bad[] = {
      {R"([{"tensor":"lse","box_rows":64}]})", "\"lse\" is not q, k, v, o, dout, dk or dv"},
      {R"([{"tensor":"q","box_rows":0}]})", "box_rows 0"},
      {R"([{"tensor":"q","box_rows":257}]})", "box_rows 257"},
      {R"([{"tensor":"q"}]})", "each entry must be"},
      {R"([{"tensor":"q","box_rows":64,"swizzle":128}]})", "each entry must be"},
      {R"({"tensor":"q","box_rows":64}})", "must be an array"},
  };
  for (const auto& [tail, why] : bad) {
    auto r = ParseManifest(bwd + tail);
    ASSERT_FALSE(r.ok()) << tail;
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status();
  }
  std::string nine = "[";
  for (int i = 0; i < 9; ++i) nine += std::string(i ? "," : "") + R"({"tensor":"q","box_rows":64})";
  auto many = ParseManifest(bwd + nine + "]}");
  ASSERT_FALSE(many.ok());
  EXPECT_NE(many.status().message().find("at most 8"), std::string::npos) << many.status();
  // dk and dv: the backward's outputs, mapped by a backward only
  auto out = ParseManifest(bwd + R"([{"tensor":"dk","box_rows":64},{"tensor":"dv","box_rows":64}]})");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->tensor_maps, (std::vector<TensorMapRequest>{{"dk", 64}, {"dv", 64}}));
  std::string fwd = bwd + R"([{"tensor":"dv","box_rows":64}]})";
  fwd.replace(fwd.find(R"("ops":["bwd"])"), 13, R"("ops":["fwd"])");
  fwd.replace(fwd.find(R"("key_major":true,)"), 17, "");
  auto fwd_out = ParseManifest(fwd);
  ASSERT_FALSE(fwd_out.ok());
  EXPECT_NE(fwd_out.status().message().find("\"dv\" is a backward output"), std::string::npos)
      << fwd_out.status();
  std::string no_tma = bwd + R"([{"tensor":"q","box_rows":64}]})";
  no_tma.replace(no_tma.find(R"(,"tma")"), 6, "");
  auto r = ParseManifest(no_tma);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("\"tma\""), std::string::npos) << r.status();
}

// zero_dq_accum false (CONTRACT.md "Backward"): a backward variant that
// writes each dq_accum element before reading it asks the host not to zero
// it; the flag round-trips, is left out when true, and a forward manifest
// (which has no dq_accum) or a non-boolean value is refused.
TEST(ManifestTest, ZeroDqAccumIsABackwardFlag) {
  const std::string bwd = R"({"entry_point":"kf_attn_bwd","threads":384,"tile_m":64,
      "tile_n":128,"grid":"persistent","archs":["sm_90a"],"head_dims":[128],"ops":["bwd"],
      "key_major":true)";
  auto m = ParseManifest(bwd + R"(,"zero_dq_accum":false})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->zero_dq_accum);
  auto again = ParseManifest(ManifestToJson(*m));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->zero_dq_accum);
  auto plain = ParseManifest(bwd + "}");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->zero_dq_accum);
  EXPECT_EQ(ManifestToJson(*plain).find("zero_dq_accum"), std::string::npos);

  std::string fwd = kGood;
  fwd.insert(fwd.size() - 1, R"(,"zero_dq_accum":false)");
  auto bad = ParseManifest(fwd);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("zero_dq_accum"), std::string::npos) << bad.status();
  bad = ParseManifest(bwd + R"(,"zero_dq_accum":"no"})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("zero_dq_accum"), std::string::npos) << bad.status();
}

// restores_dq_accum (CONTRACT.md "Backward"): a backward variant that gives
// dq_accum back zeroed asks the host to zero it once per scratch; the flag
// round-trips, is left out when false, and needs a backward manifest whose
// dq_accum the host zeroes (zero_dq_accum true).
TEST(ManifestTest, RestoresDqAccumIsABackwardFlagOnZeroedScratch) {
  const std::string bwd = R"({"entry_point":"kf_attn_bwd","threads":384,"tile_m":64,
      "tile_n":128,"grid":"persistent","archs":["sm_90a"],"head_dims":[128],"ops":["bwd"],
      "key_major":true)";
  auto m = ParseManifest(bwd + R"(,"restores_dq_accum":true})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->restores_dq_accum);
  EXPECT_TRUE(m->zero_dq_accum);
  auto again = ParseManifest(ManifestToJson(*m));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->restores_dq_accum);
  auto plain = ParseManifest(bwd + "}");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->restores_dq_accum);
  EXPECT_EQ(ManifestToJson(*plain).find("restores_dq_accum"), std::string::npos);

  auto bad = ParseManifest(bwd + R"(,"restores_dq_accum":true,"zero_dq_accum":false})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("restores_dq_accum"), std::string::npos) << bad.status();
  std::string fwd = kGood;
  fwd.insert(fwd.size() - 1, R"(,"restores_dq_accum":true)");
  bad = ParseManifest(fwd);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("restores_dq_accum"), std::string::npos) << bad.status();
  bad = ParseManifest(bwd + R"(,"restores_dq_accum":1})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("restores_dq_accum"), std::string::npos) << bad.status();
}

TEST(ManifestTest, FeaturesAndLimitsPerArch) {
  EXPECT_TRUE(ArchHasFeature("sm_90a", "wgmma"));
  EXPECT_FALSE(ArchHasFeature("sm_90", "wgmma"));
  EXPECT_FALSE(ArchHasFeature("sm_100a", "wgmma"));
  EXPECT_TRUE(ArchHasFeature("sm_100a", "tma"));
  EXPECT_FALSE(ArchHasFeature("sm_80", "tma"));
  EXPECT_EQ(MaxSmemPerBlock("sm_90a"), 232448);
  EXPECT_EQ(MaxSmemPerBlock("sm_80"), 166912);
}

// deterministic (CONTRACT.md "Backward"): a backward variant's claim that its
// outputs are bitwise the same every launch; round-trips, left out when
// false, refused for a forward manifest (every forward must be). The
// "levels" tile order it comes with is key-major only.
TEST(ManifestTest, DeterministicIsABackwardClaimAndLevelsAKeyMajorOrder) {
  const std::string bwd = R"({"entry_point":"kf_attn_bwd","threads":384,"tile_m":64,
      "tile_n":128,"grid":"persistent","archs":["sm_90a"],"head_dims":[128],"ops":["bwd"],
      "key_major":true)";
  auto m = ParseManifest(bwd + R"(,"deterministic":true,"tile_order":"levels"})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->deterministic);
  EXPECT_EQ(m->tile_order, TileOrder::kKeyLevels);
  auto again = ParseManifest(ManifestToJson(*m));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->deterministic);
  EXPECT_EQ(again->tile_order, TileOrder::kKeyLevels);
  auto plain = ParseManifest(bwd + "}");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->deterministic);
  EXPECT_EQ(ManifestToJson(*plain).find("deterministic"), std::string::npos);

  std::string fwd = kGood;
  fwd.insert(fwd.size() - 1, R"(,"deterministic":true)");
  auto bad = ParseManifest(fwd);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("deterministic"), std::string::npos) << bad.status();
  fwd = kGood;
  fwd.insert(fwd.size() - 1, R"(,"tile_order":"levels")");
  bad = ParseManifest(fwd);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("levels"), std::string::npos) << bad.status();
  bad = ParseManifest(bwd + R"(,"deterministic":"yes"})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("deterministic"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace kforge
