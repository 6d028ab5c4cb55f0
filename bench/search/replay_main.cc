// kforge-search-replay: how many evaluations the builtin proposer needs to
// come within 2% and 5% of the exhaustive best, replayed against the tables
// of bench/search/sweep.sh (README.md there). No GPU: the tables answer.
//
//   kforge-search-replay --sweep sweep.json --lengths lengths.json [--only a,b]
//       [--seeds 20] [--batch 4] [--max-evaluations N] [--noise F] [--check-restarts]
//       [--json out.json] [--explore P] [--template-level X] [--across-templates X]
//       [--theta-start X]
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "agent/builtin_proposer.h"
#include "bench/search/replay.h"
#include "bench/search/table.h"

namespace kforge::search {
namespace {

std::string ReadFile(const std::string& path, bool& ok) {
  std::ifstream in(path);
  ok = static_cast<bool>(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> Split(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

int Main(int argc, char** argv) {
  CLI::App app{"Replays the builtin proposer against exhaustive sweep tables"};
  std::string sweep_path, lengths_path, only, json_path, templates_arg;
  int seeds = 20, batch = 4, max_evaluations = 0;
  bool check_restarts = false;
  double explore = agent::BuiltinOptions{}.explore, noise = 0;
  agent::KnobModelOptions model;
  app.add_option("--sweep", sweep_path, "kforge-bench-attn --variants all output (sweep.json)")
      ->required();
  app.add_option("--lengths", lengths_path, "the lengths file the sweep ran on")->required();
  app.add_option("--only", only, "only these shapes (comma-separated)");
  app.add_option("--templates", templates_arg,
                 "the proposer sees only these catalog templates (comma-separated; default all): "
                 "the space the tables measured, when the catalog has grown since");
  app.add_option("--seeds", seeds, "seeds 1..N per shape")->check(CLI::Range(1, 10000));
  app.add_option("--batch", batch, "candidates per round (the engine's candidates_per_round)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--max-evaluations", max_evaluations, "stop each run after this many (0: the space)")
      ->check(CLI::Range(0, 1000000));
  app.add_flag("--check-restarts", check_restarts,
               "every round, check that a restarted proposer continues identically");
  app.add_option("--json", json_path, "write every run and the summaries here");
  app.add_option("--explore", explore, "the builtin proposer's explore probability (BuiltinOptions)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--noise", noise,
                 "redraw each verified time from its own spread, times this (0: the medians)")
      ->check(CLI::Range(0.0, 100.0));
  // The model's priors, for sensitivity checks (knob_model.h).
  app.add_option("--template-level", model.template_level, "KnobModelOptions::template_level");
  app.add_option("--across-templates", model.across_templates, "KnobModelOptions::across_templates");
  app.add_option("--theta-start", model.theta_start, "KnobModelOptions::theta_start");
  CLI11_PARSE(app, argc, argv);

  bool ok = false;
  const std::string sweep = ReadFile(sweep_path, ok);
  if (!ok) return std::fprintf(stderr, "cannot read %s\n", sweep_path.c_str()), 1;
  const std::string lengths = ReadFile(lengths_path, ok);
  if (!ok) return std::fprintf(stderr, "cannot read %s\n", lengths_path.c_str()), 1;
  absl::StatusOr<std::vector<ShapeTable>> tables = LoadTables(sweep, lengths, Split(only));
  if (!tables.ok()) {
    std::fprintf(stderr, "%s\n", std::string(tables.status().message()).c_str());
    return 1;
  }
  std::set<std::string> only_templates;
  for (const auto& t : Split(templates_arg)) only_templates.insert(t);
  CachedTemplateSource templates(agent::MakeCatalogTemplateSource(), only_templates);
  const ProposerMaker make = [&](uint64_t seed) -> absl::StatusOr<std::unique_ptr<agent::Proposer>> {
    return agent::MakeBuiltinProposer(
        seed, {.templates = &templates, .explore = explore, .model = model});
  };
  ReplayOptions options;
  options.batch = batch;
  options.max_evaluations = max_evaluations;
  options.check_restarts = check_restarts;
  options.noise = noise;

  nlohmann::json out = nlohmann::json::array();
  std::printf("| shape | space | best µs (setting) | within 2%% / 5%% | evals to 2%%: median, p90, worst "
              "(worst/space) | evals to 5%%: median, p90, worst (worst/space) | blind search 2%% / 5%% |\n"
              "|---|---|---|---|---|---|---|\n");
  for (const ShapeTable& t : *tables) {
    if (t.best() == nullptr) {
      std::fprintf(stderr, "%s: nothing verified in the table; skipped\n", t.name().c_str());
      continue;
    }
    std::vector<ReplayRun> runs;
    nlohmann::json jruns = nlohmann::json::array();
    for (int s = 1; s <= seeds; ++s) {
      absl::StatusOr<ReplayRun> r = Replay(t, make, static_cast<uint64_t>(s), options);
      if (!r.ok()) {
        std::fprintf(stderr, "%s: %s\n", t.name().c_str(), std::string(r.status().message()).c_str());
        return 1;
      }
      jruns.push_back({{"seed", r->seed}, {"evaluations", r->evaluations},
                       {"to_target", r->to_target}, {"best_so_far", r->best_so_far},
                       {"proposed", r->proposed}});
      runs.push_back(*std::move(r));
    }
    const std::vector<TargetSummary> sum = Summarize(t, runs, options.targets);
    auto cell = [&](const TargetSummary& s) {
      return fmt::format("{:g}, {:g}, {}{} ({:.1f}%)", s.median, s.p90, s.worst,
                         s.never ? fmt::format(" [{} never]", s.never) : "", 100 * s.worst_fraction);
    };
    std::printf("| %s | %zu | %.1f (%s) | %d / %d | %s | %s | %.1f / %.1f |\n", t.name().c_str(),
                t.size(), t.best_us(), SettingKey(t.best()->template_name, t.best()->knobs).c_str(),
                sum[0].within, sum[1].within, cell(sum[0]).c_str(), cell(sum[1]).c_str(),
                sum[0].random_expected, sum[1].random_expected);
    nlohmann::json jsum = nlohmann::json::array();
    for (const TargetSummary& s : sum) {
      jsum.push_back({{"target", s.target}, {"median", s.median}, {"mean", s.mean}, {"p90", s.p90},
                      {"worst", s.worst}, {"never", s.never}, {"worst_fraction", s.worst_fraction},
                      {"median_fraction", s.median_fraction}, {"within", s.within},
                      {"random_expected", s.random_expected}});
    }
    out.push_back({{"shape", t.name()}, {"space", t.size()}, {"best_us", t.best_us()},
                   {"best", SettingKey(t.best()->template_name, t.best()->knobs)},
                   {"summary", jsum}, {"runs", jruns}});
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(1);
  return 0;
}

}  // namespace
}  // namespace kforge::search

int main(int argc, char** argv) { return kforge::search::Main(argc, argv); }
