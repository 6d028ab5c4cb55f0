#include "agent/openai_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <map>
#include <limits>
#include <mutex>
#include <regex>
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

// Words of a 400 that refuses a parameter's name (rather than its value).
bool RefusesTheName(const std::string& body) {
  std::string text = body;
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* word : {"unsupported", "not supported", "does not support", "unrecognized",
                           "unknown", "extra", "not permitted", "not allowed", "instead"})
    if (text.find(word) != std::string::npos) return true;
  return false;
}

// What the client has learned about the endpoint's optional parameters.
struct Learned {
  TokenParam token_param = TokenParam::kMaxTokens;
  bool tried_other_token_param = false;  // both names refused: stop switching
  int max_tokens_cap = 0;                // > 0: the endpoint's own limit on the completion
  bool drop_temperature = false;
  bool drop_reasoning_effort = false;
  bool drop_seed = false;
  bool drop_n = false;
};

// One try of a request, through the retries for 429/5xx.
struct Sent {
  absl::StatusOr<ChatResponse> response = absl::UnknownError("not sent");
  std::string client_error_body;  // the body of a 400 answer
};

int ProgressCheck(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto* cancelled = static_cast<const std::atomic<bool>*>(user);
  return cancelled != nullptr && cancelled->load() ? 1 : 0;  // non-zero aborts the transfer
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
    learned_.token_param = config_.token_param == TokenParam::kMaxCompletionTokens
                               ? TokenParam::kMaxCompletionTokens
                               : TokenParam::kMaxTokens;
  }

  std::string Model() const override { return config_.model; }

  absl::StatusOr<ChatResponse> Complete(const ChatRequest& request) override {
    std::vector<std::string> adaptations;
    int attempts = 0;
    // Each pass either answers or learns one thing about the endpoint; there
    // are only so many things to learn.
    for (int pass = 0; pass < 8; ++pass) {
      Learned now = Snapshot();
      std::vector<std::string> sent;
      const std::string body = BuildBody(request, now, sent);
      Sent r = Send(body, request.cancelled);
      attempts += r.response.ok() ? r.response->attempts : 1;
      if (r.response.ok()) {
        r.response->attempts = attempts;
        r.response->adaptations = std::move(adaptations);
        return r.response;
      }
      if (r.client_error_body.empty()) return r.response.status();
      std::string note = Learn(r.client_error_body, sent, now);
      if (note.empty()) return r.response.status();
      spdlog::warn("model endpoint {}: {}; sending again", url_, note);
      adaptations.push_back(std::move(note));
    }
    return absl::InvalidArgumentError(fmt::format(
        "model endpoint {}: still refused after adapting the request: {}", url_,
        fmt::join(adaptations, "; ")));
  }

 private:
  Learned Snapshot() const {
    std::lock_guard lock(mu_);
    return learned_;
  }

  // Applies what a 400 body says; returns what changed, or "" when the body
  // names nothing the client can change (then the error stands).
  std::string Learn(const std::string& error_body, const std::vector<std::string>& sent,
                    const Learned& used) {
    const std::string param = UnsupportedParameter(error_body, sent);
    std::lock_guard lock(mu_);
    Learned& l = learned_;
    const std::string limit_name(TokenParamName(used.token_param));
    if (param == limit_name) {
      // A limit that is too large is not an unsupported name: learn the
      // endpoint's own cap when it states one.
      if (std::optional<int> cap = StatedCompletionCap(error_body, used); cap) {
        if (l.max_tokens_cap != 0 && l.max_tokens_cap <= *cap) return "";
        l.max_tokens_cap = *cap;
        return fmt::format("{} capped at {} (the endpoint's limit)", limit_name, *cap);
      }
      // "too large" without a number is about the value, not the name.
      if (!RefusesTheName(error_body)) return "";
      if (l.tried_other_token_param || l.token_param != used.token_param) return "";
      l.tried_other_token_param = true;
      l.token_param = used.token_param == TokenParam::kMaxTokens ? TokenParam::kMaxCompletionTokens
                                                                  : TokenParam::kMaxTokens;
      return fmt::format("{} -> {} (the endpoint refused {})", limit_name,
                         TokenParamName(l.token_param), limit_name);
    }
    auto drop = [&](bool& flag, const char* name) -> std::string {
      if (flag) return "";
      flag = true;
      return fmt::format("{} dropped (the endpoint refused it)", name);
    };
    if (param == "temperature") return drop(l.drop_temperature, "temperature");
    if (param == "reasoning_effort") return drop(l.drop_reasoning_effort, "reasoning_effort");
    if (param == "seed") return drop(l.drop_seed, "seed");
    if (param == "n") return drop(l.drop_n, "n");
    return "";
  }

  // "at most 16384 completion tokens", or vLLM's "maximum context length is
  // 32768 tokens ... (9000 in the messages": the room left for the answer.
  static std::optional<int> StatedCompletionCap(const std::string& body, const Learned& used) {
    static const std::regex at_most(R"(at most (\d+) (completion )?tokens)", std::regex::icase);
    static const std::regex context(
        R"(maximum context length is (\d+) tokens[^(]*\((\d+) in the messages)", std::regex::icase);
    std::smatch m;
    auto positive = [&](int64_t v) -> std::optional<int> {
      if (v < 16) return std::nullopt;
      if (used.max_tokens_cap > 0 && v >= used.max_tokens_cap) return std::nullopt;
      return static_cast<int>(std::min<int64_t>(v, std::numeric_limits<int>::max()));
    };
    if (std::regex_search(body, m, at_most)) return positive(std::stoll(m[1].str()));
    if (std::regex_search(body, m, context))
      return positive(std::stoll(m[1].str()) - std::stoll(m[2].str()) - 16);
    return std::nullopt;
  }

  std::string BuildBody(const ChatRequest& request, const Learned& l,
                        std::vector<std::string>& sent) const {
    json messages = json::array();
    for (const ChatMessage& m : request.messages) messages.push_back({{"role", m.role}, {"content", m.content}});
    int limit = request.max_tokens > 0 ? request.max_tokens : config_.max_tokens;
    if (l.max_tokens_cap > 0) limit = std::min(limit, l.max_tokens_cap);
    const std::string limit_name(TokenParamName(l.token_param));
    json body = {{"model", config_.model}, {"messages", std::move(messages)}, {limit_name, limit}};
    sent.push_back(limit_name);
    if (config_.temperature && !l.drop_temperature) {
      body["temperature"] = *config_.temperature;
      sent.push_back("temperature");
    }
    if (!config_.reasoning_effort.empty() && !l.drop_reasoning_effort) {
      body["reasoning_effort"] = config_.reasoning_effort;
      sent.push_back("reasoning_effort");
    }
    const std::optional<int64_t> seed = request.seed ? request.seed : config_.seed;
    if (seed && !l.drop_seed) {
      body["seed"] = *seed;
      sent.push_back("seed");
    }
    const int n = request.n > 0 ? request.n : config_.n;
    if (n > 1 && !l.drop_n) {
      body["n"] = n;
      sent.push_back("n");
    }
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

  // Sleeps `wait`, waking early when the request is cancelled.
  static bool SleepUnlessCancelled(std::chrono::milliseconds wait, const std::atomic<bool>* cancelled) {
    const auto until = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < until) {
      if (cancelled != nullptr && cancelled->load()) return false;
      std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(
          std::chrono::milliseconds(20), std::chrono::duration_cast<std::chrono::milliseconds>(
                                             until - std::chrono::steady_clock::now()) +
                                             std::chrono::milliseconds(1)));
    }
    return cancelled == nullptr || !cancelled->load();
  }

  Sent Send(const std::string& body, const std::atomic<bool>* cancelled) const {
    Sent out;
    absl::Status last;
    const int attempts = 1 + std::max(0, config_.max_retries);
    for (int attempt = 0; attempt < attempts; ++attempt) {
      HttpResult r = Post(body, cancelled);
      std::optional<std::chrono::milliseconds> wait;
      if (r.code == CURLE_ABORTED_BY_CALLBACK) {
        out.response = absl::CancelledError(fmt::format("model endpoint {}: request cancelled", url_));
        return out;
      }
      if (r.code == CURLE_OPERATION_TIMEDOUT) {
        // Not retried: a model that is too slow once is likely slow again,
        // and a retry would double the time the job waits.
        out.response = absl::DeadlineExceededError(fmt::format(
            "model endpoint {}: no complete answer within {} ms (connect timeout {} ms): {}", url_,
            config_.total_timeout.count(), config_.connect_timeout.count(), r.curl_error));
        return out;
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
          out.response = absl::Status(parsed.status().code(),
                                      fmt::format("model endpoint {}: {}", url_, parsed.status().ToString()));
          return out;
        }
        parsed->attempts = attempt + 1;
        if (parsed->usage_estimated) {
          parsed->prompt_tokens = EstimateTokens(body.size());
          parsed->total_tokens = parsed->prompt_tokens + parsed->completion_tokens;
        }
        out.response = std::move(parsed);
        return out;
      } else if (r.status == 429 || r.status >= 500) {
        std::string what = fmt::format("model endpoint {}: HTTP {}: {}", url_, r.status, Excerpt(r.body));
        // 429 maps to Unavailable as in gRPC's HTTP mapping: retry later. It
        // keeps ResourceExhausted for the job's own budget.
        last = absl::UnavailableError(r.status == 429 ? what + " (rate limited)" : what);
        if (r.retry_after_s) wait = std::chrono::milliseconds(*r.retry_after_s * 1000);
      } else if (r.status == 401) {
        out.response = absl::UnauthenticatedError(
            fmt::format("model endpoint {}: HTTP 401 (is ${} set?): {}", url_, config_.api_key_env, Excerpt(r.body)));
        return out;
      } else if (r.status == 403) {
        out.response = absl::PermissionDeniedError(fmt::format("model endpoint {}: HTTP 403: {}", url_, Excerpt(r.body)));
        return out;
      } else {
        out.response = absl::InvalidArgumentError(
            fmt::format("model endpoint {}: HTTP {}: {}", url_, r.status, Excerpt(r.body)));
        // 400 and 422 (FastAPI's validation error) may name a parameter.
        if (r.status == 400 || r.status == 422) out.client_error_body = r.body;
        return out;
      }
      if (attempt + 1 == attempts) break;
      if (!wait) {
        auto backoff = config_.initial_backoff * (int64_t{1} << std::min(attempt, 30));
        wait = std::chrono::duration_cast<std::chrono::milliseconds>(backoff);
      }
      wait = std::min(*wait, config_.max_backoff);
      spdlog::warn("{}; retry {}/{} in {} ms", last.ToString(), attempt + 1, attempts - 1, wait->count());
      // An injected clock (tests) decides the wait exactly; the system's is
      // slept in slices, so a cancelled request ends during its backoff.
      if (config_.clock != nullptr) {
        config_.clock->SleepFor(*wait);
        if (cancelled != nullptr && cancelled->load()) {
          out.response = absl::CancelledError(fmt::format("model endpoint {}: request cancelled", url_));
          return out;
        }
      } else if (!SleepUnlessCancelled(*wait, cancelled)) {
        out.response = absl::CancelledError(fmt::format("model endpoint {}: request cancelled", url_));
        return out;
      }
    }
    out.response = absl::Status(last.code(), fmt::format("{} (gave up after {} attempts)",
                                                         std::string(last.message()), attempts));
    return out;
  }

  HttpResult Post(const std::string& body, const std::atomic<bool>* cancelled) const {
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
    // The progress callback runs about once a second even while nothing
    // arrives, so a cancelled request ends while the model still thinks.
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, ProgressCheck);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, const_cast<std::atomic<bool>*>(cancelled));
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    r.code = curl_easy_perform(curl);
    r.curl_error = error;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    return r;
  }

  const OpenAIConfig config_;
  std::string key_;
  std::string url_;
  mutable std::mutex mu_;
  Learned learned_;  // guarded by mu_
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
  ChatResponse r;
  for (const json& choice : *choices) {
    auto message = choice.is_object() ? choice.find("message") : choice.end();
    if (!choice.is_object() || message == choice.end() || !message->is_object()) {
      if (r.choices.empty())
        return absl::InternalError(fmt::format("choices[0] has no message: {}", Excerpt(body)));
      continue;  // a malformed later choice costs only itself
    }
    ChatChoice c;
    if (auto t = message->find("content"); t != message->end() && t->is_string()) c.content = t->get<std::string>();
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
        c.tool_calls.push_back(std::move(t));
      }
    }
    if (auto fr = choice.find("finish_reason"); fr != choice.end() && fr->is_string()) c.finish_reason = fr->get<std::string>();
    r.choices.push_back(std::move(c));
  }
  r.content = r.choices[0].content;
  r.tool_calls = r.choices[0].tool_calls;
  r.finish_reason = r.choices[0].finish_reason;
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
    if (auto d = usage->find("completion_tokens_details"); d != usage->end() && d->is_object()) {
      if (auto rt = d->find("reasoning_tokens"); rt != d->end() && rt->is_number_integer())
        r.reasoning_tokens = rt->get<int64_t>();
    }
  } else {
    size_t bytes = 0;
    for (const ChatChoice& c : r.choices) {
      bytes += c.content.size();
      for (const ToolCall& t : c.tool_calls) bytes += t.arguments_json.size();
    }
    r.completion_tokens = EstimateTokens(bytes);
    r.total_tokens = r.completion_tokens;
    r.usage_estimated = true;
  }
  if (std::all_of(r.choices.begin(), r.choices.end(),
                  [](const ChatChoice& c) { return c.content.empty() && c.tool_calls.empty(); }))
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
  // Streams are read for their first choice only (the proposer streams with n = 1).
  r.choices.push_back(ChatChoice{r.content, r.tool_calls, r.finish_reason});
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

