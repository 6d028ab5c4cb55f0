// The production implementations of the server's pluggable parts, built by
// main(): proposers from agent/ and seed kernels from kernels/ + gpu/.
// Tests use scripted proposers and fake seeds instead.
#pragma once

#include <set>

#include "agent/program_db.h"
#include "server/jobs.h"
#include "server/kernel_cache.h"

namespace kforge::server {

// "builtin": agent::MakeBuiltinProposer. "model", "model:<names>", "hybrid":
// agent/factory.h with `model_options_json` (agent::ParseModelOptions's
// format); when that is empty the model proposers are not available
// (NOT_FOUND saying how to configure it). INVALID_ARGUMENT for bad model
// options.
//
// With a `store` (which must outlive the factory and every proposer it
// builds), the model proposers of all jobs share: the spend ledger, whose
// calls are the store's model_calls (so job and server limits hold across
// restarts), and the program database, filled here from every evaluation
// the store holds (LoadProgramDatabase). Without one (tests) they share an
// in-memory ledger and an empty database.
absl::StatusOr<ProposerFactory> DefaultProposerFactory(const std::string& model_options_json,
                                                       Store* store = nullptr);

// Adds every variant of `store` with its evaluations (verified and compiled
// ones for selection, all of them for dedupe) to `db`; returns how many
// variants were read.
absl::StatusOr<int> LoadProgramDatabase(Store* store, agent::ProgramDatabase& db);

// kernels::DefaultVariant(shape) compiled with NVRTC for shape.arch. When
// compiling fails the kernel is still served, without a cubin (clients can
// compile the source themselves); the failure is logged.
SeedProvider DefaultSeedProvider();

// Head dims some template of the kernel catalog supports.
std::set<int> CatalogHeadDims();
// True when a catalog template serves the backward op.
bool CatalogServesBackward();

}  // namespace kforge::server
