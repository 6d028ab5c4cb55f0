#include "server/components.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "agent/factory.h"
#include "gpu/compile.h"
#include "kernels/catalog.h"

namespace kforge::server {

absl::StatusOr<ProposerFactory> DefaultProposerFactory(const std::string& model_options_json) {
  agent::ProposerOptions options;
  if (!model_options_json.empty()) {
    auto parsed = agent::ParseModelOptions(model_options_json);
    if (!parsed.ok())
      return absl::InvalidArgumentError(
          fmt::format("model_proposer: {}", std::string(parsed.status().message())));
    options.model = *std::move(parsed);
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
