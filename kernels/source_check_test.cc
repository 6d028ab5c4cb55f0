// The source check against every way of spelling an include (and the other
// tricks a red-team used to make NVRTC read a file), and against the seeds.
#include "kernels/source_check.h"

#include <gtest/gtest.h>

#include "kernels/catalog.h"
#include "kernels/check.h"

namespace kforge {
namespace {

constexpr char kEntry[] =
    "extern \"C\" __global__ void kf_attn_fwd(const __grid_constant__ KfAttnParams p) {}\n";
constexpr char kInclude[] = "#include \"kforge/attn_params.h\"\n";

std::string Source(const std::string& middle) { return kInclude + middle + "\n" + kEntry; }

// Rejected, and the message names `word`.
void ExpectRejected(const std::string& source, const std::string& word) {
  absl::Status s = CheckSource(source);
  ASSERT_FALSE(s.ok()) << "accepted:\n" << source;
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(word), std::string::npos) << s.message();
}

void ExpectAccepted(const std::string& source) {
  absl::Status s = CheckSource(source);
  EXPECT_TRUE(s.ok()) << s.message() << "\n" << source;
}

TEST(SourceCheckTest, AcceptsTheOneIncludeAndPlainDeviceCode) {
  ExpectAccepted(Source("__device__ float twice(float x) { return 2.0f * x; }"));
}

TEST(SourceCheckTest, RejectsAnAngleInclude) {
  ExpectRejected(Source("#include </proc/self/environ>"), "line 2");
  ExpectRejected(Source("#include </proc/self/environ>"), "/proc/self/environ");
}

TEST(SourceCheckTest, RejectsAQuotedIncludeOfAnyOtherFile) {
  ExpectRejected(Source("#include \"/proc/self/environ\""), "not allowed");
  ExpectRejected(Source("#include \"kforge/attn_params.h \""), "not allowed");
  ExpectRejected(Source("#include \"../kforge/attn_params.h\""), "not allowed");
}

TEST(SourceCheckTest, RejectsAMacroComputedInclude) {
  ExpectRejected(Source("#define F </proc/self/environ>\n#include F"), "#include F");
  ExpectRejected(Source("#define F \"kforge/attn_params.h\"\n#include F"), "#include F");
}

TEST(SourceCheckTest, RejectsTheDigraphInclude) {
  ExpectRejected(Source("%:include </proc/self/environ>"), "%:include </proc/self/environ>");
  ExpectRejected(Source("%: include </proc/self/environ>"), "not allowed");
  ExpectRejected(Source("  %:   include </proc/self/environ>"), "not allowed");
}

TEST(SourceCheckTest, RejectsASpliceInsideTheDirectiveName) {
  ExpectRejected(Source("#inc\\\nlude </proc/self/environ>"), "#include </proc");
  ExpectRejected(Source("#\\\ninclude </proc/self/environ>"), "#include </proc");
  ExpectRejected(Source("%:\\\ninclude </proc/self/environ>"), "not allowed");
  ExpectRejected(Source("%\\\n:include </proc/self/environ>"), "not allowed");
}

TEST(SourceCheckTest, RejectsASpliceThatBringsTheIncludeIntoALineComment) {
  // Whether the include is inside the comment depends on whether `\ ` +
  // newline splices: rejected, not guessed.
  ExpectRejected(Source("// harmless \\ \n#include </proc/self/environ>"), "backslash");
  ExpectRejected(Source("// harmless \\\t\n#include </proc/self/environ>"), "backslash");
}

TEST(SourceCheckTest, ASpliceContinuesALineCommentOverTheNextLine) {
  // Both compilers and the check agree: the second line is comment.
  ExpectAccepted(Source("// harmless \\\n#include </proc/self/environ>"));
}

TEST(SourceCheckTest, RejectsAStringOrCharLiteralThatConfusedTheCommentStripper) {
  ExpectRejected(Source("__device__ const char* s = \"/*\";\n#include </proc/self/environ>\n// */"),
                 "/proc/self/environ");
  ExpectRejected(Source("__device__ char c = '\"';\n#include </proc/self/environ>\n// \""),
                 "/proc/self/environ");
  ExpectRejected(Source("__device__ const char* s = \"\\\"/*\";\n#include </x>\n// */"), "</x>");
  ExpectRejected(Source("__device__ char c = '/*';\n#include </x>\n// */"), "</x>");
  ExpectRejected(Source("__device__ const char* s = u8\"/*\";\n#include </x>\n// */"), "</x>");
  ExpectRejected(Source("__device__ const char* s = R\"x(/*)x\";\n#include </x>\n// */"), "</x>");
}

TEST(SourceCheckTest, RejectsACommentBetweenTheHashAndInclude) {
  ExpectRejected(Source("#/* c */include </proc/self/environ>"), "# include");
  ExpectRejected(Source("/* c */ # /* c */ include </proc/self/environ>"), "not allowed");
  ExpectRejected(Source("/* a comment\n over lines */ #include </proc/self/environ>"), "line 3");
}

TEST(SourceCheckTest, RejectsAHashAfterACommentThatSpansLines) {
  // Not a directive by the standard, but NVRTC 13 includes the file.
  ExpectRejected(Source("__device__ int x; /*\n*/ #include </proc/self/environ>"),
                 "does not start a line");
  ExpectRejected(Source("#define X 1 /*\n*/ #include </proc/self/environ>"),
                 "does not start a line");
  ExpectRejected(Source("__device__ int x; /* c */ #include </proc/self/environ>"),
                 "does not start a line");
}

TEST(SourceCheckTest, RejectsTrigraphs) {
  ExpectRejected(Source("?\?=include </proc/self/environ>"), "trigraph");
  ExpectRejected(Source("// ?\?/\n#include </x>"), "trigraph");
  ExpectRejected(Source("__device__ const char* s = \"?\?=\";"), "trigraph");
}

TEST(SourceCheckTest, RejectsHasInclude) {
  ExpectRejected(Source("#if __has_include(</proc/self/environ>)\n#endif"), "__has_include");
  ExpectRejected(Source("#if __has_include_next(<x>)\n#endif"), "__has_include_next");
  ExpectRejected(Source("#if defined(__has_include)\n#endif"), "__has_include");
  ExpectRejected(Source("#define H __has_include\n#if H(<x>)\n#endif"), "__has_include");
}

TEST(SourceCheckTest, RejectsPragmaOperators) {
  ExpectRejected(Source("_Pragma(\"GCC dependency \\\"/proc/self/environ\\\"\")"), "_Pragma");
  ExpectRejected(Source("#define P(x) _Pragma(#x)\nP(once)"), "_Pragma");
  ExpectRejected(Source("__pragma(once)"), "__pragma");
}

TEST(SourceCheckTest, RejectsOtherDirectivesByName) {
  for (const char* d : {"include_next <x>", "import <x>", "embed </proc/self/environ>",
                        "line 1 \"/proc/self/environ\"", "ident \"x\"", "sccs \"x\"",
                        "assert x(y)", "unassert x", "elifdef X", "foo"}) {
    const std::string directive = std::string("#") + d;
    const std::string name = std::string(d).substr(0, std::string(d).find(' '));
    ExpectRejected(Source(directive), "#" + name);
  }
  ExpectRejected(Source("# 1 \"/proc/self/environ\""), "not an allowed directive");
}

TEST(SourceCheckTest, RejectsAnExtraTokenAfterTheAllowedInclude) {
  ExpectRejected(Source("#include \"kforge/attn_params.h\" </proc/self/environ>"), "not allowed");
  ExpectRejected(Source("#include \"kforge/attn_params.h\" x"), "not allowed");
  ExpectRejected(Source("#include u8\"kforge/attn_params.h\""), "not allowed");
  ExpectRejected(Source("#include R\"(kforge/attn_params.h)\""), "not allowed");
  ExpectRejected(Source("#include \"kforge/attn_params.h\"_s"), "not allowed");
  // A comment after it is not a token.
  ExpectAccepted("#include \"kforge/attn_params.h\" // the contract\n" + std::string(kEntry));
}

TEST(SourceCheckTest, AnIncludeInsideARawStringOrACommentIsHarmless) {
  ExpectAccepted(Source("__device__ const char* s = R\"(\n#include </proc/self/environ>\n)\";"));
  ExpectAccepted(Source("__device__ const char* s = R\"kf(\n)\"\n#include </x>\n)kf\";"));
  ExpectAccepted(Source("// #include </proc/self/environ>"));
  ExpectAccepted(Source("/*\n#include </proc/self/environ>\n*/"));
  ExpectAccepted(Source("__device__ const char* s = \"#include </proc/self/environ>\";"));
}

TEST(SourceCheckTest, RejectsASpliceInsideARawString) {
  ExpectRejected(Source("__device__ const char* s = R\"x(a\\\n)x\";"), "raw string");
}

TEST(SourceCheckTest, RejectsTokenPasting) {
  ExpectRejected(Source("#define CAT(a, b) a##b\nCAT(_Pra, gma)(\"once\")"), "token pasting");
  ExpectRejected(Source("#define CAT(a, b) a %:%: b"), "token pasting");
}

TEST(SourceCheckTest, AllowsStringizingInADefine) {
  ExpectAccepted(Source("#define S(x) #x\n__device__ const char* s = S(hello);"));
  ExpectAccepted(Source("#define S(x) %:x"));
}

TEST(SourceCheckTest, RejectsUnterminatedCommentsAndLiterals) {
  ExpectRejected(Source("/* never closed"), "unterminated /* comment");
  ExpectRejected(Source("__device__ const char* s = \"open;"), "unterminated string");
  ExpectRejected(Source("__device__ char c = 'x;"), "unterminated character");
  ExpectRejected(Source("__device__ const char* s = R\"x(open)y\";"), "unterminated raw string");
}

TEST(SourceCheckTest, RejectsAmbiguousBytes) {
  ExpectRejected(Source("__device__ int x;\r\n"), "carriage return");
  ExpectRejected(Source(std::string("__device__ int x;") + '\0' + "#include </x>"), "NUL");
  ExpectRejected(Source("__device__ int \\u0078;"), "'\\'");
  ExpectRejected(Source("__device__ int $x;"), "'$'");
  ExpectRejected(Source("__device__ int x\xc3\x97;"), "byte 0xc3");
}

TEST(SourceCheckTest, NonAsciiIsFineInCommentsAndLiterals) {
  ExpectAccepted(Source("// 2 \xc3\x97 faster \xe2\x86\x92 good\n"
                        "__device__ const char* s = \"\xc3\x97\";"));
}

TEST(SourceCheckTest, PragmasOnlyFromTheAllowlist) {
  ExpectAccepted(Source("#pragma once\n__device__ void f() {\n#pragma unroll\n"
                        "for (int i = 0; i < 4; ++i) {}\n#pragma unroll 4\n"
                        "for (int i = 0; i < 4; ++i) {}\n#pragma unroll (UNROLL * 2)\n"
                        "for (int i = 0; i < 4; ++i) {}\n#pragma nounroll\n"
                        "for (int i = 0; i < 4; ++i) {}\n}\n#pragma nv_diag_suppress 177"));
  ExpectRejected(Source("#pragma GCC dependency \"/proc/self/environ\""), "#pragma GCC");
  ExpectRejected(Source("#pragma include_alias(<a>, </proc/self/environ>)"), "include_alias");
  ExpectRejected(Source("#pragma push_macro(\"X\")"), "push_macro");
  ExpectRejected(Source("#pragma unroll \"4\""), "\"4\"");
  ExpectRejected(Source("#pragma once x"), "\"x\"");
  ExpectRejected(Source("#pragma"), "#pragma");
}

TEST(SourceCheckTest, SeedDirectivesAreAllowed) {
  ExpectAccepted(Source("#ifndef KF_X\n#define KF_X 1\n#endif\n#if KF_X == 1 && defined(KF_X)\n"
                        "#elif KF_X\n#else\n#error \"bad knob\"\n#warning \"odd\"\n#endif\n"
                        "#undef KF_X\n#ifdef KF_X\n#endif\n#\n"));
}

TEST(SourceCheckTest, HostCodeIsFoundOnTokensNotText) {
  ExpectRejected(Source("int main() { return 0; }"), "\"main\"");
  ExpectRejected(Source("__device__ void f() { printf(\"x\"); }"), "\"printf\"");
  ExpectRejected(Source("#define P printf\n__device__ void f() { P(\"x\"); }"), "\"printf\"");
  ExpectRejected(Source("__device__ void f() { void* p = malloc(4); free(p); }"), "\"malloc\"");
  ExpectRejected(Source("__device__ void f() { int* p = new int; }"), "\"new\"");
  ExpectRejected(Source("__device__ void f() { cudaDeviceSynchronize(); }"), "cudaDeviceSynchronize");
  ExpectRejected(Source("__device__ void f() { cuMemAlloc(0, 0); }"), "cuMemAlloc");
  ExpectRejected(Source("__device__ void f() { __trap(); }"), "__trap");
  ExpectRejected(Source("__device__ void f() { asm volatile(\"trap;\"); }"), "PTX trap");
  ExpectRejected(Source("__device__ void f() { asm volatile(\"tr\" \"ap;\"); }"), "PTX trap");
  ExpectRejected(Source("__device__ void f() { system(\"ls\"); getenv(\"X\"); }"), "\"system\"");
  ExpectRejected(Source("__host__ __device__ int g() { return 1; }"), "__host__");
  ExpectRejected(Source("__device__ std::size_t n;"), "std::");
  ExpectRejected(Source("__device__ ::std::size_t n;"), "std::");
  ExpectRejected(Source("using namespace std;"), "std::");
  ExpectRejected(Source("import foo;"), "\"import\"");
  ExpectRejected(Source("module foo;"), "module");
  // Strings and comments neither hide nor fake host code.
  ExpectAccepted(Source("// printf(\"x\") int main( malloc std::vector\n"
                        "__device__ const char* s = \"printf( main( std::\";"));
  ExpectAccepted(Source("__device__ int g(cuda::std::array<int, 2> a) { return a[0]; }"));
  ExpectAccepted(Source("__device__ void f() { asm volatile(\"exit;\"); }"));
}

TEST(SourceCheckTest, LexesTheTrickyTokens) {
  absl::StatusOr<std::vector<SourceToken>> t =
      LexSource("a<::b>c; x = 1'000'000 + 0x1p-3 + 1e+5; y = u8'a' + L'\\'' ; <%%> <::> %:%: ...");
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<std::string> texts;
  for (const SourceToken& tok : *t) texts.push_back(tok.text);
  const std::vector<std::string> want = {"a", "<", "::", "b", ">", "c", ";", "x", "=", "1'000'000",
                                         "+", "0x1p-3", "+", "1e+5", ";", "y", "=", "u8'a'", "+",
                                         "L'\\''", ";", "<%", "%>", "<:", ":>", "%:%:", "..."};
  EXPECT_EQ(texts, want);
  EXPECT_TRUE((*t)[0].starts_line);
  EXPECT_FALSE((*t)[1].starts_line);
}

TEST(SourceCheckTest, LinesCountPhysicalLinesAcrossSplices) {
  absl::StatusOr<std::vector<SourceToken>> t = LexSource("a \\\nb\nc");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 3u);
  EXPECT_EQ((*t)[1].line, 2);
  EXPECT_FALSE((*t)[1].starts_line);  // spliced onto a's line
  EXPECT_EQ((*t)[2].line, 3);
  EXPECT_TRUE((*t)[2].starts_line);
}

