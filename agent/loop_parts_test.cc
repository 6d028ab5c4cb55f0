// The pieces of the model loop that need no model: source normalization,
// search/replace edits and diffs, knob declarations, the program database
// and the spend ledger.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "agent/edits.h"
#include "agent/knobs.h"
#include "agent/normalize.h"
#include "agent/program_db.h"
#include "agent/spend.h"
#include "kernels/catalog.h"

namespace kforge::agent {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

ShapeKey Shape(int64_t max_len = 3000) {
  ShapeKey s;
  s.head_dim = 128;
  s.heads = 16;
  s.kv_heads = 16;
  s.causal = true;
  s.arch = "sm_90a";
  s.batch = 8;
  s.max_len_q = s.max_len_k = max_len;
  s.total_q = s.total_k = 4 * max_len;
  return s;
}

std::string Seed() {
  absl::StatusOr<Variant> v = DefaultVariant(Shape());
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? v->source : "";
}

// ---------------------------------------------------------------- normalize

TEST(NormalizeSource, CommentsAndWhitespaceDoNotCount) {
  const std::string a = "__global__ void k(int* p) {\n  p[0] = 1 + 2;  // set\n}\n";
  const std::string b = "/* a comment */ __global__   void k(int *p){ p[0]=1+2;\n\n}";
  EXPECT_EQ(NormalizeSource(a), NormalizeSource(b));
  EXPECT_EQ(NormalizedSourceHash(a), NormalizedSourceHash(b));
  // A real change does count, and so does whitespace inside a literal.
  EXPECT_NE(NormalizeSource(a), NormalizeSource("__global__ void k(int* p) { p[0] = 1 + 3; }"));
  EXPECT_NE(NormalizeSource("const char* s = \"a b\";"), NormalizeSource("const char* s = \"a  b\";"));
}

TEST(NormalizeSource, DirectivesKeepTheirLines) {
  // Joining a directive with the next line would change the program.
  const std::string a = "#define N 4\nint x = N;\n";
  const std::string b = "#define N 4 int x = N;\n";
  EXPECT_NE(NormalizeSource(a), NormalizeSource(b));
  EXPECT_EQ(NormalizeSource(a), NormalizeSource("#define  N  4   // four\n\nint x=N;"));
}

TEST(NormalizeSource, TheSeedWithAnExtraCommentIsTheSameKernel) {
  const std::string seed = Seed();
  std::string commented = seed;
  commented.insert(commented.find('\n') + 1, "// a faster kernel, promise\n\n   \n");
  for (size_t at = 0; (at = commented.find(" = ", at)) != std::string::npos; at += 2) commented.replace(at, 3, "=");
  EXPECT_EQ(NormalizedSourceHash(seed), NormalizedSourceHash(commented));
}

// ------------------------------------------------------------------- edits

TEST(Edits, ParsesNamedParentAndBlocks) {
  auto e = ParseEdits(
      "I change the tile.\nparent: `v12`\n<<<<<<< SEARCH\n#define KF_BLOCK_N 128\n=======\n#define KF_BLOCK_N 64\n"
      ">>>>>>> REPLACE\n<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->parent, "v12");
  ASSERT_EQ(e->edits.size(), 2u);
  EXPECT_EQ(e->edits[0].search, "#define KF_BLOCK_N 128\n");
  EXPECT_EQ(e->edits[0].replace, "#define KF_BLOCK_N 64\n");
  auto none = ParseEdits("```cuda\nint x;\n```\n");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->edits.empty());
  EXPECT_THAT(Msg(ParseEdits("<<<<<<< SEARCH\na\n").status()), HasSubstr("no ======= line"));
  EXPECT_THAT(Msg(ParseEdits("<<<<<<< SEARCH\na\n=======\nb\n").status()), HasSubstr("no >>>>>>> REPLACE"));
}

TEST(Edits, ApplyExactlyOnceEachOrSayWhy) {
  const std::string parent = "line one\nline two  \nline three\nrepeat\nrepeat\n";
  auto got = ApplyEdits(parent, {{"line two\n", "LINE 2\n"}, {"line three\n", ""}});
  ASSERT_TRUE(got.ok()) << got.status();  // trailing spaces in the parent do not matter
  EXPECT_EQ(*got, "line one\nLINE 2\nrepeat\nrepeat\n");
  EXPECT_THAT(Msg(ApplyEdits(parent, {{"line four\n", "x"}}).status()),
              HasSubstr("edit 1: the SEARCH text is not in the parent (its first line: \"line four\")"));
  EXPECT_THAT(Msg(ApplyEdits(parent, {{"repeat\n", "x"}}).status()), HasSubstr("occurs 2 times"));
  EXPECT_THAT(Msg(ApplyEdits(parent, {{"\n\n", "x"}}).status()), HasSubstr("SEARCH text is empty"));
  // A later edit sees the earlier ones.
  EXPECT_TRUE(ApplyEdits(parent, {{"line one\n", "first\n"}, {"first\n", "1\n"}}).ok());
}

TEST(Edits, AnEditOfTheSeedKernelApplies) {
  const std::string seed = Seed();
  // The define is there twice (the knob prelude and the #ifndef default):
  // one SEARCH line is ambiguous, two lines of context are not.
  EXPECT_THAT(Msg(ApplyEdits(seed, {{"#define KF_BLOCK_N 128\n", "#define KF_BLOCK_N 64\n"}}).status()),
              HasSubstr("occurs 2 times"));
  auto got = ApplyEdits(seed, {{"#define KF_BLOCK_M 128\n#define KF_BLOCK_N 128\n",
                                "#define KF_BLOCK_M 128\n#define KF_BLOCK_N 64\n"}});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), seed.size() - 1);
}

