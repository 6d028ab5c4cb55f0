// The hybrid proposer over a scripted model: a kernel that declares knobs is
// swept by the builtin search once verified, and a restart resumes the sweep.
#include "agent/hybrid_proposer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "agent/model_proposer.h"
#include "agent/scripted_chat_client.h"
#include "kernels/catalog.h"

namespace kforge::agent {
namespace {

using ::testing::HasSubstr;

ShapeKey Shape() {
  ShapeKey s;
  s.head_dim = 128;
  s.heads = 16;
  s.kv_heads = 16;
  s.causal = true;
  s.arch = "sm_90a";
  s.batch = 8;
  s.max_len_q = s.max_len_k = 3000;
  s.total_q = s.total_k = 12000;
  return s;
}

ProposalContext Ctx() {
  ProposalContext ctx;
  ctx.shape = Shape();
  ctx.bucket = BucketOf(ctx.shape);
  return ctx;
}

// The seed kernel with BLOCK_N and STAGES declared as knobs.
std::string KnobbedAnswer(int variation) {
  absl::StatusOr<Variant> seed = DefaultVariant(Shape());
  std::string body = seed->source;
  for (const char* k : {"#define KF_BLOCK_N 128\n", "#define KF_STAGES 2\n"}) body.erase(body.find(k), strlen(k));
  body = "// kforge-knob BLOCK_N default=128 values=64,96,128\n// kforge-knob STAGES default=2 values=2,3\n" + body +
         fmt::format("__device__ int kf_idea_{}() {{ return {}; }}\n", variation, variation);
  return fmt::format("```cuda\n{}```\n```json\n{}\n```\n", body, seed->manifest_json);
}

std::unique_ptr<Proposer> Hybrid(int answers) {
  auto client = std::make_unique<ScriptedChatClient>();
  for (int i = 0; i < answers; ++i) client->ThenText(KnobbedAnswer(i));
  ModelOptions o;
  o.knob_sweeps = true;
  return MakeHybridProposer(MakeModelProposer(std::move(client), o), 7);
}

Feedback Verified(const std::string& id, const Candidate& c, double us) {
  Feedback f;
  f.variant_id = id;
  f.bucket = Ctx().bucket.Id();
  f.candidate = c;
  f.outcome = Outcome::kVerified;
  f.median_us = us;
  return f;
}

TEST(HybridProposer, AVerifiedKernelWithKnobsIsSweptByTheSearch) {
  auto p = Hybrid(10);
  EXPECT_EQ(p->Name(), "hybrid");
  auto first = p->Propose(Ctx(), 1);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->size(), 1u);
  const Candidate declaring = (*first)[0];
  EXPECT_EQ(declaring.kind, "fresh");
  p->Observe(Verified("v1", declaring, 500));

  auto next = p->Propose(Ctx(), 4);
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_EQ(next->size(), 4u);
  int sweeps = 0;
  std::set<std::string> settings;
  for (const Candidate& c : *next) {
    if (c.kind != "sweep") continue;
    ++sweeps;
    EXPECT_EQ(c.origin, "model");
    EXPECT_EQ(c.template_name, "model:v1");
    EXPECT_EQ(c.parent_id, "v1");
    EXPECT_NE(nlohmann::json::parse(c.knobs_json), nlohmann::json::parse(R"({"BLOCK_N":128,"STAGES":2})"));
    EXPECT_TRUE(settings.insert(c.knobs_json).second);
    // An instance: the setting's defines, then the declaring kernel's body.
    auto knobs = nlohmann::json::parse(c.knobs_json);
    EXPECT_EQ(c.source.rfind(fmt::format("#define KF_BLOCK_N {}\n#define KF_STAGES {}\n", knobs["BLOCK_N"].get<int>(),
                                         knobs["STAGES"].get<int>()),
                             0),
              0u);
    EXPECT_THAT(c.source, HasSubstr("kf_idea_0()"));
    EXPECT_EQ(nlohmann::json::parse(c.provenance_json)["sweep_of"], "v1");
  }
  EXPECT_EQ(sweeps, 2);  // half the round; the model writes the rest
}

TEST(HybridProposer, ARestartResumesTheSweepWithoutRepeats) {
  std::vector<Candidate> history;
  std::vector<Feedback> results;
  {
    auto p = Hybrid(10);
    auto first = p->Propose(Ctx(), 1);
    ASSERT_TRUE(first.ok());
    history.push_back((*first)[0]);
    results.push_back(Verified("v1", (*first)[0], 500));
    p->Observe(results.back());
    auto next = p->Propose(Ctx(), 4);
    ASSERT_TRUE(next.ok());
    for (const Candidate& c : *next) history.push_back(c);
  }
  auto restarted = Hybrid(10);
  restarted->Remember(history[0]);
  restarted->Observe(results[0]);
  std::set<std::string> seen;
  for (size_t i = 1; i < history.size(); ++i) {
    restarted->Remember(history[i]);
    if (history[i].kind == "sweep") seen.insert(history[i].knobs_json);
  }
  auto more = restarted->Propose(Ctx(), 4);
  ASSERT_TRUE(more.ok()) << more.status();
  for (const Candidate& c : *more) {
    if (c.kind == "sweep") EXPECT_FALSE(seen.count(c.knobs_json)) << c.knobs_json << " was swept before the restart";
  }
}

TEST(HybridProposer, AKernelWithoutKnobsIsNotSwept) {
  auto client = std::make_unique<ScriptedChatClient>();
  absl::StatusOr<Variant> seed = DefaultVariant(Shape());
  for (int i = 0; i < 6; ++i)
    client->ThenText(fmt::format("```cuda\n{}__device__ int kf_plain_{}() {{ return 0; }}\n```\n```json\n{}\n```\n",
                                 seed->source, i, seed->manifest_json));
  ModelOptions o;
  o.knob_sweeps = true;
  auto p = MakeHybridProposer(MakeModelProposer(std::move(client), o), 7);
  auto first = p->Propose(Ctx(), 1);
  ASSERT_TRUE(first.ok());
  p->Observe(Verified("v1", (*first)[0], 500));
  auto next = p->Propose(Ctx(), 2);
  ASSERT_TRUE(next.ok()) << next.status();
  for (const Candidate& c : *next) EXPECT_NE(c.kind, "sweep");
}

}  // namespace
}  // namespace kforge::agent
