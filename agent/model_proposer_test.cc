#include "agent/model_proposer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "agent/fake_openai_server.h"
#include "agent/normalize.h"
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
  // A real difference: a comment alone would normalize away (normalize.h).
  return {v->source + fmt::format("\n__device__ int kf_variation_{}() {{ return {}; }}\n", variation, variation),
          v->manifest_json};
}

Candidate GoodKernelCandidate(int variation) {
  ExtractedKernel k = GoodKernel(variation);
  Candidate c;
  c.source = k.source;
  c.manifest_json = k.manifest_json;
  c.origin = "model";
  c.model = "test-model";
  return c;
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
  ctx.anchors = {{"FlashAttention-2 varlen", 456.25}};
  auto got = p->Propose(ctx, 1);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  const Candidate& c = (*got)[0];
  EXPECT_EQ(c.origin, "model");
  EXPECT_EQ(c.model, "fake-model");
  EXPECT_EQ(c.kind, "fresh");
  EXPECT_EQ(c.attempt, 0);
  EXPECT_EQ(c.parent_id, "");  // the seed is not a stored variant
  EXPECT_EQ(c.source, GoodKernel().source);
  EXPECT_EQ(c.normalized_hash, NormalizedSourceHash(c.source));
  EXPECT_EQ(nlohmann::json::parse(c.manifest_json), nlohmann::json::parse(GoodKernel().manifest_json));
  EXPECT_EQ(c.answer, answer);
  EXPECT_EQ(c.tokens_used, 1200);
  EXPECT_EQ(c.prompt_hash, Sha256Hex(c.prompt));
  auto prov = nlohmann::json::parse(c.provenance_json);
  EXPECT_EQ(prov["answer_form"], "whole");
  EXPECT_EQ(prov["prompt_tokens"], 900);
  EXPECT_EQ(prov["purpose"], "propose");
  // The stored prompt is exactly what was sent.
  EXPECT_EQ(nlohmann::json::parse(c.prompt), Body(server, 0)["messages"]);
  const std::string user = UserMessage(server, 0);
  EXPECT_THAT(user, HasSubstr(ctx.bucket.Id()));
  EXPECT_THAT(user, HasSubstr("sm_90a"));
  EXPECT_THAT(user, HasSubstr("123.50 us"));
  EXPECT_THAT(user, HasSubstr("FlashAttention-2 varlen: 456.25 us"));
  EXPECT_THAT(user, HasSubstr("roofline floor of this shape"));
  EXPECT_THAT(user, HasSubstr("## Parent seed: the seed variant"));  // nothing verified yet
  const std::string system = Body(server, 0)["messages"][0]["content"].get<std::string>();
  EXPECT_THAT(system, HasSubstr(ContractText().substr(0, 200)));
  EXPECT_THAT(system, HasSubstr("struct KfAttnParams"));
  EXPECT_THAT(system, HasSubstr("<<<<<<< SEARCH"));
  EXPECT_EQ(Body(server, 0)["tools"][0]["function"]["name"], "submit_kernel");
  EXPECT_EQ(Body(server, 0)["tools"][1]["function"]["name"], "edit_kernel");
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

TEST(ModelProposer, TheServedBestIsAParentWithItsTimeAndRecentFailuresAreShown) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(2))));
  auto p = Make(Options(server));
  Feedback failed;
  failed.variant_id = "v3";
  failed.outcome = Outcome::kCompileError;
  failed.message = "error: identifier \"warp_sum\" is undefined" + std::string(5000, 'x');
  failed.candidate.origin = "template";  // not the model's: shown, not repaired
  p->Observe(failed);
  Feedback wrong;
  wrong.variant_id = "v4";
  wrong.outcome = Outcome::kWrong;
  wrong.rel_l2_error = 0.25;
  wrong.message = "O at row 17 of a sequence of 300 differs";
  wrong.candidate.origin = "template";
  p->Observe(wrong);
  ProposalContext ctx = Ctx();
  Feedback best;
  best.variant_id = "v-best";
  best.outcome = Outcome::kVerified;
  best.median_us = 87.25;
  best.registers = 168;
  best.candidate = GoodKernelCandidate(50);
  ctx.best = best;
  auto got = p->Propose(ctx, 1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].parent_id, "v-best");
  const std::string user = UserMessage(server, 0);
  EXPECT_THAT(user, HasSubstr("## Parent v-best"));
  EXPECT_THAT(user, HasSubstr("87.25 us"));
  EXPECT_THAT(user, HasSubstr("168 registers"));
  EXPECT_THAT(user, HasSubstr("kf_variation_50()"));
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

// For a deterministic backward bucket a kernel whose manifest does not say
// deterministic is refused before compiling, the reason naming the field
// (a recorded refusal the repair prompt shows, not an error); the catalog's
// deterministic seed passes, and the prompt's shape says what is asked.
TEST(ModelProposer, ADeterministicBucketRefusesAKernelThatIsNotDeterministic) {
  ShapeKey det = Shape();
  det.op = Op::kBackward;
  absl::StatusOr<Variant> plain = DefaultVariant(det);
  ASSERT_TRUE(plain.ok()) << plain.status();
  det.deterministic = true;
  absl::StatusOr<Variant> ordered = DefaultVariant(det);
  ASSERT_TRUE(ordered.ok()) << ordered.status();
  absl::Status refused = ValidateKernel({plain->source, plain->manifest_json}, det, 256 * 1024);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("deterministic"), std::string::npos) << refused;
  EXPECT_TRUE(ValidateKernel({ordered->source, ordered->manifest_json}, det, 256 * 1024).ok());
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