TEST(LineDiff, ShowsTheChangedLinesWithContext) {
  const std::string a = "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n";
  const std::string b = "1\n2\n3\n4\nfive\n6\n7\n8\n9\n10\n11\n";
  const std::string d = LineDiff(a, b);
  EXPECT_THAT(d, HasSubstr("-5\n+five\n"));
  EXPECT_THAT(d, HasSubstr("+11\n"));
  EXPECT_THAT(d, HasSubstr("@@ -2,"));
  EXPECT_EQ(LineDiff(a, a), "");
  std::string big_a, big_b;
  for (int i = 0; i < 500; ++i) {
    big_a += fmt::format("a{}\n", i);
    big_b += fmt::format("b{}\n", i);
  }
  EXPECT_THAT(LineDiff(big_a, big_b, 50), HasSubstr("[diff cut at 50 lines]"));
}

// ------------------------------------------------------------------- knobs

constexpr char kKnobbed[] =
    "// kforge-knob BLOCK_N default=64 values=32,64,128\n"
    "// kforge-knob STAGES default=2 values=1,2,3\n"
    "// kforge-manifest dynamic_smem_bytes = (64 + 2 * BLOCK_N * STAGES) * HEAD_DIM * 2\n"
    "// kforge-manifest tile_n = BLOCK_N\n"
    "__device__ int f() { return KF_BLOCK_N * KF_STAGES; }\n";

TEST(Knobs, ExpressionsAreIntegerArithmetic) {
  EXPECT_EQ(*EvalIntExpr("(64 + 2 * N) * D", {{"N", 32}, {"D", 128}}), (64 + 64) * 128);
  EXPECT_EQ(*EvalIntExpr("min(4, 7) + max(1, 2) - 10 / 3 % 2", {}), 4 + 2 - 1);
  EXPECT_EQ(*EvalIntExpr("-3 * -2", {}), 6);
  EXPECT_THAT(Msg(EvalIntExpr("N / 0", {{"N", 1}}).status()), HasSubstr("division by zero"));
  EXPECT_THAT(Msg(EvalIntExpr("X + 1", {}).status()), HasSubstr("unknown name X"));
  EXPECT_THAT(Msg(EvalIntExpr("9223372036854775807 + 1", {}).status()), HasSubstr("overflow"));
  EXPECT_THAT(Msg(EvalIntExpr("(1 + 2", {}).status()), HasSubstr("missing ')'"));
  EXPECT_FALSE(EvalIntExpr("1; rm", {}).ok());
}

