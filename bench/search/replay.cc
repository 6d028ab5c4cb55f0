#include "bench/search/replay.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>
#include <variant>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kforge::search {
namespace {

std::optional<agent::KnobValues> KnobsOf(const agent::Candidate& c) {
  nlohmann::json j = nlohmann::json::parse(c.knobs_json.empty() ? "{}" : c.knobs_json, nullptr,
                                           /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  agent::KnobValues out;
  for (const auto& [k, v] : j.items()) {
    if (!v.is_number_integer()) return std::nullopt;
    out[k] = v.get<int>();
  }
  return out;
}

std::string Describe(const agent::Candidate& c) {
  return fmt::format("{} {} (parent {})", c.template_name, c.knobs_json,
                     c.parent_id.empty() ? "-" : c.parent_id);
}

// A standard normal draw that is a function of (seed, key) only: SplitMix64
// of the seed and an FNV-1a hash of the key, then Box-Muller.
double NormalDraw(uint64_t seed, const std::string& key) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : key) h = (h ^ c) * 0x100000001b3ULL;
  uint64_t state = seed * 0x9e3779b97f4a7c15ULL ^ h;
  auto next = [&] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  const double u1 = (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53;
  const double u2 = static_cast<double>(next() >> 11) * 0x1.0p-53;
  return std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
}

// The history as the engine would replay it after a restart: candidates and
// results in the order they happened.
using Event = std::variant<agent::Candidate, agent::Feedback>;

}  // namespace

absl::StatusOr<ReplayRun> Replay(const ShapeTable& table, const ProposerMaker& make, uint64_t seed,
                                 const ReplayOptions& options) {
  absl::StatusOr<std::unique_ptr<agent::Proposer>> made = make(seed);
  if (!made.ok()) return made.status();
  std::unique_ptr<agent::Proposer> proposer = *std::move(made);
  ReplayRun run;
  run.seed = seed;
  run.to_target.assign(options.targets.size(), -1);
  agent::ProposalContext ctx;
  ctx.shape = table.shape();
  ctx.bucket = BucketOf(table.shape());
  const std::string bucket_id = ctx.bucket.Id();
  const int limit = options.max_evaluations > 0
                        ? std::min<int>(options.max_evaluations, static_cast<int>(table.size()))
                        : static_cast<int>(table.size());
  std::set<std::string> seen;
  std::vector<Event> history;
  double best = 0;
  while (run.evaluations < limit) {
    const int n = std::min(options.batch, limit - run.evaluations);
    ctx.variants_left = limit - run.evaluations;
    absl::StatusOr<std::vector<agent::Candidate>> got = proposer->Propose(ctx, n);
    if (!got.ok()) return got.status();
    if (options.check_restarts && !history.empty()) {
      // What the engine does after a restart, at this point of the job.
      absl::StatusOr<std::unique_ptr<agent::Proposer>> fresh = make(seed);
      if (!fresh.ok()) return fresh.status();
      for (const Event& e : history) {
        if (const auto* c = std::get_if<agent::Candidate>(&e)) (*fresh)->Remember(*c);
        else (*fresh)->Observe(std::get<agent::Feedback>(e));
      }
      absl::StatusOr<std::vector<agent::Candidate>> again = (*fresh)->Propose(ctx, n);
      if (!again.ok()) return again.status();
      for (size_t i = 0; i < std::max(got->size(), again->size()); ++i) {
        const std::string a = i < got->size() ? Describe((*got)[i]) : "nothing";
        const std::string b = i < again->size() ? Describe((*again)[i]) : "nothing";
        if (a != b) {
          return absl::FailedPreconditionError(fmt::format(
              "seed {}: after {} evaluations a restarted proposer proposes {} where the running "
              "one proposes {}",
              seed, run.evaluations, b, a));
        }
      }
      proposer = *std::move(fresh);
    }
    if (got->empty()) break;  // the space is used up
    std::vector<agent::Feedback> results;
    for (agent::Candidate& c : *got) {
      std::optional<agent::KnobValues> knobs = KnobsOf(c);
      if (!knobs) {
        return absl::FailedPreconditionError(
            fmt::format("seed {}: a candidate with unreadable knobs: {}", seed, Describe(c)));
      }
      const std::string key = SettingKey(c.template_name, *knobs);
      const Setting* s = table.Find(c.template_name, *knobs);
      if (s == nullptr) {
        return absl::FailedPreconditionError(fmt::format(
            "seed {}: {} is not in {}'s table: the proposer's space and the sweep's differ", seed,
            key, table.name()));
      }
      if (!seen.insert(key).second) {
        return absl::FailedPreconditionError(
            fmt::format("seed {}: {} proposed twice", seed, key));
      }
      agent::Feedback f;
      f.variant_id = fmt::format("v{}", run.evaluations + 1);
      f.bucket = bucket_id;
      f.candidate = c;
      f.outcome = s->outcome;
      f.message = s->message;
      if (s->outcome == Outcome::kVerified) {
        f.median_us = s->median_us;
        if (options.noise > 0 && s->q1_us > 0 && s->q3_us > s->q1_us) {
          const double sigma = options.noise * std::log(s->q3_us / s->q1_us) / 1.349;
          f.median_us *= std::exp(sigma * NormalDraw(seed, key));
        }
        f.spread_us = s->q3_us - s->q1_us;
        if (best == 0 || s->median_us < best) best = s->median_us;
      }
      ++run.evaluations;
      run.best_so_far.push_back(best);
      run.proposed.push_back(key);
      for (size_t t = 0; t < options.targets.size(); ++t) {
        if (run.to_target[t] < 0 && best > 0 &&
            best <= table.best_us() * (1 + options.targets[t])) {
          run.to_target[t] = run.evaluations;
        }
      }
      history.emplace_back(c);
      results.push_back(std::move(f));
    }
    // Lockstep: every result of the round arrives before the next round.
    for (agent::Feedback& f : results) {
      proposer->Observe(f);
      history.emplace_back(std::move(f));
    }
  }
  return run;
}

