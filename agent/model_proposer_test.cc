#include "agent/model_proposer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "agent/fake_openai_server.h"
#include "core/hash.h"
#include "agent/scripted_chat_client.h"
#include "kernels/catalog.h"

namespace kforge::agent {
namespace {

using testing::FakeOpenAIServer;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

ShapeKey Shape() {
  ShapeKey s;
  s.head_dim = 128;
  s.heads = 16;
  s.kv_heads = 4;
  s.causal = true;
  s.arch = "sm_90a";
  s.batch = 8;
  s.max_len_q = s.max_len_k = 3000;
  s.total_q = s.total_k = 12000;
  return s;
}

ProposalContext Ctx() {
  ProposalContext ctx;
  ctx.shape = Shape();
  ctx.bucket = BucketOf(ctx.shape);
  return ctx;
}

// A kernel that passes the static checks: the seed variant, made distinct.
ExtractedKernel GoodKernel(int variation = 0) {
  absl::StatusOr<Variant> v = DefaultVariant(Shape());
  EXPECT_TRUE(v.ok()) << v.status();
  return {v->source + fmt::format("\n// variation {}\n", variation), v->manifest_json};
}

std::string Fenced(const ExtractedKernel& k, std::string lang = "cuda") {
  return fmt::format("I unrolled the inner loop.\n\n```{}\n{}```\n\nManifest:\n```json\n{}\n```\n", lang, k.source,
                     k.manifest_json);
}

ModelOptions Options(const FakeOpenAIServer& server) {
  ModelOptions o;
  o.client.base_url = server.BaseUrl();
  o.client.model = "test-model";
  o.client.api_key_env = "";
  o.client.connect_timeout = 500ms;
  o.client.total_timeout = 5000ms;
  o.client.max_retries = 0;
  o.client.initial_backoff = 1ms;
  o.client.max_tokens = 4096;
  return o;
}

std::unique_ptr<Proposer> Make(const ModelOptions& o) {
  auto p = MakeModelProposer(o);
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

nlohmann::json Body(const FakeOpenAIServer& server, size_t i) {
  return nlohmann::json::parse(server.Requests().at(i).body);
}

std::string UserMessage(const FakeOpenAIServer& server, size_t i) {
  return Body(server, i)["messages"][1]["content"].get<std::string>();
}

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(ModelProposer, AcceptsAFencedAnswerAndRecordsPromptAnswerAndTokens) {
  FakeOpenAIServer server;
  const std::string answer = Fenced(GoodKernel());
  server.Then(FakeOpenAIServer::Answer(answer, 900, 300));
  auto p = Make(Options(server));
  EXPECT_EQ(p->Name(), "model");
  ProposalContext ctx = Ctx();
  ctx.anchors_us = {123.5};
  auto got = p->Propose(ctx, 1);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  const Candidate& c = (*got)[0];
  EXPECT_EQ(c.origin, "model");
  EXPECT_EQ(c.model, "fake-model");
  EXPECT_EQ(c.source, GoodKernel().source);
  EXPECT_EQ(nlohmann::json::parse(c.manifest_json), nlohmann::json::parse(GoodKernel().manifest_json));
  EXPECT_EQ(c.answer, answer);
  EXPECT_EQ(c.tokens_used, 1200);
  EXPECT_EQ(c.prompt_hash, Sha256Hex(c.prompt));
  // The stored prompt is exactly what was sent.
  EXPECT_EQ(nlohmann::json::parse(c.prompt), Body(server, 0)["messages"]);
  const std::string user = UserMessage(server, 0);
  EXPECT_THAT(user, HasSubstr(ctx.bucket.Id()));
  EXPECT_THAT(user, HasSubstr("sm_90a"));
  EXPECT_THAT(user, HasSubstr("123.5"));
  EXPECT_THAT(user, HasSubstr("seed variant"));  // nothing verified yet: the seed is the start
  const std::string system = Body(server, 0)["messages"][0]["content"].get<std::string>();
  EXPECT_THAT(system, HasSubstr(ContractText().substr(0, 200)));
  EXPECT_THAT(system, HasSubstr("struct KfAttnParams"));
  EXPECT_EQ(Body(server, 0)["tools"][0]["function"]["name"], "submit_kernel");
}

TEST(ModelProposer, AcceptsASubmitKernelToolCall) {
  FakeOpenAIServer server;
  ExtractedKernel k = GoodKernel(1);
  server.Then(FakeOpenAIServer::ToolCall(
      "submit_kernel", {{"source", k.source}, {"manifest", nlohmann::json::parse(k.manifest_json)}}, 500));
  auto got = Make(Options(server))->Propose(Ctx(), 1);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ((*got)[0].source, k.source);
  EXPECT_EQ((*got)[0].tokens_used, 500);
  EXPECT_THAT((*got)[0].answer, HasSubstr("[tool call submit_kernel]"));
}

TEST(ModelProposer, ShowsTheCurrentBestAndRecentFailures) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(2))));
  auto p = Make(Options(server));
  Feedback failed;
  failed.outcome = Outcome::kCompileError;
  failed.message = "error: identifier \"warp_sum\" is undefined" + std::string(5000, 'x');
  failed.candidate.origin = "model";
  p->Observe(failed);
  Feedback wrong;
  wrong.outcome = Outcome::kWrong;
  wrong.rel_l2_error = 0.25;
  wrong.message = "row 17 of sequence 3 differs";
  p->Observe(wrong);
  ProposalContext ctx = Ctx();
  Feedback best;
  best.variant_id = "v-best";
  best.outcome = Outcome::kVerified;
  best.median_us = 87.25;
  best.candidate.source = "extern \"C\" __global__ void kf_attn_fwd() { /* best one */ }";
  best.candidate.manifest_json = "{}";
  best.candidate.origin = "template";
  best.candidate.template_name = "fwd_mma";
  ctx.best = best;
  auto got = p->Propose(ctx, 1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].parent_id, "v-best");
  const std::string user = UserMessage(server, 0);
  EXPECT_THAT(user, HasSubstr("87.25 us"));
  EXPECT_THAT(user, HasSubstr("/* best one */"));
  EXPECT_THAT(user, HasSubstr("fwd_mma"));
  EXPECT_THAT(user, HasSubstr("warp_sum\" is undefined"));
  EXPECT_THAT(user, Not(HasSubstr(std::string(2000, 'x'))));  // excerpts only
  EXPECT_THAT(user, HasSubstr("relative L2 error 0.25"));
}

