#include "agent/factory.h"

#include <fmt/format.h>

#include "agent/hybrid_proposer.h"

namespace kforge::agent {
namespace {

// Builtin results feed the shared program database too: the model builds on
// the best template settings other jobs found.
class FeedsDatabase final : public Proposer {
 public:
  FeedsDatabase(std::unique_ptr<Proposer> inner, std::shared_ptr<ProgramDatabase> db)
      : inner_(std::move(inner)), db_(std::move(db)) {}
  absl::StatusOr<std::vector<Candidate>> Propose(const ProposalContext& ctx, int n) override {
    return inner_->Propose(ctx, n);
  }
  void Observe(const Feedback& f) override {
    const Candidate& c = f.candidate;
    if (!f.variant_id.empty() && !f.bucket.empty()) {
      db_->Add(ProgramRecord{f.variant_id, c.source, c.manifest_json, c.origin, c.template_name, c.knobs_json,
                             c.model, c.parent_id, c.kind, c.normalized_hash},
               ProgramResult{f.bucket, f.outcome, f.median_us, f.spread_us, f.registers, f.spill_bytes,
                             f.static_smem_bytes, f.dynamic_smem_bytes, f.cubin_hash});
    }
    inner_->Observe(f);
  }
  void Remember(const Candidate& c) override { inner_->Remember(c); }
  std::string Name() const override { return inner_->Name(); }

 private:
  std::unique_ptr<Proposer> inner_;
  std::shared_ptr<ProgramDatabase> db_;
};

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    if (comma > pos) out.push_back(s.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Proposer>> MakeModel(const std::string& selection, uint64_t seed,
                                                    const ProposerOptions& options, bool knob_sweeps) {
  ModelOptions o = *options.model;
  o.knob_sweeps = o.knob_sweeps || knob_sweeps;
  ModelEnvironment env;
  env.seed = seed;
  if (options.resources) {
    env.clients = options.resources->clients;
    env.ledger = options.resources->ledger;
    env.programs = options.resources->programs;
    env.executor = options.resources->executor;
  } else {
    for (const ModelEntry& e : ModelsOf(o)) {
      absl::StatusOr<std::unique_ptr<ChatClient>> client = MakeOpenAIClient(e.client);
      if (!client.ok()) return client.status();
      env.clients.push_back(ModelClient{e, std::shared_ptr<ChatClient>(*std::move(client))});
    }
  }
  if (!selection.empty()) {
    std::vector<ModelClient> chosen;
    for (const std::string& name : Split(selection)) {
      auto it = std::find_if(env.clients.begin(), env.clients.end(),
                             [&](const ModelClient& m) { return m.entry.name == name; });
      if (it == env.clients.end()) {
        std::vector<std::string> names;
        for (const ModelClient& m : env.clients) names.push_back(m.entry.name);
        return absl::NotFoundError(fmt::format("unknown model '{}' (configured: {})", name, fmt::join(names, ", ")));
      }
      chosen.push_back(*it);
    }
    env.clients = std::move(chosen);
  }
  if (env.clients.empty()) return absl::FailedPreconditionError("no model is configured");
  return MakeModelProposer(std::move(env), std::move(o));
}

}  // namespace

absl::StatusOr<std::shared_ptr<ModelResources>> MakeModelResources(const ModelOptions& options,
                                                                    std::unique_ptr<SpendLog> log,
                                                                    std::shared_ptr<ProgramDatabase> programs) {
  auto r = std::make_shared<ModelResources>();
  for (const ModelEntry& e : ModelsOf(options)) {
    absl::StatusOr<std::unique_ptr<ChatClient>> client = MakeOpenAIClient(e.client);
    if (!client.ok()) return client.status();
    r->clients.push_back(ModelClient{e, std::shared_ptr<ChatClient>(*std::move(client))});
  }
  // The ledger owns its log: requests still running at shutdown settle
  // into it after everything else of the proposer is gone.
  struct Owned {
    std::unique_ptr<SpendLog> log;
    SpendLedger ledger;
    Owned(std::unique_ptr<SpendLog> l, SpendLedgerOptions o) : log(std::move(l)), ledger(log.get(), std::move(o)) {}
  };
  SpendLedgerOptions lo;
  lo.server = options.server_limits;
  lo.server_window_ms = options.server_window_ms;
  auto owned = std::make_shared<Owned>(log ? std::move(log) : MakeInMemorySpendLog(), lo);
  r->ledger = std::shared_ptr<SpendLedger>(owned, &owned->ledger);
  r->programs = programs ? std::move(programs) : std::make_shared<ProgramDatabase>(options.program_db);
  r->executor = std::make_shared<Executor>(std::max(1, options.max_concurrent_requests));
  return r;
}

absl::StatusOr<std::unique_ptr<Proposer>> MakeProposer(const std::string& name, uint64_t seed,
                                                       const ProposerOptions& options) {
  if (name == "builtin") {
    std::unique_ptr<Proposer> p = MakeBuiltinProposer(seed, options.builtin);
    if (options.resources && options.resources->programs)
      return std::unique_ptr<Proposer>(std::make_unique<FeedsDatabase>(std::move(p), options.resources->programs));
    return p;
  }
  const size_t colon = name.find(':');
  const std::string kind = name.substr(0, colon);
  const std::string selection = colon == std::string::npos ? "" : name.substr(colon + 1);
  if (kind == "model" || kind == "hybrid") {
    if (!options.model) {
      return absl::FailedPreconditionError(fmt::format(
          "proposer '{}' is not configured on this server (no model endpoint options)", name));
    }
    if (colon != std::string::npos && selection.empty())
      return absl::NotFoundError(fmt::format("proposer '{}': no model named after ':'", name));
    absl::StatusOr<std::unique_ptr<Proposer>> model = MakeModel(selection, seed, options, kind == "hybrid");
    if (!model.ok() || kind == "model") return model;
    return MakeHybridProposer(*std::move(model), seed);
  }
  return absl::NotFoundError(fmt::format("unknown proposer '{}' (available: builtin{})", name,
                                         options.model ? ", model, model:<names>, hybrid" : ""));
}

}  // namespace kforge::agent
