// The compile child: the real kforge-worker binary (`--compile-child`) with
// real NVRTC, started directly (no static source check in front of it, so
// it is the last line), and stand-in children (shell scripts) for the ways a
// child can fail that NVRTC cannot be made to show on demand.
#include "worker/compile_child.h"

#include <gtest/gtest.h>
#include <linux/landlock.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "gpu/compile_cache.h"
#include "tests/worker/worker_bin.h"

namespace kforge::worker {
namespace {

using namespace std::chrono_literals;

constexpr char kKernel[] = R"(#include "kforge/attn_params.h"
extern "C" __global__ void kf_attn_fwd(const __grid_constant__ KfAttnParams p) {
  if (threadIdx.x == 0) p.lse[blockIdx.x] = 2.0f;
}
)";

// What a hostile variant would hold, were a worker to run in this test's
// environment.
constexpr char kToken[] = "kf-worker-token-4f1c9a7e2b";

gpu::CompileRequest Request(std::string source) {
  gpu::CompileRequest r;
  r.source = std::move(source);
  r.arch = "sm_90a";
  r.name = "v1.cu";
  r.time_limit = 60s;
  return r;
}

class CompileChildTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kforge-compile-child-test-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static CompileChildOptions Options() {
    CompileChildOptions o;
    o.executable = testing::WorkerBinary();
    return o;
  }

  // A stand-in child: a shell script given the compile child's arguments.
  CompileChildOptions Script(const std::string& body) {
    const std::filesystem::path path = dir_ / ("child-" + std::to_string(scripts_++) + ".sh");
    {
      std::ofstream out(path);
      out << "#!/bin/sh\n" << body << "\n";
    }
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
    CompileChildOptions o;
    o.executable = path.string();
    o.child_args = {};
    return o;
  }

  std::filesystem::path dir_;
  int scripts_ = 0;
};

// Everything a result carries that someone may see.
std::string Everything(const gpu::CompileResult& r) {
  return r.log + "\n" + r.options + "\n" + r.arch + "\n" + r.nvrtc_version + "\n" + r.cubin;
}

TEST_F(CompileChildTest, CompilesInAChildAsInProcess) {
  absl::StatusOr<gpu::CompileResult> child = CompileChild(Options()).Compile(Request(kKernel));
  absl::StatusOr<gpu::CompileResult> here = gpu::Compile(Request(kKernel));
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE(here.ok()) << here.status();
  EXPECT_TRUE(child->ok) << child->log;
  EXPECT_EQ(child->cubin, here->cubin);
  EXPECT_EQ(child->options, here->options);
  EXPECT_EQ(child->nvrtc_version, here->nvrtc_version);
  EXPECT_EQ(child->total.registers, here->total.registers);
  ASSERT_EQ(child->functions.size(), 1u);
  EXPECT_EQ(child->functions[0].function, "kf_attn_fwd");
  EXPECT_GT(child->compile_ms, 0);
  EXPECT_FALSE(child->transient);
}

TEST_F(CompileChildTest, ACompileErrorComesBackWithItsLog) {
  absl::StatusOr<gpu::CompileResult> r =
      CompileChild(Options()).Compile(Request("extern \"C\" __global__ void f() { oops; }"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->ok);
  EXPECT_TRUE(r->cubin.empty());
  EXPECT_NE(r->log.find("oops"), std::string::npos) << r->log;
  EXPECT_FALSE(r->transient);
}

bool HaveLandlock() {
  return syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION) >= 1;
}

