// A client for OpenAI-compatible chat completions endpoints (OpenAI, vLLM,
// SGLang, llama.cpp server, Ollama...): POST {base_url}/chat/completions.
//
// ChatClient is the seam the model proposer talks through; the HTTP
// implementation (libcurl, kept inside openai_client.cc) retries 429 and 5xx
// answers with exponential backoff, honouring a Retry-After header given in
// seconds, and reports token usage from the answer's `usage` object.
//
// Endpoints disagree on optional parameters. Reasoning models refuse
// `max_tokens` and want `max_completion_tokens`; older servers know only
// `max_tokens`; some models refuse a temperature, a `reasoning_effort`, a
// `seed` or `n`. `token_param` picks the name of the completion limit
// (kAuto: `max_tokens` until the endpoint says otherwise). Whatever the
// configuration, a 400 answer that names one of these parameters as
// unsupported is not an error: the client switches the limit's name (or
// drops the optional parameter), sends the request again at once, and keeps
// what it learned for every later request (ChatResponse::adaptations says
// what changed). Only a 400 it cannot attribute so is InvalidArgument.
//
// Errors (absl::Status codes, which map onto gRPC codes):
//   DeadlineExceeded  connect or total timeout of the last attempt
//   Unavailable       still 429 ("rate limited") or 5xx after all retries, or
//                     the connection failed: worth trying again later
//   Unauthenticated / PermissionDenied  401 / 403
//   InvalidArgument   another 4xx (the message carries the body excerpt)
//   Internal          an answer that is not the expected JSON (no choices...)
//
// Thread-safety: Complete() may be called from several threads at once (one
// HTTP connection each); what the client learned about the endpoint is
// shared between them.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <string_view>

#include "absl/status/statusor.h"
#include "core/clock.h"

namespace kforge::agent {

// The name of the completion limit in the request body.
enum class TokenParam { kAuto, kMaxTokens, kMaxCompletionTokens };
std::string_view TokenParamName(TokenParam p);  // "auto" | "max_tokens" | "max_completion_tokens"
std::optional<TokenParam> ParseTokenParam(std::string_view name);

struct OpenAIConfig {
  // Up to and including the version prefix, e.g. "https://api.openai.com/v1"
  // or "http://127.0.0.1:8000/v1"; "/chat/completions" is appended.
  std::string base_url = "https://api.openai.com/v1";
  std::string model;
  // The key: `api_key` if set, else the environment variable `api_key_env`;
  // neither set means no Authorization header (fine for local servers).
  std::string api_key;
  std::string api_key_env = "OPENAI_API_KEY";
  std::chrono::milliseconds connect_timeout{10'000};
  std::chrono::milliseconds total_timeout{300'000};  // per attempt
  int max_retries = 4;                               // attempts = 1 + max_retries
  std::chrono::milliseconds initial_backoff{1'000};  // doubled on every retry
  std::chrono::milliseconds max_backoff{60'000};     // also caps Retry-After
  // Completion tokens per request (reasoning tokens count: a reasoning
  // model needs room to think before it writes a 30 KB kernel).
  int max_tokens = 32768;
  TokenParam token_param = TokenParam::kAuto;
  std::optional<double> temperature;
  std::string reasoning_effort;                      // "" (not sent) | "minimal" | "low" | "medium" | "high"
  std::optional<int64_t> seed;                       // sent when set (a request's own seed wins)
  int n = 1;                                         // choices per request (a request's own n wins)
  // Ask for a server-sent-events answer ("stream": true, usage in the last
  // chunk). The answer is assembled before Complete() returns; streaming
  // keeps long generations alive through proxies that cut idle connections.
  bool stream = false;
  // What the waits between attempts wait on; must outlive the client.
  // Null: the system's clock.
  Clock* clock = nullptr;
};

struct ChatMessage {
  std::string role;  // "system" | "user" | "assistant"
  std::string content;
};

// A function the model may call instead of answering in text.
struct ChatTool {
  std::string name;
  std::string description;
  std::string parameters_json;  // JSON schema of the arguments
};

struct ChatRequest {
  std::vector<ChatMessage> messages;
  std::vector<ChatTool> tools;
  int max_tokens = 0;  // 0: the config's max_tokens
  std::optional<int64_t> seed;  // unset: the config's
  int n = 0;                    // 0: the config's n
  // Set (from any thread) to abandon the request: Complete() returns
  // Cancelled as soon as the transfer or the backoff notices. Must outlive
  // the call; nullptr: never cancelled.
  const std::atomic<bool>* cancelled = nullptr;
};

struct ToolCall {
  std::string name;
  std::string arguments_json;  // as sent by the model (a JSON text)
};

// One of the `n` answers of a request.
struct ChatChoice {
  std::string content;
  std::vector<ToolCall> tool_calls;
  std::string finish_reason;  // "stop", "length" (cut off at the limit), "tool_calls", ...
};

struct ChatResponse {
  // The first choice, as most callers want it; `choices` has all of them
  // (choices[0] repeats these three fields).
  std::string content;
  std::vector<ToolCall> tool_calls;
  std::string finish_reason;
  std::vector<ChatChoice> choices;
  std::string model;  // as reported by the endpoint
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t total_tokens = 0;
  int64_t reasoning_tokens = 0;  // of completion_tokens, when the endpoint says
  bool usage_estimated = false;  // no `usage` in the answer: ~4 bytes per token
  int attempts = 0;              // HTTP requests it took
  // What the client changed to get this answer, e.g. "max_tokens ->
  // max_completion_tokens (the endpoint refused max_tokens)"; empty when
  // the request went as configured.
  std::vector<std::string> adaptations;
};

class ChatClient {
 public:
  virtual ~ChatClient() = default;
  virtual absl::StatusOr<ChatResponse> Complete(const ChatRequest& request) = 0;
  virtual std::string Model() const = 0;
};

// The libcurl client. InvalidArgument for a config without model or URL.
absl::StatusOr<std::unique_ptr<ChatClient>> MakeOpenAIClient(OpenAIConfig config);

// Parses a chat completions answer body (exposed for tests and for the
// scripted client).
absl::StatusOr<ChatResponse> ParseChatResponse(const std::string& body);

// What a 400 answer body says is unsupported, among the optional parameters
// the client may send ("max_tokens", "max_completion_tokens",
// "temperature", "reasoning_effort", "seed", "n"); "" when it names none of
// them. Reads OpenAI's {"error": {"param": ..., "message": ...}} and the
// plain-text forms of vLLM, llama.cpp and LiteLLM.
std::string UnsupportedParameter(const std::string& body, const std::vector<std::string>& sent);

// Assembles a streamed answer (the "data: {...}" lines of server-sent events,
// ending with "data: [DONE]") into one response.
absl::StatusOr<ChatResponse> ParseChatStream(const std::string& body);

}  // namespace kforge::agent
