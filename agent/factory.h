// One entry point for the job engine: a proposer by name.
//
// main() builds ProposerOptions once (model options from a config file via
// ParseModelOptions, and the resources every model proposer of the server
// shares: MakeModelResources) and the engine calls MakeProposer(name, seed,
// options) for every job and bucket. Thread-safe: a pure function of its
// arguments (the shared resources are thread-safe themselves).
//
// Names:
//   "builtin"                 the knob search over the seed templates
//   "model"                   the model proposer with every configured model
//   "model:<a>[,<b>...]"      ... with only the named models (a job's choice:
//                             e.g. a cheap one, or a cheap and a strong one)
//   "hybrid", "hybrid:<a>,..." the model proposer with knob sweeps
//                             (hybrid_proposer.h), models as above
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/builtin_proposer.h"
#include "agent/model_proposer.h"
#include "agent/proposer.h"

namespace kforge::agent {

// What the model proposers of one server share: one client per configured
// model (so what a client learns about its endpoint holds for every job),
// the spend ledger, the program database and the request executor.
struct ModelResources {
  std::vector<ModelClient> clients;
  std::shared_ptr<SpendLedger> ledger;
  std::shared_ptr<ProgramDatabase> programs;
  std::shared_ptr<Executor> executor;
};

// Builds the clients and the executor (max_concurrent_requests threads),
// and a ledger over `log` with the options' server limits (the ledger owns
// the log). `programs` null: a new, empty database. InvalidArgument for a
// bad client config.
absl::StatusOr<std::shared_ptr<ModelResources>> MakeModelResources(const ModelOptions& options,
                                                                    std::unique_ptr<SpendLog> log,
                                                                    std::shared_ptr<ProgramDatabase> programs);

struct ProposerOptions {
  BuiltinOptions builtin;
  std::optional<ModelOptions> model;  // unset: "model" and "hybrid" are not offered
  // Shared by every model proposer; null: each builds its own (own clients,
  // in-memory ledger without a server limit, private database).
  std::shared_ptr<ModelResources> resources;
};

// NotFound for an unknown name or an unknown model in "model:<names>";
// FailedPrecondition for "model"/"hybrid" without model options; the model
// client's config errors as is.
absl::StatusOr<std::unique_ptr<Proposer>> MakeProposer(const std::string& name, uint64_t seed,
                                                       const ProposerOptions& options);

}  // namespace kforge::agent
