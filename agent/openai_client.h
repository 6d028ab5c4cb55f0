// A client for OpenAI-compatible chat completions endpoints (OpenAI, vLLM,
// SGLang, llama.cpp server, Ollama...): POST {base_url}/chat/completions.
//
// ChatClient is the seam the model proposer talks through; the HTTP
// implementation (libcurl, kept inside openai_client.cc) retries 429 and 5xx
// answers with exponential backoff, honouring a Retry-After header given in
// seconds, and reports token usage from the answer's `usage` object.
//
// Errors (absl::Status codes, which map onto gRPC codes):
//   DeadlineExceeded  connect or total timeout of the last attempt
//   Unavailable       still 429 ("rate limited") or 5xx after all retries, or
//                     the connection failed: worth trying again later
//   Unauthenticated / PermissionDenied  401 / 403
//   InvalidArgument   another 4xx (the message carries the body excerpt)
//   Internal          an answer that is not the expected JSON (no choices...)
//
// Thread-safety: one Complete() at a time per client.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/clock.h"

namespace kforge::agent {

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
  int max_tokens = 8192;                             // completion tokens per request
  std::optional<double> temperature;
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
};

struct ToolCall {
  std::string name;
  std::string arguments_json;  // as sent by the model (a JSON text)
};

struct ChatResponse {
  std::string content;
  std::vector<ToolCall> tool_calls;
  std::string finish_reason;
  std::string model;  // as reported by the endpoint
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t total_tokens = 0;
  bool usage_estimated = false;  // no `usage` in the answer: ~4 bytes per token
  int attempts = 0;              // HTTP requests it took
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

// Assembles a streamed answer (the "data: {...}" lines of server-sent events,
// ending with "data: [DONE]") into one response.
absl::StatusOr<ChatResponse> ParseChatStream(const std::string& body);

}  // namespace kforge::agent