// ---------------------------------------------------------------- helpers

ModelEnvironment Env(const FakeOpenAIServer& server, const ModelOptions& o) {
  ModelEnvironment env;
  for (const ModelEntry& e : ModelsOf(o)) {
    auto client = MakeOpenAIClient(e.client);
    EXPECT_TRUE(client.ok()) << client.status();
    ModelEntry named = e;
    (void)server;
    env.clients.push_back(ModelClient{named, std::shared_ptr<ChatClient>(*std::move(client))});
  }
  return env;
}

// Calls to the engine's wake, and waiting for them.
struct Wakes {
  std::mutex mu;
  std::condition_variable cv;
  int count = 0;
  std::function<void()> Fn() {
    return [this] {
      std::lock_guard lock(mu);
      ++count;
      cv.notify_all();
    };
  }
  bool WaitFor(int n, std::chrono::milliseconds timeout = 10s) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, timeout, [&] { return count >= n; });
  }
};

// An asynchronous proposer driven as the engine drives it: Propose after
// every wake until `n` candidates came or it fails or goes idle.
absl::StatusOr<std::vector<Candidate>> Drain(Proposer& p, Wakes& wakes, const ProposalContext& ctx, int n,
                                             std::chrono::milliseconds timeout = 15s) {
  std::vector<Candidate> all;
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (static_cast<int>(all.size()) < n && std::chrono::steady_clock::now() < until) {
    int seen;
    {
      std::lock_guard lock(wakes.mu);
      seen = wakes.count;
    }
    // As the engine does: the bucket's budget less what was proposed.
    ProposalContext now = ctx;
    if (now.variants_left >= 0) now.variants_left -= static_cast<int>(all.size());
    auto got = p.Propose(now, n - static_cast<int>(all.size()));
    if (!got.ok()) {
      if (!all.empty()) return all;
      return got.status();
    }
    for (Candidate& c : *got) all.push_back(std::move(c));
    if (static_cast<int>(all.size()) >= n) break;
    if (!p.Busy()) {
      if (got->empty()) break;
      continue;  // ask again: it may start more, or say why not
    }
    wakes.WaitFor(seen + 1, std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()));
  }
  return all;
}

Feedback Failed(const std::string& id, Outcome outcome, Candidate c, std::string message) {
  Feedback f;
  f.variant_id = id;
  f.outcome = outcome;
  f.candidate = std::move(c);
  f.message = std::move(message);
  return f;
}

// A handler answering a fresh distinct kernel to every request.
FakeOpenAIServer::Handler Distinct(std::shared_ptr<std::atomic<int>> next, int prompt_tokens = 100,
                                   int completion_tokens = 50) {
  return [=](const httplib::Request& req, httplib::Response& res) {
    FakeOpenAIServer::Answer(Fenced(GoodKernel(1000 + (*next)++)), prompt_tokens, completion_tokens)(req, res);
  };
}

// ------------------------------------------------------------------ repairs

struct SharedLedger {
  std::unique_ptr<SpendLog> log = MakeInMemorySpendLog();
  std::shared_ptr<SpendLedger> ledger;
  explicit SharedLedger(SpendLedgerOptions o = {}) : ledger(std::make_shared<SpendLedger>(log.get(), o)) {}
};


TEST(ModelProposerRepair, ACompileErrorIsSentBackWithTheFailingSourceAndTheLog) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(60))));
  auto p = Make(Options(server));
  Candidate broken = GoodKernelCandidate(61);
  broken.source += "__device__ int oops() { return bogus; }\n";
  broken.kind = "fresh";
  p->Observe(Failed("v7", Outcome::kCompileError, broken,
                    "nvrtc: compilation failed\nkernel.cu(412): error: identifier \"bogus\" is undefined\n"
                    "--- full log ---\nptxas info : Used 99 registers"));
  auto got = p->Propose(Ctx(), 1);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  const Candidate& fix = (*got)[0];
  EXPECT_EQ(fix.kind, "repair");
  EXPECT_EQ(fix.attempt, 1);
  EXPECT_EQ(fix.parent_id, "v7");
  auto prov = nlohmann::json::parse(fix.provenance_json);
  EXPECT_EQ(prov["repair_of"], "v7");
  EXPECT_THAT(prov["repair_class"].get<std::string>(), HasSubstr("compile error"));
  const std::string user = UserMessage(server, 0);
  EXPECT_THAT(user, HasSubstr("Your variant v7 failed: compile error"));
  EXPECT_THAT(user, HasSubstr("repair attempt 1 of 3"));
  EXPECT_THAT(user, HasSubstr(broken.source));  // its own source, whole
  EXPECT_THAT(user, HasSubstr("identifier \"bogus\" is undefined"));
  EXPECT_THAT(user, HasSubstr("ptxas info : Used 99 registers"));
  EXPECT_THAT(user, Not(HasSubstr("## Parent")));
}

