#include "agent/openai_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "agent/fake_openai_server.h"
#include "core/clock.h"

namespace kforge::agent {
namespace {

using testing::FakeOpenAIServer;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

OpenAIConfig Config(const FakeOpenAIServer& server) {
  OpenAIConfig c;
  c.base_url = server.BaseUrl();
  c.model = "test-model";
  c.api_key_env = "KFORGE_AGENT_TEST_KEY";
  c.connect_timeout = 500ms;
  c.total_timeout = 2000ms;
  c.max_retries = 3;
  c.initial_backoff = 10ms;
  c.max_backoff = 2000ms;
  c.max_tokens = 777;
  return c;
}

std::unique_ptr<ChatClient> Client(const OpenAIConfig& c) {
  auto client = MakeOpenAIClient(c);
  EXPECT_TRUE(client.ok()) << client.status();
  return *std::move(client);
}

ChatRequest Hello() {
  ChatRequest r;
  r.messages = {{"system", "be brief"}, {"user", "hello"}};
  return r;
}

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(OpenAIClient, SendsTheRequestAndReadsAnswerAndUsage) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer("hi there", 12, 3));
  setenv("KFORGE_AGENT_TEST_KEY", "sk-test", 1);
  auto got = Client(Config(server))->Complete(Hello());
  unsetenv("KFORGE_AGENT_TEST_KEY");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->content, "hi there");
  EXPECT_EQ(got->prompt_tokens, 12);
  EXPECT_EQ(got->completion_tokens, 3);
  EXPECT_EQ(got->total_tokens, 15);
  EXPECT_FALSE(got->usage_estimated);
  EXPECT_EQ(got->model, "fake-model");
  EXPECT_EQ(got->attempts, 1);
  auto seen = server.Requests();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].authorization, "Bearer sk-test");
  auto body = nlohmann::json::parse(seen[0].body);
  EXPECT_EQ(body["model"], "test-model");
  EXPECT_EQ(body["max_tokens"], 777);
  EXPECT_EQ(body["messages"][1]["content"], "hello");
  EXPECT_FALSE(body.contains("tools"));
}

TEST(OpenAIClient, KeyFromConfigWinsAndNoKeyMeansNoHeader) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer("ok"));
  OpenAIConfig c = Config(server);
  c.api_key = "sk-config";
  ASSERT_TRUE(Client(c)->Complete(Hello()).ok());
  c.api_key = "";
  ASSERT_TRUE(Client(c)->Complete(Hello()).ok());
  auto seen = server.Requests();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].authorization, "Bearer sk-config");
  EXPECT_EQ(seen[1].authorization, "");
}

TEST(OpenAIClient, ReadsToolCallsAndSendsTools) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::ToolCall("submit_kernel", {{"source", "x"}, {"manifest", {{"a", 1}}}}));
  ChatRequest r = Hello();
  r.tools.push_back(ChatTool{"submit_kernel", "submit", R"({"type":"object"})"});
  auto got = Client(Config(server))->Complete(r);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->tool_calls.size(), 1u);
  EXPECT_EQ(got->tool_calls[0].name, "submit_kernel");
  EXPECT_EQ(nlohmann::json::parse(got->tool_calls[0].arguments_json)["source"], "x");
  auto body = nlohmann::json::parse(server.Requests()[0].body);
  EXPECT_EQ(body["tools"][0]["function"]["name"], "submit_kernel");
}

TEST(OpenAIClient, MalformedJsonIsAnError) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Raw("{\"choices\": [ oops"));
  auto got = Client(Config(server))->Complete(Hello());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(Msg(got.status()), HasSubstr("not JSON"));
  EXPECT_EQ(server.Requests().size(), 1u);
}

TEST(OpenAIClient, EmptyChoicesIsAnError) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Raw(R"({"choices": [], "usage": {"total_tokens": 3}})"));
  auto got = Client(Config(server))->Complete(Hello());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(Msg(got.status()), HasSubstr("no choices"));
}

