// RunChild and the children's environment, with ordinary programs as
// children (env, cat, sleep, ls) and the real sandbox under a wrapper.
#include "worker/child_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/worker/worker_bin.h"
#include "worker/sandbox.h"

namespace kforge::worker {
namespace {

using namespace std::chrono_literals;

constexpr char kToken[] = "kf-worker-token-77c0d2e91a";

// No protocol: collects fd 3 and gives the child `limit`.
class PlainWatcher final : public ChildWatcher {
 public:
  explicit PlainWatcher(std::chrono::milliseconds limit = 10s)
      : deadline_(ChildClock::now() + limit) {}
  void OnResult(std::string_view bytes) override { result.append(bytes); }
  ChildClock::time_point Deadline() const override { return deadline_; }
  std::string result;

 private:
  ChildClock::time_point deadline_;
};

ChildExit RunPlain(ChildCommand command, std::chrono::milliseconds limit = 10s) {
  PlainWatcher watcher(limit);
  absl::StatusOr<ChildExit> exit = RunChild(command, watcher, 1 << 16);
  EXPECT_TRUE(exit.ok()) << exit.status();
  return exit.ok() ? *exit : ChildExit{};
}

// Sets environment variables for one test and takes them away after.
class ScopedEnv {
 public:
  explicit ScopedEnv(std::vector<std::pair<std::string, std::string>> vars) : vars_(std::move(vars)) {
    for (const auto& [k, v] : vars_) setenv(k.c_str(), v.c_str(), 1);
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : vars_) unsetenv(k.c_str());
  }

 private:
  std::vector<std::pair<std::string, std::string>> vars_;
};

TEST(ChildEnvironment, KeepsOnlyTheAllowlist) {
  ScopedEnv env({{"KFORGE_WORKER_TOKEN", kToken},
                 {"KFORGE_CLIENT_TOKEN", kToken},
                 {"AWS_SECRET_ACCESS_KEY", kToken},
                 {"CUDA_VISIBLE_DEVICES", "1"},
                 {"TMPDIR", "/tmp"}});
  ChildExit exit = RunPlain({.argv = {"/usr/bin/env"}, .env = ChildEnvironment()});
  EXPECT_TRUE(exit.Clean()) << exit.Ending();
  EXPECT_EQ(exit.output_tail.find(kToken), std::string::npos) << exit.output_tail;
  EXPECT_NE(exit.output_tail.find("CUDA_VISIBLE_DEVICES=1\n"), std::string::npos);
  EXPECT_NE(exit.output_tail.find("TMPDIR=/tmp\n"), std::string::npos);
  if (getenv("PATH") != nullptr) EXPECT_NE(exit.output_tail.find("PATH="), std::string::npos);
  for (const std::string& e : ChildEnvironment()) {
    const std::string name = e.substr(0, e.find('='));
    EXPECT_NE(std::find(std::begin(kChildEnvAllowlist), std::end(kChildEnvAllowlist), name),
              std::end(kChildEnvAllowlist))
        << name;
  }
}

TEST(ChildEnvironment, AnOperatorCanAddNames) {
  ScopedEnv env({{"KF_EXTRA_SETTING", "on"}, {"KF_OTHER", "off"}});
  const std::vector<std::string> extra = {"KF_EXTRA_SETTING"};
  ChildExit exit = RunPlain({.argv = {"/usr/bin/env"}, .env = ChildEnvironment(extra)});
  EXPECT_NE(exit.output_tail.find("KF_EXTRA_SETTING=on"), std::string::npos);
  EXPECT_EQ(exit.output_tail.find("KF_OTHER"), std::string::npos);
}

TEST(ChildEnvironment, RefusesCredentialsAndBadNames) {
  EXPECT_TRUE(CheckChildEnvName("HOME").ok());
  EXPECT_TRUE(CheckChildEnvName("CUDA_CACHE_PATH").ok());
  EXPECT_FALSE(CheckChildEnvName("KFORGE_WORKER_TOKEN").ok());
  EXPECT_FALSE(CheckChildEnvName("KFORGE_TOKEN").ok());
  EXPECT_FALSE(CheckChildEnvName("A=B").ok());
  EXPECT_FALSE(CheckChildEnvName("").ok());
  EXPECT_FALSE(CheckChildEnvName("1X").ok());
}

TEST(RunChild, TheWrappedSandboxChildGetsTheAllowlistToo) {
  // The wrapper stands in for compute-sanitizer: it shows its environment,
  // then runs the child (which reports whether it sees a token).
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kforge-child-env-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::filesystem::path wrapper = dir / "wrapper.sh";
  { std::ofstream(wrapper) << "#!/bin/sh\nenv >&2\nexec \"$@\"\n"; }
  std::filesystem::permissions(wrapper, std::filesystem::perms::owner_all);
  ScopedEnv env({{"KFORGE_WORKER_TOKEN", kToken}, {"SOME_SECRET", kToken}});
  SandboxOptions o;
  o.executable = testing::WorkerBinary();
  o.child_args = {"--eval-child", "--self-test=report_env"};
  o.wrapper = {wrapper.string()};
  o.scratch_dir = dir;
  Sandbox sandbox(o);
  ChildRequest request;
  request.candidate.variant_id = "v1";
  request.candidate.manifest_json = "{}";
  request.candidate.cubin = "x";
  absl::StatusOr<SandboxRun> run = sandbox.Run(request);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->report.message, "no token");
  EXPECT_EQ(run->stderr_tail.find(kToken), std::string::npos) << run->stderr_tail;
  EXPECT_NE(run->stderr_tail.find("PATH="), std::string::npos) << run->stderr_tail;
}

