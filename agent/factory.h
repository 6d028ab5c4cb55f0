// One entry point for the job engine: a proposer by name.
//
// main() builds ProposerOptions once (model options from a config file via
// ParseModelOptions) and the engine calls MakeProposer(name, seed, options)
// for every job and bucket. Thread-safe: a pure function of its arguments.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "agent/builtin_proposer.h"
#include "agent/model_proposer.h"
#include "agent/proposer.h"

namespace kforge::agent {

struct ProposerOptions {
  BuiltinOptions builtin;
  std::optional<ModelOptions> model;  // unset: "model" is not offered
};

// "builtin" | "model". NotFound for another name; FailedPrecondition for
// "model" without model options; the model client's config errors as is.
absl::StatusOr<std::unique_ptr<Proposer>> MakeProposer(const std::string& name, uint64_t seed,
                                                       const ProposerOptions& options);

}  // namespace kforge::agent
