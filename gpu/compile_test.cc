// NVRTC compiles, the ptxas report, the compile cache and pool. No GPU needed.
#include "gpu/compile.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "fmt/format.h"
#include "core/arch.h"
#include "gpu/compile_cache.h"

namespace kforge::gpu {
namespace {

constexpr const char* kSmallKernel = R"(
#include "kforge/attn_params.h"
extern "C" __global__ void kf_scale(const __grid_constant__ KfAttnParams p) {
  __shared__ float buf[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  buf[threadIdx.x] = i * p.softmax_scale;
  __syncthreads();
  if (i < p.total_q) p.lse[i] = buf[255 - threadIdx.x];
}
)";

CompileRequest Small(std::string arch) {
  CompileRequest r;
  r.source = kSmallKernel;
  r.arch = std::move(arch);
  r.name = "small.cu";
  return r;
}

class CompileForArch : public ::testing::TestWithParam<std::string> {};

TEST_P(CompileForArch, SmallKernelCompilesWithResourceReport) {
  absl::StatusOr<CompileResult> r = Compile(Small(GetParam()));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok) << r->log;
  EXPECT_FALSE(r->cubin.empty());
  EXPECT_EQ(r->arch, GetParam());
  EXPECT_NE(r->options.find(fmt::format("-arch={}", GetParam())), std::string::npos);
  EXPECT_NE(r->options.find("-default-device"), std::string::npos);
  EXPECT_NE(r->options.find("--ptxas-options=-v"), std::string::npos);
  EXPECT_GT(r->compile_ms, 0);
  ASSERT_EQ(r->functions.size(), 1u) << r->log;
  EXPECT_EQ(r->functions[0].function, "kf_scale");
  EXPECT_GT(r->functions[0].registers, 0);
  EXPECT_EQ(r->functions[0].static_smem_bytes, 1024);
  EXPECT_EQ(r->total.registers, r->functions[0].registers);
}

INSTANTIATE_TEST_SUITE_P(Archs, CompileForArch,
                         ::testing::Values("sm_80", "sm_90a", "sm_100a"));

TEST(Compile, SyntaxErrorIsAResultWithTheLog) {
  CompileRequest req = Small("sm_90a");
  req.source = "extern \"C\" __global__ void broken() { int x = undefined_thing; }";
  absl::StatusOr<CompileResult> r = Compile(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->ok);
  EXPECT_TRUE(r->cubin.empty());
  EXPECT_NE(r->log.find("undefined_thing"), std::string::npos) << r->log;
}

TEST(Compile, BadExtraOptionIsACompileError) {
  CompileRequest req = Small("sm_90a");
  req.extra_options = {"--no-such-option"};
  absl::StatusOr<CompileResult> r = Compile(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->ok);
  EXPECT_NE(r->log.find("--no-such-option"), std::string::npos) << r->log;
}

TEST(Compile, OverrunningTheTimeLimitIsACompileError) {
  CompileRequest req = Small("sm_90a");
  req.time_limit = std::chrono::milliseconds(1);
  absl::StatusOr<CompileResult> r = Compile(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->ok);
  EXPECT_NE(r->log.find("compile exceeded"), std::string::npos) << r->log;
  EXPECT_TRUE(r->transient);
  CompileCache cache;
  cache.Insert(CompileKey(req), *r);
  EXPECT_FALSE(cache.Lookup(CompileKey(req)).has_value()) << "a timeout is not cached";
  // Let the abandoned compile finish before the process exits.
  std::this_thread::sleep_for(std::chrono::seconds(2));
}

TEST(Compile, NvrtcVersionIsMajorDotMinor) {
  std::string v = NvrtcVersion();
  EXPECT_NE(v.find('.'), std::string::npos) << v;
}

TEST(Compile, TargetArchsListTheArchsKforgeCompilesForAndEachCompiles) {
  const std::vector<std::string> archs = NvrtcTargetArchs();
  for (const char* want : {"sm_80", "sm_90", "sm_90a", "sm_100a"})
    EXPECT_NE(std::find(archs.begin(), archs.end(), want), archs.end()) << want;
  EXPECT_EQ(std::find(archs.begin(), archs.end(), "sm_80a"), archs.end())
      << "no arch-specific target before Hopper";
  for (const std::string& a : archs) {
    EXPECT_TRUE(ParseArch(a).ok()) << a;
    CompileRequest req;
    req.source = "extern \"C\" __global__ void k() {}\n";
    req.arch = a;
    req.name = "k.cu";
    absl::StatusOr<CompileResult> r = Compile(req);
    ASSERT_TRUE(r.ok()) << a << ": " << r.status();
    EXPECT_TRUE(r->ok) << a << ": " << r->log;
  }
}

TEST(PtxasLog, ParsesRegistersSpillsStackAndSmem) {
  constexpr std::string_view kLog =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'kf_fwd' for 'sm_90a'\n"
      "ptxas info    : Function properties for kf_fwd\n"
      "    40 bytes stack frame, 24 bytes spill stores, 16 bytes spill loads\n"
      "ptxas info    : Used 168 registers, used 1 barriers, 2048 bytes smem, 904 bytes cmem[0]\n"
      "ptxas info    : Compiling entry function 'kf_bwd' for 'sm_90a'\n"
      "ptxas info    : Function properties for kf_bwd\n"
      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 255 registers, used 1 barriers, 904 bytes cmem[0]\n"
      "ptxas info    : Compile time = 13.703 ms\n";
  std::vector<FunctionResources> f = ParsePtxasLog(kLog);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].function, "kf_fwd");
  EXPECT_EQ(f[0].registers, 168);
  EXPECT_EQ(f[0].stack_frame_bytes, 40);
  EXPECT_EQ(f[0].spill_stores_bytes, 24);
  EXPECT_EQ(f[0].spill_loads_bytes, 16);
  EXPECT_EQ(f[0].static_smem_bytes, 2048);
  EXPECT_EQ(f[1].function, "kf_bwd");
  EXPECT_EQ(f[1].registers, 255);
  EXPECT_EQ(f[1].static_smem_bytes, 0);
  FunctionResources m = MaxResources(f);
  EXPECT_EQ(m.registers, 255);
  EXPECT_EQ(m.spill_stores_bytes, 24);
}