TEST(OpenAIClient, MissingUsageIsEstimated) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Raw(R"({"choices": [{"message": {"role": "assistant", "content": "0123456789abcdef"}}]})"));
  auto got = Client(Config(server))->Complete(Hello());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->usage_estimated);
  EXPECT_EQ(got->completion_tokens, 4);
  EXPECT_GT(got->prompt_tokens, 0);
  EXPECT_EQ(got->total_tokens, got->prompt_tokens + 4);
}

// The waits between attempts are on an injected clock: Complete runs on a
// thread, and the test moves time past each wait (and checks none is cut short).
class OpenAIClientRetry : public ::testing::Test {
 protected:
  void Start(FakeOpenAIServer& server) {
    OpenAIConfig c = Config(server);
    c.clock = &clock_;
    client_ = Client(c);
    thread_ = std::thread([this] { got_ = client_->Complete(Hello()); });
  }
  absl::StatusOr<ChatResponse> Finish() {
    thread_.join();
    return got_;
  }
  // The client waits `expected` before its next attempt, and makes none
  // while it waits.
  void ExpectWait(const FakeOpenAIServer& server, std::chrono::milliseconds expected) {
    ASSERT_TRUE(clock_.AwaitWaiters(1));
    EXPECT_EQ(clock_.NextDeadline(), expected);
    const size_t sent = server.Requests().size();
    clock_.Advance(expected - 1ms);
    ASSERT_TRUE(clock_.AwaitWaiters(1));
    EXPECT_EQ(server.Requests().size(), sent) << "retried before its wait";
    clock_.Advance(1ms);
  }
  ManualClock clock_;
  std::unique_ptr<ChatClient> client_;
  absl::StatusOr<ChatResponse> got_;
  std::thread thread_;
};

TEST_F(OpenAIClientRetry, HonoursRetryAfterOn429) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Status(429, R"({"error":"slow down"})", "1"));
  server.Then(FakeOpenAIServer::Answer("finally"));
  Start(server);
  ExpectWait(server, 1000ms);  // Retry-After: 1, not the 10 ms backoff
  auto got = Finish();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->content, "finally");
  EXPECT_EQ(got->attempts, 2);
  EXPECT_EQ(server.Requests().size(), 2u);
}

TEST(OpenAIClient, RetriesA500ThenSucceeds) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Status(500));
  server.Then(FakeOpenAIServer::Answer("ok"));
  auto got = Client(Config(server))->Complete(Hello());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->attempts, 2);
}

TEST_F(OpenAIClientRetry, GivesUpAfterTheRetriesWithBackoff) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Status(503));
  Start(server);
  for (auto backoff : {10ms, 20ms, 40ms}) ExpectWait(server, backoff);  // doubling
  auto got = Finish();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(got.status()), HasSubstr("HTTP 503"));
  EXPECT_THAT(Msg(got.status()), HasSubstr("gave up after 4 attempts"));
  EXPECT_EQ(server.Requests().size(), 4u);  // 1 + max_retries
}

TEST(OpenAIClient, Still429AfterRetriesIsUnavailable) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Status(429, "{}", "0"));
  OpenAIConfig c = Config(server);
  c.max_retries = 1;
  auto got = Client(c)->Complete(Hello());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(got.status()), HasSubstr("rate limited"));
  EXPECT_EQ(server.Requests().size(), 2u);
}

TEST(OpenAIClient, ClientErrorsAreNotRetried) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Status(401, R"({"error":"bad key"})"));
  server.Then(FakeOpenAIServer::Status(400, R"({"error":"max_tokens too large"})"));
  auto client = Client(Config(server));
  EXPECT_EQ(client->Complete(Hello()).status().code(), absl::StatusCode::kUnauthenticated);
  auto bad = client->Complete(Hello());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(bad.status()), HasSubstr("max_tokens too large"));
  EXPECT_EQ(server.Requests().size(), 2u);
}

TEST(OpenAIClient, SlowAnswerTimesOut) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Slow(400ms, FakeOpenAIServer::Answer("late")));
  OpenAIConfig c = Config(server);
  c.total_timeout = 100ms;
  auto start = std::chrono::steady_clock::now();
  auto got = Client(c)->Complete(Hello());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(Msg(got.status()), HasSubstr("100 ms"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 350ms);
  EXPECT_EQ(server.Requests().size(), 1u);  // not retried
}

