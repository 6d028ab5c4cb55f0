#include "agent/openai_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace kforge::agent
