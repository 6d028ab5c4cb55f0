#include "core/redact.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kforge {
namespace {

TEST(Redact, ReplacesEveryOccurrenceOfAKnownSecret) {
  const std::vector<std::string> secrets = {"s3cr3t-token-value-0123"};
  EXPECT_EQ(Redact("a s3cr3t-token-value-0123 b s3cr3t-token-value-0123", secrets),
            "a [redacted] b [redacted]");
}

TEST(Redact, IgnoresShortSecrets) {
  const std::vector<std::string> secrets = {"", "abc"};
  EXPECT_EQ(Redact("abc abc", secrets), "abc abc");
}

TEST(Redact, ReplacesCredentialShapedAssignmentsAndBearerValues) {
  EXPECT_EQ(Redact("KFORGE_WORKER_TOKEN=abcdef PATH=/usr/bin"),
            "KFORGE_WORKER_TOKEN=[redacted] PATH=/usr/bin");
  EXPECT_EQ(Redact("AWS_SECRET_ACCESS_KEY=xyz\nHOME=/root"), "AWS_SECRET_ACCESS_KEY=[redacted]\nHOME=/root");
  EXPECT_EQ(Redact("authorization: Bearer abc.def"), "authorization: Bearer [redacted]");
}

TEST(Redact, AnEnvironmentBlockReadAsTextLosesItsSecrets) {
  // /proc/self/environ is NUL-separated: the values must not survive either.
  const std::string environ = std::string("PATH=/bin") + '\0' + "KFORGE_TOKEN=abcdefgh1234" + '\0' +
                              "X_API_KEY=zzz" + '\0';
  const std::string out = Redact(environ);
  EXPECT_EQ(out.find("abcdefgh1234"), std::string::npos) << out;
  EXPECT_EQ(out.find("zzz"), std::string::npos) << out;
  EXPECT_EQ(out.find('\0'), std::string::npos);
  // Each entry's value alone is replaced: the next entry survives.
  EXPECT_NE(out.find("X_API_KEY=[redacted]"), std::string::npos) << out;
}

TEST(Redact, LeavesOrdinaryCompileLogsAlone) {
  const std::string log =
      "ptxas info    : Used 128 registers, 0 bytes smem\ncandidate.cu(3): error: identifier "
      "\"x\" is undefined\n";
  EXPECT_EQ(Redact(log), log);
}

TEST(ClipMiddle, KeepsHeadAndTail) {
  const std::string text = std::string(100, 'a') + std::string(100, 'b');
  const std::string out = ClipMiddle(text, 20);
  EXPECT_EQ(out.substr(0, 10), std::string(10, 'a'));
  EXPECT_EQ(out.substr(out.size() - 10), std::string(10, 'b'));
  EXPECT_NE(out.find("180 bytes cut"), std::string::npos);
  EXPECT_EQ(ClipMiddle("short", 20), "short");
}

}  // namespace
}  // namespace kforge
