#include "agent/factory.h"

#include <fmt/format.h>

namespace kforge::agent {

absl::StatusOr<std::unique_ptr<Proposer>> MakeProposer(const std::string& name, uint64_t seed,
                                                       const ProposerOptions& options) {
  if (name == "builtin") return MakeBuiltinProposer(seed, options.builtin);
  if (name == "model") {
    if (!options.model) {
      return absl::FailedPreconditionError(
          "proposer 'model' is not configured on this server (no model endpoint options)");
    }
    return MakeModelProposer(*options.model);
  }
  return absl::NotFoundError(fmt::format("unknown proposer '{}' (available: builtin{})", name,
                                         options.model ? ", model" : ""));
}

}  // namespace kforge::agent
