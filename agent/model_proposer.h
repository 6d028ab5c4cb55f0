// The model proposer: asks a model behind an OpenAI-compatible chat
// completions endpoint for kernel variants.
//
// Each request sends the kernel contract, the bucket's shape, the current
// best source (or the catalog's default variant when nothing is verified
// yet) with its time and the anchors' times, and excerpts of recent failures,
// all within a fixed size. The answer's kernel comes from a `submit_kernel`
// tool call (arguments `source`, `manifest`) or from a ```cuda (or ```cpp)
// block plus a ```json manifest block. Before it can cost a compile it is
// checked: size limit, manifest parses, no host code, the contract's entry
// point and the kernels' static check (CheckVariant). A refused answer is not
// an error: its reason becomes feedback in the next prompt, and the proposer
// asks again (at most `requests_per_candidate` times per candidate wanted).
//
// Tokens: each Candidate carries the tokens it cost (from the answer's
// `usage`), plus those of refused answers before it, so the engine's sum of
// tokens_used is the job's spend. ProposalContext::tokens_left is the job's
// budget; when what is left cannot pay for a request, Propose() fails with
// ResourceExhausted ("token budget exhausted...").
//
// Errors of Propose(): the endpoint's (see openai_client.h; Unavailable and
// DeadlineExceeded are worth retrying later), ResourceExhausted only for the
// job's token budget, Unavailable when every answer was refused (the message
// names the last reason). Candidates made before an error in the same call
// are returned instead of the error.
//
// Not thread-safe (see Proposer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "agent/openai_client.h"
#include "agent/proposer.h"

namespace kforge::agent {

struct ModelOptions {
  OpenAIConfig client;                     // endpoint, model, key, timeouts, retries, max_tokens
  size_t max_source_bytes = 64 * 1024;     // a larger kernel is refused before compiling
  size_t max_prompt_bytes = 96 * 1024;     // feedback, then the best source, trimmed to fit
  size_t feedback_excerpt_bytes = 1200;    // per failure message in the prompt
  int max_feedback = 6;                    // most recent failures shown
  int requests_per_candidate = 3;          // Propose(n) makes at most n * this requests
  bool offer_tool = true;                  // offer the submit_kernel function
  int64_t min_completion_tokens = 1024;    // a budget that cannot pay for this stops the job
};

// Options from a JSON object (a config file), every key optional, defaults
// as above; unknown keys are rejected so typos do not pass silently:
//   {"base_url": "http://127.0.0.1:8000/v1", "model": "qwen3-coder",
//    "api_key_env": "OPENAI_API_KEY", "api_key": "",
//    "connect_timeout_ms": 10000, "total_timeout_ms": 300000,
//    "max_retries": 4, "initial_backoff_ms": 1000, "max_backoff_ms": 60000,
//    "max_tokens": 8192, "temperature": 0.7, "stream": false,
//    "max_source_bytes": 65536, "max_prompt_bytes": 98304,
//    "feedback_excerpt_bytes": 1200, "max_feedback": 6,
//    "requests_per_candidate": 3, "offer_tool": true, "min_completion_tokens": 1024}
// InvalidArgument naming the key for a wrong type or an unknown key.
absl::StatusOr<ModelOptions> ParseModelOptions(std::string_view json_text);

// Builds the libcurl client from options.client. InvalidArgument for a bad
// config (no model, no URL).
absl::StatusOr<std::unique_ptr<Proposer>> MakeModelProposer(ModelOptions options);

// With a given client (a scripted one in tests). `client` must not be null.
std::unique_ptr<Proposer> MakeModelProposer(std::unique_ptr<ChatClient> client, ModelOptions options);

// --- The pieces, exposed for tests. ---

struct ExtractedKernel {
  std::string source;
  std::string manifest_json;
};

// The kernel of an answer (tool call first, then fenced blocks).
// InvalidArgument naming what is missing, e.g. "no ```cuda code block".
absl::StatusOr<ExtractedKernel> ExtractKernel(const ChatResponse& answer);

// The checks before compiling. InvalidArgument naming the problem.
absl::Status ValidateKernel(const ExtractedKernel& kernel, const ShapeKey& shape,
                            size_t max_source_bytes);

// The contract text every prompt carries (kernels/CONTRACT.md when the build
// has it, else the parameter header with a summary).
std::string ContractText();

}  // namespace kforge::agent
