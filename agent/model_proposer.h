// The model proposer: a kernel agent over OpenAI-compatible chat models.
//
// What it asks for:
//   - Fresh proposals. A parent is drawn from the program database
//     (program_db.h: islands and MAP-Elites over the verified variants of
//     this bucket and similar ones; the catalog's seed when there are none)
//     and the prompt carries the kernel contract, the target shape, the
//     roofline floor of the shape (core/roofline.h), the anchors' times (the
//     seed's and the best template setting's on this bucket, configured
//     external ones), the parent's source with its time and ptxas resources
//     (registers, spills, shared memory), inspirations (other elites, as
//     diffs of the parent) and the recent results.
//   - Repairs. A candidate that failed to compile, was refused by the
//     static checks, gave a wrong result, crashed or timed out is sent back
//     to the model with its own source and the diagnostics: the compile log
//     (NVRTC and ptxas), or the check's reason, or the error class and size
//     (which output, relative L2 and max abs error, where in a sequence).
//     Never the check schedule, seeds or which launches are checked
//     (verification.md): the evaluator's messages carry none, and nothing
//     else of a task reaches a prompt. Up to max_repair_attempts per
//     lineage, each attempt its own candidate (kind "repair") with the
//     failed one as its parent; refused drafts are repaired at once, in the
//     background, and recorded as model calls with their parent.
// What it accepts: a whole source (a ```cuda block plus a ```json manifest,
// or the submit_kernel tool) or search/replace edits of a named parent
// (edits.h; the edit_kernel tool), so a 30 KB kernel can change without
// being written out. Before an answer can cost a compile it is checked: the
// edits apply, size limit, manifest parses, the static checks
// (CheckVariant), knob declarations (knobs.h) parse, and it is not a
// duplicate: a source that normalizes (normalize.h) to one proposed or
// evaluated on the bucket before, by this job or any other, is refused as
// such (a comment-only change is never compiled again). A refused answer is
// not an error: it is recorded and repaired.
//
// Models. Several may be configured (a cheap, fast one for most proposals,
// a strong one for some): fresh proposals pick by weight, repairs from
// `escalate_after` on go to a strong model. A job picks a subset by naming
// them ("model:mini,big", factory.h).
//
// Concurrency (Proposer's "asynchronous proposers"): requests run on an
// executor, up to `parallelism` per bucket (and the executor's threads per
// server), so workers are not kept waiting on the model. Without SetWake()
// the proposer behaves synchronously: Propose() waits for its answers.
//
// Spend. Every request reserves its largest possible cost in the spend
// ledger (spend.h) against the job's limits (ProposalContext max_tokens,
// max_cost_usd) and the server's; the call is recorded with its real usage,
// refused, duplicate and failed ones included. When the room left cannot pay
// for a request with min_completion_tokens of answer, Propose() fails with
// ResourceExhausted. Each Candidate carries the tokens and cost of the call
// that produced it (and of refused calls before it).
//
// Errors of Propose(): the endpoint's (openai_client.h; Unavailable and
// DeadlineExceeded are worth retrying later), ResourceExhausted for a spent
// budget, Unavailable when max_consecutive_refusals answers in a row were
// refused (the message names the last reason). Candidates that are ready are
// returned instead of an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/executor.h"
#include "agent/openai_client.h"
#include "agent/program_db.h"
#include "agent/proposer.h"
#include "agent/spend.h"

