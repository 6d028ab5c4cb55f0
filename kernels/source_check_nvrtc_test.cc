// The source check against NVRTC itself: sources it accepts must never make
// NVRTC try to open the file they name. A differential test: random sources
// are built as context (a comment, a literal, a directive being opened) +
// something compilers may read differently (splices, bytes, comments over
// lines) + an include spelled some way + noise, from fragments. It knows no
// particular trick, only what NVRTC does with the result.
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/source_check.h"
#include "kernels/testing/nvrtc_util.h"

namespace kforge {
namespace {

TEST(SourceCheckAgainstNvrtc, AcceptedSourcesNeverOpenAFile) {
  const std::vector<std::string> openers = {
      "", "", "//", "// x ", "/*", "/* x ", "\"", "\"x", "'", "R\"x(", "u8R\"(", "L\"", "#define X ",
      "#define X(a) ", "#if 0\n", "#pragma unroll ", "#error ", "int a; ", "x", "%:define X "};
  const std::vector<std::string> ambiguities = {
      "\n", "\\\n", "\\ \n", "\\\t\n", "\\\r\n", "\r", "\r\n", "?\?/\n", "?\?=", "\v", "\f", "\x1a",
      "/*\n*/", "/* */", "*/", "*/ ", ")x\"", ")\"", "\"", "'", "\\\"", "\\'", "\\\\\n", "\x85",
      "\xe2\x80\xa8", "$", "\\u0023", "", " "};
  const std::vector<std::string> includes = {
      "#include </nonexistent/kforge-fuzz.h>", "%:include </nonexistent/kforge-fuzz.h>",
      "# include \"/nonexistent/kforge-fuzz.h\"", "%: include </nonexistent/kforge-fuzz.h>",
      "#inc\\\nlude </nonexistent/kforge-fuzz.h>", "#\\\ninclude </nonexistent/kforge-fuzz.h>",
      "#/**/include </nonexistent/kforge-fuzz.h>", "include </nonexistent/kforge-fuzz.h>",
      "#include_next </nonexistent/kforge-fuzz.h>", "#import \"/nonexistent/kforge-fuzz.h\"",
      "#if __has_include(</nonexistent/kforge-fuzz.h>)\n#endif",
      "_Pragma(\"include_alias(<a>, </nonexistent/kforge-fuzz.h>)\")\n#include <a>"};
  const std::vector<std::string> noise = {
      "\n", " ", "\t", "\\\n", "//", "/*", "*/", "\"", "'", "#", "%:", "(", ")", "x", "<:", ":>",
      "<%", "%>", "##", "1'2", "\"a\"", "'b'", "\\", "R\"x(", ")x\"", "\n#define X ", "\n#"};
  std::mt19937 rng(20261201);
  auto pick = [&](const std::vector<std::string>& v) { return v[rng() % v.size()]; };
  int compiled = 0;
  for (int i = 0; i < 12000; ++i) {
    std::string source = pick(openers);
    for (int k = static_cast<int>(rng() % 3); k > 0; --k) source += pick(noise);
    source += pick(ambiguities);
    if (rng() % 2) source += pick(ambiguities);
    source += pick(includes);
    for (int k = static_cast<int>(rng() % 3); k > 0; --k) source += pick(noise);
    source += "\n";
    if (!CheckSource(source).ok()) continue;
    ++compiled;
    const testing::CompileReport r = testing::CompileVariant(source, "sm_90a");
    EXPECT_EQ(r.log.find("open source file"), std::string::npos) << source << "\n----\n" << r.log;
  }
  EXPECT_GT(compiled, 100);
  std::printf("%d accepted sources compiled\n", compiled);
}

}  // namespace
}  // namespace kforge
