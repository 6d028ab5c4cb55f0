// The production implementations of the server's pluggable parts, built by
// main(): proposers from agent/ and seed kernels from kernels/ + gpu/.
// Tests use scripted proposers and fake seeds instead.
#pragma once

#include <set>

#include "server/jobs.h"
#include "server/kernel_cache.h"

namespace kforge::server {

// "builtin": agent::MakeBuiltinProposer. "model": agent::MakeModelProposer
// with `model_options_json` (agent::ParseModelOptions's format); when that is
// empty the model proposer is not available (NOT_FOUND saying how to
// configure it). INVALID_ARGUMENT for bad model options.
absl::StatusOr<ProposerFactory> DefaultProposerFactory(const std::string& model_options_json);

// kernels::DefaultVariant(shape) compiled with NVRTC for shape.arch. When
// compiling fails the kernel is still served, without a cubin (clients can
// compile the source themselves); the failure is logged.
SeedProvider DefaultSeedProvider();

// Head dims some template of the kernel catalog supports.
std::set<int> CatalogHeadDims();
// True when a catalog template serves the backward op.
bool CatalogServesBackward();

}  // namespace kforge::server
