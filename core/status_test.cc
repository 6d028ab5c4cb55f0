#include "core/status.h"

#include <gtest/gtest.h>

namespace kforge {
TEST(Invalid, IsInvalidArgumentNamingTheField) {
  absl::Status s = Invalid("head_dim", "100 is not a multiple of 8");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "head_dim: 100 is not a multiple of 8");
}
}  // namespace kforge

namespace kforge {
TEST(Utf8, TellsWellFormedFromMalformed) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("h\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xff"));
  EXPECT_FALSE(IsValidUtf8("\xc3"));              // cut short
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // a surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // above U+10FFFF
}

TEST(Utf8, ValidUtf8ReplacesOnlyWhatIsNotUtf8) {
  EXPECT_EQ(ValidUtf8("log\n\tline h\xc3\xa9"), "log\n\tline h\xc3\xa9");
  EXPECT_EQ(ValidUtf8("a\xff\xc3" "b\xed\xa0\x80"), "a??b???");
  EXPECT_TRUE(IsValidUtf8(ValidUtf8(std::string("\xf0\x9f\x98", 3) + "\x80\x80")));
}

TEST(Excerpt, QuotesLittleAndOnlyText) {
  EXPECT_EQ(Excerpt("short"), "short");
  const std::string big(10 << 20, 'x');
  const std::string e = Excerpt(big, 16);
  EXPECT_EQ(e, std::string(16, 'x') + "... (10485760 bytes)");
  // Not cut inside a sequence: the euro sign (3 bytes) does not fit in 5.
  EXPECT_EQ(Excerpt("abc\xe2\x82\xac", 5), "abc... (6 bytes)");
  EXPECT_EQ(Excerpt("a\xff" "b\n", 64), "a?b?");
  EXPECT_TRUE(IsValidUtf8(Excerpt("\xc3\xa9\xff\xfe" + std::string(100, '\x80'), 32)));
}
}  // namespace kforge