std::string_view TokenParamName(TokenParam p) {
  switch (p) {
    case TokenParam::kAuto: return "auto";
    case TokenParam::kMaxTokens: return "max_tokens";
    case TokenParam::kMaxCompletionTokens: return "max_completion_tokens";
  }
  return "auto";
}

std::optional<TokenParam> ParseTokenParam(std::string_view name) {
  if (name == "auto") return TokenParam::kAuto;
  if (name == "max_tokens") return TokenParam::kMaxTokens;
  if (name == "max_completion_tokens") return TokenParam::kMaxCompletionTokens;
  return std::nullopt;
}

namespace {

std::string LowerCase(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// `name` as a whole word of `text` (not inside max_completion_tokens when
// looking for max_tokens, nor the n of "not").
bool MentionsWord(const std::string& text, const std::string& name) {
  for (size_t at = text.find(name); at != std::string::npos; at = text.find(name, at + 1)) {
    const bool left = at == 0 || !IsNameChar(text[at - 1]);
    const bool right = at + name.size() >= text.size() || !IsNameChar(text[at + name.size()]);
    if (left && right) return true;
  }
  return false;
}

}  // namespace

std::string UnsupportedParameter(const std::string& body, const std::vector<std::string>& sent) {
  auto was_sent = [&](const std::string& p) { return std::find(sent.begin(), sent.end(), p) != sent.end(); };
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  std::string message = body;
  if (j.is_object()) {
    const json* err = j.contains("error") ? &j["error"] : &j;
    if (err->is_object()) {
      if (auto p = err->find("param"); p != err->end() && p->is_string() && was_sent(p->get<std::string>()))
        return p->get<std::string>();
      if (auto m = err->find("message"); m != err->end() && m->is_string()) message = m->get<std::string>();
    } else if (err->is_string()) {
      message = err->get<std::string>();
    }
    // FastAPI/pydantic: {"detail": [{"loc": ["body", "reasoning_effort"], "msg": "Extra inputs..."}]}
    if (auto d = j.find("detail"); d != j.end() && d->is_array()) {
      for (const json& e : *d) {
        if (!e.is_object() || !e.contains("loc") || !e["loc"].is_array()) continue;
        for (const json& part : e["loc"])
          if (part.is_string() && was_sent(part.get<std::string>())) return part.get<std::string>();
      }
    }
  }
  const std::string text = LowerCase(message);
  static const char* kRefusals[] = {"unsupported", "not supported", "does not support", "unrecognized",
                                    "unknown", "extra", "not permitted", "not allowed", "invalid",
                                    "too large", "exceed", "at most", "maximum"};
  bool refusal = false;
  for (const char* word : kRefusals) refusal = refusal || text.find(word) != std::string::npos;
  if (!refusal) return "";
  // Longer names first: max_completion_tokens before anything it contains.
  std::vector<std::string> by_length = sent;
  std::sort(by_length.begin(), by_length.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  for (const std::string& p : by_length) {
    if (p.size() <= 2) {
      // A one-letter name is only taken when quoted: "'n'", "`n`", "\"n\"".
      for (const char* q : {"'", "`", "\""})
        if (text.find(std::string(q) + p + q) != std::string::npos) return p;
      continue;
    }
    if (MentionsWord(text, p)) return p;
  }
  return "";
}

absl::StatusOr<std::unique_ptr<ChatClient>> MakeOpenAIClient(OpenAIConfig config) {
  if (config.base_url.empty()) return absl::InvalidArgumentError("openai: base_url is empty");
  if (config.model.empty()) return absl::InvalidArgumentError("openai: model is empty");
  if (config.max_tokens <= 0) return absl::InvalidArgumentError("openai: max_tokens must be positive");
  if (config.n < 1 || config.n > 16) return absl::InvalidArgumentError("openai: n must be 1..16");
  static const char* kEfforts[] = {"", "minimal", "low", "medium", "high"};
  if (std::find(std::begin(kEfforts), std::end(kEfforts), config.reasoning_effort) == std::end(kEfforts))
    return absl::InvalidArgumentError(fmt::format(
        "openai: reasoning_effort \"{}\" is not one of minimal, low, medium, high", config.reasoning_effort));
  return std::unique_ptr<ChatClient>(new OpenAIClient(std::move(config)));
}

}  // namespace kforge::agent
