#include "agent/openai_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

namespace kforge::agent {
namespace {

using nlohmann::json;

std::string Excerpt(const std::string& s, size_t max = 300) {
  if (s.size() <= max) return s;
  return s.substr(0, max) + fmt::format("... ({} bytes)", s.size());
}

int64_t EstimateTokens(size_t bytes) { return static_cast<int64_t>((bytes + 3) / 4); }

struct HttpResult {
  CURLcode code = CURLE_OK;
  std::string curl_error;
  long status = 0;
  std::string body;
  std::optional<int64_t> retry_after_s;
};

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

// Only the seconds form of Retry-After is honoured; an HTTP date falls back
// to the exponential backoff.
size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  std::string_view line(data, size * n);
  constexpr std::string_view kName = "retry-after:";
  if (line.size() > kName.size()) {
    bool match = true;
    for (size_t i = 0; i < kName.size() && match; ++i)
      match = std::tolower(static_cast<unsigned char>(line[i])) == kName[i];
    if (match) {
      std::string_view v = line.substr(kName.size());
      while (!v.empty() && std::isspace(static_cast<unsigned char>(v.front()))) v.remove_prefix(1);
      while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.remove_suffix(1);
      int64_t seconds = 0;
      auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), seconds);
      if (ec == std::errc() && end == v.data() + v.size() && seconds >= 0)
        static_cast<HttpResult*>(user)->retry_after_s = seconds;
    }
  }
  return size * n;
}

void GlobalInitOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

class OpenAIClient final : public ChatClient {
 public:
  explicit OpenAIClient(OpenAIConfig config) : config_(std::move(config)) {
    key_ = config_.api_key;
    if (key_.empty() && !config_.api_key_env.empty()) {
      if (const char* env = std::getenv(config_.api_key_env.c_str())) key_ = env;
    }
    url_ = config_.base_url;
    while (!url_.empty() && url_.back() == '/') url_.pop_back();
    url_ += "/chat/completions";
  }

  std::string Model() const override { return config_.model; }

  absl::StatusOr<ChatResponse> Complete(const ChatRequest& request) override {
    const std::string body = BuildBody(request);
    absl::Status last;
    const int attempts = 1 + std::max(0, config_.max_retries);
    for (int attempt = 0; attempt < attempts; ++attempt) {
      HttpResult r = Post(body);
      std::optional<std::chrono::milliseconds> wait;
      if (r.code == CURLE_OPERATION_TIMEDOUT) {
        // Not retried: a model that is too slow once is likely slow again,
        // and a retry would double the time the job waits.
        return absl::DeadlineExceededError(fmt::format(
            "model endpoint {}: no complete answer within {} ms (connect timeout {} ms): {}", url_,
            config_.total_timeout.count(), config_.connect_timeout.count(), r.curl_error));
      }
      if (r.code != CURLE_OK) {
        last = absl::UnavailableError(
            fmt::format("model endpoint {}: {} ({})", url_, curl_easy_strerror(r.code), r.curl_error));
      } else if (r.status == 200) {
        // A server may ignore "stream" and answer with one JSON object.
        const bool sse = config_.stream && r.body.find_first_not_of(" \t\r\n") != std::string::npos &&
                         r.body[r.body.find_first_not_of(" \t\r\n")] != '{';
        absl::StatusOr<ChatResponse> parsed = sse ? ParseChatStream(r.body) : ParseChatResponse(r.body);
        if (!parsed.ok()) {
          return absl::Status(parsed.status().code(),
                              fmt::format("model endpoint {}: {}", url_, parsed.status().ToString()));
        }
        parsed->attempts = attempt + 1;
        if (parsed->usage_estimated) {
          parsed->prompt_tokens = EstimateTokens(body.size());
          parsed->total_tokens = parsed->prompt_tokens + parsed->completion_tokens;
        }
        return parsed;
      } else if (r.status == 429 || r.status >= 500) {
        std::string what = fmt::format("model endpoint {}: HTTP {}: {}", url_, r.status, Excerpt(r.body));
        // 429 maps to Unavailable as in gRPC's HTTP mapping: retry later. It
        // keeps ResourceExhausted for the job's own token budget.
        last = absl::UnavailableError(r.status == 429 ? what + " (rate limited)" : what);
        if (r.retry_after_s) wait = std::chrono::milliseconds(*r.retry_after_s * 1000);
      } else if (r.status == 401) {
        return absl::UnauthenticatedError(
            fmt::format("model endpoint {}: HTTP 401 (is ${} set?): {}", url_, config_.api_key_env, Excerpt(r.body)));
      } else if (r.status == 403) {
        return absl::PermissionDeniedError(fmt::format("model endpoint {}: HTTP 403: {}", url_, Excerpt(r.body)));
      } else {
        return absl::InvalidArgumentError(
            fmt::format("model endpoint {}: HTTP {}: {}", url_, r.status, Excerpt(r.body)));
      }
      if (attempt + 1 == attempts) break;
      if (!wait) {
        auto backoff = config_.initial_backoff * (int64_t{1} << std::min(attempt, 30));
        wait = std::chrono::duration_cast<std::chrono::milliseconds>(backoff);
      }
      wait = std::min(*wait, config_.max_backoff);
      spdlog::warn("{}; retry {}/{} in {} ms", last.ToString(), attempt + 1, attempts - 1, wait->count());
      (config_.clock != nullptr ? config_.clock : &system_clock_)->SleepFor(*wait);
    }
    return absl::Status(last.code(), fmt::format("{} (gave up after {} attempts)", std::string(last.message()), attempts));
  }