TEST(Knobs, DeclarationsParseAndInstancesPrependDefines) {
  auto seed = DefaultVariant(Shape());
  ASSERT_TRUE(seed.ok());
  auto manifest = nlohmann::json::parse(seed->manifest_json);
  manifest["threads"] = 128;
  auto t = ParseKnobTemplate(kKnobbed, manifest.dump(), 128);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->knobs.size(), 2u);
  EXPECT_EQ(t->knobs[0].name, "BLOCK_N");
  EXPECT_EQ(t->knobs[0].default_value, 64);
  EXPECT_EQ(t->knobs[0].values, (std::vector<int>{32, 64, 128}));
  auto inst = InstantiateKnobs(*t, {{"BLOCK_N", 32}}, 128);
  ASSERT_TRUE(inst.ok()) << inst.status();
  EXPECT_EQ(inst->source.rfind("#define KF_BLOCK_N 32\n#define KF_STAGES 2\n#define KF_HEAD_DIM 128\n", 0), 0u);
  auto m = nlohmann::json::parse(inst->manifest_json);
  EXPECT_EQ(m["dynamic_smem_bytes"], (64 + 2 * 32 * 2) * 128 * 2);
  EXPECT_EQ(m["tile_n"], 32);
  EXPECT_EQ(m["threads"], 128);
  // The body of an instance is the template again.
  EXPECT_EQ(StripKnobPrelude(inst->source, t->knobs), kKnobbed);
  EXPECT_THAT(Msg(InstantiateKnobs(*t, {{"BLOCK_N", 48}}, 128).status()), HasSubstr("not one of its declared values"));
  EXPECT_THAT(Msg(InstantiateKnobs(*t, {{"WARPS", 4}}, 128).status()), HasSubstr("not declared"));
}

TEST(Knobs, MalformedDeclarationsNameTheLine) {
  EXPECT_THAT(Msg(ParseKnobTemplate("int x;\n// kforge-knob N default=5 values=1,2\n", "{}", 128).status()),
              HasSubstr("line 2: kforge-knob N: default 5 is not one of its values"));
  EXPECT_THAT(Msg(ParseKnobTemplate("// kforge-knob N values=1,x\n", "{}", 128).status()), HasSubstr("not an integer"));
  EXPECT_THAT(Msg(ParseKnobTemplate("// kforge-knob N values=1\n// kforge-manifest speed = 3\n", "{}", 128).status()),
              HasSubstr("\"speed\" is not a manifest field"));
  EXPECT_THAT(Msg(ParseKnobTemplate("// kforge-manifest threads = 128\n", "{}", 128).status()),
              HasSubstr("need kforge-knob"));
  EXPECT_THAT(Msg(ParseKnobTemplate("// kforge-knob N values=1\n// kforge-manifest threads = N / 0\n", "{}", 128).status()),
              HasSubstr("division by zero"));
  // No declarations: an ordinary kernel.
  auto plain = ParseKnobTemplate("__global__ void k() {}\n", "{}", 128);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->knobs.empty());
}

TEST(Knobs, TheSeedKernelWithDeclaredKnobsIsASearchableTemplate) {
  // The seed's own defines as knobs: a model marks BLOCK_N and STAGES.
  absl::StatusOr<Variant> seed = DefaultVariant(Shape());
  ASSERT_TRUE(seed.ok());
  std::string body = seed->source;
  for (const char* k : {"#define KF_BLOCK_N 128\n", "#define KF_STAGES 2\n"}) body.erase(body.find(k), strlen(k));
  body = "// kforge-knob BLOCK_N default=128 values=64,128\n// kforge-knob STAGES default=2 values=2,3\n" + body;
  auto t = ParseKnobTemplate(body, seed->manifest_json, 128);
  ASSERT_TRUE(t.ok()) << t.status();
  ModelTemplateSource source;
  source.Add("v9", *t, Shape());
  std::vector<TemplateSpec> specs = source.Templates();
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_EQ(specs[0].name, "model:v9");
  EXPECT_TRUE(source.Supports(specs[0], Shape()));
  ShapeKey other = Shape();
  other.head_dim = 64;
  EXPECT_FALSE(source.Supports(specs[0], other));
  auto defaults = source.DefaultKnobs("model:v9", Shape());
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ((*defaults)["BLOCK_N"], 128);
  auto inst = source.Instantiate("model:v9", {{"BLOCK_N", 64}, {"STAGES", 3}}, Shape());
  ASSERT_TRUE(inst.ok()) << inst.status();
  EXPECT_THAT(inst->source, HasSubstr("#define KF_BLOCK_N 64\n#define KF_STAGES 3\n"));
}

