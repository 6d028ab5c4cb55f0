// On a GPU: every kernel of the bad-kernel corpus (tests/bad_kernels) goes
// through the worker's real path — CompilePool, then the sandboxed child
// (kforge-worker --eval-child) running worker/eval — and must end in the
// outcome expected.json names, while the worker keeps going: faults and hangs
// included, each in its own child. Skips, saying why, without a CUDA driver.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "gpu/compile.h"
#include "gpu/compile_cache.h"
#include "gpu/gpu.h"
#include "kernels/catalog.h"
#include "tests/bad_kernels/corpus.h"
#include "tests/worker/fake_server.h"
#include "tests/worker/worker_bin.h"
#include "worker/rpc_client.h"
#include "worker/sandbox.h"
#include "worker/task_runner.h"
#include "worker/worker.h"

namespace kforge::worker {
namespace {

using namespace std::chrono_literals;
namespace pb = ::kforge::v1;

struct CorpusCase {
  std::string file;
  std::string expected;
  nlohmann::json shape;
  nlohmann::json manifest;
};

// gtest (and so CTest's test names) show a case by its file.
void PrintTo(const CorpusCase& c, std::ostream* os) { *os << c.file; }

std::vector<CorpusCase> LoadCorpus() {
  std::vector<CorpusCase> out;
  nlohmann::json expected = nlohmann::json::parse(bad_kernels::ExpectedJson());
  for (const auto& k : expected.at("kernels")) {
    out.push_back({k.at("file").get<std::string>(), k.at("expected").get<std::string>(),
                   k.contains("shape") ? k["shape"] : expected["shape"],
                   k.contains("manifest") ? k["manifest"] : expected["manifest"]});
  }
  return out;
}

// The device, found once; null with a reason when there is none.
struct Gpu {
  std::unique_ptr<gpu::Driver> driver;
  gpu::DeviceInfo info;
  std::string skip_reason;
};

Gpu& TheGpu() {
  static Gpu* g = [] {
    auto* g = new Gpu;
    absl::StatusOr<std::unique_ptr<gpu::Driver>> d = gpu::Driver::Load();
    if (!d.ok()) {
      g->skip_reason = fmt::format("no CUDA driver: {}", std::string(d.status().message()));
      return g;
    }
    absl::StatusOr<gpu::DeviceInfo> info = (*d)->GetDeviceInfo(0);
    if (!info.ok()) {
      g->skip_reason = fmt::format("no CUDA device 0: {}", std::string(info.status().message()));
      return g;
    }
    g->driver = *std::move(d);
    g->info = *info;
    return g;
  }();
  return *g;
}

GpuDescription Describe(const gpu::DeviceInfo& info) {
  GpuDescription d;
  d.name = info.name;
  d.compute_capability = info.ComputeCapability();
  d.arch = info.arch;
  d.sm_count = info.sm_count;
  d.memory_bytes = info.memory_bytes;
  d.driver_version = info.DriverVersionString();
  d.nvrtc_version = gpu::NvrtcVersion();
  return d;
}

SandboxOptions GpuSandboxOptions() {
  SandboxOptions o;
  o.executable = testing::WorkerBinary();
  o.scratch_dir = std::filesystem::temp_directory_path() / "kforge-worker-gpu-test";
  o.setup_limit = 120s;
  o.min_run_limit = 5s;
  o.absolute_limit = 180s;
  return o;
}

// The reference's compile is cached here across the children of this test.
std::string CacheDir() {
  std::filesystem::path d = std::filesystem::temp_directory_path() / "kforge-worker-gpu-test-cache";
  std::filesystem::create_directories(d);
  return d.string();
}

TaskSpec CorpusTask(const CorpusCase& c, const std::string& arch, uint64_t seed) {
  TaskSpec t;
  t.task_id = "t-" + c.file;
  t.kind = TaskKind::kEvaluate;
  t.shape.key = bad_kernels::ShapeFromJson(c.shape);
  t.shape.key.arch = arch;
  t.variant.variant_id = c.file;
  t.variant.source = bad_kernels::Source(c.file);
  t.variant.manifest_json = c.manifest.dump();
  t.seed = seed;
  return t;
}

class WorkerGpu : public ::testing::TestWithParam<CorpusCase> {
 protected:
  void SetUp() override {
    if (!TheGpu().driver) GTEST_SKIP() << TheGpu().skip_reason;
  }
};

TEST_P(WorkerGpu, CorpusKernelGetsItsExpectedOutcomeInTheSandbox) {
  const CorpusCase& c = GetParam();
  gpu::CompilePool pool(1, nullptr);
  Sandbox sandbox(GpuSandboxOptions());
  RunnerOptions ro;
  ro.gpu = Describe(TheGpu().info);
  ro.compile_cache_dir = CacheDir();
  LocalTaskRunner runner(&pool, &sandbox, ro);
  std::atomic<bool> cancel{false};
  const auto start = std::chrono::steady_clock::now();
  std::optional<TaskResult> r = runner.Run(CorpusTask(c, ro.gpu.arch, 4242), cancel);
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(r.has_value());
  std::cout << fmt::format("{:22} {:14} {:6.1f} s  {}\n", c.file, OutcomeName(r->outcome), s,
                           r->message);
  const std::string got(OutcomeName(r->outcome));
  if (c.file == "oob_write.cu") {
    // An out-of-bounds write may land in memory the process owns (then the
    // output is wrong) or fault (crashed): never verified.
    EXPECT_TRUE(got == "crashed" || got == "wrong") << got << ": " << r->message;
  } else {
    EXPECT_EQ(got, c.expected) << r->message << "\n" << r->compile.log.substr(0, 2000);
  }
  EXPECT_EQ(r->gpu.name, TheGpu().info.name);
  if (got == "verified") {
    ASSERT_TRUE(r->timing.has_value());
    EXPECT_GT(r->timing->median_us, 0);
    EXPECT_FALSE(r->compile.cubin.empty());
    EXPECT_FALSE(r->reference_version.empty());
  }
  if (got == "wrong") {
    ASSERT_TRUE(r->errors.has_value());
    EXPECT_FALSE(r->errors->detail.empty());
  }
  if (got == "timeout") {
    EXPECT_LT(s, 120);
  }
}

INSTANTIATE_TEST_SUITE_P(Corpus, WorkerGpu, ::testing::ValuesIn(LoadCorpus()),
                         [](const ::testing::TestParamInfo<CorpusCase>& info) {
                           std::string name = info.param.file.substr(0, info.param.file.find('.'));
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

class WorkerGpuSequence : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!TheGpu().driver) GTEST_SKIP() << TheGpu().skip_reason;
  }
};

// One runner (one worker) through the whole corpus in a row, hostile ones in
// between: each later good kernel must still verify (a fresh child each).
TEST_F(WorkerGpuSequence, TheWorkerKeepsGoingAfterCrashesAndHangs) {
  gpu::CompilePool pool(2, nullptr);
  Sandbox sandbox(GpuSandboxOptions());
  RunnerOptions ro;
  ro.gpu = Describe(TheGpu().info);
  ro.compile_cache_dir = CacheDir();
  LocalTaskRunner runner(&pool, &sandbox, ro);
  std::vector<CorpusCase> corpus = LoadCorpus();
  CorpusCase good;
  for (const CorpusCase& c : corpus)
    if (c.file == "good.cu") good = c;
  ASSERT_FALSE(good.file.empty());
  std::atomic<bool> cancel{false};
  uint64_t seed = 100;
  for (const char* hostile : {"oob_write.cu", "endless_loop.cu", "nan_output.cu"}) {
    for (const CorpusCase& c : corpus) {
      if (c.file != hostile) continue;
      std::optional<TaskResult> bad = runner.Run(CorpusTask(c, ro.gpu.arch, ++seed), cancel);
      ASSERT_TRUE(bad.has_value());
      EXPECT_NE(bad->outcome, Outcome::kVerified) << hostile;
    }
    std::optional<TaskResult> after = runner.Run(CorpusTask(good, ro.gpu.arch, ++seed), cancel);
    ASSERT_TRUE(after.has_value());
    EXPECT_EQ(after->outcome, Outcome::kVerified) << "after " << hostile << ": " << after->message;
  }
}

TEST_F(WorkerGpuSequence, RetimeTimesCandidateAndIncumbentInOneChild) {
  gpu::CompilePool pool(2, nullptr);
  Sandbox sandbox(GpuSandboxOptions());
  RunnerOptions ro;
  ro.gpu = Describe(TheGpu().info);
  ro.compile_cache_dir = CacheDir();
  LocalTaskRunner runner(&pool, &sandbox, ro);
  CorpusCase good;
  for (const CorpusCase& c : LoadCorpus())
    if (c.file == "good.cu") good = c;
  TaskSpec t = CorpusTask(good, ro.gpu.arch, 77);
  t.kind = TaskKind::kRetime;
  t.incumbent = t.variant;
  t.incumbent->variant_id = "incumbent-good";
  std::atomic<bool> cancel{false};
  std::optional<TaskResult> r = runner.Run(t, cancel);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, Outcome::kVerified) << r->message;
  ASSERT_TRUE(r->timing.has_value());
  ASSERT_TRUE(r->incumbent_timing.has_value()) << r->message;
  EXPECT_GT(r->timing->median_us, 0);
  EXPECT_GT(r->incumbent_timing->median_us, 0);
  std::cout << "retime: " << r->message << "\n";
}