 private:
  std::string BuildBody(const ChatRequest& request) const {
    json messages = json::array();
    for (const ChatMessage& m : request.messages) messages.push_back({{"role", m.role}, {"content", m.content}});
    json body = {{"model", config_.model},
                 {"messages", std::move(messages)},
                 {"max_tokens", request.max_tokens > 0 ? request.max_tokens : config_.max_tokens}};
    if (config_.temperature) body["temperature"] = *config_.temperature;
    if (config_.stream) {
      body["stream"] = true;
      body["stream_options"] = {{"include_usage", true}};
    }
    if (!request.tools.empty()) {
      json tools = json::array();
      for (const ChatTool& t : request.tools) {
        json params = json::parse(t.parameters_json, nullptr, false);
        if (params.is_discarded()) params = json::object();
        tools.push_back({{"type", "function"},
                         {"function", {{"name", t.name}, {"description", t.description}, {"parameters", params}}}});
      }
      body["tools"] = std::move(tools);
      body["tool_choice"] = "auto";
    }
    return body.dump();
  }

  HttpResult Post(const std::string& body) const {
    GlobalInitOnce();
    HttpResult r;
    CURL* curl = curl_easy_init();
    if (curl == nullptr) {
      r.code = CURLE_FAILED_INIT;
      r.curl_error = "curl_easy_init failed";
      return r;
    }
    char error[CURL_ERROR_SIZE] = {0};
    curl_slist* headers = nullptr;
    headers = curl_slist_append(headers, "Content-Type: application/json");
    headers = curl_slist_append(headers, "Accept: application/json");
    std::string auth;
    if (!key_.empty()) {
      auth = "Authorization: Bearer " + key_;
      headers = curl_slist_append(headers, auth.c_str());
    }
    curl_easy_setopt(curl, CURLOPT_URL, url_.c_str());
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(config_.connect_timeout.count()));
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(config_.total_timeout.count()));
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM in a threaded server
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &r.body);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &r);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
    r.code = curl_easy_perform(curl);
    r.curl_error = error;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    return r;
  }

  OpenAIConfig config_;
  SystemClock system_clock_;  // when config_.clock is null
  std::string key_;
  std::string url_;
};

}  // namespace

absl::StatusOr<ChatResponse> ParseChatResponse(const std::string& body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InternalError(fmt::format("answer is not JSON: {}", Excerpt(body)));
  if (!j.is_object()) return absl::InternalError(fmt::format("answer is not a JSON object: {}", Excerpt(body)));
  if (j.contains("error")) return absl::InternalError(fmt::format("answer is an error: {}", Excerpt(j["error"].dump())));
  auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array() || choices->empty())
    return absl::InternalError(fmt::format("answer has no choices: {}", Excerpt(body)));
  const json& choice = (*choices)[0];
  auto message = choice.find("message");
  if (!choice.is_object() || message == choice.end() || !message->is_object())
    return absl::InternalError(fmt::format("choices[0] has no message: {}", Excerpt(body)));
  ChatResponse r;
  if (auto c = message->find("content"); c != message->end() && c->is_string()) r.content = c->get<std::string>();
  if (auto calls = message->find("tool_calls"); calls != message->end() && calls->is_array()) {
    for (const json& call : *calls) {
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
      const json& f = call["function"];
      ToolCall t;
      if (f.contains("name") && f["name"].is_string()) t.name = f["name"].get<std::string>();
      if (f.contains("arguments")) {
        // The API sends a JSON text; some servers send the object itself.
        t.arguments_json = f["arguments"].is_string() ? f["arguments"].get<std::string>() : f["arguments"].dump();
      }
      r.tool_calls.push_back(std::move(t));
    }
  }
  if (auto fr = choice.find("finish_reason"); fr != choice.end() && fr->is_string()) r.finish_reason = fr->get<std::string>();
  if (auto m = j.find("model"); m != j.end() && m->is_string()) r.model = m->get<std::string>();
  auto usage = j.find("usage");
  auto number = [&](const char* name) -> int64_t {
    auto it = usage->find(name);
    return it != usage->end() && it->is_number_integer() ? it->get<int64_t>() : 0;
  };
  if (usage != j.end() && usage->is_object()) {
    r.prompt_tokens = number("prompt_tokens");
    r.completion_tokens = number("completion_tokens");
    r.total_tokens = number("total_tokens");
    if (r.total_tokens == 0) r.total_tokens = r.prompt_tokens + r.completion_tokens;
  } else {
    size_t bytes = r.content.size();
    for (const ToolCall& t : r.tool_calls) bytes += t.arguments_json.size();
    r.completion_tokens = EstimateTokens(bytes);
    r.total_tokens = r.completion_tokens;
    r.usage_estimated = true;
  }
  if (r.content.empty() && r.tool_calls.empty())
    return absl::InternalError(fmt::format("answer has neither content nor a tool call: {}", Excerpt(body)));
  return r;
}

