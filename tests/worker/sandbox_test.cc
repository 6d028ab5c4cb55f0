// The sandbox without a GPU: the real kforge-worker binary runs as the child
// in its test-only self-test modes (hang, segfault, abort, garbage, ...), and
// each misbehaviour must become the right outcome while the parent goes on.
#include "worker/sandbox.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "tests/worker/worker_bin.h"

namespace kforge::worker {
namespace {

using namespace std::chrono_literals;

class SandboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    scratch_ = std::filesystem::temp_directory_path() /
               ("kforge-sandbox-test-" + std::to_string(getpid()));
    std::filesystem::create_directories(scratch_);
  }
  void TearDown() override { std::filesystem::remove_all(scratch_); }

  SandboxOptions Options() const {
    SandboxOptions o;
    o.executable = testing::WorkerBinary();
    o.scratch_dir = scratch_;
    o.setup_limit = 1500ms;
    o.min_run_limit = 500ms;
    o.absolute_limit = 20s;
    o.exit_grace = 1s;
    return o;
  }

  static ChildRequest Request(const std::string& self_test) {
    ChildRequest r;
    r.shape.key.head_dim = 128;
    r.shape.key.heads = 4;
    r.shape.key.kv_heads = 4;
    r.shape.key.arch = "sm_90a";
    r.shape.cu_seqlens_q = {0, 3, 10};
    r.candidate.variant_id = "v1";
    r.candidate.manifest_json = "{}";
    r.candidate.cubin = std::string("\x7f" "ELF\0\1\2", 7);
    r.seed = 42;
    r.self_test = self_test;
    return r;
  }

  SandboxRun RunChild(const std::string& self_test, SandboxOptions o) {
    Sandbox sandbox(std::move(o));
    absl::StatusOr<SandboxRun> run = sandbox.Run(Request(self_test));
    EXPECT_TRUE(run.ok()) << run.status();
    return run.ok() ? *run : SandboxRun{};
  }
  SandboxRun RunChild(const std::string& self_test) { return RunChild(self_test, Options()); }

  std::filesystem::path scratch_;
};

TEST_F(SandboxTest, WellBehavedChildResultPassesThrough) {
  SandboxRun run = RunChild("verified");
  EXPECT_EQ(run.report.outcome, Outcome::kVerified) << run.report.message;
  ASSERT_TRUE(run.report.timing.has_value());
  EXPECT_EQ(run.report.timing->median_us, 10);
  EXPECT_EQ(run.reference_ms, 1.0);
  EXPECT_EQ(run.launches, 10);
  EXPECT_FALSE(run.protocol_error);
}

TEST_F(SandboxTest, TheChildDoesNotSeeTheWorkersToken) {
  setenv("KFORGE_WORKER_TOKEN", "secret", 1);
  SandboxRun run = RunChild("report_env");
  unsetenv("KFORGE_WORKER_TOKEN");
  EXPECT_EQ(run.report.message, "no token");
}

TEST_F(SandboxTest, WrongResultKeepsItsErrorMetrics) {
  SandboxRun run = RunChild("wrong");
  EXPECT_EQ(run.report.outcome, Outcome::kWrong);
  ASSERT_TRUE(run.report.errors.has_value());
  EXPECT_EQ(run.report.errors->max_abs_error, 3.5);
  EXPECT_NE(run.report.errors->detail.find("unwritten"), std::string::npos);
}

TEST_F(SandboxTest, ChildThatHangsBeforeTheReferenceIsKilledAsTimeout) {
  SandboxRun run = RunChild("hang");
  EXPECT_EQ(run.report.outcome, Outcome::kTimeout) << run.report.message;
  EXPECT_NE(run.report.message.find("setup limit"), std::string::npos) << run.report.message;
  EXPECT_LT(run.wall_ms, 5000);
  EXPECT_TRUE(run.infrastructure_failure);  // no candidate code had run
}

TEST_F(SandboxTest, HangAfterTheReferenceGetsTheReferenceDerivedLimit) {
  // 50 x 0.001 ms x 10 launches is tiny: the minimum run limit (500 ms) applies.
  SandboxRun run = RunChild("hang_after_reference");
  EXPECT_EQ(run.report.outcome, Outcome::kTimeout) << run.report.message;
  EXPECT_NE(run.report.message.find("run limit"), std::string::npos) << run.report.message;
  EXPECT_GE(run.wall_ms, 500);
  EXPECT_LT(run.wall_ms, 5000);
  EXPECT_FALSE(run.infrastructure_failure);  // the candidate's hang
}

TEST_F(SandboxTest, AbsoluteLimitCapsEverything) {
  SandboxOptions o = Options();
  o.setup_limit = 60s;
  o.absolute_limit = 700ms;
  SandboxRun run = RunChild("hang", o);
  EXPECT_EQ(run.report.outcome, Outcome::kTimeout);
  EXPECT_LT(run.wall_ms, 5000);
}

