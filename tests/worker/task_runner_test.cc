// The task runner's whole EVALUATE/RETIME path without a GPU: real NVRTC
// compiles, a real sandboxed child (kforge-worker --eval-child) whose
// evaluation is replaced by a self-test mode (--self-test=MODE).
#include "worker/task_runner.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <unistd.h>

#include "gpu/compile.h"
#include "gpu/compile_cache.h"
#include "tests/worker/worker_bin.h"
#include "worker/compile_child.h"
#include "worker/sandbox.h"

namespace kforge::worker {
namespace {

using namespace std::chrono_literals;

constexpr char kGood[] = R"(#include "kforge/attn_params.h"
extern "C" __global__ void kf_attn_fwd(const __grid_constant__ KfAttnParams p) {
  if (threadIdx.x == 0) p.lse[blockIdx.x] = 2.0f;
}
)";
constexpr char kBroken[] = R"(#include "kforge/attn_params.h"
extern "C" __global__ void kf_attn_fwd(const __grid_constant__ KfAttnParams p) { oops }
)";

class TaskRunnerTest : public ::testing::Test {
 protected:
  TaskRunnerTest()
      : pool_(2, nullptr),
        scratch_(std::filesystem::temp_directory_path() /
                 ("kforge-runner-test-" + std::to_string(getpid()))) {}
  ~TaskRunnerTest() override { std::filesystem::remove_all(scratch_); }

  std::optional<TaskResult> Run(const std::string& self_test, TaskSpec task,
                                std::atomic<bool>* cancel = nullptr,
                                const std::string& gate_script = "",
                                std::vector<std::string> tools = {"memcheck"}) {
    std::vector<std::optional<TaskResult>> r =
        RunAll(self_test, {std::move(task)}, cancel, gate_script, std::move(tools));
    return r[0];
  }

  // The tasks one after the other through one runner.
  std::vector<std::optional<TaskResult>> RunAll(const std::string& self_test,
                                                std::vector<TaskSpec> tasks,
                                                std::atomic<bool>* cancel = nullptr,
                                                const std::string& gate_script = "",
                                                std::vector<std::string> tools = {"memcheck"}) {
    SandboxOptions so;
    so.executable = testing::WorkerBinary();
    so.child_args = {"--eval-child", "--self-test=" + self_test};
    so.scratch_dir = scratch_;
    so.setup_limit = 800ms;
    so.min_run_limit = 500ms;
    Sandbox sandbox(so);
    // The gate's wrapper is a script standing in for compute-sanitizer; its
    // child runs the candidate's checks alone ("verified").
    SandboxOptions gate_options = so;
    gate_options.child_args = {"--eval-child", "--self-test=verified"};
    gate_options.wrapper = {gate_script};
    RunnerOptions ro;
    ro.secrets = secrets_;
    if (!gate_script.empty()) {
      ro.sanitizer = gate_script;
      ro.sanitizer_tools = std::move(tools);
      ro.gate_sandbox = gate_options;
    }
    ro.gpu.name = "Fake GPU";
    ro.gpu.arch = "sm_90a";
    LocalTaskRunner runner(&pool_, &sandbox, ro);
    std::atomic<bool> no_cancel{false};
    std::vector<std::optional<TaskResult>> results;
    for (const TaskSpec& task : tasks) results.push_back(runner.Run(task, cancel ? *cancel : no_cancel));
    return results;
  }

  static TaskSpec Evaluate(const std::string& source = kGood) {
    TaskSpec t;
    t.task_id = "t1";
    t.kind = TaskKind::kEvaluate;
    t.shape.key.head_dim = 64;
    t.shape.key.heads = 2;
    t.shape.key.kv_heads = 2;
    t.shape.key.arch = "sm_90a";
    t.variant = {"v1", source, R"({"entry_point":"kf_attn_fwd","threads":64})", ""};
    t.seed = 5;
    return t;
  }

