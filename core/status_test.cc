#include "core/status.h"

#include <gtest/gtest.h>

namespace kforge {
TEST(Invalid, IsInvalidArgumentNamingTheField) {
  absl::Status s = Invalid("head_dim", "100 is not a multiple of 8");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "head_dim: 100 is not a multiple of 8");
}
}  // namespace kforge