TEST(OpenAIClient, NothingListeningIsUnavailable) {
  int port;
  {
    FakeOpenAIServer server;  // take a free port, then close it
    port = std::stoi(server.BaseUrl().substr(17, 5));
  }
  OpenAIConfig c;
  c.base_url = "http://127.0.0.1:" + std::to_string(port) + "/v1";
  c.model = "m";
  c.max_retries = 1;
  c.initial_backoff = 1ms;
  auto got = Client(c)->Complete(Hello());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
}

TEST(OpenAIClient, AssemblesAStreamedAnswer) {
  FakeOpenAIServer server;
  using nlohmann::json;
  auto delta = [](json d, json finish = nullptr) {
    return json{{"model", "fake-model"}, {"choices", {{{"index", 0}, {"delta", d}, {"finish_reason", finish}}}}};
  };
  server.Then(FakeOpenAIServer::Stream({
      delta({{"role", "assistant"}, {"content", ""}}),
      delta({{"content", "```cuda\n__global__"}}),
      delta({{"content", " void k() {}\n```"}}),
      delta({{"tool_calls", {{{"index", 0}, {"function", {{"name", "submit_kernel"}, {"arguments", "{\"sou"}}}}}}}),
      delta({{"tool_calls", {{{"index", 0}, {"function", {{"arguments", "rce\": \"x\"}"}}}}}}}, "stop"),
      json{{"choices", json::array()}, {"usage", {{"prompt_tokens", 7}, {"completion_tokens", 9}, {"total_tokens", 16}}}},
  }));
  OpenAIConfig c = Config(server);
  c.stream = true;
  auto got = Client(c)->Complete(Hello());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->content, "```cuda\n__global__ void k() {}\n```");
  ASSERT_EQ(got->tool_calls.size(), 1u);
  EXPECT_EQ(got->tool_calls[0].name, "submit_kernel");
  EXPECT_EQ(got->tool_calls[0].arguments_json, R"({"source": "x"})");
  EXPECT_EQ(got->finish_reason, "stop");
  EXPECT_EQ(got->total_tokens, 16);
  EXPECT_FALSE(got->usage_estimated);
  auto body = nlohmann::json::parse(server.Requests()[0].body);
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
}

TEST(OpenAIClient, StreamWithBrokenChunkIsAnError) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Raw("data: {\"choices\": [{\"delta\": {\"content\": \"a\"}}]}\n\ndata: {oops\n\n"));
  OpenAIConfig c = Config(server);
  c.stream = true;
  auto got = Client(c)->Complete(Hello());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(Msg(got.status()), HasSubstr("stream chunk is not JSON"));
}

TEST(OpenAIClient, RejectsABadConfig) {
  OpenAIConfig c;
  EXPECT_EQ(MakeOpenAIClient(c).status().code(), absl::StatusCode::kInvalidArgument);  // no model
}