  gpu::CompilePool pool_;
  std::filesystem::path scratch_;
  std::vector<std::string> secrets_;
};

TEST_F(TaskRunnerTest, EvaluateCompilesThenReportsWhatTheChildMeasured) {
  std::optional<TaskResult> r = Run("verified", Evaluate());
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, Outcome::kVerified) << r->message;
  ASSERT_TRUE(r->timing.has_value());
  EXPECT_EQ(r->timing->median_us, 10);
  EXPECT_FALSE(r->compile.cubin.empty());
  EXPECT_GT(r->compile.compile_ms, 0);
  EXPECT_EQ(r->gpu.name, "Fake GPU");
  EXPECT_EQ(r->reference_version, "self-test");
}

TEST_F(TaskRunnerTest, ABrokenSourceIsACompileErrorAndNeverRuns) {
  std::optional<TaskResult> r = Run("segv", Evaluate(kBroken));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, Outcome::kCompileError) << r->message;
  EXPECT_FALSE(r->compile.log.empty());
}

TEST_F(TaskRunnerTest, HangingCandidateIsATimeout) {
  std::optional<TaskResult> r = Run("hang_after_reference", Evaluate());
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, Outcome::kTimeout) << r->message;
  EXPECT_FALSE(r->timing.has_value());
  EXPECT_FALSE(r->worker_fault);
}

TEST_F(TaskRunnerTest, ChildFailingBeforeTheReferenceIsTheWorkersFault) {
  for (const char* mode : {"hang", "exit_silently", "garbage"}) {
    std::optional<TaskResult> r = Run(mode, Evaluate());
    ASSERT_TRUE(r.has_value());
    EXPECT_TRUE(r->worker_fault) << mode << ": " << r->message;
    EXPECT_NE(r->message.find("before running the candidate"), std::string::npos) << r->message;
  }
}

TEST_F(TaskRunnerTest, CrashingChildIsCrashedWithTheReason) {
  std::optional<TaskResult> r = Run("fault", Evaluate());
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, Outcome::kCrashed);
  EXPECT_NE(r->message.find("CUDA_ERROR_ILLEGAL_ADDRESS"), std::string::npos) << r->message;
  EXPECT_FALSE(r->worker_fault);
}

TEST_F(TaskRunnerTest, NaNErrorMetricsAreReportedAsInfinite) {
  std::optional<TaskResult> r = Run("nan_metrics", Evaluate());
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, Outcome::kWrong);
  ASSERT_TRUE(r->errors.has_value());
  EXPECT_TRUE(std::isinf(r->errors->max_abs_error));
  EXPECT_TRUE(std::isinf(r->errors->rel_l2_error));
}

TEST_F(TaskRunnerTest, VerifiedWithoutTimingIsNotTrusted) {
  std::optional<TaskResult> r = Run("verified_without_timing", Evaluate());
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, Outcome::kCrashed);
  EXPECT_NE(r->message.find("without valid timing"), std::string::npos) << r->message;
}

TEST_F(TaskRunnerTest, RetimeReportsBothTimings) {
  TaskSpec t = Evaluate();
  t.kind = TaskKind::kRetime;
  t.incumbent = VariantSpec{"v0", kGood, R"({"entry_point":"kf_attn_fwd","threads":64})", "-DX=1"};
  std::optional<TaskResult> r = Run("retime", t);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, Outcome::kVerified) << r->message;
  ASSERT_TRUE(r->incumbent_timing.has_value());
  EXPECT_EQ(r->incumbent_timing->median_us, 20);
}

// Writes an executable shell script into the scratch folder.
std::string Script(const std::filesystem::path& dir, const std::string& name,
                   const std::string& body) {
  std::filesystem::create_directories(dir);
  const std::filesystem::path path = dir / name;
  std::ofstream(path) << "#!/bin/sh\n" << body;
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  return path.string();
}

