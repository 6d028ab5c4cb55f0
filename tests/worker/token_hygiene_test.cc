// The kforge-worker binary keeps its token out of /proc: started with the
// token in the environment, a running worker's /proc/<pid>/environ no
// longer shows it; --token-file keeps it off both from the start; a token on
// the command line is refused (it would show in cmdline from the start), and
// so are short tokens and plaintext to a server that is not on loopback. No
// server is needed: the worker keeps trying to register with one that is not
// there.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/worker/worker_bin.h"

extern char** environ;

namespace kforge::worker {
namespace {

using namespace std::chrono_literals;

constexpr char kToken[] = "kf-hygiene-token-5d8e21b04c-0123456789";
constexpr char kClientToken[] = "kf-hygiene-client-93a7f6e1d2-012345678";

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The worker binary, its output in a file, stopped with SIGKILL.
class Worker {
 public:
  Worker(std::vector<std::string> args, std::vector<std::string> extra_env,
         std::filesystem::path log)
      : log_(std::move(log)) {
    args.insert(args.begin(), testing::WorkerBinary());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    for (std::string& e : extra_env) env.push_back(std::move(e));
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), envp.data()) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~Worker() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  // True once the log has `text` (the worker is past its start-up).
  bool WaitForLog(const std::string& text, std::chrono::seconds timeout = 30s) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      if (Log().find(text) != std::string::npos) return true;
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }
  // The exit status once it has exited by itself; -1 after the timeout.
  int Wait(std::chrono::seconds timeout = 30s) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return status;
      }
      std::this_thread::sleep_for(50ms);
    }
    return -1;
  }
  std::string Log() const { return ReadFile(log_); }
  std::string Proc(const char* file) const {
    return ReadFile(std::filesystem::path("/proc") / std::to_string(pid_) / file);
  }
  pid_t pid() const { return pid_; }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
};

class TokenHygiene : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kforge-token-hygiene-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::vector<std::string> Args() const {
    // Port 1 on loopback: nothing listens, so registration keeps retrying.
    return {"--server", "127.0.0.1:1", "--compile-only", "--arch", "sm_90a",
            "--cache-dir", (dir_ / "cache").string(), "--lease-wait-ms", "1000"};
  }

  std::filesystem::path dir_;
};

TEST_F(TokenHygiene, ATokenInTheEnvironmentIsGoneFromProc) {
  Worker w(Args(),
           {std::string("KFORGE_WORKER_TOKEN=") + kToken,
            std::string("KFORGE_CLIENT_TOKEN=") + kClientToken},
           dir_ / "worker.log");
  ASSERT_GT(w.pid(), 0);
  ASSERT_TRUE(w.WaitForLog("serving")) << w.Log();
  const std::string environ_block = w.Proc("environ");
  // Readable here (root, or the same user without the non-dumpable flag
  // taking effect); elsewhere the kernel refuses to show it at all.
  EXPECT_EQ(environ_block.find(kToken), std::string::npos);
  EXPECT_EQ(environ_block.find(kClientToken), std::string::npos);
  EXPECT_EQ(w.Log().find(kToken), std::string::npos);
  if (!environ_block.empty()) {
    EXPECT_NE(environ_block.find("KFORGE_WORKER_TOKEN=*"), std::string::npos) << "scrubbed in place";
  }
}

TEST_F(TokenHygiene, ATokenOnTheCommandLineIsRefusedSayingWhereTokensGo) {
  std::vector<std::string> args = Args();
  args.insert(args.end(), {"--token", kToken});
  Worker w(args, {}, dir_ / "worker.log");
  const int status = w.Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
  EXPECT_NE(w.Log().find("--token is gone"), std::string::npos) << w.Log();
  EXPECT_NE(w.Log().find("--token-file"), std::string::npos) << w.Log();
  EXPECT_NE(w.Log().find("KFORGE_WORKER_TOKEN"), std::string::npos) << w.Log();
  EXPECT_EQ(w.Log().find(kToken), std::string::npos) << w.Log();
}

TEST_F(TokenHygiene, AShortTokenIsRefusedWithoutShowingIt) {
  Worker w(Args(), {"KFORGE_WORKER_TOKEN=hunter2-hunter2"}, dir_ / "worker.log");
  const int status = w.Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
  EXPECT_NE(w.Log().find("KFORGE_WORKER_TOKEN: the token has 15 characters, fewer than 32"),
            std::string::npos)
      << w.Log();
  EXPECT_EQ(w.Log().find("hunter2"), std::string::npos) << w.Log();
}

TEST_F(TokenHygiene, PlaintextToAServerOffLoopbackIsRefusedUnlessForced) {
  std::vector<std::string> args = Args();
  args[1] = "192.0.2.1:1";  // TEST-NET-1: reachable by no one
  Worker refused(args, {std::string("KFORGE_WORKER_TOKEN=") + kToken}, dir_ / "refused.log");
  const int status = refused.Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
  EXPECT_NE(refused.Log().find("is not a loopback address and TLS is off"), std::string::npos)
      << refused.Log();
  EXPECT_NE(refused.Log().find("--tls-ca"), std::string::npos) << refused.Log();
  args.push_back("--allow-plaintext");
  Worker forced(args, {std::string("KFORGE_WORKER_TOKEN=") + kToken}, dir_ / "forced.log");
  EXPECT_TRUE(forced.WaitForLog("serving")) << forced.Log();
}

TEST_F(TokenHygiene, ATokenFileKeepsTheTokenOffTheCommandLine) {
  const std::filesystem::path file = dir_ / "token";
  { std::ofstream(file) << kToken << "\n"; }
  std::vector<std::string> args = Args();
  args.insert(args.end(), {"--token-file", file.string()});
  Worker w(args, {}, dir_ / "worker.log");
  ASSERT_TRUE(w.WaitForLog("serving")) << w.Log();
  EXPECT_EQ(w.Proc("cmdline").find(kToken), std::string::npos);
  EXPECT_EQ(w.Proc("environ").find(kToken), std::string::npos);
}

TEST_F(TokenHygiene, AMissingTokenFileStopsTheWorker) {
  std::vector<std::string> args = Args();
  args.insert(args.end(), {"--token-file", (dir_ / "absent").string()});
  Worker w(args, {}, dir_ / "worker.log");
  const int status = w.Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
  EXPECT_NE(w.Log().find("--token-file"), std::string::npos) << w.Log();
}

}  // namespace
}  // namespace kforge::worker