// Several entry points: shared memory, a stack array, none of either.
constexpr const char* kResourceKernels = R"(
extern "C" __global__ void kf_stack(float* out, int n, int k) {
  __shared__ float buf[300];
  float local[64];
  for (int i = 0; i < 64; ++i) local[i] = out[(i * n) % 1000];
  buf[threadIdx.x] = local[k & 63];
  __syncthreads();
  out[threadIdx.x] = buf[(threadIdx.x + 1) % 300] + local[(k * 7) & 63];
}
extern "C" __global__ void kf_plain(float* out) { out[threadIdx.x] = 1.f; }
)";

TEST_P(CompileForArch, CubinResourcesMatchThePtxasReport) {
  CompileRequest req = Small(GetParam());
  req.source = kResourceKernels;
  absl::StatusOr<CompileResult> r = Compile(req);
  ASSERT_TRUE(r.ok() && r->ok) << r->log;
  std::vector<FunctionResources> elf = ParseCubinResources(r->cubin, GetParam());
  ASSERT_EQ(elf.size(), 2u);
  auto find = [](const std::vector<FunctionResources>& v, const std::string& name) {
    for (const auto& f : v) {
      if (f.function == name) return f;
    }
    return FunctionResources{};
  };
  FunctionResources stack = find(elf, "kf_stack"), plain = find(elf, "kf_plain");
  EXPECT_EQ(stack.static_smem_bytes, 1200);
  EXPECT_EQ(stack.stack_frame_bytes, 256);
  EXPECT_GT(stack.registers, 0);
  EXPECT_EQ(plain.static_smem_bytes, 0);
  EXPECT_EQ(plain.stack_frame_bytes, 0);
  EXPECT_GT(plain.registers, 0);
  if (r->resources_from_log) {
    std::vector<FunctionResources> log = ParsePtxasLog(r->log);
    for (const char* name : {"kf_stack", "kf_plain"}) {
      EXPECT_EQ(find(log, name).registers, find(elf, name).registers) << name;
      EXPECT_EQ(find(log, name).stack_frame_bytes, find(elf, name).stack_frame_bytes) << name;
      EXPECT_EQ(find(log, name).static_smem_bytes, find(elf, name).static_smem_bytes) << name;
    }
  } else {
    std::cout << "this NVRTC wrote no ptxas report; log was: [" << r->log << "]\n";
  }
}