// The stand-in sanitizers drop compute-sanitizer's own options (everything
// before the child's absolute path) and record which tool they were asked for.
const std::string kSkipSanitizerOptions =
    "while [ \"${1#/}\" = \"$1\" ]; do\n"
    "  if [ \"$1\" = --tool ]; then echo \"$2\" >> \"$(dirname \"$0\")/tools-run\"; fi\n"
    "  shift\n"
    "done\n";

TEST_F(TaskRunnerTest, ConfirmRunsEveryGateThenAPromotionStrengthEvaluation) {
  TaskSpec t = Evaluate();
  t.kind = TaskKind::kConfirm;
  const std::string clean = Script(scratch_, "clean-sanitizer", kSkipSanitizerOptions + "exec \"$@\"\n");
  std::optional<TaskResult> r =
      Run("verified", t, nullptr, clean, {"memcheck", "synccheck", "racecheck", "initcheck"});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, Outcome::kVerified) << r->message;
  std::ifstream in(scratch_ / "tools-run");
  std::set<std::string> tools;
  for (std::string line; std::getline(in, line);) tools.insert(line);
  EXPECT_EQ(tools, (std::set<std::string>{"memcheck", "synccheck", "racecheck", "initcheck"}));
}

TEST_F(TaskRunnerTest, AFindingOfAnyToolStopsAConfirmAndNamesTheTool) {
  TaskSpec t = Evaluate();
  t.kind = TaskKind::kConfirm;
  const std::string racy = Script(
      scratch_, "racy-sanitizer",
      "case \" $* \" in *' racecheck '*) race=1;; esac\n" + kSkipSanitizerOptions +
          "\"$@\"\nif [ -n \"$race\" ]; then echo '========= Race reported' >&2; exit " +
          std::to_string(kSanitizerFindingExit) + "; fi\n");
  std::optional<TaskResult> r = Run("verified", t, nullptr, racy, {"memcheck", "racecheck"});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, Outcome::kCrashed) << r->message;
  EXPECT_NE(r->message.find("compute-sanitizer racecheck gate"), std::string::npos) << r->message;
  EXPECT_FALSE(r->worker_fault);
}

// racecheck and synccheck run the sampled checks; memcheck and initcheck
// every length. A stand-in records what each tool's child was asked.
const std::string kRecordSampled =
    "for a in \"$@\"; do case \"$a\" in --request-dir=*) d=\"${a#--request-dir=}\";; esac; done\n"
    "grep -o '\"sampled_checks\":[a-z]*' \"$d/request.json\" | sed \"s/^/$tool /\" >> "
    "\"$(dirname \"$0\")/sampled\"\n";

TEST_F(TaskRunnerTest, TheCostliestToolsRunTheSampledChecks) {
  TaskSpec t = Evaluate();
  t.kind = TaskKind::kConfirm;
  const std::string script = Script(
      scratch_, "recording-sanitizer",
      "while [ \"${1#/}\" = \"$1\" ]; do [ \"$1\" = --tool ] && tool=$2; shift; done\n" +
          kRecordSampled + "exec \"$@\"\n");
  std::optional<TaskResult> r =
      Run("verified", t, nullptr, script, {"memcheck", "synccheck", "racecheck", "initcheck"});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, Outcome::kVerified) << r->message;
  std::ifstream in(scratch_ / "sampled");
  std::set<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.insert(line);
  EXPECT_EQ(lines, (std::set<std::string>{
                       "memcheck \"sampled_checks\":false", "initcheck \"sampled_checks\":false",
                       "racecheck \"sampled_checks\":true", "synccheck \"sampled_checks\":true"}));
}