TEST(ModelProposer, WindowsLineEndingsBecomeUnixOnes) {
  ChatResponse answer;
  std::string fenced = Fenced(GoodKernel(5));
  std::string crlf;
  for (char c : fenced) {
    if (c == '\n') crlf += '\r';
    crlf += c;
  }
  answer.content = crlf;
  absl::StatusOr<ExtractedKernel> k = ExtractKernel(answer);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->source.find('\r'), std::string::npos);
  EXPECT_TRUE(ValidateKernel(*k, Ctx().shape, 64 * 1024).ok());
}

TEST(ModelProposer, FeedbackIsRedactedAndCappedBeforeItReachesAPrompt) {
  // A compile log that carried a file a hostile kernel included: tokens,
  // the endpoint's own key, control bytes.
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(4))));
  ModelOptions o = Options(server);
  o.client.api_key = "sk-the-endpoint-key-0123456789";
  o.feedback_excerpt_bytes = 600;
  auto p = Make(o);
  Feedback leaked;
  leaked.outcome = Outcome::kCompileError;
  leaked.message = std::string("kernel.cu(1): error: PATH=/usr/bin") + '\0' +
                   "KFORGE_CLIENT_TOKEN=c1ient-t0ken-value-abc" + '\0' +
                   "KFORGE_WORKER_TOKEN=w0rker-t0ken-value-def " +
                   "Authorization: Bearer b3arer-value-ghi and sk-the-endpoint-key-0123456789 " +
                   std::string(20000, 'y') + " tail of the log";
  p->Observe(leaked);
  auto got = p->Propose(Ctx(), 1);
  ASSERT_TRUE(got.ok()) << got.status();
  const std::string user = UserMessage(server, 0);
  for (const char* secret : {"c1ient-t0ken-value-abc", "w0rker-t0ken-value-def", "b3arer-value-ghi",
                             "sk-the-endpoint-key-0123456789"}) {
    EXPECT_THAT(user, Not(HasSubstr(secret)));
  }
  EXPECT_THAT(user, HasSubstr("[redacted]"));
  EXPECT_THAT(user, HasSubstr("tail of the log"));  // head and tail are kept
  EXPECT_THAT(user, Not(HasSubstr(std::string(1000, 'y'))));
}

