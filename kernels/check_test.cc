#include "kernels/check.h"

#include <gtest/gtest.h>

namespace kforge {
namespace {

constexpr const char* kSource =
    "#include \"kforge/attn_params.h\"\n"
    "extern \"C\" __global__ void kf_attn_fwd(const __grid_constant__ KfAttnParams p) {}\n";

Manifest Good() {
  Manifest m;
  m.threads = 256;
  m.dynamic_smem_bytes = 100 * 1024;
  m.tile_m = 128;
  m.tile_n = 64;
  m.archs = {"sm_80", "sm_90a", "sm_100a"};
  m.head_dims = {128};
  return m;
}

ShapeKey Shape(const std::string& arch) {
  ShapeKey s;
  s.head_dim = 128;
  s.heads = s.kv_heads = 4;
  s.arch = arch;
  s.batch = 16;
  return s;
}

void ExpectRejected(absl::Status s, const std::string& word) {
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(word), std::string::npos) << s.message();
}

TEST(CheckTest, AcceptsAValidVariant) {
  EXPECT_TRUE(CheckVariant(kSource, Good(), "sm_90a", Shape("sm_90a")).ok());
}

TEST(CheckTest, RejectsSmemOverTheArchLimit) {
  Manifest m = Good();
  m.dynamic_smem_bytes = 200 * 1024;
  EXPECT_TRUE(CheckVariant(kSource, m, "sm_90a", Shape("sm_90a")).ok());
  ExpectRejected(CheckVariant(kSource, m, "sm_80", Shape("sm_80")), "sm_80's limit");
  m.dynamic_smem_bytes = 228 * 1024;
  ExpectRejected(CheckVariant(kSource, m, "sm_90a", Shape("sm_90a")), "dynamic_smem_bytes");
}

TEST(CheckTest, RejectsBadThreads) {
  Manifest m = Good();
  m.threads = 100;
  ExpectRejected(CheckVariant(kSource, m, "sm_90a", Shape("sm_90a")), "threads");
  m.threads = 2048;
  ExpectRejected(CheckVariant(kSource, m, "sm_90a", Shape("sm_90a")), "threads");
}

TEST(CheckTest, RejectsArchAndFeatureMismatch) {
  Manifest m = Good();
  m.archs = {"sm_90a"};
  ExpectRejected(CheckVariant(kSource, m, "sm_100a", Shape("sm_100a")), "archs");
  m.archs = {"sm_90a", "sm_100a"};
  m.features = {"wgmma"};
  ExpectRejected(CheckVariant(kSource, m, "sm_100a", Shape("sm_100a")), "wgmma");
}

TEST(CheckTest, RejectsUnsupportedShape) {
  ShapeKey s = Shape("sm_90a");
  s.head_dim = 64;
  ExpectRejected(CheckVariant(kSource, Good(), "sm_90a", s), "head_dims");
  Manifest m = Good();
  m.causal = false;
  s = Shape("sm_90a");
  s.causal = true;
  ExpectRejected(CheckVariant(kSource, m, "sm_90a", s), "causal");
  s = Shape("sm_90a");
  s.op = Op::kBackward;
  ExpectRejected(CheckVariant(kSource, Good(), "sm_90a", s), "bwd");
  // A deterministic shape takes only a variant whose manifest says so.
  m = Good();
  m.ops = {"bwd"};
  s.deterministic = true;
  ExpectRejected(CheckVariant(kSource, m, "sm_90a", s), "deterministic");
  m.deterministic = true;
  EXPECT_TRUE(CheckVariant(kSource, m, "sm_90a", s).ok());
}

TEST(CheckTest, RejectsSourceProblems) {
  ExpectRejected(CheckVariant("__global__ void f() {}", Good(), "sm_90a", Shape("sm_90a")),
                 "kf_attn_fwd");
  std::string s = std::string("#include <cuda_bf16.h>\n") + kSource;
  ExpectRejected(CheckVariant(s, Good(), "sm_90a", Shape("sm_90a")), "cuda_bf16.h");
  s = std::string(kSource) + "int main() { return 0; }\n";
  ExpectRejected(CheckVariant(s, Good(), "sm_90a", Shape("sm_90a")), "main");
  s = std::string(kSource) + "__device__ void f() { printf(\"x\"); }\n";
  ExpectRejected(CheckVariant(s, Good(), "sm_90a", Shape("sm_90a")), "printf");
  s = std::string(kSource) + "__device__ void f() { system(\"rm -rf /\"); }\n";
  ExpectRejected(CheckVariant(s, Good(), "sm_90a", Shape("sm_90a")), "\"system\"");
  s = std::string(kSource) + "__device__ std::vector<int> v;\n";
  ExpectRejected(CheckVariant(s, Good(), "sm_90a", Shape("sm_90a")), "std::");
  s = std::string(kSource) + "__device__ ::std::size_t n;\n";
  ExpectRejected(CheckVariant(s, Good(), "sm_90a", Shape("sm_90a")), "std::");
  s = std::string(kSource) + "__device__ int g(cuda::std::array<int, 2> a) { return a[0]; }\n";
  EXPECT_TRUE(CheckVariant(s, Good(), "sm_90a", Shape("sm_90a")).ok()) << "libcu++ is device code";
  // Markers inside comments do not count.
  s = std::string(kSource) + "// printf(\"x\") int main(\n";
  EXPECT_TRUE(CheckVariant(s, Good(), "sm_90a", Shape("sm_90a")).ok());
  ExpectRejected(CheckVariant(std::string(300 * 1024, ' ') + kSource, Good(), "sm_90a",
                              Shape("sm_90a")),
                 "bytes");
}

}  // namespace
}  // namespace kforge

