// Every corpus kernel compiles for every target, except the one meant not to
// (no GPU needed).
#include <gtest/gtest.h>

#include "gpu/compile.h"
#include "gpu/cubin.h"
#include "tests/bad_kernels/corpus.h"

namespace kforge::bad_kernels {
namespace {

TEST(BadKernelCorpus, EveryListedFileIsEmbedded) {
  nlohmann::json expected = nlohmann::json::parse(ExpectedJson());
  for (const auto& k : expected.at("kernels")) {
    EXPECT_NE(Source(k.at("file").get<std::string>()), nullptr) << k.at("file");
  }
}

TEST(BadKernelCorpus, CompilesExactlyWhenExpected) {
  nlohmann::json expected = nlohmann::json::parse(ExpectedJson());
  for (const char* arch : {"sm_80", "sm_90a", "sm_100a"}) {
    for (const auto& k : expected.at("kernels")) {
      const std::string file = k.at("file").get<std::string>();
      gpu::CompileRequest req;
      req.source = Source(file);
      req.arch = arch;
      req.name = file;
      absl::StatusOr<gpu::CompileResult> r = gpu::Compile(req);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->ok, k.value("compiles", true)) << file << " " << arch << "\n"
                                                            << r->log;
    }
  }
}

// The evaluator refuses images with more writable __device__ memory than a
// few constants need; the launch counter is under the cap (it is caught
// changing it), and so is every other kernel.
TEST(BadKernelCorpus, EveryKernelIsUnderTheModuleGlobalsCap) {
  nlohmann::json expected = nlohmann::json::parse(ExpectedJson());
  for (const auto& k : expected.at("kernels")) {
    if (!k.value("compiles", true)) continue;
    const std::string file = k.at("file").get<std::string>();
    gpu::CompileRequest req;
    req.source = Source(file);
    req.arch = "sm_90a";
    absl::StatusOr<gpu::CompileResult> r = gpu::Compile(req);
    ASSERT_TRUE(r.ok() && r->ok) << file;
    EXPECT_LE(gpu::MutableGlobalBytes(r->cubin), gpu::kMaxModuleGlobalBytes) << file;
    if (file == "first_run_only.cu") EXPECT_GT(gpu::MutableGlobalBytes(r->cubin), 0);
  }
}

}  // namespace
}  // namespace kforge::bad_kernels