// compute-sanitizer, where the machine has one that works: the tool's own
// path from $KFORGE_COMPUTE_SANITIZER, else CUDA's default place.
std::string SanitizerPath() {
  const char* env = std::getenv("KFORGE_COMPUTE_SANITIZER");
  std::string path = env != nullptr && *env != '\0' ? env : "/usr/local/cuda/bin/compute-sanitizer";
  return access(path.c_str(), X_OK) == 0 ? path : "";
}

// As kforge-worker's, with room for a whole test's worth of gates.
SandboxOptions GateSandboxOptions() {
  SandboxOptions o = worker::GateSandboxOptions(GpuSandboxOptions());
  o.absolute_limit = 900s;
  return o;
}

// The gates this machine runs, probed once as kforge-worker does at start.
const std::vector<std::string>& WorkingGates() {
  static const std::vector<std::string>* tools = [] {
    auto* t = new std::vector<std::string>;
    const std::string path = SanitizerPath();
    if (path.empty() || !TheGpu().driver) return t;
    *t = ProbeSanitizerTools(path, {std::begin(kSanitizerTools), std::end(kSanitizerTools)},
                             GateSandboxOptions(), 0, CacheDir(),
                             SeedCalibration(TheGpu().info.arch, 0, CacheDir()));
    std::cout << "sanitizer gates that run here: " << fmt::format("{}", fmt::join(*t, ", ")) << "\n";
    return t;
  }();
  return *tools;
}

