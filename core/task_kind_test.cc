#include "core/task_kind.h"

#include <gtest/gtest.h>

namespace kforge {
TEST(TaskKind, NamesRoundTrip) {
  for (TaskKind k : {TaskKind::kEvaluate, TaskKind::kRetime, TaskKind::kCompile, TaskKind::kConfirm}) {
    std::optional<TaskKind> parsed = ParseTaskKind(TaskKindName(k));
    ASSERT_TRUE(parsed.has_value()) << TaskKindName(k);
    EXPECT_EQ(*parsed, k);
  }
  EXPECT_FALSE(ParseTaskKind("benchmark").has_value());
}
}  // namespace kforge