TEST_F(CompileChildTest, IncludingTheEnvironmentShowsNoToken) {
  // The check in front of NVRTC would refuse this source; here the child is
  // the last line. Even unsealed, and with no redaction (no secrets given),
  // its allowlisted environment holds no token.
  setenv("KFORGE_WORKER_TOKEN", kToken, 1);
  setenv("KFORGE_CLIENT_TOKEN", kToken, 1);
  setenv("SOME_CLOUD_SECRET", kToken, 1);
  for (bool seal : {false, true}) {
    CompileChildOptions o = Options();
    o.seal_filesystem = seal;
    const CompileChild child(o);
    absl::StatusOr<gpu::CompileResult> r =
        child.Compile(Request(std::string("#include </proc/self/environ>\n") + kKernel));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->ok);
    EXPECT_EQ(Everything(*r).find(kToken), std::string::npos) << r->log;
    if (!seal) {
      // It did read the child's (allowlisted) environment: the attack is real.
      EXPECT_NE(r->log.find("PATH"), std::string::npos) << r->log;
    } else if (HaveLandlock()) {
      EXPECT_EQ(child.sealed(), true);
      EXPECT_NE(r->log.find("cannot open source file"), std::string::npos) << r->log;
      EXPECT_EQ(r->log.find("PATH"), std::string::npos) << r->log;
    }
  }
  unsetenv("KFORGE_WORKER_TOKEN");
  unsetenv("KFORGE_CLIENT_TOKEN");
  unsetenv("SOME_CLOUD_SECRET");
}

TEST_F(CompileChildTest, WhateverTheLogSaysIsRedacted) {
  // A token the child can still read (a token file) where it is not sealed:
  // the log is redacted with the worker's secrets before it leaves.
  const std::filesystem::path token_file = dir_ / "token";
  { std::ofstream(token_file) << "int " << kToken << " = 1;\n"; }
  CompileChildOptions o = Options();
  o.secrets = {kToken};
  o.seal_filesystem = false;
  absl::StatusOr<gpu::CompileResult> r = CompileChild(o).Compile(
      Request("#include \"" + token_file.string() + "\"\nbroken " + std::string(kToken) + "\n"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->ok);
  EXPECT_EQ(Everything(*r).find(kToken), std::string::npos) << r->log;
  EXPECT_NE(r->log.find("[redacted]"), std::string::npos) << r->log;
}

TEST_F(CompileChildTest, ASealedChildOpensNoFileAtAll) {
  if (!HaveLandlock()) GTEST_SKIP() << "no Landlock in this kernel: the child cannot be sealed";
  const CompileChild child(Options());
  for (const char* path : {"/dev/null", "/etc/passwd", "/proc/self/cmdline"}) {
    absl::StatusOr<gpu::CompileResult> r =
        child.Compile(Request(std::string("#include \"") + path + "\"\n" + kKernel));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->ok) << path;
    EXPECT_NE(r->log.find("cannot open source file"), std::string::npos) << r->log;
  }
  EXPECT_EQ(child.sealed(), true);
  // And what needs no file still compiles to the in-process cubin.
  absl::StatusOr<gpu::CompileResult> ok = child.Compile(Request(kKernel));
  ASSERT_TRUE(ok.ok() && ok->ok);
  EXPECT_EQ(ok->cubin, gpu::Compile(Request(kKernel))->cubin);
}

TEST_F(CompileChildTest, OverrunningTheTimeLimitIsATransientCompileError) {
  // 128 copies of a statement with sinf and cosf keep NVRTC busy for
  // seconds (3 s on the 2-core build machine).
  std::string source = "#define A0 p[i] = sinf(p[i + 1]) * cosf(p[i + 2]); ++i;\n";
  for (int k = 1; k <= 7; ++k) source += fmt::format("#define A{} A{} A{}\n", k, k - 1, k - 1);
  source += "extern \"C\" __global__ void slow(float* p) { int i = threadIdx.x; A7 }\n";
  gpu::CompileRequest req = Request(source);
  req.time_limit = 700ms;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<gpu::CompileResult> r = CompileChild(Options()).Compile(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->ok);
  EXPECT_NE(r->log.find("compile exceeded 0.7 s"), std::string::npos) << r->log;
  EXPECT_TRUE(r->transient);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);  // killed, not waited for
}