TEST(ModelProposerRepair, AWrongResultSendsTheErrorClassAndSize) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(62))));
  auto p = Make(Options(server));
  Feedback f = Failed("v8", Outcome::kWrong, GoodKernelCandidate(63),
                      "O at row 17 of a sequence of 300, head 2, dim 5: got 1.5, want -0.25");
  f.rel_l2_error = 0.31;
  f.max_abs_error = 2.5;
  f.registers = 128;
  f.spill_bytes = 16;
  p->Observe(f);
  ASSERT_TRUE(p->Propose(Ctx(), 1).ok());
  const std::string user = UserMessage(server, 0);
  EXPECT_THAT(user, HasSubstr("Your variant v8 failed: wrong result"));
  EXPECT_THAT(user, HasSubstr("relative L2 error 0.31, max abs error 2.5"));
  EXPECT_THAT(user, HasSubstr("row 17 of a sequence of 300"));
  EXPECT_THAT(user, HasSubstr("ptxas: 128 registers/thread, 16 bytes spilled"));
}

TEST(ModelProposerRepair, RepairsStopAfterTheLastAttempt) {
  FakeOpenAIServer server;
  auto next = std::make_shared<std::atomic<int>>(0);
  server.Then(Distinct(next));
  ModelOptions o = Options(server);
  o.max_repair_attempts = 2;
  auto p = Make(o);
  Candidate last = GoodKernelCandidate(64);
  last.attempt = 2;  // already the second repair
  p->Observe(Failed("v9", Outcome::kCrashed, last, "CUDA_ERROR_ILLEGAL_ADDRESS"));
  ASSERT_TRUE(p->Propose(Ctx(), 1).ok());
  EXPECT_THAT(UserMessage(server, 0), HasSubstr("## Parent seed"));
  Candidate one = GoodKernelCandidate(65);
  one.attempt = 1;
  p->Observe(Failed("v10", Outcome::kTimeout, one, "killed at the time limit"));
  ASSERT_TRUE(p->Propose(Ctx(), 1).ok());
  EXPECT_THAT(UserMessage(server, 1), HasSubstr("repair attempt 2 of 2"));
  EXPECT_THAT(UserMessage(server, 1), HasSubstr("timed out"));
}

TEST(ModelProposerRepair, TemplateFailuresAreNotSentToTheModel) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(66))));
  auto p = Make(Options(server));
  Candidate t = GoodKernelCandidate(67);
  t.origin = "template";
  p->Observe(Failed("v11", Outcome::kCompileError, t, "error"));
  ASSERT_TRUE(p->Propose(Ctx(), 1).ok());
  EXPECT_THAT(UserMessage(server, 0), Not(HasSubstr("repair attempt")));
}

TEST(ModelProposerRepair, ARefusedDraftIsRepairedAtOnceAndEveryCallIsRecordedWithItsParent) {
  FakeOpenAIServer server;
  ExtractedKernel bad = GoodKernel(68);
  bad.source = "int main() { return 0; }\n" + bad.source;
  server.Then(FakeOpenAIServer::Answer(Fenced(bad), 400, 10));
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(69)), 500, 100));
  ModelOptions o = Options(server);
  ModelEnvironment env = Env(server, o);
  SharedLedger shared;
  env.ledger = shared.ledger;
  auto p = MakeModelProposer(std::move(env), o);
  ProposalContext ctx = Ctx();
  ctx.job_id = "j1";
  auto got = p->Propose(ctx, 1);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  const Candidate& c = (*got)[0];
  EXPECT_EQ(c.kind, "repair");
  EXPECT_EQ(c.attempt, 1);
  EXPECT_EQ(c.parent_id, "");  // the draft derived from the seed
  EXPECT_EQ(nlohmann::json::parse(c.provenance_json)["repair_of"], "call1");
  EXPECT_EQ(c.tokens_used, 410 + 600);
  ASSERT_EQ(server.Requests().size(), 2u);
  const std::string repair = UserMessage(server, 1);
  EXPECT_THAT(repair, HasSubstr("Your variant call1 failed: refused before compiling"));
  EXPECT_THAT(repair, HasSubstr("int main() { return 0; }"));  // the draft itself
  EXPECT_THAT(repair, HasSubstr("main"));
  auto spent = shared.ledger->JobSpent("j1");
  ASSERT_TRUE(spent.ok());
  EXPECT_EQ(spent->calls, 2);
  EXPECT_EQ(spent->tokens, 1010);
}

TEST(ModelProposerRepair, ReplayedRepairsAreNotAskedForAgain) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(70))));
  auto p = Make(Options(server));
  Candidate failed = GoodKernelCandidate(71);
  Candidate its_repair = GoodKernelCandidate(72);
  its_repair.kind = "repair";
  its_repair.attempt = 1;
  its_repair.parent_id = "v12";
  // The order a restart replays: the failed one's result, then its repair.
  p->Remember(failed);
  p->Observe(Failed("v12", Outcome::kCompileError, failed, "error"));
  p->Remember(its_repair);
  ASSERT_TRUE(p->Propose(Ctx(), 1).ok());
  EXPECT_THAT(UserMessage(server, 0), Not(HasSubstr("repair attempt")));
}

