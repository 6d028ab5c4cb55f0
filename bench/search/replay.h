// Replays a proposer against an exhaustive table (table.h) instead of a GPU:
// the real proposer is asked for candidates in the job engine's lockstep
// rounds (server/jobs.cc: a synchronous proposer gets candidates_per_round
// candidates, and every result of a round is observed before the next round
// is asked for), each candidate's measured outcome and time are looked up in
// the table and fed back through the proposer's own Observe(), and the run
// records how many evaluations it took until the best verified time found
// was within each target fraction of the table's best.
//
// What the replay enforces of the proposer's contract (agent/proposer.h):
// every candidate is a setting of the table (the proposer's space and the
// bench's enumeration agree), none is proposed twice, and, with
// check_restarts, a fresh proposer given the history so far through
// Remember()/Observe() proposes exactly what the running one proposes next.
// A breach is an error naming the setting, not a figure.
//
// Not thread-safe (the proposers are not); one replay at a time per table is
// fine, tables are immutable.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/proposer.h"
#include "agent/template_source.h"
#include "bench/search/table.h"

namespace kforge::search {

using ProposerMaker =
    std::function<absl::StatusOr<std::unique_ptr<agent::Proposer>>(uint64_t seed)>;

struct ReplayOptions {
  int batch = 4;            // candidates per round (the engine's default candidates_per_round)
  int max_evaluations = 0;  // stop after this many; 0: when the proposer has nothing more
  bool check_restarts = false;
  std::vector<double> targets = {0.02, 0.05};  // within 2%, within 5% of the table's best
  // The proposer sees each verified time redrawn as median * exp(sigma z),
  // z standard normal (drawn from the seed and the setting), sigma the
  // setting's own spread (the interquartile range of a normal: log(q3/q1) /
  // 1.349) times `noise`: what another run of the sweep might have measured.
  // Targets are still judged on the table's medians. 0: the medians as is.
  double noise = 0;
};

struct ReplayRun {
  uint64_t seed = 0;
  int evaluations = 0;
  // Per target: evaluations until the best verified time was within it (the
  // count includes the one that got there); -1: never, in `evaluations`.
  std::vector<int> to_target;
  std::vector<double> best_so_far;  // after each evaluation; 0 until something verified
  std::vector<std::string> proposed;  // SettingKey of each evaluation, in order
};

absl::StatusOr<ReplayRun> Replay(const ShapeTable& table, const ProposerMaker& make, uint64_t seed,
                                 const ReplayOptions& options);

// Over seeds, per target: how many evaluations the runs needed. A run that
// never got there counts as the whole space plus one (it is also in `never`).
struct TargetSummary {
  double target = 0;
  double median = 0, mean = 0, p90 = 0;
  int worst = 0;
  int never = 0;
  double worst_fraction = 0, median_fraction = 0;  // of the space (table.size())
  // A blind search of the same space: expected evaluations to draw one of
  // the settings within the target, without replacement.
  double random_expected = 0;
  int within = 0;  // settings of the table within the target
};

std::vector<TargetSummary> Summarize(const ShapeTable& table, const std::vector<ReplayRun>& runs,
                                     const std::vector<double>& targets);

// (N + 1) / (m + 1): the expected draws, without replacement, until the
// first of m marked items among N.
double RandomSearchExpectation(int space, int marked);

// A TemplateSource that remembers every answer of another. The catalog's
// Instantiate runs the kernels' static check on every source, which a
// replay of hundreds of settings over many seeds would otherwise repeat
// for every seed; answers are a pure function of the arguments
// (template_source.h), so remembering them changes nothing.
class CachedTemplateSource final : public agent::TemplateSource {
 public:
  // `only`: the templates the proposer sees (empty: all of inner's), so a
  // study of a given space can leave out templates added to the catalog
  // after its tables were measured.
  explicit CachedTemplateSource(std::unique_ptr<agent::TemplateSource> inner,
                                std::set<std::string> only = {});

  std::vector<agent::TemplateSpec> Templates() const override;
  bool Supports(const agent::TemplateSpec& spec, const ShapeKey& shape) const override;
  absl::StatusOr<agent::KnobValues> DefaultKnobs(const std::string& tmpl,
                                                 const ShapeKey& shape) const override;
  absl::StatusOr<agent::TemplateVariant> Instantiate(const std::string& tmpl,
                                                     const agent::KnobValues& knobs,
                                                     const ShapeKey& shape) const override;

 private:
  std::unique_ptr<agent::TemplateSource> inner_;
  std::set<std::string> only_;
  mutable std::mutex mu_;
  mutable std::map<std::string, absl::StatusOr<agent::TemplateVariant>> variants_;  // guarded by mu_
};

}  // namespace kforge::search
