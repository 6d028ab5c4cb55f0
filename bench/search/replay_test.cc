// The replay against synthetic tables (never measured ones): the table
// reader on the bench's JSON layout, the lockstep loop, the counts to each
// target, the contract checks (settings outside the table, duplicates,
// restarts) and, on the real catalog, that the builtin proposer's space is
// the space `kforge-bench-attn --variants all` enumerates.
#include "bench/search/replay.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "agent/builtin_proposer.h"
#include "bench/search/table.h"
#include "kernels/catalog.h"
#include "kernels/check.h"

namespace kforge::search {
namespace {

using nlohmann::json;
using testing::HasSubstr;

// One template "t" with X, Y in 1..6 (36 settings) on sm_90a, head dim 128.
class GridTemplates final : public agent::TemplateSource {
 public:
  std::vector<agent::TemplateSpec> Templates() const override {
    return {agent::TemplateSpec{"t", {"sm_90a"}, {"fwd"}, {128},
                                {{"X", {1, 2, 3, 4, 5, 6}}, {"Y", {1, 2, 3, 4, 5, 6}}}}};
  }
  bool Supports(const agent::TemplateSpec&, const ShapeKey& s) const override {
    return s.head_dim == 128 && s.arch == "sm_90a";
  }
  absl::StatusOr<agent::KnobValues> DefaultKnobs(const std::string&, const ShapeKey&) const override {
    return agent::KnobValues{{"X", 1}, {"Y", 1}};
  }
  absl::StatusOr<agent::TemplateVariant> Instantiate(const std::string& t, const agent::KnobValues& k,
                                                     const ShapeKey&) const override {
    return agent::TemplateVariant{fmt::format("// {} X={} Y={}", t, k.at("X"), k.at("Y")), "{}"};
  }
};

constexpr const char* kLengths =
    R"([{"name": "s", "B": 2, "H": 4, "D": 128, "causal": true, "lq": [100, 300], "lk": [100, 300]},
        {"name": "x", "B": 2, "H": 4, "KVH": 2, "D": 128, "causal": false, "lq": [5, 7], "lk": [9, 7]}])";

// A sweep in kforge-bench-attn's --out layout over GridTemplates' space:
// times 100 + (X-5)^2 + (Y-2)^2 µs; X = 6, Y = 6 fails to compile.
json GridSweep() {
  json variants = json::array();
  for (int x = 1; x <= 6; ++x) {
    for (int y = 1; y <= 6; ++y) {
      json v = {{"variant", fmt::format("t X={} Y={}", x, y)}, {"template", "t"},
                {"knobs", {{"X", x}, {"Y", y}}}};
      if (x == 6 && y == 6) {
        v["outcome"] = "compile_error";
        v["error"] = "compile error: scripted";
      } else {
        const double us = 100 + (x - 5) * (x - 5) + (y - 2) * (y - 2);
        v["outcome"] = "verified";
        v["us"] = us;
        v["us_q1"] = us - 0.5;
        v["us_q3"] = us + 0.5;
      }
      variants.push_back(v);
    }
  }
  return {{"gpu", "synthetic"}, {"arch", "sm_90a"}, {"op", "fwd"},
          {"shapes", {{{"shape", "s"}, {"op", "fwd"}, {"variants", variants}}}}};
}

ShapeTable GridTable() {
  auto t = LoadTables(GridSweep().dump(), kLengths);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(t->at(0));
}