// The same image on the same bucket is gated once per worker: the RETIME
// that follows a CONFIRM does not run the tools again; another bucket does.
TEST_F(TaskRunnerTest, AnImageGatedOnABucketIsNotGatedThereAgain) {
  TaskSpec confirm = Evaluate();
  confirm.kind = TaskKind::kConfirm;
  TaskSpec retime = confirm;
  retime.kind = TaskKind::kRetime;
  retime.incumbent = VariantSpec{"v0", kGood, R"({"entry_point":"kf_attn_fwd","threads":64})", ""};
  TaskSpec elsewhere = confirm;
  elsewhere.shape.key.causal = !confirm.shape.key.causal;
  const std::string clean =
      Script(scratch_, "clean-sanitizer", kSkipSanitizerOptions + "exec \"$@\"\n");
  std::vector<std::optional<TaskResult>> r =
      RunAll("verified", {confirm, retime, elsewhere}, nullptr, clean, {"memcheck"});
  ASSERT_EQ(r.size(), 3u);
  for (const auto& x : r) ASSERT_TRUE(x.has_value());
  EXPECT_EQ(r[0]->outcome, Outcome::kVerified) << r[0]->message;
  EXPECT_EQ(r[2]->outcome, Outcome::kVerified) << r[2]->message;
  std::ifstream in(scratch_ / "tools-run");
  int runs = 0;
  for (std::string line; std::getline(in, line);) runs += line == "memcheck";
  EXPECT_EQ(runs, 2);
}

TEST(SanitizerReportsErrors, ReadsTheSummaryAndRaceWarnings) {
  EXPECT_FALSE(SanitizerReportsErrors("========= ERROR SUMMARY: 0 errors\n"));
  EXPECT_TRUE(SanitizerReportsErrors("========= ERROR SUMMARY: 3 errors\n"));
  // racecheck reports races as warnings, which its exit code does not count.
  EXPECT_TRUE(SanitizerReportsErrors(
      "========= WARN: Race reported between Write access at 0x1f0 in kf_attn_fwd\n"
      "========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)\n"));
  EXPECT_FALSE(SanitizerReportsErrors("verified; median 12 us"));
}

TEST(SanitizerGateWrapper, InstrumentsOnlyTheCandidateExceptForInitcheck) {
  const auto memcheck = SanitizerGateWrapper("/cs", "memcheck", "kf_attn_fwd");
  EXPECT_NE(std::find(memcheck.begin(), memcheck.end(), "kns=kf_attn_fwd"), memcheck.end());
  const auto initcheck = SanitizerGateWrapper("/cs", "initcheck", "kf_attn_fwd");
  EXPECT_EQ(std::find(initcheck.begin(), initcheck.end(), "--kernel-name"), initcheck.end());
  // The host's own failed API calls (the parameter count's probe) are no finding.
  const auto api = std::find(memcheck.begin(), memcheck.end(), "--report-api-errors");
  ASSERT_NE(api, memcheck.end());
  EXPECT_EQ(*(api + 1), "no");
  // A name that is no identifier is not passed to compute-sanitizer's parser.
  const auto odd = SanitizerGateWrapper("/cs", "memcheck", "a,b=c");
  EXPECT_EQ(std::find(odd.begin(), odd.end(), "--kernel-name"), odd.end());
}

TEST_F(TaskRunnerTest, RetimeAfterACleanSanitizerGateIsTimedAsUsual) {
  TaskSpec t = Evaluate();
  t.kind = TaskKind::kRetime;
  t.incumbent = VariantSpec{"v0", kGood, R"({"entry_point":"kf_attn_fwd","threads":64})", ""};
  const std::string clean = Script(scratch_, "clean-sanitizer", kSkipSanitizerOptions + "exec \"$@\"\n");
  std::optional<TaskResult> r = Run("retime", t, nullptr, clean);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, Outcome::kVerified) << r->message;
  ASSERT_TRUE(r->incumbent_timing.has_value());
}

