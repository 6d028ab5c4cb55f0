#include "core/hash.h"

#include <gtest/gtest.h>

namespace kforge {
namespace {

TEST(Sha256Hex, MatchesKnownDigests) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256Hex, HashesEmbeddedZeroBytes) {
  EXPECT_NE(Sha256Hex(std::string_view("a\0b", 3)), Sha256Hex("a"));
}

TEST(ContentVariantId, IsStableAndNamesEveryPart) {
  const std::string id = ContentVariantId("src", "{}", "-arch=sm_90a");
  EXPECT_EQ(id, ContentVariantId("src", "{}", "-arch=sm_90a"));
  EXPECT_EQ(id.rfind("s-", 0), 0u);
  EXPECT_EQ(id.size(), 26u);
  EXPECT_NE(id, ContentVariantId("src2", "{}", "-arch=sm_90a"));
  EXPECT_NE(id, ContentVariantId("src", "{ }", "-arch=sm_90a"));
  EXPECT_NE(id, ContentVariantId("src", "{}", "-arch=sm_80"));
  // Moving bytes from one part to the next changes the id.
  EXPECT_NE(ContentVariantId("ab", "c", ""), ContentVariantId("a", "bc", ""));
}

}  // namespace
}  // namespace kforge