// Where compute-sanitizer is, every one of its four tools passes kforge's own
// seed kernel, so the worker keeps every gate. (On 12-07 memcheck failed it
// on an H100, on the host's deliberate cuFuncGetParamInfo errors, and the
// worker dropped memcheck without anything else failing: notes/bwd.md v18.)
TEST(WorkerGpuGates, EveryGateWorksWhereComputeSanitizerIs) {
  if (SanitizerPath().empty()) GTEST_SKIP() << "no compute-sanitizer here";
  if (!TheGpu().driver) GTEST_SKIP() << "no GPU here";
  for (const char* tool : kSanitizerTools) {
    EXPECT_TRUE(std::find(WorkingGates().begin(), WorkingGates().end(), tool) !=
                WorkingGates().end())
        << tool << " does not pass the seed kernel here";
  }
}

// A runner as kforge-worker builds it: every gate that works here.
RunnerOptions GatedRunnerOptions() {
  RunnerOptions ro;
  ro.gpu = Describe(TheGpu().info);
  ro.compile_cache_dir = CacheDir();
  ro.sanitizer = SanitizerPath();
  ro.sanitizer_tools = WorkingGates();
  ro.gate_sandbox = GateSandboxOptions();
  return ro;
}

// The compile pool, sandbox and gated runner of a gate test.
struct GatedRig {
  gpu::CompilePool pool{2, nullptr};
  Sandbox sandbox{GpuSandboxOptions()};
  LocalTaskRunner runner{&pool, &sandbox, GatedRunnerOptions()};
};