TEST(ModelProposer, ARefusedAnswerBecomesFeedbackAndItsTokensAreCounted) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer("Sorry, I cannot write that kernel.", 400, 10));
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(3)), 500, 100));
  auto got = Make(Options(server))->Propose(Ctx(), 1);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ((*got)[0].tokens_used, 410 + 600);
  ASSERT_EQ(server.Requests().size(), 2u);
  const std::string second = UserMessage(server, 1);
  EXPECT_THAT(second, HasSubstr("refused before compiling"));
  EXPECT_THAT(second, HasSubstr("no ```cuda code block"));
  EXPECT_THAT(second, HasSubstr("Sorry, I cannot"));
}

TEST(ModelProposer, OnlyRefusedAnswersIsAnErrorNamingTheReason) {
  FakeOpenAIServer server;
  ExtractedKernel k = GoodKernel(4);
  k.source = "int main() { return 0; }\n" + k.source;
  server.Then(FakeOpenAIServer::Answer(Fenced(k)));
  ModelOptions o = Options(server);
  o.requests_per_candidate = 3;
  auto got = Make(o)->Propose(Ctx(), 1);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(got.status()), HasSubstr("main"));
  EXPECT_EQ(server.Requests().size(), 3u);
}

TEST(ModelProposer, SeveralCandidatesPerRoundAskForDifferentIdeas) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(20))));
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(21))));
  auto got = Make(Options(server))->Propose(Ctx(), 2);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), 2u);
  EXPECT_THAT(UserMessage(server, 0), Not(HasSubstr("different idea")));
  EXPECT_THAT(UserMessage(server, 1), HasSubstr("1 other variant(s) in this round"));
}

TEST(ModelProposer, NeverProposesTheSameSourceTwice) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(5))));
  auto p = Make(Options(server));
  auto first = p->Propose(Ctx(), 1);
  ASSERT_TRUE(first.ok()) << first.status();
  auto again = p->Propose(Ctx(), 1);  // the model repeats itself
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(again.status()), HasSubstr("identical to one proposed before"));

  // After a restart, remembered candidates count too.
  auto restarted = Make(Options(server));
  restarted->Remember((*first)[0]);
  EXPECT_FALSE(restarted->Propose(Ctx(), 1).ok());
}

TEST(ModelProposer, StopsAtTheSpendLimitWithoutARequest) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(6))));
  auto p = Make(Options(server));
  ProposalContext ctx = Ctx();
  ctx.tokens_left = 500;
  auto got = p->Propose(ctx, 1);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Msg(got.status()), HasSubstr("token budget exhausted"));
  EXPECT_EQ(server.Requests().size(), 0u);
}