namespace modern {

using Handler = FakeOpenAIServer::Handler;

// An endpoint in the manner of OpenAI's reasoning models: max_tokens and a
// temperature other than 1 are refused with a 400 naming the parameter.
Handler ReasoningEndpoint(std::string content = "ok") {
  return [content](const httplib::Request& req, httplib::Response& res) {
    auto body = nlohmann::json::parse(req.body);
    auto refuse = [&](const std::string& param, const std::string& message) {
      res.status = 400;
      res.set_content(nlohmann::json{{"error", {{"message", message}, {"type", "invalid_request_error"},
                                                {"param", param}, {"code", "unsupported_parameter"}}}}
                          .dump(),
                      "application/json");
    };
    if (body.contains("max_tokens"))
      return refuse("max_tokens", "Unsupported parameter: 'max_tokens' is not supported with this model. "
                                  "Use 'max_completion_tokens' instead.");
    if (body.contains("temperature") && body["temperature"] != 1)
      return refuse("temperature", "Unsupported value: 'temperature' does not support 0.7 with this model. "
                                   "Only the default (1) value is supported.");
    FakeOpenAIServer::Answer(content, 10, 5)(req, res);
  };
}

TEST(OpenAIClientModern, LearnsMaxCompletionTokensFromTheEndpointsRefusal) {
  FakeOpenAIServer server;
  server.Then(ReasoningEndpoint());
  OpenAIConfig c = Config(server);
  c.temperature = 0.7;
  auto client = Client(c);
  auto first = client->Complete(Hello());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->content, "ok");
  ASSERT_EQ(first->adaptations.size(), 2u);
  EXPECT_THAT(first->adaptations[0], HasSubstr("max_tokens -> max_completion_tokens"));
  EXPECT_THAT(first->adaptations[1], HasSubstr("temperature dropped"));
  EXPECT_EQ(first->attempts, 3);
  // Learned once for the client's life: the next request goes right.
  auto second = client->Complete(Hello());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->adaptations.empty());
  auto seen = server.Requests();
  ASSERT_EQ(seen.size(), 4u);
  auto last = nlohmann::json::parse(seen[3].body);
  EXPECT_EQ(last["max_completion_tokens"], 777);
  EXPECT_FALSE(last.contains("max_tokens"));
  EXPECT_FALSE(last.contains("temperature"));
}

TEST(OpenAIClientModern, ConfiguredLimitNameIsSentFirstAndSwitchedBackWhenRefused) {
  FakeOpenAIServer server;
  // An older server that knows only max_tokens, and says so in plain text.
  server.Then([](const httplib::Request& req, httplib::Response& res) {
    auto body = nlohmann::json::parse(req.body);
    if (body.contains("max_completion_tokens")) {
      res.status = 400;
      res.set_content("Unrecognized request argument supplied: max_completion_tokens", "text/plain");
      return;
    }
    FakeOpenAIServer::Answer("ok")(req, res);
  });
  OpenAIConfig c = Config(server);
  c.token_param = TokenParam::kMaxCompletionTokens;
  auto got = Client(c)->Complete(Hello());
  ASSERT_TRUE(got.ok()) << got.status();
  auto seen = server.Requests();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_TRUE(nlohmann::json::parse(seen[0].body).contains("max_completion_tokens"));
  EXPECT_EQ(nlohmann::json::parse(seen[1].body)["max_tokens"], 777);
}

TEST(OpenAIClientModern, BothLimitNamesRefusedIsAnErrorNotALoop) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Status(400, R"({"error":{"message":"Unsupported parameter: 'max_tokens'","param":"max_tokens"}})"));
  server.Then(FakeOpenAIServer::Status(
      400, R"({"error":{"message":"Unsupported parameter: 'max_completion_tokens'","param":"max_completion_tokens"}})"));
  auto got = Client(Config(server))->Complete(Hello());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(server.Requests().size(), 2u);
}

TEST(OpenAIClientModern, LearnsTheEndpointsStatedCompletionCap) {
  FakeOpenAIServer server;
  server.Then([](const httplib::Request& req, httplib::Response& res) {
    auto body = nlohmann::json::parse(req.body);
    if (body["max_tokens"].get<int>() > 500) {
      res.status = 400;
      res.set_content(R"({"error":{"message":"max_tokens is too large: 777. This model supports at most 500 completion tokens, whereas you provided 777.","param":"max_tokens"}})",
                      "application/json");
      return;
    }
    FakeOpenAIServer::Answer("ok")(req, res);
  });
  auto got = Client(Config(server))->Complete(Hello());
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->adaptations.size(), 1u);
  EXPECT_THAT(got->adaptations[0], HasSubstr("capped at 500"));
  EXPECT_EQ(nlohmann::json::parse(server.Requests().back().body)["max_tokens"], 500);
}

