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

namespace kforge::agent {
namespace {

ModelOptions TwoModels() {
  auto o = ParseModelOptions(R"({"base_url": "http://127.0.0.1:9/v1", "api_key_env": "",
      "models": [{"name": "mini", "model": "m-mini"}, {"name": "big", "model": "m-big", "strong": true}]})");
  EXPECT_TRUE(o.ok()) << o.status();
  return *o;
}

TEST(MakeProposer, AJobChoosesItsModelsByName) {
  ProposerOptions options;
  options.model = TwoModels();
  auto resources = MakeModelResources(*options.model, nullptr, nullptr);
  ASSERT_TRUE(resources.ok()) << resources.status();
  options.resources = *resources;
  EXPECT_EQ((*resources)->clients.size(), 2u);
  for (const char* name : {"model", "model:mini", "model:mini,big", "hybrid", "hybrid:big"}) {
    auto p = MakeProposer(name, 1, options);
    ASSERT_TRUE(p.ok()) << name << ": " << p.status();
  }
  EXPECT_EQ((*MakeProposer("hybrid:mini", 1, options))->Name(), "hybrid");
  auto unknown = MakeProposer("model:huge", 1, options);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.status().message()), ::testing::HasSubstr("configured: mini, big"));
  EXPECT_EQ(MakeProposer("model:", 1, options).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(MakeProposer("builtin:x", 1, options).status().code(), absl::StatusCode::kNotFound);
}

TEST(MakeProposer, BuiltinResultsReachTheSharedDatabase) {
  ProposerOptions options;
  options.model = TwoModels();
  auto resources = MakeModelResources(*options.model, nullptr, nullptr);
  ASSERT_TRUE(resources.ok());
  options.resources = *resources;
  auto p = MakeProposer("builtin", 1, options);
  ASSERT_TRUE(p.ok());
  Feedback f;
  f.variant_id = "v1";
  f.bucket = "fwd.bf16.d128.h4.kv4.causal.self.sm_90a.b8.mq512.aq512.mk512.ak512";
  f.outcome = Outcome::kVerified;
  f.median_us = 10;
  f.candidate.source = "__global__ void k() {}";
  f.candidate.origin = "template";
  (*p)->Observe(f);
  EXPECT_EQ((*resources)->programs->size(), 1u);
}

}  // namespace
}  // namespace kforge::agent
