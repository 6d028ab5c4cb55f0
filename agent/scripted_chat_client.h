// ScriptedChatClient: a ChatClient that answers from a script instead of a
// network endpoint, for tests of anything built on the model proposer (the
// job engine's included). Each Complete() takes the next scripted answer (the
// last one repeats) and records the request. Header-only. Thread-safe, as
// the model proposer calls Complete() from several threads at once (the
// order of concurrent requests is then the order they reach the lock).
#pragma once

#include <deque>
#include <mutex>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/openai_client.h"

namespace kforge::agent {

class ScriptedChatClient final : public ChatClient {
 public:
  // What the test can still reach after the client moved into a proposer.
  struct Log {
    std::vector<ChatRequest> requests;
  };

  explicit ScriptedChatClient(std::shared_ptr<Log> log = std::make_shared<Log>()) : log_(std::move(log)) {}

  ScriptedChatClient& Then(absl::StatusOr<ChatResponse> answer) {
    std::lock_guard lock(mu_);
    script_.push_back(std::move(answer));
    return *this;
  }

  // A text answer with the given usage.
  ScriptedChatClient& ThenText(std::string content, int64_t prompt_tokens = 100, int64_t completion_tokens = 50) {
    ChatResponse r;
    r.content = std::move(content);
    r.model = "scripted-model";
    r.finish_reason = "stop";
    r.prompt_tokens = prompt_tokens;
    r.completion_tokens = completion_tokens;
    r.total_tokens = prompt_tokens + completion_tokens;
    r.attempts = 1;
    return Then(std::move(r));
  }

  absl::StatusOr<ChatResponse> Complete(const ChatRequest& request) override {
    std::lock_guard lock(mu_);
    log_->requests.push_back(request);
    if (script_.empty()) return absl::FailedPreconditionError("scripted chat client: no answer scripted");
    absl::StatusOr<ChatResponse> answer = script_.front();
    if (script_.size() > 1) script_.pop_front();
    return answer;
  }

  std::string Model() const override { return "scripted-model"; }

 private:
  std::mutex mu_;
  std::shared_ptr<Log> log_;                          // guarded by mu_ while a request runs
  std::deque<absl::StatusOr<ChatResponse>> script_;  // guarded by mu_
};

}  // namespace kforge::agent