bool Has(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

std::vector<CorpusCase> VerifiedCorpus() {
  std::vector<CorpusCase> out;
  nlohmann::json expected = nlohmann::json::parse(bad_kernels::ExpectedJson());
  for (const CorpusCase& c : LoadCorpus()) {
    if (c.expected == "verified") out.push_back(c);
  }
  return out;
}

// What a CONFIRM task (promotion strength, every gate that runs here) must
// end in for corpus kernel `file`, and the gate it needs to get there.
std::pair<std::string, std::string> Promoted(const std::string& file) {
  nlohmann::json expected = nlohmann::json::parse(bad_kernels::ExpectedJson());
  for (const auto& k : expected.at("kernels")) {
    if (k.at("file") != file) continue;
    return {k.value("promoted", k.at("expected").get<std::string>()), k.value("gate", "")};
  }
  return {"", ""};
}

class WorkerGpuPromotion : public ::testing::TestWithParam<CorpusCase> {
 protected:
  void SetUp() override {
    if (!TheGpu().driver) GTEST_SKIP() << TheGpu().skip_reason;
  }
};

// Every corpus kernel an EVALUATE verifies goes through a CONFIRM, as one
// about to become a bucket's best would: the quiet out-of-bounds read, the
// race and the divergent barrier are stopped by their sanitizer, the 32-bit
// offsets by the bucket's corner, and the good kernels pass everything.
TEST_P(WorkerGpuPromotion, CorpusKernelGetsItsPromotedOutcome) {
  const CorpusCase& c = GetParam();
  const auto [want, gate] = Promoted(c.file);
  if (!gate.empty() && !Has(WorkingGates(), gate)) {
    GTEST_SKIP() << c.file << " needs compute-sanitizer's " << gate << ", which does not run here";
  }
  gpu::CompilePool pool(1, nullptr);
  Sandbox sandbox(GpuSandboxOptions());
  LocalTaskRunner runner(&pool, &sandbox, GatedRunnerOptions());
  TaskSpec t = CorpusTask(c, TheGpu().info.arch, 5150);
  t.kind = TaskKind::kConfirm;
  std::atomic<bool> cancel{false};
  const auto start = std::chrono::steady_clock::now();
  std::optional<TaskResult> r = runner.Run(t, cancel);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(r.has_value());
  std::cout << fmt::format("confirm {:22} {:14} {:6.1f} s  {}\n", c.file, OutcomeName(r->outcome), s,
                           r->message.substr(0, 300));
  EXPECT_EQ(std::string(OutcomeName(r->outcome)), want) << r->message;
  EXPECT_FALSE(r->worker_fault) << r->message;
  if (!gate.empty()) {
    EXPECT_NE(r->message.find("compute-sanitizer " + gate + " gate"), std::string::npos) << r->message;
  }
  if (want == "verified") {
    ASSERT_TRUE(r->verified.has_value());
    // Promotion verifies the whole bucket: the extent covers its corner.
    const ShapeKey key = bad_kernels::ShapeFromJson(c.shape);
    EXPECT_TRUE(ExtentCovers(*r->verified, key));
  }
}

INSTANTIATE_TEST_SUITE_P(Corpus, WorkerGpuPromotion, ::testing::ValuesIn(VerifiedCorpus()),
                         [](const ::testing::TestParamInfo<CorpusCase>& info) {
                           std::string name = info.param.file.substr(0, info.param.file.find('.'));
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

// A bucket shape of the seed-gate tests: GQA 4:2, 24 sequences of up to 700.
ShapeKey GateShape(Op op, int d, bool causal) {
  ShapeKey k;
  k.op = op;
  k.head_dim = d;
  k.heads = 4;
  k.kv_heads = 2;
  k.causal = causal;
  k.arch = TheGpu().info.arch;
  k.batch = 24;
  k.max_len_q = 700;
  k.total_q = 24 * 300;
  k.max_len_k = 700;
  k.total_k = 24 * 300;
  return k;
}

// The gate batch as tiny sequences (6 queries and keys on average, at most
// 90): nearly every tile is a packed run.
ShapeKey TinyGateShape(Op op, int d, bool causal) {
  ShapeKey k = GateShape(op, d, causal);
  k.max_len_q = k.max_len_k = 90;
  k.total_q = k.total_k = k.batch * 6;
  return k;
}

// The gate batch as cross attention (keys apart from the queries). Its
// sampled check problem pairs zero queries with keys, so the racecheck and
// synccheck gates see key tiles without steps after other tiles of the same
// CTA (that problem runs on two or three CTAs).
ShapeKey CrossGateShape(Op op, int d, bool causal) {
  ShapeKey k = GateShape(op, d, causal);
  k.cross = true;
  k.max_len_k = 900;
  k.total_k = k.batch * 200;
  return k;
}

// One CONFIRM through every working gate; prints what it took.
std::optional<TaskResult> ConfirmThroughGates(LocalTaskRunner& runner, const ShapeKey& k, const Variant& v,
                               const std::string& label, uint64_t seed) {
  std::atomic<bool> cancel{false};
  TaskSpec t;
  t.task_id = fmt::format("gate-{}-d{}-{}", OpName(k.op), k.head_dim, seed);
  t.kind = TaskKind::kConfirm;
  t.shape.key = k;
  t.variant.variant_id = v.template_name;
  t.variant.source = v.source;
  t.variant.manifest_json = ManifestToJson(v.manifest);
  t.seed = seed;
  const auto start = std::chrono::steady_clock::now();
  std::optional<TaskResult> r = runner.Run(t, cancel);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!r) return r;
  std::cout << fmt::format("confirm {:40} {} d{} {:10} {:6.1f} s  {}\n", label, OpName(k.op),
                           k.head_dim, OutcomeName(r->outcome), s, r->message.substr(0, 300));
  return r;
}

// `tmpl` at `knobs` and head dim d through every gate, on the gate batch of
// `op` (or its batch of tiny sequences), expected verified; `label` names
// the setting in a failure.
void ExpectVerifiedThroughGates(LocalTaskRunner& runner, const std::string& tmpl,
                                const std::map<std::string, int>& knobs, const ShapeKey& k,
                                const std::string& label, uint64_t seed) {
  absl::StatusOr<Variant> v = Instantiate(tmpl, knobs, k.head_dim);
  ASSERT_TRUE(v.ok()) << label << ": " << v.status();
  auto r = ConfirmThroughGates(runner, k, *v, label, seed);
  ASSERT_TRUE(r.has_value()) << label;
  EXPECT_EQ(r->outcome, Outcome::kVerified) << label << " d" << k.head_dim << ": " << r->message;
}
void ExpectVerifiedThroughGates(LocalTaskRunner& runner, const std::string& tmpl,
                                const std::map<std::string, int>& knobs, int d, Op op,
                                bool causal, bool tiny, const std::string& label, uint64_t seed) {
  ExpectVerifiedThroughGates(runner, tmpl, knobs,
                             tiny ? TinyGateShape(op, d, causal) : GateShape(op, d, causal), label,
                             seed);
}

// kforge's own seed kernels must pass every gate: a sanitizer that flags
// them would stop every bucket from being served a tuned kernel.
TEST_F(WorkerGpuSequence, SeedDefaultsPassEveryGate) {
  if (WorkingGates().empty()) GTEST_SKIP() << "no compute-sanitizer tool runs here";
  GatedRig rig;
  uint64_t seed = 900;
  for (Op op : {Op::kForward, Op::kBackward}) {
    for (int d : {64, 128}) {
      const ShapeKey k = GateShape(op, d, d == 128);
      absl::StatusOr<Variant> v = DefaultVariant(k);
      ASSERT_TRUE(v.ok()) << v.status();
      auto r = ConfirmThroughGates(rig.runner, k, *v, "seed " + v->template_name, ++seed);
      ASSERT_TRUE(r.has_value());
      EXPECT_EQ(r->outcome, Outcome::kVerified) << v->template_name << " d" << d << ": " << r->message;
    }
  }
}

// bwd_sm90 through every gate (kernels/notes/bwd.md): every consumer thread
// releases the stages (racecheck flagged the elected-lane form); tiles are
// handed from the producer to the consumers through smem slots and
// mbarriers; the dQ staging buffers are written by the consumers and read
// by bulk reduce-adds (the async proxy); delta is claimed and published in
// global memory; runs of short sequences share a key block (packed tiles:
// row windows and member offsets in smem). Its defaults at both head dims,
// both masks, the other tile order, and a batch of tiny sequences.
TEST_F(WorkerGpuSequence, BwdSm90PassesEveryGate) {
  if (WorkingGates().empty()) GTEST_SKIP() << "no compute-sanitizer tool runs here";
  if (TheGpu().info.arch != "sm_90a") GTEST_SKIP() << "bwd_sm90 needs sm_90a";
  GatedRig rig;
  struct S { int d, bm; bool causal; int order; bool tiny = false; int split = 0; int direct = 0; int dqw = 0; };
  uint64_t seed = 950;
  // (DQ_DIRECT=1: dQ stored by the consumer threads from the staging buffer
  // that bulk reduce-adds read in the other tiles)
  for (S s : {S{64, 128, false, 1}, S{128, 64, true, 1}, S{128, 64, false, 1},
              S{64, 64, true, 0}, S{128, 64, true, 0}, S{128, 64, true, 1, true},
              S{128, 64, false, 1, false, 1}, S{128, 64, true, 1, true, 0, 1},
              S{64, 128, false, 1, false, 0, 1}, S{128, 64, false, 1, false, 1, 0, 1},
              S{64, 128, true, 1, false, 0, 0, 1}}) {
    const std::string label =
        fmt::format("bwd_sm90 BM{} ORDER{}{}{}{}{}{}", s.bm, s.order, s.causal ? " causal" : "",
                    s.tiny ? " tiny" : "", s.split ? " SPLIT" : "", s.direct ? " DQ_DIRECT" : "",
                    s.dqw ? " DQW" : "");
    ExpectVerifiedThroughGates(
        rig.runner, "bwd_sm90",
        {{"BLOCK_M", s.bm}, {"BLOCK_N", 128}, {"STAGES", 2}, {"ORDER", s.order}, {"SPLIT", s.split},
         {"DQ_DIRECT", s.direct}, {"DQW", s.dqw}},
        s.d, Op::kBackward, s.causal, s.tiny, label, ++seed);
  }
}

// bwd_sm90 on cross attention through every gate: a key tile without steps
// (keys of a sequence without queries) writes the staging buffer that the
// previous tile's dK/dV copy of the same CTA read, with a warpgroup barrier
// between them since v20 (notes/bwd.md; racecheck before it: see v20). The
// served defaults (KVSTORE=1) at both head dims, causal, DQ_DIRECT, KVSTORE=0
// (the threads' copy), and the heavy-tailed class's settings with HELP=2.
TEST_F(WorkerGpuSequence, BwdSm90CrossPassesEveryGate) {
  if (WorkingGates().empty()) GTEST_SKIP() << "no compute-sanitizer tool runs here";
  if (TheGpu().info.arch != "sm_90a") GTEST_SKIP() << "bwd_sm90 needs sm_90a";
  GatedRig rig;
  struct S { int d; bool causal; std::map<std::string, int> knobs; std::string what; };
  const std::map<std::string, int> heavy = {{"ORDER", 1}, {"SPLIT", 1}, {"KVFIRST", 1}, {"DQW", 1},
                                            {"DQZ", 0}, {"HELP", 2}, {"CSKIP", 0}};
  uint64_t seed = 1130;
  for (const S& s : {S{128, false, {}, "defaults"}, S{64, true, {}, "defaults"},
                     S{128, true, {{"DQ_DIRECT", 1}}, "DQ_DIRECT"},
                     S{128, false, {{"KVSTORE", 0}}, "KVSTORE0"}, S{128, false, heavy, "HELP2"}}) {
    std::map<std::string, int> knobs = {
        {"BLOCK_M", s.d == 64 ? 128 : 64}, {"BLOCK_N", 128}, {"STAGES", 2}, {"KVSTORE", 1}};
    for (const auto& [name, value] : s.knobs) knobs[name] = value;
    ExpectVerifiedThroughGates(
        rig.runner, "bwd_sm90", knobs, CrossGateShape(Op::kBackward, s.d, s.causal),
        fmt::format("bwd_sm90 cross {}{}", s.what, s.causal ? " causal" : ""), ++seed);
  }
}

// bwd_sm90 with the heavy-tailed short class's settings (SPLIT=1 KVFIRST=1
// DQW=1) and HELP=2: at head dim 128 with CSKIP 0 (that class's default) and
// 1, at head dim 64 with CSKIP 1 (its default; notes/bwd.md v17, v18),
// through every gate: head
// ends that complete many blocks queue them while tiles are left, and CTAs
// without tiles convert them from the queue (global-memory tags, a ticket
// counter and a tiles-finished count), both masks and a batch of tiny
// sequences.
TEST_F(WorkerGpuSequence, BwdSm90Help2PassesEveryGate) {
  if (WorkingGates().empty()) GTEST_SKIP() << "no compute-sanitizer tool runs here";
  if (TheGpu().info.arch != "sm_90a") GTEST_SKIP() << "bwd_sm90 needs sm_90a";
  GatedRig rig;
  struct S { bool causal, tiny; int cskip, d = 128; };
  uint64_t seed = 970;
  for (S s : {S{false, false, 0}, S{true, false, 0}, S{false, true, 0}, S{false, false, 1},
              S{true, false, 1}, S{false, true, 1}, S{false, false, 1, 64},
              S{true, false, 1, 64}, S{false, true, 1, 64}}) {
    const std::string label = fmt::format("bwd_sm90 HELP2 CSKIP{}{}{}", s.cskip,
                                          s.causal ? " causal" : "", s.tiny ? " tiny" : "");
    ExpectVerifiedThroughGates(
        rig.runner, "bwd_sm90",
        {{"BLOCK_M", s.d == 64 ? 128 : 64}, {"BLOCK_N", 128}, {"STAGES", 2}, {"ORDER", 1},
         {"SPLIT", 1}, {"KVFIRST", 1}, {"DQW", 1}, {"CSKIP", s.cskip}, {"HELP", 2}},
        s.d, Op::kBackward, s.causal, s.tiny, label, ++seed);
  }
}

// bwd_sm90 KVSTORE=1 (served since v20) through every gate: dK and dV staged
// as swizzled panels and stored by TMA (the async proxy reads the staging
// buffer the next tile's dQ slices reuse), tails copied from the panels; the
// defaults at both head dims, causal, tiny sequences, and the heavy-tailed
// class's HELP=2 settings.
TEST_F(WorkerGpuSequence, BwdSm90KvStorePassesEveryGate) {
  if (WorkingGates().empty()) GTEST_SKIP() << "no compute-sanitizer tool runs here";
  if (TheGpu().info.arch != "sm_90a") GTEST_SKIP() << "bwd_sm90 needs sm_90a";
  GatedRig rig;
  struct S { int d; bool causal, tiny; bool heavy = false; };
  uint64_t seed = 1110;
  for (S s : {S{128, false, false}, S{128, true, false}, S{128, false, true}, S{64, true, true},
              S{64, false, false}, S{128, false, false, true}, S{64, false, true, true}}) {
    std::map<std::string, int> knobs = {
        {"BLOCK_M", s.d == 64 ? 128 : 64}, {"BLOCK_N", 128}, {"STAGES", 2}, {"KVSTORE", 1}};
    if (s.heavy) {
      // the heavy-tailed class's served settings (HELP=2; CSKIP=0 at head dim 128)
      for (const auto& [k, v] : std::map<std::string, int>{
               {"ORDER", 1}, {"SPLIT", 1}, {"KVFIRST", 1}, {"DQW", 1}, {"DQZ", 0}, {"HELP", 2},
               {"CSKIP", s.d == 128 ? 0 : 1}})
        knobs[k] = v;
    }
    ExpectVerifiedThroughGates(rig.runner, "bwd_sm90", knobs, s.d, Op::kBackward, s.causal, s.tiny,
                               fmt::format("bwd_sm90 KVSTORE{}{}{}", s.heavy ? " HELP2" : "",
                                           s.causal ? " causal" : "", s.tiny ? " tiny" : ""),
                               ++seed);
  }
}

// fwd_sm90 with the host-balanced list and packed tiles (ORDER=1 PACK=1)
// through every gate: each thread's row windows come from the offsets in
// global memory, and the K/V ring is shared by plain and packed tiles of one
// CTA's list; on the gate batch and on a batch of tiny sequences.
TEST_F(WorkerGpuSequence, FwdSm90PackedPassesEveryGate) {
  if (WorkingGates().empty()) GTEST_SKIP() << "no compute-sanitizer tool runs here";
  if (TheGpu().info.arch != "sm_90a") GTEST_SKIP() << "fwd_sm90 needs sm_90a";
  GatedRig rig;
  struct S { int d; bool causal, tiny; };
  uint64_t seed = 990;
  for (S s : {S{128, true, false}, S{128, false, true}, S{64, true, true}}) {
    ExpectVerifiedThroughGates(
        rig.runner, "fwd_sm90",
        {{"BLOCK_M", 128}, {"BLOCK_N", 128}, {"STAGES", 2}, {"PERSISTENT", 1}, {"ORDER", 1},
         {"PACK", 1}},
        s.d, Op::kForward, s.causal, s.tiny,
        fmt::format("fwd_sm90 PACK1{}{}", s.causal ? " causal" : "", s.tiny ? " tiny" : ""),
        ++seed);
  }
}

// fwd_sm90 QAHEAD=2 through every gate: the next tile's Q is copied into the
// buffer the tile before read, while the other warps may still be in this
// tile, and the next tile's first QK^T runs beside this one's last PV, so a
// missing barrier would show as a race or a sync error here.
TEST_F(WorkerGpuSequence, FwdSm90ChainedPassesEveryGate) {
  if (WorkingGates().empty()) GTEST_SKIP() << "no compute-sanitizer tool runs here";
  if (TheGpu().info.arch != "sm_90a") GTEST_SKIP() << "fwd_sm90 needs sm_90a";
  GatedRig rig;
  struct S { int d, stages; bool causal, tiny; };
  uint64_t seed = 1010;
  for (S s : {S{128, 2, true, false}, S{64, 3, false, true}}) {
    ExpectVerifiedThroughGates(
        rig.runner, "fwd_sm90",
        {{"BLOCK_M", 128}, {"BLOCK_N", 128}, {"STAGES", s.stages}, {"PERSISTENT", 1},
         {"QAHEAD", 2}},
        s.d, Op::kForward, s.causal, s.tiny,
        fmt::format("fwd_sm90 QAHEAD2{}{}", s.causal ? " causal" : "", s.tiny ? " tiny" : ""),
        ++seed);
  }
}

// fwd_stream through every gate, on the short-key cross batches it is served
// for: its served setting at both head dims (causal at D=64: rows that see no
// key); its stages are refilled by cp.async while other warps still compute.
TEST_F(WorkerGpuSequence, FwdStreamPassesEveryGate) {
  if (WorkingGates().empty()) GTEST_SKIP() << "no compute-sanitizer tool runs here";
  GatedRig rig;
  struct S { int d; bool causal; };
  uint64_t seed = 970;
  for (S s : {S{128, false}, S{64, true}}) {
    ShapeKey k = GateShape(Op::kForward, s.d, s.causal);
    k.cross = true;
    k.max_len_k = 16;
    k.total_k = 24 * 8;
    absl::StatusOr<Variant> v = DefaultVariant(k);
    ASSERT_TRUE(v.ok()) << v.status();
    ASSERT_EQ(v->template_name, "fwd_stream");
    const std::string label = fmt::format("fwd_stream{}", s.causal ? " causal" : "");
    auto r = ConfirmThroughGates(rig.runner, k, *v, label, ++seed);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->outcome, Outcome::kVerified) << label << " d" << s.d << ": " << r->message;
  }
}

// The whole worker (gRPC client, loop, runner, sandbox) against the test
// double of the server: an EVALUATE task comes back VERIFIED with timing.
TEST_F(WorkerGpuSequence, EvaluateTaskEndToEndThroughTheWorkerLoop) {
  testing::FakeServer server("gpu-token");
  gpu::CompilePool pool(1, nullptr);
  Sandbox sandbox(GpuSandboxOptions());
  RunnerOptions ro;
  ro.gpu = Describe(TheGpu().info);
  ro.compile_cache_dir = CacheDir();
  LocalTaskRunner runner(&pool, &sandbox, ro);
  GrpcClientOptions co;
  co.target = server.address();
  co.token = "gpu-token";
  std::unique_ptr<ServerClient> client = MakeGrpcServerClient(co);
  WorkerOptions wo;
  wo.registration.worker_name = "gpu-test";
  wo.registration.gpu = ro.gpu;
  wo.lease_wait = 500ms;
  Worker worker(client.get(), &runner, wo);
  std::thread loop([&] { worker.Run(); });

  CorpusCase good;
  for (const CorpusCase& c : LoadCorpus())
    if (c.file == "good.cu") good = c;
  pb::Task task;
  task.set_task_id("e2e");
  task.set_kind(pb::TASK_KIND_EVALUATE);
  pb::Shape* s = task.mutable_shape();
  const ShapeKey key = bad_kernels::ShapeFromJson(good.shape);
  s->set_op(pb::OP_FORWARD);
  s->set_dtype(pb::DTYPE_BF16);
  s->set_head_dim(key.head_dim);
  s->set_heads(key.heads);
  s->set_kv_heads(key.kv_heads);
  s->set_causal(key.causal);
  s->set_cross(key.cross);
  s->set_arch(ro.gpu.arch);
  s->set_batch(key.batch);
  s->set_max_len_q(key.max_len_q);
  s->set_total_q(key.total_q);
  s->set_max_len_k(key.max_len_k);
  s->set_total_k(key.total_k);
  task.mutable_variant()->set_variant_id("good");
  task.mutable_variant()->set_source(bad_kernels::Source("good.cu"));
  task.mutable_variant()->set_manifest_json(good.manifest.dump());
  task.set_seed(9);
  server.service().Enqueue(task);
  bool reported = server.service().WaitFor([](auto& sv) { return sv.reports_locked() == 1; }, 180s);
  worker.Stop();
  loop.join();
  ASSERT_TRUE(reported);
  pb::ReportResultRequest r = server.service().reports()[0];
  EXPECT_EQ(r.result().outcome(), pb::EVAL_OUTCOME_VERIFIED) << r.result().message();
  EXPECT_GT(r.result().timing().median_us(), 0);
  EXPECT_EQ(r.result().gpu().name(), TheGpu().info.name);
  EXPECT_FALSE(server.service().workers().begin()->second.compile_only());
}

}  // namespace
}  // namespace kforge::worker