absl::StatusOr<ChatResponse> ParseChatStream(const std::string& body) {
  ChatResponse r;
  std::map<int, ToolCall> calls;  // tool call fragments by index
  bool usage = false, done = false, any = false;
  size_t pos = 0;
  while (pos < body.size() && !done) {
    size_t end = body.find('\n', pos);
    if (end == std::string::npos) end = body.size();
    std::string line = body.substr(pos, end - pos);
    pos = end + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind("data:", 0) != 0) continue;  // comments, event names, blank separators
    std::string data = line.substr(5);
    if (!data.empty() && data.front() == ' ') data.erase(0, 1);
    if (data == "[DONE]") {
      done = true;
      break;
    }
    json chunk = json::parse(data, nullptr, /*allow_exceptions=*/false);
    if (!chunk.is_object()) return absl::InternalError(fmt::format("stream chunk is not JSON: {}", Excerpt(data)));
    if (chunk.contains("error")) return absl::InternalError(fmt::format("stream carries an error: {}", Excerpt(chunk["error"].dump())));
    any = true;
    if (auto m = chunk.find("model"); m != chunk.end() && m->is_string()) r.model = m->get<std::string>();
    if (auto u = chunk.find("usage"); u != chunk.end() && u->is_object()) {
      usage = true;
      r.prompt_tokens = u->value("prompt_tokens", int64_t{0});
      r.completion_tokens = u->value("completion_tokens", int64_t{0});
      r.total_tokens = u->value("total_tokens", r.prompt_tokens + r.completion_tokens);
    }
    auto choices = chunk.find("choices");
    if (choices == chunk.end() || !choices->is_array() || choices->empty()) continue;
    const json& choice = (*choices)[0];
    if (auto fr = choice.find("finish_reason"); fr != choice.end() && fr->is_string()) r.finish_reason = fr->get<std::string>();
    auto delta = choice.find("delta");
    if (delta == choice.end() || !delta->is_object()) continue;
    if (auto c = delta->find("content"); c != delta->end() && c->is_string()) r.content += c->get<std::string>();
    if (auto tc = delta->find("tool_calls"); tc != delta->end() && tc->is_array()) {
      for (const json& part : *tc) {
        if (!part.is_object()) continue;
        ToolCall& call = calls[part.value("index", 0)];
        if (!part.contains("function") || !part["function"].is_object()) continue;
        const json& f = part["function"];
        if (f.contains("name") && f["name"].is_string()) call.name += f["name"].get<std::string>();
        if (f.contains("arguments") && f["arguments"].is_string()) call.arguments_json += f["arguments"].get<std::string>();
      }
    }
  }
  if (!any) return absl::InternalError(fmt::format("stream has no data chunks: {}", Excerpt(body)));
  for (auto& [index, call] : calls) r.tool_calls.push_back(std::move(call));
  if (!usage) {
    size_t bytes = r.content.size();
    for (const ToolCall& t : r.tool_calls) bytes += t.arguments_json.size();
    r.completion_tokens = EstimateTokens(bytes);
    r.total_tokens = r.completion_tokens;
    r.usage_estimated = true;
  }
  if (r.content.empty() && r.tool_calls.empty())
    return absl::InternalError(fmt::format("streamed answer has neither content nor a tool call{}",
                                           done ? "" : " (no [DONE]: cut off?)"));
  return r;
}

absl::StatusOr<std::unique_ptr<ChatClient>> MakeOpenAIClient(OpenAIConfig config) {
  if (config.base_url.empty()) return absl::InvalidArgumentError("openai: base_url is empty");
  if (config.model.empty()) return absl::InvalidArgumentError("openai: model is empty");
  if (config.max_tokens <= 0) return absl::InvalidArgumentError("openai: max_tokens must be positive");
  return std::unique_ptr<ChatClient>(new OpenAIClient(std::move(config)));
}

}  // namespace kforge::agent