TEST(ModelProposerRepair, DiagnosticsAreRedactedBeforeTheyReachAPrompt) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(73))));
  ModelOptions o = Options(server);
  o.client.api_key = "sk-the-endpoint-key-0123456789";
  o.diagnostics_bytes = 2000;
  auto p = Make(o);
  p->Observe(Failed("v13", Outcome::kCompileError, GoodKernelCandidate(74),
                    std::string("kernel.cu(1): error: KFORGE_WORKER_TOKEN=w0rker-t0ken-value-def ") +
                        "Authorization: Bearer b3arer-value-ghi sk-the-endpoint-key-0123456789 " +
                        std::string(20000, 'y') + " tail of the log"));
  ASSERT_TRUE(p->Propose(Ctx(), 1).ok());
  const std::string user = UserMessage(server, 0);
  for (const char* secret : {"w0rker-t0ken-value-def", "b3arer-value-ghi", "sk-the-endpoint-key-0123456789"})
    EXPECT_THAT(user, Not(HasSubstr(secret)));
  EXPECT_THAT(user, HasSubstr("tail of the log"));
  EXPECT_THAT(user, Not(HasSubstr(std::string(2500, 'y'))));
}

// -------------------------------------------------------------------- edits

std::string SeedSource() { return DefaultVariant(Shape())->source; }

constexpr char kBlockEdit[] =
    "Smaller key blocks.\nparent: seed\n<<<<<<< SEARCH\n#define KF_BLOCK_M 128\n#define KF_BLOCK_N 128\n=======\n"
    "#define KF_BLOCK_M 128\n#define KF_BLOCK_N 64\n>>>>>>> REPLACE\n";

TEST(ModelProposerEdits, SearchReplaceEditsOfTheNamedParentApply) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer(kBlockEdit));
  auto got = Make(Options(server))->Propose(Ctx(), 1);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  std::string want = SeedSource();
  want.replace(want.find("#define KF_BLOCK_N 128\n"), 23, "#define KF_BLOCK_N 64\n");
  EXPECT_EQ((*got)[0].source, want);
  EXPECT_EQ((*got)[0].manifest_json, DefaultVariant(Shape())->manifest_json);  // the parent's
  auto prov = nlohmann::json::parse((*got)[0].provenance_json);
  EXPECT_EQ(prov["answer_form"], "edits");
  EXPECT_EQ(prov["edits_of"], "seed");
}

TEST(ModelProposerEdits, TheEditToolWorksToo) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::ToolCall(
      "edit_kernel", {{"parent", "seed"},
                      {"edits", {{{"search", "#define KF_BLOCK_M 128\n#define KF_BLOCK_N 128\n"},
                                  {"replace", "#define KF_BLOCK_M 128\n#define KF_BLOCK_N 96\n"}}}}}));
  auto got = Make(Options(server))->Propose(Ctx(), 1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT((*got)[0].source, HasSubstr("#define KF_BLOCK_N 96\n"));
}

TEST(ModelProposerEdits, EditsThatDoNotApplyAreRepairedWithTheReason) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer(
      "parent: seed\n<<<<<<< SEARCH\nthis line is not there\n=======\nx\n>>>>>>> REPLACE\n"));
  server.Then(FakeOpenAIServer::Answer(kBlockEdit));
  auto got = Make(Options(server))->Propose(Ctx(), 1);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(server.Requests().size(), 2u);
  const std::string repair = UserMessage(server, 1);
  EXPECT_THAT(repair, HasSubstr("edits of seed: edit 1: the SEARCH text is not in the parent"));
  EXPECT_THAT(repair, HasSubstr(SeedSource().substr(0, 300)));  // the source the edits were for
  EXPECT_EQ((*got)[0].kind, "repair");
}

TEST(ModelProposerEdits, EditsOfASourceNotShownAreRefused) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer("parent: v999\n<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n"));
  ModelOptions o = Options(server);
  o.max_repair_attempts = 0;
  auto got = Make(o)->Propose(Ctx(), 1);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(got.status()), HasSubstr("parent \"v999\", which is not one of the sources shown (seed)"));
}

TEST(ModelProposerEdits, AnAnswerCutOffAtItsLimitIsAskedForEdits) {
  FakeOpenAIServer server;
  nlohmann::json cut = {{"model", "m"},
                        {"choices", {{{"index", 0},
                                      {"message", {{"role", "assistant"}, {"content", "```cuda\n" + SeedSource().substr(0, 4000)}}},
                                      {"finish_reason", "length"}}}},
                        {"usage", {{"prompt_tokens", 10}, {"completion_tokens", 4096}, {"total_tokens", 4106}}}};
  server.Then(FakeOpenAIServer::Raw(cut.dump()));
  server.Then(FakeOpenAIServer::Answer(kBlockEdit));
  ASSERT_TRUE(Make(Options(server))->Propose(Ctx(), 1).ok());
  ASSERT_EQ(server.Requests().size(), 2u);
  EXPECT_THAT(UserMessage(server, 1), HasSubstr("cut off at the completion limit"));
  EXPECT_THAT(UserMessage(server, 1), HasSubstr("SEARCH/REPLACE"));
}

// ------------------------------------------------------------------- dedupe