TEST(CubinResources, NotAnElfImageGivesNothing) {
  EXPECT_TRUE(ParseCubinResources("", "sm_90a").empty());
  EXPECT_TRUE(ParseCubinResources(std::string(100, 'x'), "sm_90a").empty());
}

TEST(CompileKey, DependsOnSourceOptionsAndArch) {
  CompileRequest a = Small("sm_90a");
  CompileRequest b = a;
  EXPECT_EQ(CompileKey(a), CompileKey(b));
  b.arch = "sm_100a";
  EXPECT_NE(CompileKey(a), CompileKey(b));
  b = a;
  b.extra_options = {"-lineinfo"};
  EXPECT_NE(CompileKey(a), CompileKey(b));
  b = a;
  b.source += " ";
  EXPECT_NE(CompileKey(a), CompileKey(b));
  EXPECT_EQ(CompileKey(a).size(), 64u);
}

std::filesystem::path FreshDir(std::string_view name) {
  auto dir = std::filesystem::temp_directory_path() /
             fmt::format("kforge_{}_{}", name, ::getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(CompileCache, SecondCompileIsAMemoryHitThenADiskHitInANewCache) {
  auto dir = FreshDir("cache");
  CompileRequest req = Small("sm_90a");
  std::string cubin;
  {
    CompileCache cache(dir);
    absl::StatusOr<CompileResult> first = cache.GetOrCompile(req);
    ASSERT_TRUE(first.ok() && first->ok);
    EXPECT_FALSE(first->from_cache);
    absl::StatusOr<CompileResult> second = cache.GetOrCompile(req);
    ASSERT_TRUE(second.ok() && second->ok);
    EXPECT_TRUE(second->from_cache);
    EXPECT_EQ(second->cubin, first->cubin);
    EXPECT_EQ(cache.memory_hits(), 1u);
    cubin = first->cubin;
  }
  CompileCache reopened(dir);
  absl::StatusOr<CompileResult> third = reopened.GetOrCompile(req);
  ASSERT_TRUE(third.ok() && third->ok);
  EXPECT_TRUE(third->from_cache);
  EXPECT_EQ(reopened.disk_hits(), 1u);
  EXPECT_EQ(third->cubin, cubin);
  ASSERT_EQ(third->functions.size(), 1u);
  EXPECT_EQ(third->functions[0].static_smem_bytes, 1024);
  std::filesystem::remove_all(dir);
}

TEST(CompileCache, CompileErrorsAreCachedToo) {
  CompileCache cache;
  CompileRequest req = Small("sm_90a");
  req.source = "this is not cuda";
  ASSERT_FALSE(cache.GetOrCompile(req)->ok);
  absl::StatusOr<CompileResult> again = cache.GetOrCompile(req);
  EXPECT_FALSE(again->ok);
  EXPECT_TRUE(again->from_cache);
}

TEST(CompilePool, CompilesRequestsConcurrently) {
  CompileCache cache;
  CompilePool pool(2, &cache);
  std::vector<std::future<absl::StatusOr<CompileResult>>> futures;
  for (const char* arch : {"sm_80", "sm_90a", "sm_100a", "sm_90a"}) {
    futures.push_back(pool.Submit(Small(arch)));
  }
  for (auto& f : futures) {
    absl::StatusOr<CompileResult> r = f.get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->ok) << r->log;
  }
}

}  // namespace
}  // namespace kforge::gpu