TEST(SourceCheckTest, FindsTheEntryPointOnTokens) {
  absl::StatusOr<std::vector<SourceToken>> t = LexSource(
      "// extern \"C\" __global__ void kf_attn_fwd(\n"
      "extern \"C\" __global__ void __launch_bounds__(256, 1)\n  kf_attn_fwd(KfAttnParams p) {}");
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(DefinesEntryPoint(*t, "kf_attn_fwd"));
  EXPECT_FALSE(DefinesEntryPoint(*t, "kf_attn_bwd"));
  t = LexSource("const char* s = \"extern \\\"C\\\" __global__ void kf_attn_fwd(\";");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(DefinesEntryPoint(*t, "kf_attn_fwd"));
}

// Every knob value of every template, in the full product: the seeds are
// what the check must never refuse.
TEST(SourceCheckTest, EverySeedSettingPassesTheCheck) {
  int checked = 0;
  for (const TemplateInfo& info : ListTemplates()) {
    for (int d : info.head_dims) {
      std::vector<std::map<std::string, int>> settings = {{}};
      for (const KnobDim& k : info.knobs) {
        std::vector<std::map<std::string, int>> next;
        for (const auto& partial : settings) {
          for (int v : k.values) {
            auto m = partial;
            m[k.name] = v;
            next.push_back(std::move(m));
          }
        }
        settings = std::move(next);
      }
      for (const auto& knobs : settings) {
        absl::StatusOr<Variant> v = Instantiate(info.name, knobs, d);
        if (!v.ok()) continue;  // an impossible combination, refused with its reason
        absl::Status s = CheckSource(v->source);
        ASSERT_TRUE(s.ok()) << info.name << " d" << d << ": " << s.message();
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

}  // namespace
}  // namespace kforge