TEST(ModelProposerDedupe, ACommentOrWhitespaceChangeIsADuplicateNeverCompiledAgain) {
  FakeOpenAIServer server;
  ExtractedKernel k = GoodKernel(75);
  ExtractedKernel restyled = k;
  restyled.source = "// the same kernel, reformatted\n" + k.source;
  for (size_t at = 0; (at = restyled.source.find("  ", at)) != std::string::npos;) restyled.source.erase(at, 1);
  server.Then(FakeOpenAIServer::Answer(Fenced(k)));
  server.Then(FakeOpenAIServer::Answer(Fenced(restyled)));
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(76))));
  auto p = Make(Options(server));
  auto first = p->Propose(Ctx(), 1);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = p->Propose(Ctx(), 1);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->size(), 1u);
  EXPECT_EQ((*second)[0].source, GoodKernel(76).source);
  ASSERT_EQ(server.Requests().size(), 3u);
  EXPECT_THAT(UserMessage(server, 2), HasSubstr("apart from comments and whitespace"));
  EXPECT_THAT(UserMessage(server, 2), Not(HasSubstr("repair attempt")));  // a duplicate is not broken

  // After a restart, remembered candidates count too.
  FakeOpenAIServer again;
  again.Then(FakeOpenAIServer::Answer(Fenced(restyled)));
  auto restarted = Make(Options(again));
  restarted->Remember((*first)[0]);
  auto got = restarted->Propose(Ctx(), 1);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(got.status()), HasSubstr("apart from comments and whitespace"));
}

TEST(ModelProposerDedupe, TheSeedShownAsTheParentIsADuplicateApartFromComments) {
  // No variant of the bucket is known (a first proposal, or the first after a
  // restart whose store holds no timed program): the parent shown is the seed,
  // and the seed with a comment added is no new program.
  absl::StatusOr<Variant> seed = DefaultVariant(Shape());
  ASSERT_TRUE(seed.ok()) << seed.status();
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer(
      Fenced(ExtractedKernel{"// A cleaner version of the kernel.\n\n" + seed->source, seed->manifest_json})));
  ModelOptions o = Options(server);
  o.max_consecutive_refusals = 1;
  o.requests_per_candidate = 1;
  auto got = Make(o)->Propose(Ctx(), 1);
  ASSERT_EQ(server.Requests().size(), 1u);
  EXPECT_THAT(UserMessage(server, 0), HasSubstr("## Parent seed"));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
  EXPECT_THAT(Msg(got.status()), HasSubstr("the same as seed apart from comments and whitespace"));
}

TEST(ModelProposerDedupe, TheSharedDatabaseKnowsOtherJobsSources) {
  FakeOpenAIServer server;
  ExtractedKernel k = GoodKernel(77);
  server.Then(FakeOpenAIServer::Answer(Fenced(ExtractedKernel{k.source + "\n\n// again\n", k.manifest_json})));
  ModelOptions o = Options(server);
  o.max_consecutive_refusals = 1;
  o.requests_per_candidate = 1;
  ModelEnvironment env = Env(server, o);
  env.programs = std::make_shared<ProgramDatabase>();
  ProgramRecord other_job{"v5", k.source, k.manifest_json, "model", "", "", "m", "", "fresh", ""};
  ProgramResult r;
  r.bucket = Ctx().bucket.Id();
  r.outcome = Outcome::kWrong;  // evaluated there, whatever became of it
  env.programs->Add(other_job, r);
  auto got = MakeModelProposer(std::move(env), o)->Propose(Ctx(), 1);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(got.status()), HasSubstr("the same as v5 apart from comments"));
}

TEST(ModelProposerDedupe, AResultWithAnotherVariantsCubinIsReported) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(78))));
  auto p = Make(Options(server));
  Feedback a;
  a.variant_id = "v20";
  a.outcome = Outcome::kCompiled;
  a.cubin_hash = "abc";
  a.candidate = GoodKernelCandidate(79);
  Feedback b = a;
  b.variant_id = "v21";
  b.candidate = GoodKernelCandidate(80);
  p->Observe(a);
  p->Observe(b);
  ASSERT_TRUE(p->Propose(Ctx(), 1).ok());
  EXPECT_THAT(UserMessage(server, 0), HasSubstr("v21 compiled to the same binary as v20"));
}

// --------------------------------------------------------- program database

TEST(ModelProposerDatabase, ParentsAndInspirationsComeFromTheDatabaseWithTimesAndResources) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(81))));
  ModelOptions o = Options(server);
  ModelEnvironment env = Env(server, o);
  ProgramDbOptions dbo;
  dbo.islands = 1;
  dbo.exploit = 1;  // always the best elite
  env.programs = std::make_shared<ProgramDatabase>(dbo);
  const std::string bucket = Ctx().bucket.Id();
  int n = 0;
  for (int block_n : {64, 96, 128}) {
    auto v = Instantiate("fwd_sm90", {{"BLOCK_N", block_n}}, 128);
    ASSERT_TRUE(v.ok()) << v.status();
    ProgramRecord p{fmt::format("v{}", 30 + n), v->source, v->manifest_json, "template", "fwd_sm90",
                    fmt::format(R"({{"BLOCK_N":{}}})", block_n), "", "", "", ""};
    ProgramResult r;
    r.bucket = bucket;
    r.outcome = Outcome::kVerified;
    r.median_us = 200 + 50 * n;  // v30 fastest
    r.registers = 128 + n;
    r.dynamic_smem_bytes = 100000;
    env.programs->Add(p, r);
    ++n;
  }
  auto got = MakeModelProposer(std::move(env), o)->Propose(Ctx(), 1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].parent_id, "v30");
  auto prov = nlohmann::json::parse((*got)[0].provenance_json);
  EXPECT_EQ(prov["inspirations"].size(), 2u);
  EXPECT_THAT(prov["selection"].get<std::string>(), HasSubstr("best elite"));
  const std::string user = UserMessage(server, 0);
  EXPECT_THAT(user, HasSubstr("## Parent v30: template fwd_sm90"));
  EXPECT_THAT(user, HasSubstr("median 200.00 us"));
  EXPECT_THAT(user, HasSubstr("ptxas: 128 registers/thread"));
  EXPECT_THAT(user, HasSubstr("## Inspirations"));
  EXPECT_THAT(user, HasSubstr("as a change of v30"));
  EXPECT_THAT(user, HasSubstr("```diff"));
  EXPECT_THAT(user, HasSubstr("best template setting so far: fwd_sm90"));
  EXPECT_THAT(user, HasSubstr("of its floor's speed"));
}

