// What MutableGlobalBytes finds in real NVRTC output. No GPU needed.
#include "gpu/cubin.h"

#include <gtest/gtest.h>

#include <string>

#include "gpu/compile.h"

namespace kforge::gpu {
namespace {

std::string CubinOf(const std::string& source, const std::string& arch) {
  CompileRequest r;
  r.source = source;
  r.arch = arch;
  r.name = "globals.cu";
  absl::StatusOr<CompileResult> c = Compile(r);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return "";
  EXPECT_TRUE(c->ok) << c->log;
  return c->cubin;
}

class Globals : public ::testing::TestWithParam<std::string> {};

TEST_P(Globals, AKernelWithoutDeviceVariablesHasNone) {
  const std::string cubin = CubinOf(R"(
__constant__ int table[4] = {1, 2, 3, 4};
extern "C" __global__ void k(int* o) { __shared__ int s; s = table[o[0] & 3]; __syncthreads(); o[1] = s; }
)", GetParam());
  EXPECT_EQ(MutableGlobalBytes(cubin), 0);
}

TEST_P(Globals, ZeroedAndInitialisedDeviceVariablesAreFound) {
  const std::string counter = CubinOf(R"(
__device__ unsigned launches;
extern "C" __global__ void k(int* o) { o[0] = atomicAdd(&launches, 1u); }
)", GetParam());
  EXPECT_EQ(MutableGlobalBytes(counter), 4);
  // The symbol that locates the section once the module is loaded.
  const std::vector<GlobalSection> sections = MutableGlobalSections(counter);
  ASSERT_EQ(sections.size(), 1u);
  EXPECT_EQ(sections[0].name, ".nv.global");
  ASSERT_EQ(sections[0].symbols.size(), 1u);
  EXPECT_EQ(sections[0].symbols[0].first, "launches");
  EXPECT_EQ(sections[0].symbols[0].second, 0u);
  // `const` does not make a __device__ variable read-only memory.
  EXPECT_EQ(MutableGlobalBytes(CubinOf(R"(
__device__ const int table[4] = {1, 2, 3, 4};
extern "C" __global__ void k(int* o) { o[0] = table[o[1] & 3]; }
)", GetParam())), 16);
}

// NVRTC's -default-device makes namespace-scope constants device variables:
// a few bytes, each with a symbol.
TEST_P(Globals, NamespaceConstantsAreAFewBytesWithSymbols) {
  const std::string cubin = CubinOf(R"(
namespace kf { constexpr int kRows = 64; constexpr int kCols = 128; }
extern "C" __global__ void k(int* o) { const int& r = kf::kRows; o[0] = r * kf::kCols; }
)", GetParam());
  EXPECT_LE(MutableGlobalBytes(cubin), 8);
  for (const GlobalSection& s : MutableGlobalSections(cubin)) EXPECT_FALSE(s.symbols.empty()) << s.name;
}

INSTANTIATE_TEST_SUITE_P(Arches, Globals, ::testing::Values("sm_80", "sm_90a", "sm_100a"));

TEST(Globals, NotAnImageHasNone) {
  EXPECT_EQ(MutableGlobalBytes(""), 0);
  EXPECT_EQ(MutableGlobalBytes(std::string(200, 'x')), 0);
}

}  // namespace
}  // namespace kforge::gpu