TEST(OpenAIClientModern, SendsReasoningEffortSeedAndNAndReadsEveryChoice) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Raw(R"({"model":"m","choices":[
      {"index":0,"message":{"role":"assistant","content":"first"},"finish_reason":"stop"},
      {"index":1,"message":{"role":"assistant","content":"second"},"finish_reason":"length"}],
      "usage":{"prompt_tokens":10,"completion_tokens":30,"total_tokens":40,
               "completion_tokens_details":{"reasoning_tokens":12}}})"));
  OpenAIConfig c = Config(server);
  c.reasoning_effort = "high";
  c.seed = 42;
  c.n = 3;
  ChatRequest r = Hello();
  r.seed = 7;  // the request's own wins
  r.n = 2;
  auto got = Client(c)->Complete(r);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->choices.size(), 2u);
  EXPECT_EQ(got->choices[0].content, "first");
  EXPECT_EQ(got->choices[1].content, "second");
  EXPECT_EQ(got->choices[1].finish_reason, "length");
  EXPECT_EQ(got->content, "first");
  EXPECT_EQ(got->reasoning_tokens, 12);
  auto body = nlohmann::json::parse(server.Requests()[0].body);
  EXPECT_EQ(body["reasoning_effort"], "high");
  EXPECT_EQ(body["seed"], 7);
  EXPECT_EQ(body["n"], 2);
}

TEST(OpenAIClientModern, RefusedOptionalParametersAreDroppedOneByOne) {
  FakeOpenAIServer server;
  // FastAPI-style validation errors (vLLM), naming the field by its location.
  server.Then([](const httplib::Request& req, httplib::Response& res) {
    auto body = nlohmann::json::parse(req.body);
    for (const char* p : {"reasoning_effort", "seed"}) {
      if (body.contains(p)) {
        res.status = 422;
        res.set_content(nlohmann::json{{"detail", {{{"loc", {"body", p}}, {"msg", "Extra inputs are not permitted"}}}}}.dump(),
                        "application/json");
        return;
      }
    }
    FakeOpenAIServer::Answer("ok")(req, res);
  });
  OpenAIConfig c = Config(server);
  c.reasoning_effort = "low";
  c.seed = 1;
  auto got = Client(c)->Complete(Hello());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->adaptations.size(), 2u);
  EXPECT_EQ(server.Requests().size(), 3u);
}

TEST(OpenAIClientModern, RequestsRunConcurrently) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Slow(400ms, FakeOpenAIServer::Answer("ok")));
  auto client = Client(Config(server));
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&] { ok += client->Complete(Hello()).ok() ? 1 : 0; });
  for (auto& t : threads) t.join();
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(ok.load(), 4);
  EXPECT_LT(took, 1200ms) << "four 400 ms answers one after another would take 1600 ms";
}

TEST(OpenAIClientModern, ACancelledRequestEndsWhileTheModelThinks) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Slow(1800ms, FakeOpenAIServer::Answer("late")));
  OpenAIConfig c = Config(server);
  c.total_timeout = 10000ms;
  auto client = Client(c);
  std::atomic<bool> cancelled{false};
  ChatRequest r = Hello();
  r.cancelled = &cancelled;
  std::thread canceller([&] {
    std::this_thread::sleep_for(100ms);
    cancelled = true;
  });
  const auto start = std::chrono::steady_clock::now();
  auto got = client->Complete(r);
  canceller.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled) << got.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1500ms);
}

TEST(OpenAIClientModern, UnsupportedParameterReadsTheCommonErrorShapes) {
  const std::vector<std::string> sent = {"max_tokens", "temperature", "n", "seed"};
  EXPECT_EQ(UnsupportedParameter(R"({"error":{"message":"x","param":"temperature"}})", sent), "temperature");
  EXPECT_EQ(UnsupportedParameter(R"({"error":{"message":"Unsupported parameter: 'max_tokens'"}})", sent), "max_tokens");
  EXPECT_EQ(UnsupportedParameter("unsupported param: 'n'", sent), "n");
  // Not refusals, or parameters not sent: nothing to learn.
  EXPECT_EQ(UnsupportedParameter(R"({"error":{"message":"prompt is too long"}})", sent), "");
  EXPECT_EQ(UnsupportedParameter("Unsupported parameter: reasoning_effort", sent), "");
  EXPECT_EQ(UnsupportedParameter("invalid input: not a string", sent), "");
}

}  // namespace modern

}  // namespace
}  // namespace kforge::agent