// ------------------------------------------------------------- concurrency

TEST(ModelProposerAsync, ProposeNeverBlocksAndTheWakeSaysWhenAnswersCame) {
  FakeOpenAIServer server;
  auto next = std::make_shared<std::atomic<int>>(0);
  server.Then(FakeOpenAIServer::Slow(300ms, Distinct(next)));
  auto p = Make(Options(server));
  Wakes wakes;
  EXPECT_TRUE(p->SetWake(wakes.Fn()));
  ProposalContext ctx = Ctx();
  ctx.variants_left = 2;
  const auto start = std::chrono::steady_clock::now();
  auto first = p->Propose(ctx, 2);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 200ms);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->empty());
  EXPECT_TRUE(p->Busy());
  ASSERT_TRUE(wakes.WaitFor(1));
  auto all = Drain(*p, wakes, ctx, 2);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 2u);
  EXPECT_EQ(server.Requests().size(), 2u);  // no more than the bucket's budget
}

TEST(ModelProposerAsync, RequestsRunInParallelUpToTheLimit) {
  FakeOpenAIServer server;
  auto next = std::make_shared<std::atomic<int>>(0);
  server.Then(FakeOpenAIServer::Slow(500ms, Distinct(next)));
  ModelOptions o = Options(server);
  o.parallelism = 3;
  auto p = Make(o);
  Wakes wakes;
  p->SetWake(wakes.Fn());
  ProposalContext ctx = Ctx();
  ctx.variants_left = 10;
  ASSERT_TRUE(p->Propose(ctx, 1).ok());
  std::this_thread::sleep_for(250ms);
  auto seen = server.Requests();
  ASSERT_EQ(seen.size(), 3u) << "three requests in flight at once";
  EXPECT_LT(seen[2].at - seen[0].at, 200ms);
  auto all = Drain(*p, wakes, ctx, 6);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 6u);
}

// -------------------------------------------------------------------- spend

TEST(ModelProposerSpend, AJobsTokenLimitHoldsWithRequestsInFlight) {
  FakeOpenAIServer server;
  auto next = std::make_shared<std::atomic<int>>(0);
  server.Then(FakeOpenAIServer::Slow(50ms, Distinct(next, 15000, 2000)));
  ModelOptions o = Options(server);
  o.client.max_tokens = 2000;
  o.min_completion_tokens = 500;
  o.parallelism = 4;
  SharedLedger shared;
  ModelEnvironment env = Env(server, o);
  env.ledger = shared.ledger;
  auto p = MakeModelProposer(std::move(env), o);
  Wakes wakes;
  p->SetWake(wakes.Fn());
  ProposalContext ctx = Ctx();
  ctx.job_id = "j1";
  ctx.max_tokens = 100000;
  ctx.variants_left = 1000;
  auto all = Drain(*p, wakes, ctx, 1000, 20s);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_GE(all->size(), 2u);
  auto last = p->Propose(ctx, 1);
  EXPECT_EQ(last.status().code(), absl::StatusCode::kResourceExhausted) << last.status();
  EXPECT_THAT(Msg(last.status()), HasSubstr("budget"));
  auto spent = shared.ledger->JobSpent("j1");
  ASSERT_TRUE(spent.ok());
  EXPECT_LE(spent->tokens, 100000);
  EXPECT_EQ(spent->calls, static_cast<int64_t>(server.Requests().size()));
  int64_t reported = 0;
  for (const Candidate& c : *all) reported += c.tokens_used;
  EXPECT_EQ(reported, spent->tokens);  // every token is on some candidate
}

