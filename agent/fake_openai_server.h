// Test helper: a real HTTP server on 127.0.0.1 (cpp-httplib) that answers
// POST /v1/chat/completions from a script, one handler per request (the last
// handler repeats), and records what it received.
#pragma once

#include <httplib.h>

#include <chrono>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace kforge::agent::testing {

class FakeOpenAIServer {
 public:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;

  struct Seen {
    std::string body;
    std::string authorization;
    std::chrono::steady_clock::time_point at;
  };

  FakeOpenAIServer() {
    server_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      Handler h;
      {
        std::lock_guard<std::mutex> lock(mu_);
        seen_.push_back(Seen{req.body, req.get_header_value("Authorization"), std::chrono::steady_clock::now()});
        if (script_.empty()) {
          res.status = 500;
          res.set_content("{\"error\":\"no script\"}", "application/json");
          return;
        }
        h = script_.front();
        if (script_.size() > 1) script_.pop_front();
      }
      h(req, res);
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  ~FakeOpenAIServer() {
    server_.stop();
    thread_.join();
  }

  std::string BaseUrl() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1"; }

  void Then(Handler h) {
    std::lock_guard<std::mutex> lock(mu_);
    script_.push_back(std::move(h));
  }

  std::vector<Seen> Requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

  // A well-formed answer with `content` and usage.
  static Handler Answer(std::string content, int prompt_tokens = 100, int completion_tokens = 50) {
    return [=](const httplib::Request&, httplib::Response& res) {
      nlohmann::json j = {
          {"id", "chatcmpl-1"},
          {"object", "chat.completion"},
          {"model", "fake-model"},
          {"choices", {{{"index", 0}, {"message", {{"role", "assistant"}, {"content", content}}}, {"finish_reason", "stop"}}}},
          {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens}, {"total_tokens", prompt_tokens + completion_tokens}}}};
      res.set_content(j.dump(), "application/json");
    };
  }

  static Handler ToolCall(std::string name, nlohmann::json arguments, int total_tokens = 120) {
    return [=](const httplib::Request&, httplib::Response& res) {
      nlohmann::json call = {{"id", "call_1"}, {"type", "function"},
                             {"function", {{"name", name}, {"arguments", arguments.dump()}}}};
      nlohmann::json j = {
          {"model", "fake-model"},
          {"choices", {{{"index", 0}, {"message", {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {call}}}}, {"finish_reason", "tool_calls"}}}},
          {"usage", {{"prompt_tokens", total_tokens - 20}, {"completion_tokens", 20}, {"total_tokens", total_tokens}}}};
      res.set_content(j.dump(), "application/json");
    };
  }

  static Handler Status(int status, std::string body = "{\"error\":{\"message\":\"busy\"}}",
                        std::string retry_after = "") {
    return [=](const httplib::Request&, httplib::Response& res) {
      res.status = status;
      if (!retry_after.empty()) res.set_header("Retry-After", retry_after);
      res.set_content(body, "application/json");
    };
  }

  // Server-sent events, one write per event, then [DONE].
  static Handler Stream(std::vector<nlohmann::json> chunks) {
    return [=](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("text/event-stream", [chunks](size_t, httplib::DataSink& sink) {
        for (const auto& c : chunks) {
          std::string event = "data: " + c.dump() + "\n\n";
          sink.write(event.data(), event.size());
        }
        std::string done = "data: [DONE]\n\n";
        sink.write(done.data(), done.size());
        sink.done();
        return true;
      });
    };
  }

  static Handler Raw(std::string body) {
    return [=](const httplib::Request&, httplib::Response& res) { res.set_content(body, "application/json"); };
  }

  static Handler Slow(std::chrono::milliseconds delay, Handler then) {
    return [=](const httplib::Request& req, httplib::Response& res) {
      std::this_thread::sleep_for(delay);
      then(req, res);
    };
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  mutable std::mutex mu_;
  std::deque<Handler> script_;
  std::vector<Seen> seen_;
};

}  // namespace kforge::agent::testing
