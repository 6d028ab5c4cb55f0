#include "core/arch.h"

#include <gtest/gtest.h>

namespace kforge {
namespace {

TEST(ParseArch, SplitsMajorMinorAndTheSuffix) {
  absl::StatusOr<Arch> a = ParseArch("sm_90a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->major, 9);
  EXPECT_EQ(a->minor, 0);
  EXPECT_TRUE(a->arch_specific);
  EXPECT_EQ(a->number(), 90);

  a = ParseArch("sm_89");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->major, 8);
  EXPECT_EQ(a->minor, 9);
  EXPECT_FALSE(a->arch_specific);

  a = ParseArch("sm_103");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->major, 10);
  EXPECT_EQ(a->minor, 3);
}

TEST(ParseArch, RejectsOtherSpellingsNamingTheField) {
  for (const char* bad : {"", "sm_", "90a", "compute_90", "sm_90x", "sm_9a0", "sm_-90", "sm_60",
                          "sm_201", "sm_aa"}) {
    absl::StatusOr<Arch> a = ParseArch(bad);
    EXPECT_FALSE(a.ok()) << bad;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(a.status().message().substr(0, 6), "arch: ") << bad;
  }
}

TEST(ArchName, IsWhatParseArchReads) {
  for (const char* name : {"sm_80", "sm_90", "sm_90a", "sm_100a", "sm_120"}) {
    absl::StatusOr<Arch> a = ParseArch(name);
    ASSERT_TRUE(a.ok()) << name;
    EXPECT_EQ(ArchName(*a), name);
  }
}

}  // namespace
}  // namespace kforge