TEST(ModelProposerSpend, TheServerLimitSpansJobsAndCostIsEstimatedFromPrices) {
  FakeOpenAIServer server;
  auto next = std::make_shared<std::atomic<int>>(0);
  server.Then(Distinct(next, 10'000, 1'000));  // $1.10 a call at the prices below
  ModelOptions o = Options(server);
  o.price = {100.0, 100.0};
  o.client.max_tokens = 1000;
  o.min_completion_tokens = 100;
  SpendLedgerOptions lo;
  // For the whole server: one call's reservation fits, and after that call
  // ($1.10 spent) a second reservation does not. A reservation is the prompt's
  // estimate (about 26k tokens with today's seed kernel in it, $2.60) plus the
  // least answer, so the limit lies in [2.6, 3.7); the seed kernel may grow or
  // shrink by a few thousand tokens before this needs moving.
  lo.server = {0, 3.2};
  SharedLedger shared(lo);
  auto make = [&] {
    ModelEnvironment env = Env(server, o);
    env.ledger = shared.ledger;
    return MakeModelProposer(std::move(env), o);
  };
  ProposalContext ctx = Ctx();
  ctx.job_id = "j1";
  auto a = make()->Propose(ctx, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_NEAR((*a)[0].cost_usd, 1.1, 1e-9);
  ctx.job_id = "j2";
  auto b = make()->Propose(ctx, 1);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << b.status();
  ctx.job_id = "j3";
  ctx.max_cost_usd = 0.0001;  // a job's own cost limit
  auto c = make()->Propose(ctx, 1);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(server.Requests().size(), 1u);
  EXPECT_NEAR(shared.ledger->ServerSpent()->cost_usd, 1.1, 1e-9);
}

// ------------------------------------------------------------------- models

TEST(ModelProposerModels, TheCheapModelProposesAndTheStrongOneRepairs) {
  auto mini_log = std::make_shared<ScriptedChatClient::Log>();
  auto big_log = std::make_shared<ScriptedChatClient::Log>();
  auto mini = std::make_shared<ScriptedChatClient>(mini_log);
  auto big = std::make_shared<ScriptedChatClient>(big_log);
  mini->ThenText(Fenced(GoodKernel(82)));
  big->ThenText(Fenced(GoodKernel(83)));
  ModelOptions o;
  o.escalate_after = 1;
  ModelEnvironment env;
  ModelEntry cheap;
  cheap.name = "mini";
  cheap.weight = 1;
  ModelEntry strong;
  strong.name = "big";
  strong.weight = 0;
  strong.strong = true;
  env.clients = {ModelClient{cheap, mini}, ModelClient{strong, big}};
  auto p = MakeModelProposer(std::move(env), o);
  auto fresh = p->Propose(Ctx(), 1);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(mini_log->requests.size(), 1u);
  EXPECT_EQ(big_log->requests.size(), 0u);
  EXPECT_EQ(nlohmann::json::parse((*fresh)[0].provenance_json)["model"], "mini");
  Candidate failed = (*fresh)[0];
  p->Observe(Failed("v40", Outcome::kWrong, failed, "O at row 3 of a sequence of 5: got 1, want 2"));
  auto fixed = p->Propose(Ctx(), 1);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ(big_log->requests.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse((*fixed)[0].provenance_json)["model"], "big");
}

TEST(ModelProposerModels, SeveralChoicesOfOneRequestAreSeveralCandidates) {
  FakeOpenAIServer server;
  nlohmann::json two = {
      {"model", "m"},
      {"choices",
       {{{"index", 0}, {"message", {{"role", "assistant"}, {"content", Fenced(GoodKernel(84))}}}, {"finish_reason", "stop"}},
        {{"index", 1}, {"message", {{"role", "assistant"}, {"content", Fenced(GoodKernel(85))}}}, {"finish_reason", "stop"}}}},
      {"usage", {{"prompt_tokens", 100}, {"completion_tokens", 80}, {"total_tokens", 180}}}};
  server.Then(FakeOpenAIServer::Raw(two.dump()));
  ModelOptions o = Options(server);
  o.client.n = 2;
  auto got = Make(o)->Propose(Ctx(), 2);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ(server.Requests().size(), 1u);
  EXPECT_EQ(Body(server, 0)["n"], 2);
  EXPECT_EQ((*got)[0].tokens_used + (*got)[1].tokens_used, 180);
  EXPECT_NE((*got)[0].source, (*got)[1].source);
}

TEST(ModelProposerModels, AReasoningEndpointsRefusalOfMaxTokensIsNotAFailure) {
  FakeOpenAIServer server;
  server.Then([](const httplib::Request& req, httplib::Response& res) {
    if (nlohmann::json::parse(req.body).contains("max_tokens")) {
      res.status = 400;
      res.set_content(R"({"error":{"message":"Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.","param":"max_tokens"}})",
                      "application/json");
      return;
    }
    FakeOpenAIServer::Answer(Fenced(GoodKernel(86)))(req, res);
  });
  ModelOptions o = Options(server);
  o.client.reasoning_effort = "high";
  auto got = Make(o)->Propose(Ctx(), 1);
  ASSERT_TRUE(got.ok()) << got.status();
  auto prov = nlohmann::json::parse((*got)[0].provenance_json);
  EXPECT_THAT(prov["adaptations"][0].get<std::string>(), HasSubstr("max_completion_tokens"));
  EXPECT_EQ(Body(server, 1)["reasoning_effort"], "high");
}

// -------------------------------------------------------------------- knobs

TEST(ModelProposerKnobs, AKernelDeclaringKnobsIsProposedAtItsDefaults) {
  FakeOpenAIServer server;
  absl::StatusOr<Variant> seed = DefaultVariant(Shape());
  ASSERT_TRUE(seed.ok());
  std::string body = seed->source;
  for (const char* k : {"#define KF_BLOCK_N 128\n", "#define KF_STAGES 2\n"}) body.erase(body.find(k), strlen(k));
  body = "// kforge-knob BLOCK_N default=128 values=64,128\n// kforge-knob STAGES default=2 values=2,3\n" + body;
  server.Then(FakeOpenAIServer::Answer(Fenced(ExtractedKernel{body, seed->manifest_json})));
  ModelOptions o = Options(server);
  o.knob_sweeps = true;
  auto got = Make(o)->Propose(Ctx(), 1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].source.rfind("#define KF_BLOCK_N 128\n#define KF_STAGES 2\n#define KF_HEAD_DIM 128\n", 0), 0u);
  EXPECT_EQ(nlohmann::json::parse((*got)[0].knobs_json), nlohmann::json::parse(R"({"BLOCK_N":128,"STAGES":2})"));
  EXPECT_TRUE(nlohmann::json::parse((*got)[0].provenance_json)["declares_knobs"].get<bool>());
  EXPECT_THAT(Body(server, 0)["messages"][0]["content"].get<std::string>(), HasSubstr("kforge-knob"));
}

