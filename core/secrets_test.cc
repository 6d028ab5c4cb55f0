#include "core/secrets.h"

#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace kforge {
namespace {

std::string ReadProc(const char* path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ReadTokenFile, TakesTheFirstLineTrimmed) {
  const std::filesystem::path p =
      std::filesystem::temp_directory_path() / ("kforge-token-" + std::to_string(getpid()));
  { std::ofstream(p) << "  s3cret-token\t\r\nsecond line\n"; }
  absl::StatusOr<std::string> t = ReadTokenFile(p.string());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "s3cret-token");
  { std::ofstream(p) << "\n"; }
  EXPECT_EQ(ReadTokenFile(p.string()).status().code(), absl::StatusCode::kInvalidArgument);
  std::filesystem::remove(p);
  EXPECT_EQ(ReadTokenFile(p.string()).status().code(), absl::StatusCode::kNotFound);
}

TEST(IsKforgeTokenVariable, NamesKforgesCredentials) {
  EXPECT_TRUE(IsKforgeTokenVariable("KFORGE_WORKER_TOKEN"));
  EXPECT_TRUE(IsKforgeTokenVariable("KFORGE_CLIENT_TOKEN"));
  EXPECT_TRUE(IsKforgeTokenVariable("KFORGE_TOKEN"));
  EXPECT_FALSE(IsKforgeTokenVariable("KFORGE_SERVER"));
  EXPECT_FALSE(IsKforgeTokenVariable("WORKER_TOKEN"));
}

TEST(TakeSecretEnvironment, ReturnsValuesAndUnsetsThem) {
  setenv("KFORGE_TEST_A_TOKEN", "value-a-123", 1);
  setenv("KFORGE_TEST_PLAIN", "kept", 1);
  std::vector<std::pair<std::string, std::string>> got = TakeSecretEnvironment(IsKforgeTokenVariable);
  const std::pair<std::string, std::string> want = {"KFORGE_TEST_A_TOKEN", "value-a-123"};
  EXPECT_NE(std::find(got.begin(), got.end(), want), got.end());
  EXPECT_EQ(getenv("KFORGE_TEST_A_TOKEN"), nullptr);
  ASSERT_NE(getenv("KFORGE_TEST_PLAIN"), nullptr);
  EXPECT_STREQ(getenv("KFORGE_TEST_PLAIN"), "kept");
  unsetenv("KFORGE_TEST_PLAIN");
}

TEST(ScrubFromProcessMemory, OverwritesArgvInPlace) {
  char a0[] = "kforge-worker";
  char a1[] = "--token=abcd-secret-1234";
  char a2[] = "abcd-secret-1234";
  char a3[] = "--name";
  char* argv[] = {a0, a1, a2, a3, nullptr};
  ScrubFromProcessMemory(4, argv, "abcd-secret-1234");
  EXPECT_STREQ(a1, "--token=****************");
  EXPECT_STREQ(a2, "****************");
  EXPECT_STREQ(a3, "--name");
  EXPECT_STREQ(a0, "kforge-worker");
}

TEST(ScrubFromProcessMemory, TheKernelNoLongerShowsTheSecret) {
  // In a child, so the test process keeps its environment; six bytes of
  // PATH's value stand in for a secret in the initial environment block.
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string environ_before = ReadProc("/proc/self/environ");
    const size_t at = environ_before.find("PATH=");
    if (at == std::string::npos) _exit(0);  // nothing to test here
    const std::string secret = environ_before.substr(at + 5, 6);
    if (secret.size() < 6) _exit(0);
    ScrubFromProcessMemory(0, nullptr, secret);
    const std::string after = ReadProc("/proc/self/environ");
    _exit(after.find(secret) == std::string::npos ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(MakeUndumpable, ClearsTheDumpableFlag) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const bool ok = MakeUndumpable().ok() && prctl(PR_GET_DUMPABLE) == 0;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace kforge