TEST_F(CompileChildTest, NvrtcCrashingOnTheSourceIsTheCandidates) {
  CompileChildOptions o = Script(
      "cat > /dev/null\n"
      "printf '{\"event\":\"compiling\"}\\n' >&3\n"
      "echo 'nvrtc: internal error' >&2\n"
      "kill -SEGV $$");
  absl::StatusOr<gpu::CompileResult> r = CompileChild(o).Compile(Request(kKernel));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->ok);
  EXPECT_TRUE(r->transient);
  EXPECT_NE(r->log.find("SIGSEGV"), std::string::npos) << r->log;
  EXPECT_NE(r->log.find("nvrtc: internal error"), std::string::npos) << r->log;
  EXPECT_NE(r->options.find("-arch=sm_90a"), std::string::npos);
}

TEST_F(CompileChildTest, AChildThatFailsBeforeCompilingIsTheWorkersFault) {
  for (const char* body : {"exit 1", "kill -SEGV $$", "printf 'garbage\\n' >&3; sleep 5",
                           "sleep 5"}) {
    CompileChildOptions o = Script(body);
    gpu::CompileRequest req = Request(kKernel);
    req.time_limit = 500ms;
    absl::StatusOr<gpu::CompileResult> r = CompileChild(o).Compile(req);
    EXPECT_FALSE(r.ok()) << body << ": " << (r.ok() ? r->log : "");
  }
  CompileChildOptions missing = Options();
  missing.executable = "/nonexistent/kforge-worker";
  absl::StatusOr<gpu::CompileResult> r = CompileChild(missing).Compile(Request(kKernel));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("could not exec"), std::string::npos) << r.status();
}

TEST_F(CompileChildTest, AMalformedAnswerIsTheWorkersFault) {
  for (const char* answer : {"not json", "{\"event\":\"result\",\"cubin_bytes\":10}",
                             "{\"event\":\"error\",\"message\":\"NVRTC_ERROR_OUT_OF_MEMORY\"}"}) {
    CompileChildOptions o = Script(std::string("cat > /dev/null\nprintf '{\"event\":\"compiling\"}\\n") +
                                   "%s\\n' '" + answer + "' >&3");
    absl::StatusOr<gpu::CompileResult> r = CompileChild(o).Compile(Request(kKernel));
    EXPECT_FALSE(r.ok()) << answer;
  }
}

TEST_F(CompileChildTest, AnOversizedAnswerIsACompileError) {
  CompileChildOptions o = Script(
      "cat > /dev/null\nprintf '{\"event\":\"compiling\"}\\n' >&3\n"
      "head -c 3000000 /dev/zero >&3");
  o.max_result_bytes = 1 << 20;
  absl::StatusOr<gpu::CompileResult> r = CompileChild(o).Compile(Request(kKernel));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->ok);
  EXPECT_NE(r->log.find("over 1048576 bytes"), std::string::npos) << r->log;
}

TEST_F(CompileChildTest, TheChildGetsTheRequestOnStdinAndStartsInTheRoot) {
  // The stand-in echoes what it got: the request JSON, and its directory.
  CompileChildOptions o = Script(
      "req=$(cat)\nprintf '{\"event\":\"compiling\"}\\n' >&3\n"
      "printf '%s %s\\n' \"$(pwd)\" \"$req\" | head -c 300 >&2\nexit 3");
  absl::StatusOr<gpu::CompileResult> r = CompileChild(o).Compile(Request(kKernel));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->log.find("/ {\"arch\":\"sm_90a\""), std::string::npos) << r->log;
}

TEST_F(CompileChildTest, ThePoolCompilesMissesInTheChildAndKeepsTheCacheHere) {
  const CompileChild child(Options());
  gpu::CompileCache cache(dir_ / "cubins");
  gpu::CompilePool pool(2, &cache, child.AsCompiler());
  absl::StatusOr<gpu::CompileResult> first = pool.Submit(Request(kKernel)).get();
  absl::StatusOr<gpu::CompileResult> second = pool.Submit(Request(kKernel)).get();
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_TRUE(first->ok) << first->log;
  EXPECT_FALSE(first->from_cache);
  EXPECT_TRUE(second->from_cache);
  EXPECT_EQ(first->cubin, second->cubin);
}

}  // namespace
}  // namespace kforge::worker