namespace kforge::agent {

// One configured model.
struct ModelEntry {
  std::string name;        // how jobs name it ("model:<name>"); defaults to client.model
  OpenAIConfig client;
  Price price;
  double weight = 1;       // share of fresh proposals, relative to the others'
  bool strong = false;     // takes repairs from escalate_after on
};

// An external reference time for one bucket (e.g. from bench/anchors.py).
struct AnchorEntry {
  std::string bucket;      // Bucket::Id()
  std::string name;
  double median_us = 0;
};

struct ModelOptions {
  OpenAIConfig client;                     // the model when `models` is empty
  Price price;                             // its prices
  std::vector<ModelEntry> models;          // several models (then `client` is unused)
  int escalate_after = 1;                  // repair attempts from this one on use a strong model
  size_t max_source_bytes = 256 * 1024;    // kernels/check.h's limit
  size_t max_prompt_bytes = 256 * 1024;    // feedback, inspirations, then sources are trimmed to fit
  size_t feedback_excerpt_bytes = 1200;    // per recent result in a fresh prompt
  size_t diagnostics_bytes = 16 * 1024;    // the compile log / mismatch detail of a repair
  int max_feedback = 6;                    // recent results shown
  int requests_per_candidate = 3;          // synchronous use: Propose(n) makes at most n * this requests
  bool offer_tool = true;                  // offer the submit_kernel / edit_kernel functions
  int64_t min_completion_tokens = 1024;    // a budget that cannot pay for this stops the bucket
  int parallelism = 4;                     // requests in flight per bucket
  int max_repair_attempts = 3;             // per lineage
  int inspirations = 2;                    // other elites shown with a parent
  size_t edits_above_bytes = 12 * 1024;    // a parent larger than this: ask for edits, not a whole source
  int max_consecutive_refusals = 8;        // then Unavailable (the engine backs off)
  bool derive_seed = false;                // send a per-request seed derived from the job's
  bool knob_sweeps = false;                // tell the model it may declare knobs (hybrid proposer)
  std::vector<AnchorEntry> anchors;
  // The server's spend limit and the executor (built once by the factory).
  SpendLimits server_limits;
  int64_t server_window_ms = 0;
  int max_concurrent_requests = 16;
  ProgramDbOptions program_db;
};

// Options from a JSON object (a config file), every key optional, defaults
// as above; unknown keys are rejected so typos do not pass silently:
//   {"base_url": "http://127.0.0.1:8000/v1", "model": "qwen3-coder",
//    "api_key_env": "OPENAI_API_KEY", "api_key": "",
//    "connect_timeout_ms": 10000, "total_timeout_ms": 300000,
//    "max_retries": 4, "initial_backoff_ms": 1000, "max_backoff_ms": 60000,
//    "max_tokens": 32768, "token_param": "auto" | "max_tokens" | "max_completion_tokens",
//    "temperature": 0.7, "reasoning_effort": "medium", "seed": 7, "n": 1, "stream": false,
//    "price_prompt_per_mtok": 0.25, "price_completion_per_mtok": 2.0,
//    "models": [{"name": "mini", "model": "gpt-5-mini", "weight": 4, ...any key above...},
//               {"name": "big", "model": "gpt-5", "strong": true, "reasoning_effort": "high"}],
//    "escalate_after": 1, "parallelism": 4, "max_concurrent_requests": 16,
//    "max_repair_attempts": 3, "inspirations": 2, "edits_above_bytes": 12288,
//    "max_consecutive_refusals": 8, "derive_seed": false, "knob_sweeps": false,
//    "server_max_tokens": 0, "server_max_cost_usd": 0, "server_window_s": 0,
//    "islands": 4, "exploit": 0.5,
//    "anchors": [{"bucket": "fwd.bf16...", "name": "FA2 varlen", "median_us": 812.3}],
//    "max_source_bytes": 262144, "max_prompt_bytes": 262144, "feedback_excerpt_bytes": 1200,
//    "diagnostics_bytes": 16384, "max_feedback": 6, "requests_per_candidate": 3,
//    "offer_tool": true, "min_completion_tokens": 1024}
// A `models` entry takes the top-level endpoint keys as its defaults.
// InvalidArgument naming the key for a wrong type or an unknown key.
absl::StatusOr<ModelOptions> ParseModelOptions(std::string_view json_text);

// The models of `options` (`models`, or the single `client`), with names.
std::vector<ModelEntry> ModelsOf(const ModelOptions& options);

// What proposers of one server share.
struct ModelClient {
  ModelEntry entry;
  std::shared_ptr<ChatClient> client;  // thread-safe (openai_client.h)
};
struct ModelEnvironment {
  std::vector<ModelClient> clients;             // at least one
  std::shared_ptr<SpendLedger> ledger;          // null: a private one in memory (no server limit)
  std::shared_ptr<ProgramDatabase> programs;    // null: a private one
  // Must outlive every proposer built with it and the requests they leave
  // running (the destructor finishes them). Null: a private one with
  // `parallelism` threads.
  std::shared_ptr<Executor> executor;
  uint64_t seed = 0;                            // the job's (per bucket)
};

// Builds libcurl clients from options. InvalidArgument for a bad config (no
// model, no URL).
absl::StatusOr<std::unique_ptr<Proposer>> MakeModelProposer(ModelOptions options);

// With a given client (a scripted one in tests). `client` must not be null.
std::unique_ptr<Proposer> MakeModelProposer(std::unique_ptr<ChatClient> client, ModelOptions options);

// With shared clients, ledger, database and executor (the factory's way).
std::unique_ptr<Proposer> MakeModelProposer(ModelEnvironment env, ModelOptions options);

// --- The pieces, exposed for tests. ---

struct ExtractedKernel {
  std::string source;
  std::string manifest_json;
};

// The kernel of an answer given as a whole source (tool call first, then
// fenced blocks). InvalidArgument naming what is missing, e.g. "no ```cuda
// code block".
absl::StatusOr<ExtractedKernel> ExtractKernel(const ChatResponse& answer);

// The checks before compiling. InvalidArgument naming the problem.
absl::Status ValidateKernel(const ExtractedKernel& kernel, const ShapeKey& shape,
                            size_t max_source_bytes);

// The contract text every prompt carries (kernels/CONTRACT.md when the build
// has it, else the parameter header with a summary).
std::string ContractText();

}  // namespace kforge::agent
