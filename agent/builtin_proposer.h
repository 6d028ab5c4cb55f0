// The builtin proposer: a search over the seed templates' knobs, guided by
// measured times. Needs no network.
//
// Order of proposals for a bucket:
//  1. the catalog's default knobs of every template that serves the shape
//     (op, head dim, architecture), templates in name order;
//  2. then, at every pick, the setting with the largest expected improvement
//     over the fastest time measured so far under a Gaussian-process model
//     of log(time) over the knobs, fitted to this bucket's verified results
//     (knob_model.h: per-knob relevance learned from the data, interactions
//     between knobs, a level per template); settings proposed and not yet
//     measured count as measured at their predicted time, so a round
//     spreads out. Before anything is timed (compile-only jobs), the setting
//     the model knows least about. Settings whose measured neighbours (one
//     value step away) mostly failed (compile error, crash, wrong result,
//     timeout) are skipped until nothing else is left. A template with at
//     most 4096 settings is scored whole; a larger one on the neighbours of
//     its `parents` fastest settings plus random ones;
//  3. with probability `explore`, a random setting anywhere in the space;
//  4. when the model has nothing left to score, the rest of the space in a
//     seeded random order. An empty answer means every setting has been
//     proposed.
// Measured with kforge-search-replay against exhaustive H200 tables
// (bench/search/README.md).
//
// Determinism and restarts: every choice is a function of the seed, the set
// of candidates proposed so far and the results observed (each pick draws
// from a generator seeded by the seed and the number of candidates proposed;
// ties go to a hash of the seed and the setting), so a fresh proposer given
// the same history through Remember()/Observe() proposes exactly what an
// uninterrupted one would. It never proposes the same knob setting twice,
// nor two settings whose sources are identical.
//
// Not thread-safe (see Proposer).
#pragma once

#include <cstdint>
#include <memory>

#include "agent/knob_model.h"
#include "agent/proposer.h"
#include "agent/template_source.h"

namespace kforge::agent {

struct BuiltinOptions {
  // Where templates come from; must outlive the proposer. nullptr: the
  // kernel catalog (kernels/catalog.h).
  const TemplateSource* templates = nullptr;
  // How many of the fastest verified settings of a template too large to
  // score whole have their neighbourhoods scored.
  int parents = 3;
  // Probability that a pick is a random setting instead of the model's
  // choice (only once something has been verified). The model explores by
  // itself (expected improvement values uncertainty), so 0 by default.
  double explore = 0;
  // The model's priors and grids (knob_model.h); the defaults were fixed
  // before any measured table was replayed (bench/search/README.md).
  KnobModelOptions model;
};

std::unique_ptr<Proposer> MakeBuiltinProposer(uint64_t seed, BuiltinOptions options = {});

}  // namespace kforge::agent
