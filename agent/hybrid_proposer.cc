#include "agent/hybrid_proposer.h"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "agent/builtin_proposer.h"
#include "agent/knobs.h"
#include "agent/normalize.h"

namespace kforge::agent {
namespace {

using nlohmann::json;

constexpr char kPrefix[] = "model:";

bool IsSweep(const Candidate& c) { return c.kind == "sweep" && c.template_name.rfind(kPrefix, 0) == 0; }

// How the builtin search sees a model-origin candidate of one of its templates.
Candidate AsTemplate(const Candidate& c) {
  Candidate t = c;
  t.origin = "template";
  return t;
}

class HybridProposer final : public Proposer {
 public:
  HybridProposer(std::unique_ptr<Proposer> model, uint64_t seed, HybridOptions options)
      : model_(std::move(model)), options_(options) {
    BuiltinOptions b;
    b.templates = &templates_;
    sweeps_ = MakeBuiltinProposer(seed ^ 0x5eedULL, b);
  }

  absl::StatusOr<std::vector<Candidate>> Propose(const ProposalContext& ctx, int n) override {
    shape_ = ctx.shape;
    have_shape_ = true;
    std::vector<Candidate> out;
    if (n <= 0) return out;
    const int sweep_share = templates_.Templates().empty() ? 0 : std::max(1, n / 2);
    if (sweep_share > 0) {
      absl::StatusOr<std::vector<Candidate>> swept = sweeps_->Propose(ctx, sweep_share);
      if (swept.ok()) {
        for (Candidate& c : *swept) out.push_back(Relabel(std::move(c)));
      } else if (!absl::IsNotFound(swept.status())) {
        spdlog::warn("hybrid: knob sweep: {}", swept.status().ToString());
      }
    }
    const int rest = n - static_cast<int>(out.size());
    if (rest <= 0) return out;
    ProposalContext model_ctx = ctx;
    if (model_ctx.variants_left >= 0) model_ctx.variants_left -= static_cast<int>(out.size());
    absl::StatusOr<std::vector<Candidate>> written = model_->Propose(model_ctx, rest);
    if (!written.ok()) {
      if (!out.empty()) return out;
      return written.status();
    }
    for (Candidate& c : *written) out.push_back(std::move(c));
    return out;
  }

  void Observe(const Feedback& f) override {
    model_->Observe(f);
    if (IsSweep(f.candidate)) {
      Feedback t = f;
      t.candidate = AsTemplate(f.candidate);
      sweeps_->Observe(t);
      return;
    }
    const bool usable = f.outcome == Outcome::kVerified || f.outcome == Outcome::kCompiled;
    if (!usable || f.candidate.origin != "model" || f.variant_id.empty() || f.candidate.knobs_json.empty()) return;
    Register(f);
  }

  void Remember(const Candidate& c) override {
    model_->Remember(c);
    if (IsSweep(c)) {
      sweeps_->Remember(AsTemplate(c));
      auto it = swept_.find(c.template_name);
      if (it != swept_.end() && ++it->second >= options_.sweeps_per_template) templates_.Remove(c.template_name);
    }
  }

  std::string Name() const override { return "hybrid"; }
  bool SetWake(std::function<void()> wake) override { return model_->SetWake(std::move(wake)); }
  bool Busy() const override { return model_->Busy(); }

 private:
  // A verified kernel that declared knobs becomes a template to sweep.
  void Register(const Feedback& f) {
    const std::string name = kPrefix + f.variant_id;
    if (templates_.Has(name) || swept_.count(name)) return;
    absl::StatusOr<KnobTemplate> t = ParseKnobTemplate(f.candidate.source, f.candidate.manifest_json,
                                                       have_shape_ ? shape_.head_dim : 0);
    if (!t.ok() || t->knobs.empty()) return;
    // The declaring variant is the template's default setting: the search
    // knows it, and starts from its result.
    ShapeKey shape = shape_;
    if (!have_shape_) {
      absl::StatusOr<Bucket> b = ParseBucketId(f.bucket);
      if (!b.ok()) return;
      shape.arch = b->arch;
      shape.op = b->op;
      shape.head_dim = b->head_dim;
    }
    templates_.Add(f.variant_id, *std::move(t), shape);
    swept_[name] = 0;
    Feedback seen = f;
    seen.candidate = AsTemplate(f.candidate);
    seen.candidate.template_name = name;
    sweeps_->Remember(seen.candidate);
    sweeps_->Observe(seen);
    declarer_model_[name] = f.candidate.model;
    spdlog::info("hybrid: {} declared knobs; sweeping them as template {}", f.variant_id, name);
  }

  Candidate Relabel(Candidate c) {
    const std::string declarer = c.template_name.substr(sizeof(kPrefix) - 1);
    if (++swept_[c.template_name] >= options_.sweeps_per_template) {
      // Enough settings of this one: the model's next ideas get the room.
      spdlog::info("hybrid: {} swept {} settings", c.template_name, swept_[c.template_name]);
      retired_.insert(c.template_name);
    }
    c.origin = "model";
    c.kind = "sweep";
    c.model = declarer_model_.count(c.template_name) ? declarer_model_[c.template_name] : "";
    if (c.parent_id.empty()) c.parent_id = declarer;
    c.normalized_hash = NormalizedSourceHash(c.source);
    c.provenance_json = json{{"purpose", "sweep"}, {"sweep_of", declarer}, {"knobs", json::parse(c.knobs_json, nullptr, false)}}.dump();
    for (const std::string& t : retired_) templates_.Remove(t);
    return c;
  }

  std::unique_ptr<Proposer> model_;
  const HybridOptions options_;
  ModelTemplateSource templates_;  // must outlive sweeps_ (declared first)
  std::unique_ptr<Proposer> sweeps_;
  std::map<std::string, int> swept_;  // template -> settings proposed
  std::set<std::string> retired_;
  std::map<std::string, std::string> declarer_model_;
  ShapeKey shape_;
  bool have_shape_ = false;
};

}  // namespace

std::unique_ptr<Proposer> MakeHybridProposer(std::unique_ptr<Proposer> model, uint64_t seed, HybridOptions options) {
  return std::make_unique<HybridProposer>(std::move(model), seed, options);
}

}  // namespace kforge::agent
