#include "agent/factory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kforge::agent {
namespace {

TEST(MakeProposer, ByName) {
  ProposerOptions options;
  auto builtin = MakeProposer("builtin", 1, options);
  ASSERT_TRUE(builtin.ok()) << builtin.status();
  EXPECT_EQ((*builtin)->Name(), "builtin");

  EXPECT_EQ(MakeProposer("model", 1, options).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(MakeProposer("oracle", 1, options).status().code(), absl::StatusCode::kNotFound);

  options.model = ModelOptions{};
  options.model->client.base_url = "http://127.0.0.1:9/v1";
  options.model->client.model = "m";
  auto model = MakeProposer("model", 1, options);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->Name(), "model");
  options.model->client.model = "";
  EXPECT_EQ(MakeProposer("model", 1, options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kforge::agent