// ---------------------------------------------------------- program database

ProgramRecord Program(const std::string& id, int block_n, const std::string& parent = "") {
  absl::StatusOr<Variant> v = Instantiate("fwd_mma", {{"BLOCK_N", block_n}}, 128);
  EXPECT_TRUE(v.ok()) << v.status();
  ProgramRecord p;
  p.variant_id = id;
  p.source = v->source;
  p.manifest_json = v->manifest_json;
  p.origin = parent.empty() ? "template" : "model";
  p.template_name = parent.empty() ? "fwd_mma" : "";
  p.knobs_json = fmt::format(R"({{"BLOCK_N":{}}})", block_n);
  p.parent_id = parent;
  return p;
}

ProgramResult Verified(const std::string& bucket, double us, int registers = 96) {
  ProgramResult r;
  r.bucket = bucket;
  r.outcome = Outcome::kVerified;
  r.median_us = us;
  r.spread_us = us / 100;
  r.registers = registers;
  return r;
}

TEST(ProgramDatabase, RanksByEfficiencyAndSeesSimilarBucketsDiscounted) {
  ProgramDatabase db;
  const Bucket here = BucketOf(Shape(3000));
  const Bucket near = BucketOf(Shape(700));
  ShapeKey other_arch = Shape();
  other_arch.arch = "sm_80";
  db.Add(Program("v1", 64), Verified(here.Id(), 500));
  db.Add(Program("v2", 32), Verified(here.Id(), 400));
  db.Add(Program("v3", 128), Verified(near.Id(), 10));  // fast, but measured elsewhere
  db.Add(Program("v4", 32), Verified(BucketOf(other_arch).Id(), 1));  // another arch: never seen here
  std::vector<ProgramView> ranked = db.Ranked(here);
  ASSERT_EQ(ranked.size(), 3u);
  EXPECT_EQ(ranked[1].program.variant_id, "v2");
  EXPECT_EQ(ranked[2].program.variant_id, "v1");
  EXPECT_EQ(ranked[0].program.variant_id, "v3");
  EXPECT_GT(ranked[0].distance, 0);
  EXPECT_LT(ranked[0].score, ranked[0].efficiency);
  EXPECT_EQ(ranked[1].distance, 0);
  EXPECT_DOUBLE_EQ(ranked[1].score, ranked[1].efficiency);
  EXPECT_GT(ranked[1].efficiency, ranked[2].efficiency);
}

TEST(ProgramDatabase, SelectionBalancesTheBestAndDiverseElites) {
  ProgramDbOptions o;
  o.islands = 1;
  o.exploit = 0.5;
  ProgramDatabase db(o);
  const Bucket b = BucketOf(Shape());
  // Two cells (BLOCK_N 64 and 128), two programs in the first.
  db.Add(Program("v1", 64), Verified(b.Id(), 300));
  db.Add(Program("v2", 128), Verified(b.Id(), 400));
  ProgramRecord same_cell = Program("v3", 64, "v1");
  same_cell.source += "// a slower sibling\n";
  db.Add(same_cell, Verified(b.Id(), 350));
  std::map<std::string, int> picks;
  for (uint64_t draw = 0; draw < 400; ++draw) {
    ProgramDatabase::Selection s = db.Select(b, draw * 7919, 2);
    ASSERT_TRUE(s.parent);
    picks[s.parent->program.variant_id]++;
    // Inspirations never repeat the parent and prefer another cell.
    ASSERT_FALSE(s.inspirations.empty());
    EXPECT_NE(s.inspirations[0].program.variant_id, s.parent->program.variant_id);
    EXPECT_NE(s.inspirations[0].cell, s.parent->cell);
  }
  // The best elite most often, the other cell's elite too, the dominated
  // sibling never (it is not an elite).
  EXPECT_GT(picks["v1"], picks["v2"]);
  EXPECT_GT(picks["v2"], 40);
  EXPECT_EQ(picks["v3"], 0);
  // Deterministic for a draw.
  EXPECT_EQ(db.Select(b, 42, 2).parent->program.variant_id, db.Select(b, 42, 2).parent->program.variant_id);
}