TEST(Table, ReadsTheBenchLayoutAndRebuildsTheShape) {
  ShapeTable t = GridTable();
  EXPECT_EQ(t.name(), "s");
  EXPECT_EQ(t.size(), 36u);
  EXPECT_EQ(t.shape().arch, "sm_90a");
  EXPECT_EQ(t.shape().batch, 2);
  EXPECT_EQ(t.shape().max_len_q, 300);
  EXPECT_EQ(t.shape().total_q, 400);
  EXPECT_TRUE(t.shape().causal);
  EXPECT_FALSE(t.shape().cross);
  EXPECT_EQ(t.best_us(), 100);
  EXPECT_EQ(t.best()->knobs, (agent::KnobValues{{"X", 5}, {"Y", 2}}));
  EXPECT_EQ(t.CountWithin(0.0), 1);
  EXPECT_EQ(t.CountWithin(0.02), 9);  // (X-5)^2 + (Y-2)^2 <= 2: the 3 x 3 around the best
  const Setting* failed = t.Find("t", {{"X", 6}, {"Y", 6}});
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ(failed->outcome, Outcome::kCompileError);
  EXPECT_EQ(failed->message, "compile error: scripted");
  EXPECT_EQ(t.Find("t", {{"X", 7}, {"Y", 1}}), nullptr);

  auto key = ShapeKeyOf(json::parse(kLengths)[1].dump(), Op::kForward, "sm_90a");
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_TRUE(key->cross);  // key lengths differ from the query lengths
  EXPECT_EQ(key->kv_heads, 2);
  EXPECT_EQ(key->max_len_k, 9);
}

TEST(Table, RefusesWhatItCannotUse) {
  json no_outcome = GridSweep();
  no_outcome["shapes"][0]["variants"][3].erase("outcome");
  EXPECT_THAT(std::string(LoadTables(no_outcome.dump(), kLengths).status().message()),
              HasSubstr("no known outcome"));
  json twice = GridSweep();
  twice["shapes"][0]["variants"].push_back(twice["shapes"][0]["variants"][0]);
  EXPECT_THAT(std::string(LoadTables(twice.dump(), kLengths).status().message()),
              HasSubstr("twice"));
  json no_time = GridSweep();
  no_time["shapes"][0]["variants"][0].erase("us");
  EXPECT_THAT(std::string(LoadTables(no_time.dump(), kLengths).status().message()),
              HasSubstr("without a time"));
  EXPECT_THAT(std::string(LoadTables(GridSweep().dump(), "[]").status().message()),
              HasSubstr("not in the lengths file"));
  json short_run = GridSweep();
  short_run["shapes"][0]["space"] = {{"kept", 40}};
  EXPECT_THAT(std::string(LoadTables(short_run.dump(), kLengths).status().message()),
              HasSubstr("36 of the space's 40 settings"));
  json no_arch = GridSweep();
  no_arch.erase("arch");
  EXPECT_FALSE(LoadTables(no_arch.dump(), kLengths).ok());
  // --only picks shapes by name.
  auto none = LoadTables(GridSweep().dump(), kLengths, {"other"});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

// A proposer that proposes settings in a fixed order: the replay's
// arithmetic, independent of any search.
class ListProposer final : public agent::Proposer {
 public:
  ListProposer(std::vector<agent::KnobValues> order,
               std::shared_ptr<std::vector<agent::Feedback>> observed = nullptr)
      : order_(std::move(order)), observed_(std::move(observed)) {}
  absl::StatusOr<std::vector<agent::Candidate>> Propose(const agent::ProposalContext&, int n) override {
    std::vector<agent::Candidate> out;
    while (static_cast<int>(out.size()) < n && next_ < order_.size()) {
      agent::Candidate c;
      c.template_name = "t";
      json j = json::object();
      for (const auto& [k, v] : order_[next_]) j[k] = v;
      c.knobs_json = j.dump();
      out.push_back(c);
      ++next_;
    }
    return out;
  }
  void Observe(const agent::Feedback& f) override {
    if (observed_) observed_->push_back(f);
  }
  void Remember(const agent::Candidate&) override { ++next_; }
  std::string Name() const override { return "list"; }

 private:
  std::vector<agent::KnobValues> order_;
  std::shared_ptr<std::vector<agent::Feedback>> observed_;
  size_t next_ = 0;
};

TEST(Replay, CountsEvaluationsUntilEachTargetAndFeedsResultsBack) {
  ShapeTable t = GridTable();
  // 117 µs (17% off), 104 (4%), the failure, 102 (2%), 101, then the best (100).
  std::vector<agent::KnobValues> order = {
      {{"X", 1}, {"Y", 1}}, {{"X", 5}, {"Y", 4}}, {{"X", 6}, {"Y", 6}}, {{"X", 4}, {"Y", 1}},
      {{"X", 5}, {"Y", 1}}, {{"X", 5}, {"Y", 2}}};
  auto observed = std::make_shared<std::vector<agent::Feedback>>();
  ProposerMaker make = [&](uint64_t) -> absl::StatusOr<std::unique_ptr<agent::Proposer>> {
    observed->clear();
    return std::make_unique<ListProposer>(order, observed);
  };
  auto run = Replay(t, make, 1, {.batch = 4});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->evaluations, 6);
  EXPECT_EQ(run->to_target, (std::vector<int>{4, 2}));
  EXPECT_EQ(run->best_so_far, (std::vector<double>{117, 104, 104, 102, 101, 100}));
  ASSERT_EQ(observed->size(), 6u);
  EXPECT_EQ((*observed)[2].outcome, Outcome::kCompileError);
  EXPECT_EQ((*observed)[2].median_us, 0);
  EXPECT_EQ((*observed)[2].message, "compile error: scripted");
  EXPECT_EQ((*observed)[1].outcome, Outcome::kVerified);
  EXPECT_EQ((*observed)[1].median_us, 104);
  EXPECT_EQ((*observed)[1].spread_us, 1);
  EXPECT_EQ((*observed)[1].variant_id, "v2");
  EXPECT_EQ((*observed)[1].bucket, BucketOf(t.shape()).Id());

  // Other targets: 0% needs the best itself.
  auto exact = Replay(t, make, 1, {.batch = 2, .targets = {0.0, 0.015}});
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(exact->to_target, (std::vector<int>{6, 5}));
  // A cap on evaluations stops the run; a target not reached is -1.
  auto capped = Replay(t, make, 1, {.batch = 4, .max_evaluations = 3, .targets = {0.05, 0.0}});
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(capped->evaluations, 3);
  EXPECT_EQ(capped->to_target, (std::vector<int>{2, -1}));
}