// ------------------------------------------------------------- old behaviours

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

TEST(ModelProposer, StopsAtTheSpendLimitWithoutARequest) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(6))));
  auto p = Make(Options(server));
  ProposalContext ctx = Ctx();
  ctx.tokens_left = 500;
  auto got = p->Propose(ctx, 1);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Msg(got.status()), HasSubstr("budget exhausted"));
  EXPECT_EQ(server.Requests().size(), 0u);
}

TEST(ModelProposer, CapsTheAnswerAtTheBudget) {
  FakeOpenAIServer server;
  server.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(7)), 9000, 1500));
  auto p = Make(Options(server));
  ProposalContext ctx = Ctx();
  ctx.job_id = "j";
  // Room for the prompt (estimated at 3 bytes a token) and 2000 more.
  FakeOpenAIServer probe;
  probe.Then(FakeOpenAIServer::Answer(Fenced(GoodKernel(9))));
  ASSERT_TRUE(Make(Options(probe))->Propose(Ctx(), 1).ok());
  const nlohmann::json sent = Body(probe, 0);
  const int64_t prompt = static_cast<int64_t>(sent["messages"].dump().size() / 3) + 128;
  ctx.max_tokens = prompt + 2000;
  auto got = p->Propose(ctx, 1);
  ASSERT_TRUE(got.ok()) << got.status();
  int max_tokens = Body(server, 0)["max_tokens"];
  EXPECT_LE(max_tokens, 2000);
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
  best.variant_id = "v1";
  best.outcome = Outcome::kVerified;
  best.median_us = 100;
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
  auto m = ParseModelOptions(R"({"base_url": "http://h/v1", "api_key_env": "K", "token_param": "max_completion_tokens",
      "reasoning_effort": "high", "seed": 3, "n": 2, "price_prompt_per_mtok": 0.5, "parallelism": 6,
      "max_repair_attempts": 4, "server_max_tokens": 1000000, "server_max_cost_usd": 25.5, "server_window_s": 86400,
      "islands": 3, "exploit": 0.7, "knob_sweeps": true, "derive_seed": true, "max_concurrent_requests": 8,
      "anchors": [{"bucket": "b", "name": "FA2", "median_us": 10.5}],
      "models": [{"name": "mini", "model": "gpt-5-mini", "weight": 4, "price_completion_per_mtok": 2},
                 {"model": "gpt-5", "strong": true, "reasoning_effort": "medium", "base_url": "http://other/v1"}]})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->client.token_param, TokenParam::kMaxCompletionTokens);
  EXPECT_EQ(m->client.reasoning_effort, "high");
  EXPECT_EQ(*m->client.seed, 3);
  EXPECT_EQ(m->client.n, 2);
  EXPECT_EQ(m->parallelism, 6);
  EXPECT_EQ(m->max_repair_attempts, 4);
  EXPECT_EQ(m->server_limits.tokens, 1000000);
  EXPECT_DOUBLE_EQ(m->server_limits.cost_usd, 25.5);
  EXPECT_EQ(m->server_window_ms, 86400000);
  EXPECT_EQ(m->program_db.islands, 3);
  EXPECT_TRUE(m->knob_sweeps);
  ASSERT_EQ(m->anchors.size(), 1u);
  ASSERT_EQ(m->models.size(), 2u);
  EXPECT_EQ(m->models[0].name, "mini");
  EXPECT_EQ(m->models[0].client.model, "gpt-5-mini");
  EXPECT_EQ(m->models[0].client.base_url, "http://h/v1");     // inherited
  EXPECT_EQ(m->models[0].client.reasoning_effort, "high");     // inherited
  EXPECT_DOUBLE_EQ(m->models[0].price.prompt_usd_per_mtok, 0.5);
  EXPECT_DOUBLE_EQ(m->models[0].price.completion_usd_per_mtok, 2);
  EXPECT_DOUBLE_EQ(m->models[0].weight, 4);
  EXPECT_EQ(m->models[1].name, "gpt-5");
  EXPECT_TRUE(m->models[1].strong);
  EXPECT_EQ(m->models[1].client.reasoning_effort, "medium");
  EXPECT_EQ(m->models[1].client.base_url, "http://other/v1");
  EXPECT_THAT(Msg(ParseModelOptions(R"({"models": [{"model": "a"}, {"model": "a"}]})").status()), HasSubstr("listed twice"));
  EXPECT_THAT(Msg(ParseModelOptions(R"({"models": [{"model": "a", "wieght": 1}]})").status()), HasSubstr("models[].wieght"));
  EXPECT_THAT(Msg(ParseModelOptions(R"({"token_param": "max"})").status()), HasSubstr("token_param"));
  EXPECT_THAT(Msg(ParseModelOptions(R"({"max_tokens": "many"})").status()), HasSubstr("max_tokens"));
  EXPECT_FALSE(ParseModelOptions("[1]").ok());
}

}  // namespace
}  // namespace kforge::agent