TEST_F(TaskRunnerTest, ASanitizerFindingStopsTheCandidateBeforeRetiming) {
  TaskSpec t = Evaluate();
  t.kind = TaskKind::kRetime;
  t.incumbent = VariantSpec{"v0", kGood, R"({"entry_point":"kf_attn_fwd","threads":64})", ""};
  // Like memcheck: the program runs (and even reports "verified"), then the
  // sanitizer prints its finding and exits with the finding code.
  const std::string finding = Script(
      scratch_, "finding-sanitizer",
      kSkipSanitizerOptions +
          "\"$@\"\necho '========= Invalid __global__ write of size 4 bytes' >&2\nexit " +
          std::to_string(kSanitizerFindingExit) + "\n");
  std::optional<TaskResult> r = Run("retime", t, nullptr, finding);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, Outcome::kCrashed) << r->message;
  EXPECT_NE(r->message.find("compute-sanitizer memcheck gate"), std::string::npos) << r->message;
  EXPECT_NE(r->message.find("Invalid __global__ write"), std::string::npos) << r->message;
  EXPECT_FALSE(r->incumbent_timing.has_value());
  EXPECT_FALSE(r->worker_fault);
}

TEST_F(TaskRunnerTest, RetimeWithoutIncumbentTimingIsNotTrusted) {
  TaskSpec t = Evaluate();
  t.kind = TaskKind::kRetime;
  t.incumbent = t.variant;
  std::optional<TaskResult> r = Run("verified", t);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, Outcome::kCrashed) << r->message;
}

TEST_F(TaskRunnerTest, RetimeWithABrokenIncumbentSaysWhich) {
  TaskSpec t = Evaluate();
  t.kind = TaskKind::kRetime;
  t.incumbent = VariantSpec{"v0", kBroken, "{}", ""};
  std::optional<TaskResult> r = Run("retime", t);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, Outcome::kCompileError);
  EXPECT_NE(r->message.find("incumbent v0"), std::string::npos) << r->message;
}

TEST_F(TaskRunnerTest, CancelDuringTheChildReportsNothing) {
  std::atomic<bool> cancel{false};
  std::thread t([&] {
    std::this_thread::sleep_for(300ms);
    cancel.store(true);
  });
  std::optional<TaskResult> r = Run("hang", Evaluate(), &cancel);
  t.join();
  EXPECT_FALSE(r.has_value());
}

TEST_F(TaskRunnerTest, VariantCompileOptionsArePassedToNvrtc) {
  TaskSpec t = Evaluate();
  t.kind = TaskKind::kCompile;
  t.variant.compile_options = "-DKF_TEST_OPTION=1  -lineinfo";
  std::optional<TaskResult> r = Run("verified", t);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, Outcome::kCompiled) << r->compile.log;
  EXPECT_NE(r->compile.options.find("-DKF_TEST_OPTION=1"), std::string::npos) << r->compile.options;
  EXPECT_NE(r->compile.options.find("-lineinfo"), std::string::npos);
}

TEST_F(TaskRunnerTest, ASourceTheCheckRefusesIsACompileErrorAndNeverCompiled) {
  for (const char* source :
       {"%:include </proc/self/environ>\n", "#define F </proc/self/environ>\n#include F\n",
        "#inc\\\nlude </proc/self/environ>\n"}) {
    TaskSpec t = Evaluate(std::string(source) + kGood);
    std::optional<TaskResult> r = Run("verified", t);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->outcome, Outcome::kCompileError) << r->message;
    EXPECT_NE(r->message.find("source: line"), std::string::npos) << r->message;
    EXPECT_TRUE(r->compile.options.empty()) << "NVRTC never saw it";
    EXPECT_FALSE(r->worker_fault);
  }
}

TEST_F(TaskRunnerTest, AnOversizedSourceIsRefused) {
  std::optional<TaskResult> r = Run("verified", Evaluate(kGood + std::string(300 * 1024, ' ')));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, Outcome::kCompileError);
  EXPECT_NE(r->message.find("exceeds the limit"), std::string::npos) << r->message;
}

