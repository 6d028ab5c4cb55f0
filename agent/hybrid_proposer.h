// The hybrid proposer: the model writes kernels, and where a kernel declares
// compile-time knobs (knobs.h) the builtin search sweeps them.
//
// A model is good at structural ideas and poor at finding the best tile
// size by guessing; the builtin search is the opposite. So the model
// proposer is told it may declare knobs (ModelOptions::knob_sweeps), and
// once a kernel that declared some is verified (compiled, in a
// compile-only job) it becomes a template "model:<variant id>" of a
// ModelTemplateSource, searched by a builtin proposer (builtin_proposer.h)
// exactly as the seed templates are: defaults first, then the settings the
// builtin's model expects the most of. Each Propose() takes up to half of its candidates
// from the sweeps (at most `sweeps_per_template` per template), the rest
// from the model.
//
// Sweep candidates are model-origin variants of kind "sweep": their
// template is "model:<id>", their knobs the setting, their parent the
// declaring variant (or the setting they step from). Their results go to
// both: the search steers by them, and the model sees them (and the program
// database keeps them).
//
// Asynchronous as the model proposer is (SetWake/Busy are its). Replay:
// the declaring kernel's result registers its template before any of its
// sweeps is replayed (results come before later rounds), so a restarted
// hybrid sweeps on where it stopped.
#pragma once

#include <cstdint>
#include <memory>

#include "agent/proposer.h"

namespace kforge::agent {

struct HybridOptions {
  int sweeps_per_template = 8;
};

// `model` must be a model proposer built with knob_sweeps set.
std::unique_ptr<Proposer> MakeHybridProposer(std::unique_ptr<Proposer> model, uint64_t seed,
                                             HybridOptions options = {});

}  // namespace kforge::agent