TEST(Replay, NoiseRedrawsWhatTheProposerSeesNotTheTargets) {
  ShapeTable t = GridTable();
  std::vector<agent::KnobValues> order = {{{"X", 1}, {"Y", 1}}, {{"X", 5}, {"Y", 4}}, {{"X", 5}, {"Y", 2}}};
  auto observed = std::make_shared<std::vector<agent::Feedback>>();
  ProposerMaker make = [&](uint64_t) -> absl::StatusOr<std::unique_ptr<agent::Proposer>> {
    observed->clear();
    return std::make_unique<ListProposer>(order, observed);
  };
  auto quiet = Replay(t, make, 7, {.batch = 4});
  ASSERT_TRUE(quiet.ok());
  std::vector<double> seen;
  auto noisy = Replay(t, make, 7, {.batch = 4, .noise = 3});
  ASSERT_TRUE(noisy.ok());
  for (const auto& f : *observed) seen.push_back(f.median_us);
  EXPECT_EQ(noisy->to_target, quiet->to_target);  // judged on the table's medians
  EXPECT_EQ(noisy->best_so_far, quiet->best_so_far);
  EXPECT_NE(seen[0], 117);
  EXPECT_NEAR(seen[0], 117, 117 * 0.2);  // sigma = 3 * log(117.5 / 116.5) / 1.349: about 2%
  // The same seed draws the same; another seed draws otherwise.
  ASSERT_TRUE(Replay(t, make, 7, {.batch = 4, .noise = 3}).ok());
  EXPECT_EQ((*observed)[0].median_us, seen[0]);
  ASSERT_TRUE(Replay(t, make, 8, {.batch = 4, .noise = 3}).ok());
  EXPECT_NE((*observed)[0].median_us, seen[0]);
}