double RandomSearchExpectation(int space, int marked) {
  if (marked <= 0) return 0;
  return static_cast<double>(space + 1) / (marked + 1);
}

std::vector<TargetSummary> Summarize(const ShapeTable& table, const std::vector<ReplayRun>& runs,
                                     const std::vector<double>& targets) {
  std::vector<TargetSummary> out;
  const int space = static_cast<int>(table.size());
  for (size_t t = 0; t < targets.size(); ++t) {
    TargetSummary s;
    s.target = targets[t];
    s.within = table.CountWithin(targets[t]);
    s.random_expected = RandomSearchExpectation(space, s.within);
    std::vector<int> n;
    for (const ReplayRun& r : runs) {
      const int x = t < r.to_target.size() ? r.to_target[t] : -1;
      if (x < 0) ++s.never;
      n.push_back(x < 0 ? space + 1 : x);
    }
    if (!n.empty()) {
      std::sort(n.begin(), n.end());
      const size_t m = n.size();
      s.median = m % 2 ? n[m / 2] : 0.5 * (n[m / 2 - 1] + n[m / 2]);
      double sum = 0;
      for (int x : n) sum += x;
      s.mean = sum / m;
      // Nearest rank.
      s.p90 = n[std::min(m - 1, static_cast<size_t>(std::ceil(0.9 * m)) - 1)];
      s.worst = n.back();
      s.worst_fraction = static_cast<double>(s.worst) / space;
      s.median_fraction = s.median / space;
    }
    out.push_back(s);
  }
  return out;
}

CachedTemplateSource::CachedTemplateSource(std::unique_ptr<agent::TemplateSource> inner,
                                           std::set<std::string> only)
    : inner_(std::move(inner)), only_(std::move(only)) {}

std::vector<agent::TemplateSpec> CachedTemplateSource::Templates() const {
  std::vector<agent::TemplateSpec> all = inner_->Templates();
  if (only_.empty()) return all;
  std::vector<agent::TemplateSpec> out;
  for (auto& t : all) {
    if (only_.count(t.name)) out.push_back(std::move(t));
  }
  return out;
}

bool CachedTemplateSource::Supports(const agent::TemplateSpec& spec, const ShapeKey& shape) const {
  return inner_->Supports(spec, shape);
}

absl::StatusOr<agent::KnobValues> CachedTemplateSource::DefaultKnobs(const std::string& tmpl,
                                                                     const ShapeKey& shape) const {
  return inner_->DefaultKnobs(tmpl, shape);
}

absl::StatusOr<agent::TemplateVariant> CachedTemplateSource::Instantiate(
    const std::string& tmpl, const agent::KnobValues& knobs, const ShapeKey& shape) const {
  // Every field of the shape, since the static check reads the mask, the
  // head layout and the batch, not only the bucket.
  const std::string key = fmt::format(
      "{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", SettingKey(tmpl, knobs), OpName(shape.op),
      DTypeName(shape.dtype), shape.head_dim, shape.heads, shape.kv_heads, shape.causal,
      shape.cross, shape.arch, shape.batch, shape.max_len_q, shape.total_q, shape.max_len_k,
      shape.total_k);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = variants_.find(key);
  if (it == variants_.end()) it = variants_.emplace(key, inner_->Instantiate(tmpl, knobs, shape)).first;
  return it->second;
}

}  // namespace kforge::search