TEST(ProgramDatabase, IslandsFollowLineages) {
  ProgramDbOptions o;
  o.islands = 4;
  ProgramDatabase db(o);
  const Bucket b = BucketOf(Shape());
  db.Add(Program("v1", 64), Verified(b.Id(), 300));
  db.Add(Program("v2", 64, "v1"), Verified(b.Id(), 290));
  db.Add(Program("v3", 32, "v2"), Verified(b.Id(), 280));
  std::vector<ProgramView> ranked = db.Ranked(b);
  ASSERT_EQ(ranked.size(), 3u);
  EXPECT_EQ(ranked[0].island, ranked[1].island);
  EXPECT_EQ(ranked[1].island, ranked[2].island);
  // A draw for an island without programs falls back to all islands.
  for (uint64_t draw = 0; draw < 4; ++draw) EXPECT_TRUE(db.Select(b, draw, 1).parent);
}

TEST(ProgramDatabase, CompiledProgramsServeWhenNothingIsTimed) {
  ProgramDatabase db;
  const Bucket b = BucketOf(Shape());
  EXPECT_FALSE(db.Select(b, 1, 2).parent);
  ProgramResult compiled;
  compiled.bucket = b.Id();
  compiled.outcome = Outcome::kCompiled;
  compiled.registers = 128;
  db.Add(Program("v1", 64), compiled);
  ProgramDatabase::Selection s = db.Select(b, 1, 2);
  ASSERT_TRUE(s.parent);
  EXPECT_EQ(s.parent->program.variant_id, "v1");
  EXPECT_THAT(s.why, HasSubstr("nothing is timed"));
  EXPECT_TRUE(db.Ranked(b).empty());
}

TEST(ProgramDatabase, KnowsSourcesAndCubinsPerBucket) {
  ProgramDatabase db;
  const Bucket b = BucketOf(Shape());
  ProgramRecord p = Program("v1", 64);
  ProgramResult r = Verified(b.Id(), 300);
  r.cubin_hash = "c0ffee";
  db.Add(p, r);
  std::string commented = p.source + "\n// nothing changed\n";
  EXPECT_EQ(db.SameSource(b.Id(), NormalizedSourceHash(commented)), "v1");
  EXPECT_EQ(db.SameCubin(b.Id(), "c0ffee"), "v1");
  EXPECT_FALSE(db.SameSource(BucketOf(Shape(100)).Id(), NormalizedSourceHash(commented)));
  EXPECT_FALSE(db.SameCubin(b.Id(), "other"));
  // Proposed before it had an id, known at once; the id comes with its result.
  db.NoteProposed(b.Id(), "n2", "");
  EXPECT_EQ(db.SameSource(b.Id(), "n2"), "");
  ProgramRecord q = Program("v2", 32);
  q.normalized_hash = "n2";
  db.Add(q, Verified(b.Id(), 200));
  EXPECT_EQ(db.SameSource(b.Id(), "n2"), "v2");
}

TEST(ProgramDatabase, FeatureCellsNameTileSizesAndStages) {
  ProgramRecord p = Program("v1", 64);
  const std::string cell = FeatureCell(p, "fwd_mma");
  EXPECT_THAT(cell, HasSubstr("fwd_mma|m"));
  EXPECT_THAT(cell, HasSubstr("|n64|"));
  EXPECT_NE(cell, FeatureCell(Program("v2", 128), "fwd_mma"));
}

// -------------------------------------------------------------------- spend

