#include "server/components.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "agent/factory.h"
#include "gpu/compile.h"
#include "kernels/catalog.h"

namespace kforge::server {

namespace {

// The spend ledger's calls, as the store's model_calls.
class StoreSpendLog final : public agent::SpendLog {
 public:
  explicit StoreSpendLog(Store* store) : store_(store) {}
  absl::StatusOr<int64_t> Append(const agent::ModelCall& c) override { return store_->AddModelCall(Record(c)); }
  absl::Status Update(int64_t id, const agent::ModelCall& c) override {
    ModelCallRecord r = Record(c);
    r.id = id;
    return store_->UpdateModelCall(r);
  }
  absl::StatusOr<agent::Spend> Sum(const std::string& job_id, int64_t since_unix_ms) override {
    absl::StatusOr<ModelSpend> s = store_->SumModelCalls(job_id, since_unix_ms);
    if (!s.ok()) return s.status();
    return agent::Spend{s->calls, s->tokens, s->cost_usd};
  }

 private:
  static ModelCallRecord Record(const agent::ModelCall& c) {
    ModelCallRecord r;
    r.job_id = c.job_id;
    r.bucket = c.bucket;
    r.model = c.model;
    r.purpose = c.purpose;
    r.parent_id = c.parent_id;
    r.attempt = c.attempt;
    r.prompt_hash = c.prompt_hash;
    r.prompt = c.prompt;
    r.answer = c.answer;
    r.prompt_tokens = c.prompt_tokens;
    r.completion_tokens = c.completion_tokens;
    r.cost_usd = c.cost_usd;
    r.usage_estimated = c.usage_estimated;
    r.outcome = c.outcome;
    r.detail = c.detail;
    r.created_unix_ms = c.created_unix_ms;
    return r;
  }

  Store* store_;  // must outlive the log
};

}  // namespace

// A call still pending at start was in flight when the server stopped: its
// answer is gone. It keeps its reserved size, so the spend it may have cost
// still counts against the limits.
absl::Status MarkLostModelCalls(Store* store) {
  absl::StatusOr<std::vector<ModelCallRecord>> calls = store->ListModelCalls("");
  if (!calls.ok()) return calls.status();
  int lost = 0;
  for (ModelCallRecord c : *calls) {
    if (c.outcome != "pending") continue;
    c.outcome = "lost";
    c.detail = "in flight when the server stopped; counted at its reserved size";
    if (absl::Status s = store->UpdateModelCall(c); !s.ok()) return s;
    ++lost;
  }
  if (lost > 0) spdlog::warn("{} model call(s) were in flight when the server stopped; counted as reserved", lost);
  return absl::OkStatus();
}

absl::StatusOr<int> LoadProgramDatabase(Store* store, agent::ProgramDatabase& db) {
  int variants = 0;
  Page page;
  page.limit = 500;
  for (;;) {
    absl::StatusOr<PageOf<VariantRecord>> batch = store->ListVariants("", page);
    if (!batch.ok()) return batch.status();
    for (const VariantRecord& v : batch->items) {
      absl::StatusOr<std::vector<EvaluationRecord>> evals = store->ListEvaluations(v.id);
      if (!evals.ok()) return evals.status();
      agent::ProgramRecord p{v.id, v.source, v.manifest_json, v.origin, v.template_name, v.knobs_json,
                             v.model, v.parent_id, v.kind, v.normalized_hash};
      for (const EvaluationRecord& e : *evals) {
        db.Add(p, agent::ProgramResult{e.bucket, e.outcome, e.timing.median_us, e.timing.Spread(), e.registers,
                                       e.spill_bytes, e.static_smem_bytes, e.dynamic_smem_bytes, e.cubin_hash});
      }
      ++variants;
    }
    if (batch->next_token.empty()) break;
    page.token = batch->next_token;
  }
  return variants;
}

absl::StatusOr<ProposerFactory> DefaultProposerFactory(const std::string& model_options_json, Store* store) {
  agent::ProposerOptions options;
  if (!model_options_json.empty()) {
    auto parsed = agent::ParseModelOptions(model_options_json);
    if (!parsed.ok())
      return absl::InvalidArgumentError(
          fmt::format("model_proposer: {}", std::string(parsed.status().message())));
    options.model = *std::move(parsed);
    auto programs = std::make_shared<agent::ProgramDatabase>(options.model->program_db);
    std::unique_ptr<agent::SpendLog> log;
    if (store != nullptr) {
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<int> loaded = LoadProgramDatabase(store, *programs);
      if (!loaded.ok()) return loaded.status();
      spdlog::info("program database: {} variants from the store ({} programs) in {} ms", *loaded,
                   programs->size(),
                   std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start)
                       .count());
      if (absl::Status s = MarkLostModelCalls(store); !s.ok()) return s;
      log = std::make_unique<StoreSpendLog>(store);
    }
    auto resources = agent::MakeModelResources(*options.model, std::move(log), std::move(programs));
    if (!resources.ok())
      return absl::InvalidArgumentError(
          fmt::format("model_proposer: {}", std::string(resources.status().message())));
    options.resources = *std::move(resources);
  }
  return ProposerFactory([options](const std::string& name, uint64_t seed) {
    return agent::MakeProposer(name, seed, options);
  });
}

SeedProvider DefaultSeedProvider() {
  return [](const ShapeKey& key) -> absl::StatusOr<SeedKernel> {
    auto v = DefaultVariant(key);
    if (!v.ok()) return v.status();
    SeedKernel seed;
    seed.source = v->source;
    seed.manifest_json = v->manifest_json;
    seed.template_name = v->template_name;
    nlohmann::json knobs = nlohmann::json::object();
    for (const auto& [k, val] : v->knobs) knobs[k] = val;
    seed.knobs_json = knobs.dump();
    gpu::CompileRequest req;
    req.source = v->source;
    req.arch = key.arch;
    req.name = fmt::format("{}_seed.cu", v->template_name);
    auto compiled = gpu::Compile(req);
    if (!compiled.ok()) {
      spdlog::warn("seed {} for {}: NVRTC unavailable: {}", v->template_name, key.arch,
                   std::string(compiled.status().message()));
    } else if (!compiled->ok) {
      spdlog::error("seed {} for {} does not compile: {}", v->template_name, key.arch,
                    compiled->log.substr(0, 2000));
    } else {
      seed.cubin = std::move(compiled->cubin);
      seed.compile_options = compiled->options;
      seed.nvrtc_version = compiled->nvrtc_version;
    }
    return seed;
  };
}

std::set<int> CatalogHeadDims() {
  std::set<int> dims;
  for (const auto& t : ListTemplates())
    for (int d : t.head_dims) dims.insert(d);
  return dims;
}

bool CatalogServesBackward() {
  for (const auto& t : ListTemplates()) {
    if (std::find(t.ops.begin(), t.ops.end(), "bwd") != t.ops.end()) return true;
  }
  return false;
}

}  // namespace kforge::server