TEST(ModelProposer, CapsTheAnswerAtTheBudgetAndCountsWithinACall) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(7)), 9000, 1500));
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(8)), 9000, 1500));
  auto p = Make(Options(server));
  ProposalContext ctx = Ctx();
  // Room for about one request: prompt (~9-10k tokens) + 2000 for the answer.
  auto probe_prompt_tokens = [&] {
    FakeOpenAIServer probe;
    probe.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(9))));
    auto q = Make(Options(probe));
    EXPECT_TRUE(q->Propose(Ctx(), 1).ok());
    return static_cast<int64_t>(probe.Requests()[0].body.size() / 4);
  };
  ctx.tokens_left = probe_prompt_tokens() + 2000;
  auto got = p->Propose(ctx, 3);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), 1u);  // the second request would go over the limit
  ASSERT_EQ(server.Requests().size(), 1u);
  int max_tokens = Body(server, 0)["max_tokens"];
  EXPECT_LE(max_tokens, 2200);
  EXPECT_GE(max_tokens, 1024);
}

TEST(ModelProposer, EndpointErrorsArePassedOn) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Status(500));
  auto got = Make(Options(server))->Propose(Ctx(), 2);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(got.status()), HasSubstr("model: "));
  EXPECT_THAT(Msg(got.status()), HasSubstr("HTTP 500"));
}

TEST(ModelProposer, KeepsThePromptWithinItsSizeLimit) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(10))));
  ModelOptions o = Options(server);
  o.max_prompt_bytes = 40 * 1024;
  auto p = Make(o);
  for (int i = 0; i < 20; ++i) {
    Feedback f;
    f.outcome = Outcome::kCrashed;
    f.message = std::string(3000, 'e');
    p->Observe(f);
  }
  ProposalContext ctx = Ctx();
  Feedback best;
  best.outcome = Outcome::kVerified;
  best.candidate.source = std::string(200 * 1024, 's');
  ctx.best = best;
  auto got = p->Propose(ctx, 1);
  ASSERT_TRUE(got.ok()) << got.status();
  size_t bytes = 0;
  const nlohmann::json body = Body(server, 0);
  for (const auto& m : body["messages"]) bytes += m["content"].get<std::string>().size();
  EXPECT_LE(bytes, o.max_prompt_bytes + 256);
  EXPECT_GT(bytes, o.max_prompt_bytes / 2);
}

// The static checks on an answer, one broken answer per case.
struct BrokenCase {
  const char* name;
  std::function<std::string()> answer;
  const char* reason;
};

class RefusesBrokenAnswers : public ::testing::TestWithParam<BrokenCase> {};

TEST_P(RefusesBrokenAnswers, WithAReasonBeforeAnyCompile) {
  ChatResponse r;
  r.content = GetParam().answer();
  r.finish_reason = "length";
  absl::StatusOr<ExtractedKernel> k = ExtractKernel(r);
  absl::Status s = k.ok() ? ValidateKernel(*k, Shape(), 64 * 1024) : k.status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << GetParam().name;
  EXPECT_THAT(Msg(s), HasSubstr(GetParam().reason));
}

