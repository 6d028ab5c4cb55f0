#include "agent/builtin_proposer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "agent/knob_model.h"
#include "core/arch.h"
#include "core/hash.h"
#include "core/outcome.h"

namespace kforge::agent {
namespace {

// SplitMix64: tiny, fast and, unlike the std distributions, the same on every
// standard library, so a stored job's seed means the same search everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : Next() % n; }
  double Unit() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  template <typename T>
  void Shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[Below(i)]);
  }

 private:
  uint64_t state_;
};

std::string CanonicalKnobs(const KnobValues& knobs) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, value] : knobs) j[name] = value;
  return j.dump();
}

// Re-serialises stored knobs so that a replayed candidate maps to the same key
// whatever whitespace or key order it was stored with.
std::optional<KnobValues> ParseKnobs(const std::string& knobs_json) {
  nlohmann::json j = nlohmann::json::parse(knobs_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  KnobValues out;
  for (const auto& [name, value] : j.items()) {
    if (!value.is_number_integer()) return std::nullopt;
    out[name] = value.get<int>();
  }
  return out;
}

std::string MakeKey(const std::string& tmpl, const std::string& canonical_knobs) {
  return tmpl + " " + canonical_knobs;
}

std::optional<std::string> KeyOf(const Candidate& c) {
  if (c.template_name.empty()) return std::nullopt;
  auto knobs = ParseKnobs(c.knobs_json.empty() ? "{}" : c.knobs_json);
  if (!knobs) return std::nullopt;
  return MakeKey(c.template_name, CanonicalKnobs(*knobs));
}

// A template whose knob product is at most this many settings is scored
// whole at every pick; a larger one (a model-written template can declare
// many knobs) only on a pool of neighbours and random settings.
constexpr uint64_t kScoreWhole = 4096;
constexpr int kRandomPool = 256;

struct Result {
  Outcome outcome = Outcome::kCompiled;
  double median_us = 0;
  std::string variant_id;
};

// A knob setting of one applicable template: indices into each knob's values.
struct Point {
  int t = 0;
  std::vector<int> idx;
};

struct Pick {
  Point point;
  std::string parent_id;
};

// The model's order of the pool, valid while `proposed` candidates have been
// proposed (one Propose() call: results do not change within it).
struct Ranking {
  size_t proposed = static_cast<size_t>(-1);
  std::vector<Point> order;
  size_t next = 0;
};

// FNV-1a: a stable hash of a setting's key for tie-breaking (std::hash may
// differ between standard libraries, and a stored seed must mean one search).
uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// Everything a pick depends on, rebuilt at the start of each Propose().
struct View {
  ShapeKey shape;
  std::vector<TemplateSpec> apps;  // applicable templates, by name
  std::vector<Point> defaults;
  std::vector<std::pair<Point, std::string>> parents;  // fastest verified first, with ids
  struct Timed {
    Point point;
    double log_us = 0;
    std::string id;
  };
  std::vector<Timed> timed;  // every verified point, fastest first
  std::vector<Point> failures;
  std::vector<Point> successes;  // observed and not failed (verified or compiled)
  std::shared_ptr<KnobModel> model;  // fitted to `timed`; null when nothing is timed
};

class BuiltinProposer final : public Proposer {
 public:
  BuiltinProposer(uint64_t seed, BuiltinOptions options, std::unique_ptr<TemplateSource> owned)
      : seed_(seed), options_(options), owned_(std::move(owned)) {
    source_ = options_.templates != nullptr ? options_.templates : owned_.get();
  }

  absl::StatusOr<std::vector<Candidate>> Propose(const ProposalContext& ctx, int n) override {
    std::vector<Candidate> out;
    if (n <= 0) return out;
    View view = BuildView(ctx.shape);
    if (view.apps.empty()) {
      return absl::NotFoundError(fmt::format(
          "builtin: no seed template serves op {} head_dim {} on {}", OpName(ctx.shape.op),
          ctx.shape.head_dim, ctx.shape.arch));
    }
    Ranking ranking;
    while (static_cast<int>(out.size()) < n) {
      std::optional<Pick> pick = NextPick(view, ranking);
      if (!pick) break;  // space exhausted
      const TemplateSpec& spec = view.apps[pick->point.t];
      KnobValues knobs = KnobsOf(spec, pick->point);
      std::string key = MakeKey(spec.name, CanonicalKnobs(knobs));
      absl::StatusOr<TemplateVariant> variant = source_->Instantiate(spec.name, knobs, view.shape);
      if (!variant.ok()) {
        spdlog::debug("builtin: {} is not a legal variant: {}", key, variant.status().ToString());
        dead_.insert(key);
        continue;
      }
      std::string hash = Sha256Hex(variant->source);
      if (hashes_.count(hash) != 0) {
        dead_.insert(key);  // same source as an earlier setting: nothing new to learn
        continue;
      }
      Candidate c;
      c.source = std::move(variant->source);
      c.manifest_json = std::move(variant->manifest_json);
      c.origin = "template";
      c.template_name = spec.name;
      c.knobs_json = CanonicalKnobs(knobs);
      c.parent_id = pick->parent_id;
      proposed_.insert(key);
      hashes_.insert(hash);
      out.push_back(std::move(c));
    }
    return out;
  }

  void Observe(const Feedback& f) override {
    Remember(f.candidate);
    std::optional<std::string> key = KeyOf(f.candidate);
    if (!key) return;
    results_[*key] = Result{f.outcome, f.median_us, f.variant_id};
  }

  void Remember(const Candidate& c) override {
    if (!c.source.empty()) hashes_.insert(Sha256Hex(c.source));
    if (std::optional<std::string> key = KeyOf(c)) proposed_.insert(*key);
  }

  std::string Name() const override { return "builtin"; }

 private:
  static KnobValues KnobsOf(const TemplateSpec& spec, const Point& p) {
    KnobValues knobs;
    for (size_t d = 0; d < spec.knobs.size(); ++d) knobs[spec.knobs[d].name] = spec.knobs[d].values[p.idx[d]];
    return knobs;
  }

  // A deterministic shape searches only the settings whose variants can be:
  // each knob the template fixes for determinism keeps that one value (none
  // where the template's range lacks it, which drops the template).
  // Whatever the knobs, Instantiate still refuses a setting whose manifest
  // is not deterministic.
  static void FixDeterministicKnobs(TemplateSpec& spec) {
    for (KnobRange& k : spec.knobs) {
      auto fixed = spec.deterministic_knobs.find(k.name);
      if (fixed == spec.deterministic_knobs.end()) continue;
      const bool legal = std::find(k.values.begin(), k.values.end(), fixed->second) != k.values.end();
      k.values = legal ? std::vector<int>{fixed->second} : std::vector<int>{};
    }
  }

  std::string KeyOfPoint(const View& v, const Point& p) const {
    const TemplateSpec& spec = v.apps[p.t];
    return MakeKey(spec.name, CanonicalKnobs(KnobsOf(spec, p)));
  }

  // Nearest legal value for each knob; a knob the catalog leaves out starts
  // in the middle of its range.
  static Point Snap(int t, const TemplateSpec& spec, const KnobValues& knobs) {
    Point p{t, {}};
    for (const KnobRange& k : spec.knobs) {
      int best = static_cast<int>(k.values.size()) / 2;
      auto it = knobs.find(k.name);
      if (it != knobs.end()) {
        long best_dist = std::numeric_limits<long>::max();
        for (size_t i = 0; i < k.values.size(); ++i) {
          long dist = std::labs(static_cast<long>(k.values[i]) - it->second);
          if (dist < best_dist) best_dist = dist, best = static_cast<int>(i);
        }
      }
      p.idx.push_back(best);
    }
    return p;
  }

  std::optional<Point> PointOfKey(const View& v, const std::string& key) const {
    size_t space = key.find(' ');
    if (space == std::string::npos) return std::nullopt;
    std::string name = key.substr(0, space);
    auto knobs = ParseKnobs(key.substr(space + 1));
    if (!knobs) return std::nullopt;
    for (size_t t = 0; t < v.apps.size(); ++t) {
      if (v.apps[t].name != name) continue;
      Point p{static_cast<int>(t), {}};
      for (const KnobRange& k : v.apps[t].knobs) {
        auto it = knobs->find(k.name);
        if (it == knobs->end()) return std::nullopt;
        auto pos = std::find(k.values.begin(), k.values.end(), it->second);
        if (pos == k.values.end()) return std::nullopt;
        p.idx.push_back(static_cast<int>(pos - k.values.begin()));
      }
      return p;
    }
    return std::nullopt;
  }

  View BuildView(const ShapeKey& shape) {
    std::string shape_id = fmt::format("{}|{}", BucketOf(shape).Id(), shape.head_dim);
    if (shape_id != dead_shape_) {  // legality depends on the shape
      dead_.clear();
      dead_shape_ = shape_id;
    }
    View v;
    v.shape = shape;
    for (TemplateSpec& spec : source_->Templates()) {
      if (shape.deterministic) FixDeterministicKnobs(spec);
      bool empty_knob = std::any_of(spec.knobs.begin(), spec.knobs.end(),
                                    [](const KnobRange& k) { return k.values.empty(); });
      if (!empty_knob && source_->Supports(spec, shape)) v.apps.push_back(std::move(spec));
    }
    std::sort(v.apps.begin(), v.apps.end(),
              [](const TemplateSpec& a, const TemplateSpec& b) { return a.name < b.name; });
    for (size_t t = 0; t < v.apps.size(); ++t) {
      absl::StatusOr<KnobValues> d = source_->DefaultKnobs(v.apps[t].name, shape);
      v.defaults.push_back(Snap(static_cast<int>(t), v.apps[t], d.ok() ? *d : KnobValues{}));
    }
    std::vector<std::tuple<double, std::string, Point, std::string>> verified;
    for (const auto& [key, r] : results_) {
      std::optional<Point> p = PointOfKey(v, key);
      if (!p) continue;
      if (r.outcome == Outcome::kVerified) verified.emplace_back(r.median_us, key, *p, r.variant_id);
      if (IsFailure(r.outcome)) {
        v.failures.push_back(*p);
      } else {
        v.successes.push_back(*p);
      }
    }
    std::sort(verified.begin(), verified.end(), [](const auto& a, const auto& b) {
      return std::tie(std::get<0>(a), std::get<1>(a)) < std::tie(std::get<0>(b), std::get<1>(b));
    });
    // Every verified point with its log time, for the model; the fastest
    // `parents` with their ids, whose neighbourhoods feed the pool of a
    // template too large to score whole.
    for (const auto& [us, key, p, id] : verified) {
      v.timed.push_back(View::Timed{p, std::log(std::max(us, 1e-3)), id});
      if (static_cast<int>(v.parents.size()) < std::max(1, options_.parents)) v.parents.emplace_back(p, id);
    }
    if (!v.timed.empty()) {
      std::vector<KnobPoint> points;
      std::vector<double> log_us;
      for (const View::Timed& x : v.timed) {
        points.push_back(ToKnobPoint(v, x.point));
        log_us.push_back(x.log_us);
      }
      v.model = std::make_shared<KnobModel>(points, log_us, KnobsPerTemplate(v), options_.model);
    }
    return v;
  }

  bool Eligible(const View& v, const Point& p) const {
    std::string key = KeyOfPoint(v, p);
    return proposed_.count(key) == 0 && dead_.count(key) == 0;
  }

  // A setting whose measured neighbours (one step away) failed more often
  // than they worked. A setting between a success and a failure is still
  // worth trying: the boundary is often where the fastest variants are.
  static bool NearFailure(const View& v, const Point& p) {
    auto adjacent = [&](const std::vector<Point>& points) {
      int count = 0;
      for (const Point& q : points) {
        if (q.t != p.t) continue;
        int dist = 0;
        for (size_t d = 0; d < p.idx.size() && dist <= 1; ++d) dist += std::abs(p.idx[d] - q.idx[d]);
        count += dist == 1;
      }
      return count;
    };
    int failed = adjacent(v.failures);
    return failed > 0 && failed > adjacent(v.successes);
  }

  // One- or two-step moves from `p` (radius 2: one knob by two, or two knobs
  // by one each), in a fixed order before the caller shuffles them.
  static std::vector<Point> Neighbours(const View& v, const Point& p, int radius) {
    const std::vector<KnobRange>& knobs = v.apps[p.t].knobs;
    std::vector<Point> out;
    auto in_range = [&](size_t d, int i) { return i >= 0 && i < static_cast<int>(knobs[d].values.size()); };
    for (size_t d = 0; d < knobs.size(); ++d) {
      for (int delta : {-radius, radius}) {
        if (!in_range(d, p.idx[d] + delta)) continue;
        Point q = p;
        q.idx[d] += delta;
        out.push_back(std::move(q));
      }
    }
    if (radius == 2) {
      for (size_t a = 0; a < knobs.size(); ++a)
        for (size_t b = a + 1; b < knobs.size(); ++b)
          for (int da : {-1, 1})
            for (int db : {-1, 1}) {
              if (!in_range(a, p.idx[a] + da) || !in_range(b, p.idx[b] + db)) continue;
              Point q = p;
              q.idx[a] += da;
              q.idx[b] += db;
              out.push_back(std::move(q));
            }
    }
    return out;
  }

  std::optional<Point> RandomPoint(const View& v, Rng& rng, int tries, bool avoid_failures) const {
    for (int i = 0; i < tries; ++i) {
      Point p{static_cast<int>(rng.Below(v.apps.size())), {}};
      for (const KnobRange& k : v.apps[p.t].knobs) p.idx.push_back(static_cast<int>(rng.Below(k.values.size())));
      if (Eligible(v, p) && !(avoid_failures && NearFailure(v, p))) return p;
    }
    return std::nullopt;
  }

  // Every setting once, from a random start; only reached when the space is
  // nearly used up, so its linear cost does not matter.
  std::optional<Point> Sweep(const View& v, Rng& rng, bool avoid_failures) const {
    std::vector<uint64_t> sizes;
    uint64_t total = 0;
    for (const TemplateSpec& spec : v.apps) {
      uint64_t size = 1;
      for (const KnobRange& k : spec.knobs) size = std::min<uint64_t>(size * k.values.size(), uint64_t{1} << 40);
      sizes.push_back(size);
      total += size;
    }
    uint64_t start = rng.Below(total);
    for (uint64_t i = 0; i < total; ++i) {
      uint64_t flat = (start + i) % total;
      int t = 0;
      while (flat >= sizes[t]) flat -= sizes[t++];
      Point p{t, std::vector<int>(v.apps[t].knobs.size())};
      for (size_t d = v.apps[t].knobs.size(); d-- > 0;) {
        uint64_t radix = v.apps[t].knobs[d].values.size();
        p.idx[d] = static_cast<int>(flat % radix);
        flat /= radix;
      }
      if (Eligible(v, p) && !(avoid_failures && NearFailure(v, p))) return p;
    }
    return std::nullopt;
  }

  static KnobPoint ToKnobPoint(const View& v, const Point& p) {
    KnobPoint k{p.t, {}};
    const std::vector<KnobRange>& knobs = v.apps[p.t].knobs;
    for (size_t d = 0; d < knobs.size(); ++d) {
      const size_t n = knobs[d].values.size();
      k.x.push_back(n > 1 ? static_cast<double>(p.idx[d]) / static_cast<double>(n - 1) : 0.0);
    }
    return k;
  }

  static std::vector<int> KnobsPerTemplate(const View& v) {
    std::vector<int> out;
    for (const TemplateSpec& spec : v.apps) out.push_back(static_cast<int>(spec.knobs.size()));
    return out;
  }

  static uint64_t SpaceSize(const TemplateSpec& spec) {
    uint64_t size = 1;
    for (const KnobRange& k : spec.knobs) size = std::min<uint64_t>(size * k.values.size(), uint64_t{1} << 40);
    return size;
  }

  // The settings a pick chooses among: every setting of a template small
  // enough to score whole; for a larger one, the one- and two-step
  // neighbours of its fastest settings (its default before any) and random
  // settings. Eligible ones only, and not next to mostly failures.
  std::vector<Point> Pool(const View& v, Rng& rng) const {
    std::vector<Point> pool;
    std::set<std::string> seen;
    auto add = [&](Point p) {
      if (Eligible(v, p) && !NearFailure(v, p) && seen.insert(KeyOfPoint(v, p)).second) {
        pool.push_back(std::move(p));
      }
    };
    for (size_t t = 0; t < v.apps.size(); ++t) {
      const std::vector<KnobRange>& knobs = v.apps[t].knobs;
      if (SpaceSize(v.apps[t]) <= kScoreWhole) {
        Point p{static_cast<int>(t), std::vector<int>(knobs.size(), 0)};
        for (;;) {
          add(p);
          size_t d = knobs.size();
          while (d-- > 0) {
            if (++p.idx[d] < static_cast<int>(knobs[d].values.size())) break;
            p.idx[d] = 0;
          }
          if (d == static_cast<size_t>(-1)) break;
        }
        continue;
      }
      std::vector<Point> around;
      for (const auto& [p, id] : v.parents)
        if (p.t == static_cast<int>(t)) around.push_back(p);
      if (around.empty()) around.push_back(v.defaults[t]);
      for (const Point& c : around)
        for (int radius : {1, 2})
          for (Point& m : Neighbours(v, c, radius)) add(std::move(m));
      for (int i = 0; i < kRandomPool; ++i) {
        Point p{static_cast<int>(t), {}};
        for (const KnobRange& k : knobs) p.idx.push_back(static_cast<int>(rng.Below(k.values.size())));
        add(std::move(p));
      }
    }
    return pool;
  }

  // The setting of the pool with the largest expected improvement over the
  // fastest measured time under the model (knob_model.h), the settings
  // proposed and not yet measured counting as measured at their predicted
  // time. Before anything is timed (compile-only jobs, or every result a
  // failure so far): the one the model is least sure of, which spreads the
  // picks over the space. Ties go to a hash of the seed, the number proposed
  // and the setting, so the order does not depend on which illegal settings
  // this proposer happens to know already (a restarted one knows none).
  // The ranking is kept while nothing new is proposed: a pick that turns out
  // illegal moves on to the next one without scoring the pool again.
  std::optional<Pick> ModelPick(const View& v, Rng& rng, Ranking& ranking) const {
    if (ranking.proposed != proposed_.size()) {
      ranking = Ranking{proposed_.size(), {}, 0};
      std::vector<Point> pool = Pool(v, rng);
      std::vector<KnobPoint> pending;
      for (const std::string& key : proposed_) {
        if (results_.count(key)) continue;
        if (std::optional<Point> p = PointOfKey(v, key)) pending.push_back(ToKnobPoint(v, *p));
      }
      KnobModel model = v.model ? *v.model : KnobModel({}, {}, KnobsPerTemplate(v), options_.model);
      model.SetPending(pending);
      std::vector<std::tuple<double, uint64_t, size_t>> scored;
      for (size_t i = 0; i < pool.size(); ++i) {
        const KnobPoint k = ToKnobPoint(v, pool[i]);
        const double score = v.model ? model.ExpectedImprovement(k) : model.Predict(k).sd;
        Rng tie(seed_ ^ Fnv1a(KeyOfPoint(v, pool[i])) ^ (0x9e3779b97f4a7c15ULL * proposed_.size()));
        scored.emplace_back(score, tie.Next(), i);
      }
      std::sort(scored.begin(), scored.end(), std::greater<>());
      for (const auto& [score, tie, i] : scored) ranking.order.push_back(std::move(pool[i]));
    }
    while (ranking.next < ranking.order.size()) {
      const Point& p = ranking.order[ranking.next++];
      if (Eligible(v, p)) return Pick{p, NearestVerified(v, p)};
    }
    return std::nullopt;
  }

  // The verified setting of the same template closest to `p` (fewest value
  // steps; the faster on a tie): the one it is a step from, for lineage.
  static std::string NearestVerified(const View& v, const Point& p) {
    std::string id;
    int best = std::numeric_limits<int>::max();
    for (const View::Timed& x : v.timed) {  // fastest first: the first of equals wins
      if (x.point.t != p.t || x.id.empty()) continue;
      int dist = 0;
      for (size_t d = 0; d < p.idx.size(); ++d) dist += std::abs(p.idx[d] - x.point.idx[d]);
      if (dist < best) best = dist, id = x.id;
    }
    return id;
  }

  std::optional<Pick> NextPick(const View& v, Ranking& ranking) const {
    // A fresh generator per pick, seeded by what has been proposed so far, so
    // the draw does not depend on how many Propose() calls came before.
    Rng rng(seed_ ^ (0xd1b54a32d192ed03ULL * (proposed_.size() + 1)));
    rng.Next();
    for (const Point& d : v.defaults)
      if (Eligible(v, d)) return Pick{d, ""};
    if (!v.parents.empty() && rng.Unit() < options_.explore) {
      if (auto p = RandomPoint(v, rng, 32, /*avoid_failures=*/true)) return Pick{*p, ""};
    }
    if (std::optional<Pick> p = ModelPick(v, rng, ranking)) return p;
    if (auto p = RandomPoint(v, rng, 64, true)) return Pick{*p, ""};
    if (auto p = Sweep(v, rng, true)) return Pick{*p, ""};
    if (auto p = Sweep(v, rng, false)) return Pick{*p, ""};
    return std::nullopt;
  }

  const uint64_t seed_;
  const BuiltinOptions options_;
  std::unique_ptr<TemplateSource> owned_;
  const TemplateSource* source_ = nullptr;
  std::set<std::string> proposed_;           // keys "template {knobs}"
  std::set<std::string> hashes_;             // sources proposed
  std::map<std::string, Result> results_;    // by key, last observation wins
  std::set<std::string> dead_;               // illegal or duplicate-source keys (a cache)
  std::string dead_shape_;
};

}  // namespace

bool ArchServes(const std::string& template_arch, const std::string& target_arch) {
  if (template_arch == target_arch) return true;
  absl::StatusOr<Arch> t = ParseArch(template_arch);
  absl::StatusOr<Arch> g = ParseArch(target_arch);
  return t.ok() && g.ok() && !t->arch_specific && g->number() >= t->number();
}

std::unique_ptr<Proposer> MakeBuiltinProposer(uint64_t seed, BuiltinOptions options) {
  std::unique_ptr<TemplateSource> owned;
  if (options.templates == nullptr) owned = MakeCatalogTemplateSource();
  return std::make_unique<BuiltinProposer>(seed, options, std::move(owned));
}

}  // namespace kforge::agent