namespace kforge {
namespace {
TEST(CheckTest, AcceptsLaunchBoundsOnTheEntryPoint) {
  const std::string s =
      "#include \"kforge/attn_params.h\"\n"
      "extern \"C\" __global__ void __launch_bounds__(256, 1)\n"
      "    kf_attn_fwd(const __grid_constant__ KfAttnParams p) {}\n";
  EXPECT_TRUE(CheckVariant(s, Good(), "sm_90a", Shape("sm_90a")).ok());
}
}  // namespace
}  // namespace kforge

namespace kforge {
namespace {

TEST(CheckTest, RejectsIncludeTricksBeforeAnythingIsCompiled) {
  // The full list is in source_check_test.cc; CheckVariant runs those rules.
  const std::string s = std::string("%:include </proc/self/environ>\n") + kSource;
  ExpectRejected(CheckVariant(s, Good(), "sm_90a", Shape("sm_90a")), "/proc/self/environ");
}

TEST(CheckCompileOptionsTest, AcceptsCodeGenerationFlags) {
  for (const char* o : {"", "-use_fast_math", "--use_fast_math", "--fmad=false", "-ftz=true",
                        "--prec-div=false", "--prec-sqrt=true", "-maxrregcount=128",
                        "--maxrregcount=255", "--extra-device-vectorization", "-lineinfo",
                        "--generate-line-info", "-restrict", "-DKF_TEST_OPTION=1", "-DFAST",
                        "-DX=-1.5f", "--define-macro=MODE=fast",
                        "-DKF_TEST_OPTION=1  -lineinfo\t-use_fast_math"}) {
    absl::Status s = CheckCompileOptions(o);
    EXPECT_TRUE(s.ok()) << o << ": " << s.message();
  }
}

TEST(CheckCompileOptionsTest, RejectsIncludePathsAndPreIncludes) {
  ExpectRejected(CheckCompileOptions("-I/x"), "include paths");
  ExpectRejected(CheckCompileOptions("-I"), "include paths");
  ExpectRejected(CheckCompileOptions("--include-path=/x"), "include paths");
  ExpectRejected(CheckCompileOptions("-use_fast_math -include /proc/self/environ"), "-include");
  ExpectRejected(CheckCompileOptions("--pre-include=/proc/self/environ"), "pre-included");
  ExpectRejected(CheckCompileOptions("-include=/proc/self/environ"), "pre-included");
}

TEST(CheckCompileOptionsTest, RejectsTargetLinkingAndUnknownOptions) {
  ExpectRejected(CheckCompileOptions("-arch=sm_80"), "target");
  ExpectRejected(CheckCompileOptions("--gpu-architecture=compute_90"), "target");
  ExpectRejected(CheckCompileOptions("-rdc=true"), "relocatable");
  ExpectRejected(CheckCompileOptions("--relocatable-device-code=true"), "relocatable");
  ExpectRejected(CheckCompileOptions("--ptxas-options=-v"), "unknown option");
  ExpectRejected(CheckCompileOptions("-G"), "unknown option");
  ExpectRejected(CheckCompileOptions("--std=c++20"), "unknown option");
  ExpectRejected(CheckCompileOptions("/proc/self/environ"), "not an option");
  ExpectRejected(CheckCompileOptions("--fmad=maybe"), "true or false");
  ExpectRejected(CheckCompileOptions("-maxrregcount=0"), "register count");
  ExpectRejected(CheckCompileOptions("-maxrregcount=99999"), "register count");
}

TEST(CheckCompileOptionsTest, MacrosPassTheSourceChecksIdentifierRules) {
  ExpectRejected(CheckCompileOptions("-DP=printf"), "printf");
  ExpectRejected(CheckCompileOptions("-DH=__has_include"), "__has_include");
  ExpectRejected(CheckCompileOptions("-DX=_Pragma"), "_Pragma");
  ExpectRejected(CheckCompileOptions("-Dmain=kf"), "main");
  ExpectRejected(CheckCompileOptions("-DN=std"), "std");
  ExpectRejected(CheckCompileOptions("-D__CUDA_ARCH__=900"), "reserved");
  ExpectRejected(CheckCompileOptions("-D_X"), "reserved");
  ExpectRejected(CheckCompileOptions("-DF=</proc/self/environ>"), "number or an identifier");
  ExpectRejected(CheckCompileOptions("-DF=\"x\""), "number or an identifier");
  ExpectRejected(CheckCompileOptions("-D"), "identifier");
  ExpectRejected(CheckCompileOptions("-D1X"), "identifier");
}

}  // namespace
}  // namespace kforge