TEST_F(TaskRunnerTest, VariantCompileOptionsOutsideTheAllowlistAreRefused) {
  for (const char* options : {"-I/etc", "-include /proc/self/environ", "--pre-include=/x",
                              "-arch=sm_80", "--no-such-option"}) {
    TaskSpec t = Evaluate();
    t.kind = TaskKind::kCompile;
    t.variant.compile_options = options;
    std::optional<TaskResult> r = Run("verified", t);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->outcome, Outcome::kCompileError) << options;
    EXPECT_NE(r->message.find("compile options"), std::string::npos) << r->message;
    EXPECT_TRUE(r->compile.options.empty()) << options;
  }
}

TEST_F(TaskRunnerTest, AnIncumbentTheCheckRefusesIsNotCompiled) {
  TaskSpec t = Evaluate();
  t.kind = TaskKind::kRetime;
  t.incumbent = VariantSpec{"v0", std::string("%:include </x>\n") + kGood, "{}", ""};
  std::optional<TaskResult> r = Run("retime", t);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, Outcome::kCompileError);
  EXPECT_NE(r->message.find("incumbent v0 is refused"), std::string::npos) << r->message;
}

TEST_F(TaskRunnerTest, TheWorkersSecretsAreRedactedFromLogsAndMessages) {
  // NVRTC quotes the offending line, secret and all.
  secrets_ = {"kfsecrettoken0123456789"};
  TaskSpec t = Evaluate(R"(#include "kforge/attn_params.h"
extern "C" __global__ void kf_attn_fwd(const __grid_constant__ KfAttnParams p) { kfsecrettoken0123456789; }
)");
  std::optional<TaskResult> r = Run("verified", t);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, Outcome::kCompileError);
  EXPECT_EQ(r->compile.log.find("kfsecrettoken0123456789"), std::string::npos) << r->compile.log;
  EXPECT_EQ(r->message.find("kfsecrettoken0123456789"), std::string::npos) << r->message;
  EXPECT_NE(r->compile.log.find("[redacted]"), std::string::npos) << r->compile.log;
}

TEST_F(TaskRunnerTest, HugeLogsAreCapped) {
  // One warning per line: far more log than a report may carry.
  std::string source = R"(#include "kforge/attn_params.h"
extern "C" __global__ void kf_attn_fwd(const __grid_constant__ KfAttnParams p) {
)";
  for (int i = 0; i < 4000; ++i) source += "  int unused_variable_number_" + std::to_string(i) + ";\n";
  source += "  oops\n}\n";
  std::optional<TaskResult> r = Run("verified", Evaluate(source));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, Outcome::kCompileError);
  EXPECT_LE(r->compile.log.size(), 64 * 1024 + 64);
  EXPECT_NE(r->compile.log.find("bytes cut"), std::string::npos);
  EXPECT_LE(r->message.size(), 4 * 1024 + 64);
}

TEST_F(TaskRunnerTest, EvaluateThroughTheCompileChild) {
  // The worker's real arrangement: misses compile in `kforge-worker
  // --compile-child`, the evaluation in the eval child.
  CompileChildOptions cco;
  cco.executable = testing::WorkerBinary();
  const CompileChild child(cco);
  gpu::CompilePool pool(1, nullptr, child.AsCompiler());
  SandboxOptions so;
  so.executable = testing::WorkerBinary();
  so.child_args = {"--eval-child", "--self-test=verified"};
  so.scratch_dir = scratch_;
  Sandbox sandbox(so);
  RunnerOptions ro;
  ro.gpu.arch = "sm_90a";
  LocalTaskRunner runner(&pool, &sandbox, ro);
  std::atomic<bool> no_cancel{false};
  std::optional<TaskResult> r = runner.Run(Evaluate(), no_cancel);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome, Outcome::kVerified) << r->message;
  EXPECT_FALSE(r->compile.cubin.empty());
  std::optional<TaskResult> broken = runner.Run(Evaluate(kBroken), no_cancel);
  ASSERT_TRUE(broken.has_value());
  EXPECT_EQ(broken->outcome, Outcome::kCompileError);
  EXPECT_NE(broken->compile.log.find("oops"), std::string::npos) << broken->compile.log;
}

}  // namespace
}  // namespace kforge::worker