TEST(SpendLedger, ReservationsAndSpendNeverPassAJobLimit) {
  std::unique_ptr<SpendLog> log = MakeInMemorySpendLog();
  SpendLedger ledger(log.get(), {});
  const SpendLimits job{1000, 0};
  ModelCall j1;
  j1.job_id = "j1";
  j1.purpose = "propose";
  j1.prompt_tokens = 200;
  auto a = ledger.Reserve(job, 600, 0, j1);
  ASSERT_TRUE(a.ok()) << a.status();
  // The reservation is a pending call at its largest size.
  EXPECT_EQ(ledger.JobSpent("j1")->tokens, 600);
  auto b = ledger.Reserve(job, 600, 0, j1);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Msg(b.status()), HasSubstr("job j1 budget: 600 of 1000 tokens spent or reserved"));
  ModelCall j2 = j1;
  j2.job_id = "j2";
  EXPECT_TRUE(ledger.Reserve(job, 600, 0, j2).ok()) << "another job has its own budget";
  ModelCall call = j1;
  call.prompt_tokens = 300;
  call.completion_tokens = 100;
  call.outcome = "candidate";
  ASSERT_TRUE(ledger.Settle(*a, call).ok());
  auto room = ledger.Room("j1", job);
  ASSERT_TRUE(room.ok());
  EXPECT_EQ(room->tokens, 600);
  EXPECT_TRUE(ledger.Reserve(job, 600, 0, j1).ok());
  EXPECT_EQ(ledger.JobSpent("j1")->tokens, 400 + 600);
}

TEST(SpendLedger, ServerLimitCountsEveryJobWithinItsWindow) {
  std::unique_ptr<SpendLog> log = MakeInMemorySpendLog();
  int64_t now = 1'000'000;
  SpendLedgerOptions o;
  o.server = {0, 1.0};  // $1
  o.server_window_ms = 60'000;
  o.now_unix_ms = [&] { return now; };
  SpendLedger ledger(log.get(), o);
  ModelCall call;
  call.job_id = "j1";
  auto r = ledger.Reserve({}, 10, 0.8, call);
  ASSERT_TRUE(r.ok());
  call.cost_usd = 0.8;
  call.outcome = "candidate";
  ASSERT_TRUE(ledger.Settle(*r, call).ok());
  ModelCall other;
  other.job_id = "j2";
  auto over = ledger.Reserve({}, 10, 0.3, other);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Msg(over.status()), HasSubstr("server budget (last 60 s)"));
  now += 61'000;  // the window moved on
  EXPECT_TRUE(ledger.Reserve({}, 10, 0.3, other).ok());
}

TEST(SpendLedger, ConcurrentReservationsHoldTheLimit) {
  std::unique_ptr<SpendLog> log = MakeInMemorySpendLog();
  SpendLedger ledger(log.get(), {});
  std::atomic<int> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        ModelCall c;
        c.job_id = "j";
        auto r = ledger.Reserve({1000, 0}, 7, 0, c);
        if (!r.ok()) continue;
        ++granted;
        c.prompt_tokens = 7;
        c.outcome = "candidate";
        (void)ledger.Settle(*r, c);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(granted.load(), 1000 / 7);
  EXPECT_LE(ledger.JobSpent("j")->tokens, 1000);
}

TEST(SpendLedger, ACallInFlightAtACrashStaysCountedAtItsReservedSize) {
  std::unique_ptr<SpendLog> log = MakeInMemorySpendLog();
  {
    SpendLedger before(log.get(), {});
    ModelCall c;
    c.job_id = "j";
    c.prompt_tokens = 100;
    ASSERT_TRUE(before.Reserve({1000, 0}, 900, 0, c).ok());
    // the process dies here: no Settle
  }
  SpendLedger after(log.get(), {});
  ModelCall c;
  c.job_id = "j";
  EXPECT_EQ(after.Reserve({1000, 0}, 200, 0, c).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(after.JobSpent("j")->tokens, 900);
}

TEST(Price, CostPerMillionTokens) {
  Price p{0.25, 2.0};
  EXPECT_DOUBLE_EQ(p.Cost(1'000'000, 500'000), 0.25 + 1.0);
}

}  // namespace
}  // namespace kforge::agent