ExtractedKernel With(std::string prefix, std::string suffix = "") {
  ExtractedKernel k = GoodKernel(100);
  k.source = prefix + k.source + suffix;
  return k;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RefusesBrokenAnswers,
    ::testing::Values(
        BrokenCase{"no code", [] { return std::string("Here is my idea: use more warps."); }, "no ```cuda code block"},
        BrokenCase{"no manifest", [] { return "```cuda\n" + GoodKernel().source + "```\n"; }, "no ```json manifest"},
        BrokenCase{"cut off", [] { return "```cuda\n" + GoodKernel().source; }, "ends inside a code block"},
        BrokenCase{"bad manifest json",
                   [] { return "```cuda\n" + GoodKernel().source + "```\n```json\n{\"threads\": 12\n```\n"; },
                   "manifest"},
        BrokenCase{"unknown manifest key",
                   [] {
                     auto m = nlohmann::json::parse(GoodKernel().manifest_json);
                     m["speed"] = "fast";
                     return "```cuda\n" + GoodKernel().source + "```\n```json\n" + m.dump() + "\n```\n";
                   },
                   "manifest"},
        BrokenCase{"missing entry point",
                   [] {
                     ExtractedKernel k = GoodKernel();
                     for (size_t at; (at = k.source.find("kf_attn_fwd")) != std::string::npos;)
                       k.source.replace(at, 11, "my_kernel__");
                     return Fenced(k);
                   },
                   "kf_attn_fwd"},
        BrokenCase{"int main", [] { return Fenced(With("", "int main() { return 0; }\n")); }, "main"},
        BrokenCase{"cudaMalloc", [] { return Fenced(With("", "void f() { void* p; cudaMalloc(&p, 4); }\n")); },
                   "cudaMalloc"},
        BrokenCase{"host include", [] { return Fenced(With("#include <stdio.h>\n")); }, "stdio.h"},
        BrokenCase{"host std", [] { return Fenced(With("", "__device__ std::vector<int> v;\n")); }, "std::"},
        BrokenCase{"system call", [] { return Fenced(With("", "__device__ void f() { system(\"rm -rf /\"); }\n")); },
                   "\"system\""},
        BrokenCase{"__host__", [] { return Fenced(With("", "__host__ void g() {}\n")); }, "__host__"},
        BrokenCase{"oversized", [] { return Fenced(With("", "// " + std::string(70 * 1024, 'z') + "\n")); },
                   "exceeds the limit of 65536"},
        BrokenCase{"empty source", [] { return "```cuda\n\n```\n```json\n" + GoodKernel().manifest_json + "\n```\n"; },
                   "source: empty"}),
    [](const ::testing::TestParamInfo<BrokenCase>& info) {
      std::string name = info.param.name;
      for (char& c : name)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      return name;
    });

TEST(ModelProposerExtract, AcceptsCppFencesAndComments) {
  ChatResponse r;
  ExtractedKernel k = GoodKernel(11);
  r.content = Fenced(With("// uses std:: nowhere; cuda::std::min is fine\n"), "cpp");
  auto got = ExtractKernel(r);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(ValidateKernel(*got, Shape(), 64 * 1024).ok()) << ValidateKernel(*got, Shape(), 64 * 1024);
}

TEST(ModelProposerExtract, TakesTheFullKernelNotASnippet) {
  ChatResponse r;
  ExtractedKernel k = GoodKernel(12);
  r.content = "The change:\n```cuda\n  acc += s * v;  // fused\n```\nFull source:\n" + Fenced(k) +
              "\nAnd a helper for reference:\n```cpp\n__global__ void tiny() {}\n```\n";
  auto got = ExtractKernel(r);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->source, k.source);
}

TEST(ModelProposerExtract, PrefersTheToolCall) {
  ChatResponse r;
  r.content = "no code here";
  r.tool_calls.push_back({"submit_kernel", R"({"source": "x", "manifest": "{\"threads\": 64}"})"});
  auto got = ExtractKernel(r);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->source, "x");
  EXPECT_EQ(got->manifest_json, R"({"threads": 64})");
  r.tool_calls[0].arguments_json = R"({"manifest": {}})";
  EXPECT_THAT(Msg(ExtractKernel(r).status()), HasSubstr("no \"source\""));
  r.tool_calls[0].name = "run_shell";
  EXPECT_THAT(Msg(ExtractKernel(r).status()), HasSubstr("unknown function \"run_shell\""));
}

// The same behaviours through both chat clients: the HTTP client against a
// loopback server, and the scripted client other components' tests use.
class HttpBackend {
 public:
  void Answer(std::string content, int prompt_tokens, int completion_tokens) {
    server_.Then(FakeOpenAIServer::Answer(std::move(content), prompt_tokens, completion_tokens));
  }
  std::unique_ptr<Proposer> Make() { return kforge::agent::Make(Options(server_)); }
  size_t Requests() const { return server_.Requests().size(); }
  std::string User(size_t i) const { return UserMessage(server_, i); }

 private:
  FakeOpenAIServer server_;
};

class ScriptedBackend {
 public:
  void Answer(std::string content, int prompt_tokens, int completion_tokens) {
    client_->ThenText(std::move(content), prompt_tokens, completion_tokens);
  }
  std::unique_ptr<Proposer> Make() { return MakeModelProposer(std::move(client_), ModelOptions{}); }
  size_t Requests() const { return log_->requests.size(); }
  std::string User(size_t i) const { return log_->requests.at(i).messages.at(1).content; }