namespace kforge::gpu {
namespace {

TEST(Compile, NothingIsSearchedNextToTheSource) {
  EXPECT_NE(Compile(Small("sm_90a"))->options.find("-no-source-include"), std::string::npos);
  // A file beside the working directory is not found by a relative include.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("kforge-nsi-{}", getpid());
  std::filesystem::create_directories(dir);
  { std::ofstream(dir / "beside.h") << "#define BESIDE 1\n"; }
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir);
  CompileRequest req = Small("sm_90a");
  req.source = "#include \"beside.h\"\n" + req.source;
  absl::StatusOr<CompileResult> r = Compile(req);
  std::filesystem::current_path(cwd);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->ok);
  EXPECT_NE(r->log.find("beside.h"), std::string::npos) << r->log;
}

TEST(Compile, ABlockingCompileGivesTheSameResult) {
  absl::StatusOr<CompileResult> a = Compile(Small("sm_90a"));
  absl::StatusOr<CompileResult> b = CompileBlocking(Small("sm_90a"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->cubin, b->cubin);
  EXPECT_EQ(a->options, b->options);
}

TEST(CompileResultJson, RoundTripsEverythingButTheCubin) {
  absl::StatusOr<CompileResult> r = Compile(Small("sm_80"));
  ASSERT_TRUE(r.ok());
  r->log += "\xff\xfe not UTF-8";
  absl::StatusOr<CompileResult> back = CompileResultFromJson(CompileResultToJson(*r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ok, r->ok);
  EXPECT_EQ(back->options, r->options);
  EXPECT_EQ(back->arch, "sm_80");
  EXPECT_EQ(back->nvrtc_version, r->nvrtc_version);
  EXPECT_EQ(back->functions.size(), r->functions.size());
  EXPECT_EQ(back->total.registers, r->total.registers);
  EXPECT_TRUE(back->cubin.empty());
  EXPECT_NE(back->log.find("not UTF-8"), std::string::npos);
  EXPECT_FALSE(CompileResultFromJson("[]").ok());
  EXPECT_FALSE(CompileResultFromJson("{\"ok\": true}").ok());
}

TEST(CompilePool, UsesTheCompilerItIsGiven) {
  std::atomic<int> calls{0};
  CompilePool pool(2, nullptr, [&](const CompileRequest& req) -> absl::StatusOr<CompileResult> {
    ++calls;
    CompileResult r;
    r.ok = false;
    r.log = "from the fake: " + req.name;
    return r;
  });
  absl::StatusOr<CompileResult> r = pool.Submit(Small("sm_90a")).get();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->log, "from the fake: small.cu");
  EXPECT_EQ(calls.load(), 1);
}

// A worker compiles the task it leased ahead while it runs the current one,
// then submits the same request again when the task's turn comes: the
// second submission waits for the first compile instead of repeating it.
TEST(CompilePool, ARequestInFlightIsCompiledOnce) {
  std::atomic<int> calls{0};
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  CompilePool pool(2, nullptr, [&](const CompileRequest& req) -> absl::StatusOr<CompileResult> {
    ++calls;
    released.wait();
    CompileResult r;
    r.ok = true;
    r.log = req.arch;
    return r;
  });
  auto first = pool.Submit(Small("sm_90a"));
  auto second = pool.Submit(Small("sm_90a"));
  auto other = pool.Submit(Small("sm_80"));
  release.set_value();
  EXPECT_EQ(first.get()->log, "sm_90a");
  EXPECT_EQ(second.get()->log, "sm_90a");
  EXPECT_EQ(other.get()->log, "sm_80");
  EXPECT_EQ(calls.load(), 2);
  // Once it has finished, the same request compiles again (this pool has no
  // cache to remember it).
  EXPECT_TRUE(pool.Submit(Small("sm_90a")).get()->ok);
  EXPECT_EQ(calls.load(), 3);
}

}  // namespace
}  // namespace kforge::gpu
