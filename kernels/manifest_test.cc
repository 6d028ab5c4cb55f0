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

TEST(ManifestTest, FeaturesAndLimitsPerArch) {
  EXPECT_TRUE(ArchHasFeature("sm_90a", "wgmma"));
  EXPECT_FALSE(ArchHasFeature("sm_90", "wgmma"));
  EXPECT_FALSE(ArchHasFeature("sm_100a", "wgmma"));
  EXPECT_TRUE(ArchHasFeature("sm_100a", "tma"));
  EXPECT_FALSE(ArchHasFeature("sm_80", "tma"));
  EXPECT_EQ(MaxSmemPerBlock("sm_90a"), 232448);
  EXPECT_EQ(MaxSmemPerBlock("sm_80"), 166912);
}

}  // namespace
}  // namespace kforge