TEST(RunChild, TheChildInheritsNoFileDescriptorButItsOwn) {
  const int opened = open("/dev/null", O_RDONLY);
  ASSERT_GE(opened, 0);
  const int stray = dup2(opened, 50);  // dup2: not close-on-exec
  close(opened);
  ASSERT_EQ(stray, 50);
  ChildExit exit = RunPlain({.argv = {"/bin/ls", "/proc/self/fd"}, .env = ChildEnvironment()});
  close(stray);
  // 0-3 are the child's; ls's own handle on the directory may show too.
  std::istringstream fds(exit.output_tail);
  std::vector<int> seen;
  for (std::string line; std::getline(fds, line);) seen.push_back(std::stoi(line));
  ASSERT_GE(seen.size(), 4u) << exit.output_tail;
  EXPECT_EQ(std::vector<int>(seen.begin(), seen.begin() + 4), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_LE(seen.size(), 5u) << exit.output_tail;
  EXPECT_EQ(std::find(seen.begin(), seen.end(), 50), seen.end());
}

TEST(RunChild, StdinComesFromTheGivenFd) {
  const int fd = memfd_create("test-stdin", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "hello child\n", 12), 12);
  lseek(fd, 0, SEEK_SET);
  ChildExit exit = RunPlain({.argv = {"/bin/cat"}, .env = ChildEnvironment(), .stdin_fd = fd});
  close(fd);
  EXPECT_EQ(exit.output_tail, "hello child\n");
  EXPECT_EQ(RunPlain({.argv = {"/bin/cat"}, .env = ChildEnvironment()}).output_tail, "");  // /dev/null
}

TEST(RunChild, ResultFdReachesTheWatcher) {
  PlainWatcher watcher;
  absl::StatusOr<ChildExit> exit =
      RunChild({.argv = {"/bin/sh", "-c", "echo result >&3"}, .env = ChildEnvironment()}, watcher,
               4096);
  ASSERT_TRUE(exit.ok());
  EXPECT_EQ(watcher.result, "result\n");
  EXPECT_TRUE(exit->Clean());
}

TEST(RunChild, TheDeadlineKillsTheChildAndItsGroup) {
  const auto start = std::chrono::steady_clock::now();
  ChildExit exit = RunPlain({.argv = {"/bin/sh", "-c", "sleep 30 & sleep 30"}, .env = ChildEnvironment()},
                       300ms);
  EXPECT_TRUE(exit.killed);
  EXPECT_TRUE(exit.deadline_passed);
  EXPECT_EQ(exit.Ending(), "killed by SIGKILL");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(RunChild, CancelKillsTheChild) {
  std::atomic<bool> cancel{true};
  PlainWatcher watcher;
  absl::StatusOr<ChildExit> exit =
      RunChild({.argv = {"/bin/sleep", "30"}, .env = ChildEnvironment()}, watcher, 4096, &cancel);
  ASSERT_TRUE(exit.ok());
  EXPECT_TRUE(exit->cancelled);
  EXPECT_LT(exit->wall_ms, 5000);
}

TEST(RunChild, ALaunchFailureSaysWhy) {
  ChildExit missing = RunPlain({.argv = {"/nonexistent/program"}, .env = ChildEnvironment()});
  EXPECT_TRUE(missing.launch_failed);
  EXPECT_NE(missing.launch_error.find("could not exec /nonexistent/program"), std::string::npos)
      << missing.launch_error;
  ChildExit no_dir =
      RunPlain({.argv = {"/bin/true"}, .env = ChildEnvironment(), .working_dir = "/nonexistent/dir"});
  EXPECT_TRUE(no_dir.launch_failed);
  EXPECT_NE(no_dir.launch_error.find("working directory"), std::string::npos) << no_dir.launch_error;
  ChildExit ok = RunPlain({.argv = {"/bin/true"}, .env = ChildEnvironment()});
  EXPECT_FALSE(ok.launch_failed);
  EXPECT_TRUE(ok.Clean());
}

TEST(RunChild, TheWorkingDirectoryIsSet) {
  ChildExit exit = RunPlain({.argv = {"/bin/pwd"}, .env = ChildEnvironment(), .working_dir = "/"});
  EXPECT_EQ(exit.output_tail, "/\n");
}

TEST(SignalNames, NamesCommonSignals) {
  EXPECT_EQ(SignalName(SIGSEGV), "SIGSEGV");
  EXPECT_NE(SignalName(SIGUSR1).find("signal"), std::string::npos);
}

}  // namespace
}  // namespace kforge::worker
