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
// Asynchronous proposers. A proposer that works in the background (the
// model's keeps several requests in flight while workers evaluate) says so
// by returning true from SetWake(). Then Propose() never blocks: it returns
// what is ready, possibly nothing; an empty answer while Busy() is true
// means "nothing yet", not "exhausted", and the proposer calls `wake` (from
// any thread) when a Propose() call would return something new or fail.
// The engine may call Propose() again while earlier candidates are still
// being evaluated. Such a proposer must not depend on the order of replayed
// Remember()/Observe() calls beyond "a candidate before its results".
// Observe() and Remember() never start work: a result is acted on at the
// next Propose().
//
// Not thread-safe: the engine calls one proposer from one thread at a time
// (an asynchronous proposer guards its own background state).
#pragma once

#include <cstdint>
#include <functional>
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
  // Model origin (VariantRecord says more): "fresh" | "repair" | "sweep",
  // the repairs in its lineage before it, its normalized source hash
  // (agent/normalize.h) and the model call that wrote it (JSON).
  std::string kind;
  int32_t attempt = 0;
  std::string normalized_hash;
  std::string provenance_json;
  double cost_usd = 0;         // estimated cost of the tokens above
};

// The verified/timed result of a candidate on the job's bucket.
struct Feedback {
  std::string variant_id;
  std::string bucket;          // Bucket::Id() it was evaluated on
  Candidate candidate;
  Outcome outcome = Outcome::kCompiled;
  double median_us = 0;        // verified only
  double spread_us = 0;        // the interquartile range (max - min for older rows): Timing::Spread
  double rel_l2_error = 0;
  double max_abs_error = 0;
  std::string message;         // compile log excerpt, crash reason, mismatch detail
  // What the compile reported (0 when nothing compiled), and the cubin's hash.
  int32_t registers = 0;
  int32_t spill_bytes = 0;
  int32_t static_smem_bytes = 0;
  int32_t dynamic_smem_bytes = 0;
  std::string cubin_hash;
};

// A reference time for the target, shown to a model as something to beat.
struct Anchor {
  std::string name;            // "FlashAttention-2 varlen", "seed fwd_mma (default knobs)"
  double median_us = 0;
};

struct ProposalContext {
  ShapeKey shape;              // a representative shape of the bucket
  Bucket bucket;
  std::optional<Feedback> best;       // current best verified, if any
  std::vector<double> anchors_us;     // times of the anchors (e.g. FA2 varlen), if known
  std::vector<Anchor> anchors;        // the same, with names
  // Model budget left for the job; -1: unlimited. Superseded by max_tokens
  // when that is set (the spend ledger then counts the job's calls).
  int64_t tokens_left = -1;
  std::string job_id;
  int64_t max_tokens = 0;      // the job's token limit; 0: none
  double max_cost_usd = 0;     // the job's estimated cost limit; 0: none
  int variants_left = -1;      // the bucket's variant budget left; -1: unlimited
  bool compile_only = false;   // results will be compiles, never timings
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

  virtual std::string Name() const = 0;  // "builtin" | "model" | "hybrid"

  // See "Asynchronous proposers" above. The default: synchronous.
  virtual bool SetWake(std::function<void()> wake) {
    (void)wake;
    return false;
  }
  virtual bool Busy() const { return false; }
};

}  // namespace kforge::agent
