#include "core/shape_json.h"

#include <gtest/gtest.h>

namespace kforge {
namespace {

TEST(ShapeJson, RoundTripsEveryField) {
  ShapeKey k;
  k.op = Op::kBackward;
  k.head_dim = 64;
  k.heads = 8;
  k.kv_heads = 2;
  k.causal = true;
  k.cross = true;
  k.arch = "sm_100a";
  k.batch = 3;
  k.max_len_q = 17;
  k.total_q = 40;
  k.max_len_k = 9;
  k.total_k = 20;
  auto back = ShapeKeyFromJson(ShapeKeyToJson(k));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(ShapeKeyToJson(*back), ShapeKeyToJson(k));
  EXPECT_EQ(back->op, Op::kBackward);
  EXPECT_EQ(back->arch, "sm_100a");
  EXPECT_EQ(back->total_k, 20);
}

// Stored shapes from before the field read as not deterministic, and a shape
// without it keeps its encoding; a deterministic one round-trips.
TEST(ShapeJson, DeterministicOnlyWhenSetAndOptionalOnRead) {
  ShapeKey k;
  k.op = Op::kBackward;
  nlohmann::json j = ShapeKeyToJson(k);
  EXPECT_FALSE(j.contains("deterministic"));
  auto back = ShapeKeyFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->deterministic);
  k.deterministic = true;
  back = ShapeKeyFromJson(ShapeKeyToJson(k));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->deterministic);
  j["deterministic"] = "yes";
  EXPECT_NE(ShapeKeyFromJson(j).status().message().find("shape.deterministic"), std::string::npos);
}

TEST(ShapeJson, ErrorsNameTheField) {
  nlohmann::json j = ShapeKeyToJson(ShapeKey{});
  j["heads"] = "four";
  auto bad = ShapeKeyFromJson(j);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("shape.heads"), std::string::npos) << bad.status();
  j = ShapeKeyToJson(ShapeKey{});
  j.erase("arch");
  EXPECT_NE(ShapeKeyFromJson(j).status().message().find("shape.arch"), std::string::npos);
  j = ShapeKeyToJson(ShapeKey{});
  j["op"] = "sideways";
  EXPECT_EQ(ShapeKeyFromJson(j).status().message(), "shape.op: unknown");
  EXPECT_FALSE(ShapeKeyFromJson(nlohmann::json::array()).ok());
}

}  // namespace
}  // namespace kforge
