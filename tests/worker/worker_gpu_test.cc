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
#include <nlohmann/json.hpp>

#include "gpu/compile.h"
#include "gpu/compile_cache.h"
#include "gpu/gpu.h"
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

// The sanitizer gate for real: the probe kforge-worker runs at start, then a
// RETIME whose candidate reads past the end of K (oob_read.cu, which passes
// every check without the gate) stopped by memcheck, and a good candidate let
// through to its retime.
TEST_F(WorkerGpuSequence, SanitizerGateStopsAQuietOutOfBoundsRead) {
  const std::string sanitizer = SanitizerPath();
  if (sanitizer.empty()) {
    GTEST_SKIP() << "no compute-sanitizer (set KFORGE_COMPUTE_SANITIZER or install CUDA's)";
  }
  SandboxOptions gate_options = GpuSandboxOptions();
  gate_options.wrapper = SanitizerGateWrapper(sanitizer);
  gate_options.setup_limit = 600s;
  gate_options.absolute_limit = 900s;
  Sandbox gate(gate_options);

  ChildRequest probe;
  probe.mode = ChildRequest::Mode::kProbe;
  probe.compile_cache_dir = CacheDir();
  absl::StatusOr<SandboxRun> ready = gate.Run(probe);
  ASSERT_TRUE(ready.ok()) << ready.status();
  if (ready->report.outcome != Outcome::kVerified &&
      ready->stderr_tail.find("Device not supported") != std::string::npos) {
    // Seen on gVisor machines: the tool refuses the device outright.
    GTEST_SKIP() << "compute-sanitizer does not support this device here: "
                 << ready->stderr_tail;
  }
  ASSERT_EQ(ready->report.outcome, Outcome::kVerified)
      << ready->report.message << "\n" << ready->stderr_tail;
  std::cout << "probe under memcheck: " << ready->wall_ms / 1000.0 << " s, "
            << ready->report.message << "\n";

  gpu::CompilePool pool(2, nullptr);
  Sandbox sandbox(GpuSandboxOptions());
  RunnerOptions ro;
  ro.gpu = Describe(TheGpu().info);
  ro.compile_cache_dir = CacheDir();
  ro.sanitizer_gate = &gate;
  LocalTaskRunner runner(&pool, &sandbox, ro);
  CorpusCase good, quiet;
  for (const CorpusCase& c : LoadCorpus()) {
    if (c.file == "good.cu") good = c;
    if (c.file == "oob_read.cu") quiet = c;
  }
  ASSERT_FALSE(quiet.file.empty());
  std::atomic<bool> cancel{false};

  // Without the gate the quiet kernel passes: the gate is what stops it.
  LocalTaskRunner plain(&pool, &sandbox, RunnerOptions{.gpu = ro.gpu,
                                                       .compile_cache_dir = ro.compile_cache_dir});
  std::optional<TaskResult> ungated = plain.Run(CorpusTask(quiet, ro.gpu.arch, 5), cancel);
  ASSERT_TRUE(ungated.has_value());
  EXPECT_EQ(ungated->outcome, Outcome::kVerified) << ungated->message;

  TaskSpec bad = CorpusTask(quiet, ro.gpu.arch, 6);
  bad.kind = TaskKind::kRetime;
  bad.incumbent = CorpusTask(good, ro.gpu.arch, 6).variant;
  std::optional<TaskResult> stopped = runner.Run(bad, cancel);
  ASSERT_TRUE(stopped.has_value());
  EXPECT_EQ(stopped->outcome, Outcome::kCrashed) << stopped->message;
  EXPECT_FALSE(stopped->worker_fault) << stopped->message;
  EXPECT_NE(stopped->message.find("compute-sanitizer gate"), std::string::npos)
      << stopped->message;
  EXPECT_NE(stopped->message.find("Invalid __global__ read"), std::string::npos)
      << stopped->message;
  std::cout << "gate on oob_read.cu: " << stopped->message << "\n";

  TaskSpec fine = CorpusTask(good, ro.gpu.arch, 7);
  fine.kind = TaskKind::kRetime;
  fine.incumbent = fine.variant;
  fine.incumbent->variant_id = "incumbent-good";
  std::optional<TaskResult> passed = runner.Run(fine, cancel);
  ASSERT_TRUE(passed.has_value());
  EXPECT_EQ(passed->outcome, Outcome::kVerified) << passed->message;
  EXPECT_TRUE(passed->incumbent_timing.has_value()) << passed->message;
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