TEST(Replay, RefusesSettingsOutsideTheTableAndDuplicates) {
  ShapeTable t = GridTable();
  auto maker = [](std::vector<agent::KnobValues> order) {
    return [order](uint64_t) -> absl::StatusOr<std::unique_ptr<agent::Proposer>> {
      return std::make_unique<ListProposer>(order);
    };
  };
  auto outside = Replay(t, maker({{{"X", 1}, {"Y", 1}}, {{"X", 9}, {"Y", 1}}}), 1, {});
  EXPECT_THAT(std::string(outside.status().message()), HasSubstr("not in s's table"));
  auto twice = Replay(t, maker({{{"X", 1}, {"Y", 1}}, {{"X", 1}, {"Y", 1}}}), 1, {});
  EXPECT_THAT(std::string(twice.status().message()), HasSubstr("proposed twice"));
}

// Forgets what it was told before a restart: a restart makes it repeat itself.
class AmnesiacProposer final : public agent::Proposer {
 public:
  absl::StatusOr<std::vector<agent::Candidate>> Propose(const agent::ProposalContext&, int n) override {
    std::vector<agent::Candidate> out;
    for (int i = 0; i < n && next_ < 36; ++i, ++next_) {
      agent::Candidate c;
      c.template_name = "t";
      c.knobs_json = fmt::format(R"({{"X":{},"Y":{}}})", next_ / 6 + 1, next_ % 6 + 1);
      out.push_back(c);
    }
    return out;
  }
  void Observe(const agent::Feedback&) override {}
  void Remember(const agent::Candidate&) override {}
  std::string Name() const override { return "amnesiac"; }

 private:
  int next_ = 0;
};

TEST(Replay, RestartChecksCatchAProposerThatForgets) {
  ShapeTable t = GridTable();
  ProposerMaker amnesiac = [](uint64_t) -> absl::StatusOr<std::unique_ptr<agent::Proposer>> {
    return std::make_unique<AmnesiacProposer>();
  };
  EXPECT_TRUE(Replay(t, amnesiac, 1, {}).ok());
  auto r = Replay(t, amnesiac, 1, {.check_restarts = true});
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("a restarted proposer proposes"));
}

TEST(Replay, TheBuiltinProposerOnAScriptedSpace) {
  ShapeTable t = GridTable();
  GridTemplates templates;
  ProposerMaker make = [&](uint64_t seed) -> absl::StatusOr<std::unique_ptr<agent::Proposer>> {
    return agent::MakeBuiltinProposer(seed, {.templates = &templates});
  };
  std::vector<ReplayRun> runs;
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    auto r = Replay(t, make, seed, {.batch = 4, .check_restarts = true});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->evaluations, 36);  // the whole space, each setting once
    EXPECT_EQ(std::set<std::string>(r->proposed.begin(), r->proposed.end()).size(), 36u);
    EXPECT_EQ(r->proposed[0], SettingKey("t", {{"X", 1}, {"Y", 1}}));  // the default first
    for (int to : r->to_target) EXPECT_GT(to, 0);
    runs.push_back(*std::move(r));
  }
  const auto sum = Summarize(t, runs, {0.02, 0.05});
  ASSERT_EQ(sum.size(), 2u);
  EXPECT_EQ(sum[0].within, 9);
  EXPECT_DOUBLE_EQ(sum[0].random_expected, 37.0 / 10.0);
  EXPECT_EQ(sum[0].never, 0);
  EXPECT_LE(sum[0].median, sum[0].p90);
  EXPECT_LE(sum[0].p90, sum[0].worst);
  EXPECT_LE(sum[1].worst, sum[0].worst);  // 5% is never harder than 2%
  EXPECT_DOUBLE_EQ(sum[0].worst_fraction, sum[0].worst / 36.0);
}

