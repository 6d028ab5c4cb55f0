#include "core/outcome.h"

#include <gtest/gtest.h>

namespace kforge {
TEST(Outcome, NamesRoundTrip) {
  for (Outcome o : {Outcome::kCompiled, Outcome::kCompileError, Outcome::kWrong,
                    Outcome::kCrashed, Outcome::kTimeout, Outcome::kVerified}) {
    auto parsed = ParseOutcome(OutcomeName(o));
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(*parsed, o);
  }
  EXPECT_FALSE(ParseOutcome("fast").has_value());
}

TEST(Outcome, FailuresAreCompileErrorWrongCrashedAndTimeout) {
  EXPECT_TRUE(IsFailure(Outcome::kCompileError));
  EXPECT_TRUE(IsFailure(Outcome::kWrong));
  EXPECT_TRUE(IsFailure(Outcome::kCrashed));
  EXPECT_TRUE(IsFailure(Outcome::kTimeout));
  EXPECT_FALSE(IsFailure(Outcome::kCompiled));
  EXPECT_FALSE(IsFailure(Outcome::kVerified));
}
}  // namespace kforge