 private:
  std::shared_ptr<ScriptedChatClient::Log> log_ = std::make_shared<ScriptedChatClient::Log>();
  std::unique_ptr<ScriptedChatClient> client_ = std::make_unique<ScriptedChatClient>(log_);
};

template <typename B>
class ModelProposerOn : public ::testing::Test {
 protected:
  B backend;
};
using Backends = ::testing::Types<HttpBackend, ScriptedBackend>;
TYPED_TEST_SUITE(ModelProposerOn, Backends);

TYPED_TEST(ModelProposerOn, AGoodAnswerIsACandidateWithItsPromptAndTokens) {
  this->backend.Answer(Fenced(GoodKernel(30)), 700, 300);
  auto p = this->backend.Make();
  auto got = p->Propose(Ctx(), 1);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ((*got)[0].tokens_used, 1000);
  EXPECT_EQ((*got)[0].prompt_hash, Sha256Hex((*got)[0].prompt));
  EXPECT_THAT((*got)[0].prompt, HasSubstr(Ctx().bucket.Id()));
  EXPECT_EQ(this->backend.Requests(), 1u);
}

TYPED_TEST(ModelProposerOn, ARefusalIsFeedbackForTheNextRequest) {
  this->backend.Answer("```cuda\n__global__ void k() {}\n```\n", 10, 10);
  this->backend.Answer(Fenced(GoodKernel(31)), 10, 10);
  auto got = this->backend.Make()->Propose(Ctx(), 1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].tokens_used, 40);
  ASSERT_EQ(this->backend.Requests(), 2u);
  EXPECT_THAT(this->backend.User(1), HasSubstr("no ```json manifest block"));
}

TYPED_TEST(ModelProposerOn, AnExhaustedBudgetMakesNoRequest) {
  this->backend.Answer(Fenced(GoodKernel(32)), 10, 10);
  ProposalContext ctx = Ctx();
  ctx.tokens_left = 0;
  auto got = this->backend.Make()->Propose(ctx, 1);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(this->backend.Requests(), 0u);
}

TEST(ModelOptionsJson, ReadsEveryKeyAndRejectsTypos) {
  auto o = ParseModelOptions(R"({"base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "K",
      "connect_timeout_ms": 5, "total_timeout_ms": 6, "max_retries": 2, "initial_backoff_ms": 7,
      "max_backoff_ms": 8, "max_tokens": 99, "temperature": 0.2, "max_source_bytes": 1000,
      "max_prompt_bytes": 2000, "requests_per_candidate": 5, "offer_tool": false, "stream": true})");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->client.base_url, "http://127.0.0.1:9/v1");
  EXPECT_EQ(o->client.model, "m");
  EXPECT_EQ(o->client.api_key_env, "K");
  EXPECT_EQ(o->client.connect_timeout, 5ms);
  EXPECT_EQ(o->client.total_timeout, 6ms);
  EXPECT_EQ(o->client.max_retries, 2);
  EXPECT_EQ(o->client.max_backoff, 8ms);
  EXPECT_EQ(o->client.max_tokens, 99);
  EXPECT_DOUBLE_EQ(*o->client.temperature, 0.2);
  EXPECT_EQ(o->max_source_bytes, 1000u);
  EXPECT_EQ(o->requests_per_candidate, 5);
  EXPECT_FALSE(o->offer_tool);
  EXPECT_TRUE(o->client.stream);
  EXPECT_THAT(Msg(ParseModelOptions(R"({"modle": "x"})").status()), HasSubstr("unknown key \"modle\""));
  EXPECT_THAT(Msg(ParseModelOptions(R"({"max_tokens": "many"})").status()), HasSubstr("max_tokens"));
  EXPECT_FALSE(ParseModelOptions("[1]").ok());
}

}  // namespace
}  // namespace kforge::agent