TEST_F(SandboxTest, SegfaultIsCrashedWithTheSignal) {
  SandboxRun run = RunChild("segv");
  EXPECT_EQ(run.report.outcome, Outcome::kCrashed);
  EXPECT_NE(run.report.message.find("SIGSEGV"), std::string::npos) << run.report.message;
  EXPECT_FALSE(run.infrastructure_failure);
}

TEST_F(SandboxTest, AbortIsCrashed) {
  SandboxRun run = RunChild("abort");
  EXPECT_EQ(run.report.outcome, Outcome::kCrashed);
  EXPECT_NE(run.report.message.find("SIGABRT"), std::string::npos) << run.report.message;
}

TEST_F(SandboxTest, CudaFaultIsCrashedWithTheDriverError) {
  SandboxRun run = RunChild("fault");
  EXPECT_EQ(run.report.outcome, Outcome::kCrashed);
  EXPECT_NE(run.report.message.find("exited with code 3"), std::string::npos) << run.report.message;
  EXPECT_NE(run.report.message.find("CUDA_ERROR_ILLEGAL_ADDRESS"), std::string::npos)
      << run.report.message;
}

TEST_F(SandboxTest, GarbageOnTheResultPipeIsAProtocolErrorAndTheChildIsKilled) {
  SandboxRun run = RunChild("garbage");  // the child then sleeps forever
  EXPECT_EQ(run.report.outcome, Outcome::kCrashed);
  EXPECT_TRUE(run.protocol_error);
  EXPECT_NE(run.report.message.find("sandbox protocol error"), std::string::npos)
      << run.report.message;
  EXPECT_NE(run.report.message.find("not a JSON object"), std::string::npos) << run.report.message;
  EXPECT_LT(run.wall_ms, 1400);  // killed at once, not at the setup limit
}

TEST_F(SandboxTest, ExitWithoutAResultIsCrashed) {
  SandboxRun run = RunChild("exit_silently");
  EXPECT_EQ(run.report.outcome, Outcome::kCrashed);
  EXPECT_NE(run.report.message.find("without a result"), std::string::npos) << run.report.message;
  EXPECT_TRUE(run.infrastructure_failure);
}

TEST_F(SandboxTest, VerifiedThenCrashIsNotTrusted) {
  SandboxRun run = RunChild("crash_after_result");
  EXPECT_EQ(run.report.outcome, Outcome::kCrashed);
  EXPECT_NE(run.report.message.find("reported verified"), std::string::npos) << run.report.message;
  EXPECT_NE(run.report.message.find("SIGSEGV"), std::string::npos) << run.report.message;
}

TEST_F(SandboxTest, MegabytesOfChildOutputDoNotBlockIt) {
  SandboxRun run = RunChild("spam_stderr");
  EXPECT_EQ(run.report.outcome, Outcome::kVerified) << run.report.message;
  EXPECT_NE(run.stderr_tail.find("last words"), std::string::npos);
  EXPECT_LE(run.stderr_tail.size(), Options().stderr_tail_bytes);
}

TEST_F(SandboxTest, CancelKillsTheChild) {
  Sandbox sandbox(Options());
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    std::this_thread::sleep_for(200ms);
    cancel.store(true);
  });
  absl::StatusOr<SandboxRun> run = sandbox.Run(Request("hang"), &cancel);
  canceller.join();
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->cancelled);
  EXPECT_LT(run->wall_ms, 1400);
}

TEST_F(SandboxTest, MissingExecutableIsCrashedNotAnError) {
  SandboxOptions o = Options();
  o.executable = "/nonexistent/kforge-worker";
  SandboxRun run = RunChild("verified", o);
  EXPECT_EQ(run.report.outcome, Outcome::kCrashed);
  EXPECT_NE(run.report.message.find("could not exec"), std::string::npos) << run.report.message;
}

TEST_F(SandboxTest, EachRunGetsAFreshChildAndCleansUp) {
  Sandbox sandbox(Options());
  const char* sequence[] = {"segv", "verified", "hang", "verified", "garbage", "verified"};
  const Outcome expected[] = {Outcome::kCrashed, Outcome::kVerified, Outcome::kTimeout,
                              Outcome::kVerified, Outcome::kCrashed, Outcome::kVerified};
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<SandboxRun> run = sandbox.Run(Request(sequence[i]));
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->report.outcome, expected[i]) << sequence[i] << ": " << run->report.message;
  }
  // Every request directory is gone.
  EXPECT_TRUE(std::filesystem::is_empty(scratch_));
}

TEST(SandboxSignals, NamesCommonSignals) {
  EXPECT_EQ(SignalName(SIGSEGV), "SIGSEGV");
  EXPECT_EQ(SignalName(SIGKILL), "SIGKILL");
  EXPECT_NE(SignalName(SIGUSR1).find("signal"), std::string::npos);
}

}  // namespace
}  // namespace kforge::worker
