// The builtin proposer: a search over the seed templates' knobs, guided by
// measured times. Needs no network.
//
// Order of proposals for a bucket:
//  1. the catalog's default knobs of every template that serves the shape
//     (op, head dim, architecture), templates in name order;
//  2. then a local search: one- and two-knob steps around the fastest few
//     verified configurations (before any result arrives, around the
//     defaults), skipping settings whose measured neighbours mostly failed
//     (compile error, crash, wrong result, timeout) until nothing else is
//     left;
//  3. with probability `explore`, a random setting anywhere in the space;
//  4. when the neighbourhoods are used up, the rest of the space in a seeded
//     random order. An empty answer means every setting has been proposed.
//
// Determinism and restarts: every choice is a function of the seed, the set
// of candidates proposed so far and the results observed (each pick draws
// from a generator seeded by the seed and the number of candidates proposed),
// so a fresh proposer given the same history through Remember()/Observe()
// proposes exactly what an uninterrupted one would. It never proposes the
// same knob setting twice, nor two settings whose sources are identical.
//
// Not thread-safe (see Proposer).
#pragma once

#include <cstdint>
#include <memory>

#include "agent/proposer.h"
#include "agent/template_source.h"

namespace kforge::agent {

struct BuiltinOptions {
  // Where templates come from; must outlive the proposer. nullptr: the
  // kernel catalog (kernels/catalog.h).
  const TemplateSource* templates = nullptr;
  // How many of the fastest verified settings the local search starts from.
  int parents = 3;
  // Probability that a pick explores a random setting instead of a
  // neighbour of the best ones (only once something has been verified).
  double explore = 0.1;
};

std::unique_ptr<Proposer> MakeBuiltinProposer(uint64_t seed, BuiltinOptions options = {});

}  // namespace kforge::agent