TEST(Summarize, NeverCountsAsTheSpacePlusOne) {
  ShapeTable t = GridTable();
  std::vector<ReplayRun> runs(3);
  runs[0].to_target = {1};
  runs[1].to_target = {5};
  runs[2].to_target = {-1};
  const auto sum = Summarize(t, runs, {0.02});
  EXPECT_EQ(sum[0].never, 1);
  EXPECT_EQ(sum[0].worst, 37);
  EXPECT_EQ(sum[0].median, 5);
  EXPECT_NEAR(sum[0].mean, 43.0 / 3, 1e-9);
  EXPECT_EQ(sum[0].p90, 37);
  EXPECT_DOUBLE_EQ(RandomSearchExpectation(402, 0), 0);
  EXPECT_DOUBLE_EQ(RandomSearchExpectation(9, 1), 5);
}

// The real catalog. Its forward space for a D = 128 shape on sm_90a is
// enumerated here as kforge-bench-attn --variants all enumerates it (each
// template's knob product, validate(), then the static check for the
// shape), with synthetic times (a smooth function of the knobs, never a
// measurement); the real builtin proposer must propose from that space only,
// every setting once, and then nothing.
TEST(ReplayCatalog, TheBuiltinProposersSpaceIsTheSweepsSpace) {
  const std::string lengths =
      R"([{"name": "c", "B": 3, "H": 4, "D": 128, "causal": true, "lq": [5, 300, 1000], "lk": [5, 300, 1000]}])";
  auto key = ShapeKeyOf(json::parse(lengths)[0].dump(), Op::kForward, "sm_90a");
  ASSERT_TRUE(key.ok());
  json variants = json::array();
  for (const TemplateInfo& info : ListTemplates()) {
    if (std::find(info.ops.begin(), info.ops.end(), "fwd") == info.ops.end()) continue;
    if (std::find(info.head_dims.begin(), info.head_dims.end(), 128) == info.head_dims.end()) continue;
    if (std::find(info.archs.begin(), info.archs.end(), "sm_90a") == info.archs.end()) continue;
    std::vector<std::map<std::string, int>> all = {{}};
    for (const KnobDim& k : info.knobs) {
      std::vector<std::map<std::string, int>> next;
      for (const auto& partial : all)
        for (int v : k.values) {
          auto x = partial;
          x[k.name] = v;
          next.push_back(x);
        }
      all = std::move(next);
    }
    for (const auto& knobs : all) {
      auto v = Instantiate(info.name, knobs, 128);
      if (!v.ok() || !CheckVariant(v->source, v->manifest, "sm_90a", *key).ok()) continue;
      double us = info.name == "fwd_sm90" ? 50 : 80;
      for (const auto& [name, value] : knobs) us += std::abs(std::log2(1.0 + value) - 2.5);
      variants.push_back({{"template", info.name}, {"knobs", knobs}, {"outcome", "verified"},
                          {"us", us}});
    }
  }
  json sweep = {{"arch", "sm_90a"}, {"shapes", {{{"shape", "c"}, {"op", "fwd"}, {"variants", variants}}}}};
  auto tables = LoadTables(sweep.dump(), lengths);
  ASSERT_TRUE(tables.ok()) << tables.status();
  const ShapeTable& t = tables->at(0);
  EXPECT_GT(t.size(), 300u);

  CachedTemplateSource templates(agent::MakeCatalogTemplateSource());
  ProposerMaker make = [&](uint64_t seed) -> absl::StatusOr<std::unique_ptr<agent::Proposer>> {
    return agent::MakeBuiltinProposer(seed, {.templates = &templates});
  };
  auto run = Replay(t, make, 3, {.batch = 4});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->evaluations, static_cast<int>(t.size()));
  // The catalog's default for the shape comes first.
  const Setting* first = nullptr;
  for (const Setting& s : t.settings())
    if (SettingKey(s.template_name, s.knobs) == run->proposed[0]) first = &s;
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->knobs, DefaultKnobs(first->template_name, *key));
}

}  // namespace
}  // namespace kforge::search
