// Proposer: where kernel variants come from.
//
// The job engine (server/) asks a proposer for candidates for one shape
// bucket, has workers verify and time them, and feeds every result back with
// Observe(). Two implementations live in agent/: the builtin search over the
// seed templates' knobs (no network, deterministic for a seed) and the model
// proposer (an OpenAI-compatible chat completions endpoint).
//
// Restarts: a proposer keeps no state of its own on disk. After a server
// restart the engine builds a fresh proposer with the job's seed, calls
// Remember() for every candidate the job already proposed and Observe() for
// every result already recorded, in their original order; a proposer must
// then continue as if it had never stopped, and never propose a variant twice.
//
// Not thread-safe: the engine calls one proposer from one thread at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/outcome.h"
#include "core/shape.h"

namespace kforge::agent {

// One proposed variant: CUDA source implementing the kernel contract plus its
// launch manifest, and where it came from.
struct Candidate {
  std::string source;
  std::string manifest_json;
  std::string origin;          // "template" | "model"
  std::string template_name;   // template origin
  std::string knobs_json;      // template origin: canonical JSON of the knob values
  std::string model;           // model origin
  std::string prompt;          // model origin: full prompt and answer, stored with the variant
  std::string answer;
  std::string prompt_hash;
  std::string parent_id;       // variant this one was derived from, if any
  int64_t tokens_used = 0;     // model tokens spent producing it
};

// The verified/timed result of a candidate on the job's bucket.
struct Feedback {
  std::string variant_id;
  Candidate candidate;
  Outcome outcome = Outcome::kCompiled;
  double median_us = 0;        // verified only
  double spread_us = 0;        // the interquartile range (max - min for older rows): Timing::Spread
  double rel_l2_error = 0;
  double max_abs_error = 0;
  std::string message;         // compile log excerpt, crash reason, mismatch detail
};

struct ProposalContext {
  ShapeKey shape;              // a representative shape of the bucket
  Bucket bucket;
  std::optional<Feedback> best;       // current best verified, if any
  std::vector<double> anchors_us;     // times of the anchors (e.g. FA2 varlen), if known
  int64_t tokens_left = -1;    // model budget left for the job; -1: unlimited
};

class Proposer {
 public:
  virtual ~Proposer() = default;

  // Up to `n` new candidates. An empty vector means the proposer has nothing
  // more to offer (search space exhausted). An error means it could not
  // propose now (model endpoint down, spend limit reached): the message says
  // why, and the engine records it on the job.
  virtual absl::StatusOr<std::vector<Candidate>> Propose(const ProposalContext& ctx, int n) = 0;

  // A result for a candidate proposed earlier (or replayed after a restart).
  virtual void Observe(const Feedback& feedback) = 0;

  // Replay after a restart: `c` was proposed before and must not be again.
  virtual void Remember(const Candidate& c) = 0;

  virtual std::string Name() const = 0;  // "builtin" | "model"
};

}  // namespace kforge::agent
