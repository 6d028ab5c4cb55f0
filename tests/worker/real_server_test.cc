// kforge-worker (the binary, compile-only: no GPU here) against the real
// kforge-server binary. COMPILE tasks are put straight into the server's
// SQLite database through the Store API (nothing in the public API enqueues
// compile-only work), and the results are read back from it:
//   - the worker registers as compile-only for its --arch;
//   - a good source ends COMPILED with its compile report and cubin stored;
//   - a broken source ends COMPILE_ERROR with the NVRTC log;
//   - heartbeats renew the lease of a compile that outlasts the lease TTL;
//   - after the server is stopped and started again on the same port, the
//     worker comes back by itself on the session it had (sessions are
//     stored) and serves the next task as the same worker.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/shape.h"
#include "server/jobs.h"
#include "storage/store.h"
#include "tests/util/pki.h"
#include "tests/worker/worker_bin.h"

extern char** environ;

namespace kforge::worker {
namespace {

using namespace std::chrono_literals;

constexpr char kWorkerToken[] = "real-test-worker-token-0123456789abcdef";

constexpr char kGoodSource[] = R"(#include "kforge/attn_params.h"
extern "C" __global__ void kf_attn_fwd(const __grid_constant__ KfAttnParams p) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.total_q) p.lse[i] = 1.0f;
}
)";

constexpr char kBrokenSource[] = R"(#include "kforge/attn_params.h"
extern "C" __global__ void kf_attn_fwd(const __grid_constant__ KfAttnParams p) {
  p.lse[0] = no_such_symbol;
}
)";

// Takes NVRTC and ptxas several seconds: longer than the lease TTL below.
constexpr char kSlowSource[] = R"(#include "kforge/attn_params.h"
template <int N> struct Chain {
  __device__ static float run(float x) { return Chain<N - 1>::run(x * 1.0001f + (float)N) * 0.9999f; }
};
template <> struct Chain<0> { __device__ static float run(float x) { return x; } };
extern "C" __global__ void kf_attn_fwd(const __grid_constant__ KfAttnParams p) {
  float x = p.softmax_scale;
#pragma unroll
  for (int i = 0; i < 16000; ++i) x = __sinf(x) * p.softmax_scale_log2 + Chain<150>::run(x + i);
  if (threadIdx.x == 0) p.lse[0] = x;
}
)";

std::string ServerBinary() {
  if (const char* env = std::getenv("KFORGE_SERVER_BIN"); env && *env) return env;
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec && std::filesystem::exists(self.parent_path() / "kforge-server")) {
    return (self.parent_path() / "kforge-server").string();
  }
  return KFORGE_SERVER_BIN_DEFAULT;
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// A child process with its output in a log file; SIGTERM then SIGKILL on Stop.
class Process {
 public:
  Process(std::vector<std::string> args, std::filesystem::path log,
          std::vector<std::string> extra_env = {})
      : log_(std::move(log)) {
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
    posix_spawn_file_actions_addopen(&fa, 1, log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), envp.data()) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~Process() { Stop(); }

  bool running() const { return pid_ > 0; }

  // Returns the exit status (as waitpid's).
  int Stop() {
    if (pid_ <= 0) return status_;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (waitpid(pid_, &status_, WNOHANG) == pid_) {
        pid_ = -1;
        return status_;
      }
      std::this_thread::sleep_for(50ms);
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &status_, 0);
    pid_ = -1;
    return status_;
  }

  std::string Log() const {
    std::ifstream in(log_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
  int status_ = 0;
};

template <typename Pred>
bool Eventually(Pred pred, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return pred();
}

class RealServer : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kforge-real-server-test-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    port_ = FreePort();
    StartServer();
    // The server creates the schema; wait for it before opening the store.
    ASSERT_TRUE(Eventually([&] { return std::filesystem::exists(dir_ / "kforge.db"); }, 20s))
        << server_->Log();
    std::this_thread::sleep_for(300ms);
    auto store = OpenSqliteStore((dir_ / "kforge.db").string());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  void TearDown() override {
    if (worker_) worker_->Stop();
    if (server_) server_->Stop();
    if (HasFailure() || std::getenv("KFORGE_TEST_SHOW_LOGS") != nullptr) {
      std::cerr << "---- server log ----\n" << (server_ ? server_->Log() : "") << "\n";
      std::cerr << "---- worker log ----\n" << (worker_ ? worker_->Log() : "") << "\n";
    }
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  void StartServer() {
    // Tokens in the environment: the server takes none from flags.
    server_ = std::make_unique<Process>(
        Concat({ServerBinary(), "--listen", Address(), "--db", (dir_ / "kforge.db").string(),
                "--heartbeat-ms", "100", "--lease-ttl-ms", "600"},
               server_extra_),
        dir_ / "server.log",
        std::vector<std::string>{std::string("KFORGE_WORKER_TOKEN=") + kWorkerToken,
                                 "KFORGE_CLIENT_TOKEN=client-token-0123456789abcdef0123456789"});
    ASSERT_TRUE(server_->running());
  }

  void StartWorker() {
    worker_ = std::make_unique<Process>(
        Concat({testing::WorkerBinary(), "--server", Address(), "--name", "real-test-worker",
                "--cache-dir", (dir_ / "cache").string(), "--arch", "sm_90a", "--lease-wait-ms",
                "1000"},
               worker_extra_),
        dir_ / "worker.log", std::vector<std::string>{std::string("KFORGE_WORKER_TOKEN=") + kWorkerToken});
    ASSERT_TRUE(worker_->running());
  }

  std::string Address() const { return "127.0.0.1:" + std::to_string(port_); }

  std::optional<WorkerRecord> RegisteredWorker() {
    auto workers = store_->ListWorkers();
    if (!workers.ok()) return std::nullopt;
    for (const WorkerRecord& w : *workers)
      if (w.name == "real-test-worker") return w;
    return std::nullopt;
  }

  // A COMPILE task of a fresh variant, in a job the server's engine leaves
  // alone (already finished).
  std::string EnqueueCompile(const std::string& source, std::string* variant_id) {
    if (job_id_.empty()) {
      JobRecord job;
      job.name = "worker-real-server-test";
      job.state = JobState::kSucceeded;
      job.proposer = "builtin";
      job.spec_json = "{}";
      auto id = store_->CreateJob(job);
      EXPECT_TRUE(id.ok()) << id.status();
      job_id_ = id.ok() ? *id : "";
    }
    VariantRecord v;
    v.source = source;
    v.manifest_json = R"({"entry_point":"kf_attn_fwd","threads":128,"dynamic_smem_bytes":2048})";
    v.origin = "template";
    v.job_id = job_id_;
    auto vid = store_->PutVariant(v);
    EXPECT_TRUE(vid.ok()) << vid.status();
    *variant_id = vid.ok() ? *vid : "";

    ShapeKey key;
    key.head_dim = 128;
    key.heads = 4;
    key.kv_heads = 4;
    key.arch = "sm_90a";
    key.batch = 2;
    key.max_len_q = 64;
    key.total_q = 100;
    key.max_len_k = 64;
    key.total_k = 100;
    TaskRecord t;
    t.job_id = job_id_;
    t.kind = TaskKind::kCompile;
    t.variant_id = *variant_id;
    t.bucket = BucketOf(key).Id();
    t.arch = "sm_90a";
    t.shape_json = server::EncodeShapeKey(key);
    t.seed = 1;
    auto ids = store_->EnqueueTasks({t});
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.ok() && !ids->empty() ? ids->front() : "";
  }

  bool WaitDone(const std::string& task_id, std::chrono::milliseconds timeout = 60s) {
    return Eventually(
        [&] {
          auto t = store_->GetTask(task_id);
          return t.ok() && t->state == TaskState::kDone;
        },
        timeout);
  }

  static std::vector<std::string> Concat(std::vector<std::string> a,
                                         const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  std::filesystem::path dir_;
  int port_ = 0;
  std::vector<std::string> server_extra_, worker_extra_;  // flags beyond the defaults
  std::unique_ptr<Process> server_, worker_;
  std::unique_ptr<Store> store_;
  std::string job_id_;
};

TEST_F(RealServer, CompileOnlyWorkerRegistersCompilesAndReportsErrors) {
  StartWorker();
  ASSERT_TRUE(Eventually([&] { return RegisteredWorker().has_value(); }, 20s));
  EXPECT_TRUE(RegisteredWorker()->compile_only);
  EXPECT_EQ(RegisteredWorker()->arch, "sm_90a");
  EXPECT_NE(worker_->Log().find("no CUDA driver: serving compile-only tasks"), std::string::npos);

  std::string good_variant, bad_variant;
  const std::string good = EnqueueCompile(kGoodSource, &good_variant);
  const std::string bad = EnqueueCompile(kBrokenSource, &bad_variant);
  ASSERT_TRUE(WaitDone(good));
  ASSERT_TRUE(WaitDone(bad));

  auto good_evals = store_->ListEvaluations(good_variant);
  ASSERT_TRUE(good_evals.ok()) << good_evals.status();
  ASSERT_EQ(good_evals->size(), 1u);
  const EvaluationRecord& g = good_evals->front();
  EXPECT_EQ(g.outcome, Outcome::kCompiled) << g.message;
  EXPECT_GT(g.compile_ms, 0);
  EXPECT_GT(g.registers, 0);
  EXPECT_EQ(g.dynamic_smem_bytes, 2048);
  EXPECT_FALSE(g.nvrtc_version.empty());
  EXPECT_NE(g.compile_options.find("-arch=sm_90a"), std::string::npos);
  ASSERT_FALSE(g.cubin_hash.empty());
  auto cubin = store_->GetCubin(g.cubin_hash);
  ASSERT_TRUE(cubin.ok());
  EXPECT_EQ(cubin->substr(1, 3), "ELF");

  auto bad_evals = store_->ListEvaluations(bad_variant);
  ASSERT_TRUE(bad_evals.ok());
  ASSERT_EQ(bad_evals->size(), 1u);
  EXPECT_EQ(bad_evals->front().outcome, Outcome::kCompileError);
  EXPECT_NE(bad_evals->front().message.find("no_such_symbol"), std::string::npos)
      << bad_evals->front().message;
}

TEST_F(RealServer, HeartbeatsRenewTheLeaseOfALongCompile) {
  StartWorker();
  ASSERT_TRUE(Eventually([&] { return RegisteredWorker().has_value(); }, 20s));
  std::string variant;
  const auto start = std::chrono::steady_clock::now();
  const std::string task = EnqueueCompile(kSlowSource, &variant);
  ASSERT_TRUE(WaitDone(task, 120s));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto t = store_->GetTask(task);
  ASSERT_TRUE(t.ok());
  // The lease TTL is 600 ms and the server reaps expired leases every
  // second: a compile this long finished under its first lease only because
  // the heartbeats renewed it.
  EXPECT_EQ(t->attempts, 1) << "compile took " << seconds << " s";
  if (seconds < 1.8) GTEST_SKIP() << "the slow source compiled in " << seconds
                                  << " s: too fast to show lease renewal";
  auto evals = store_->ListEvaluations(variant);
  ASSERT_TRUE(evals.ok());
  ASSERT_EQ(evals->size(), 1u);
  EXPECT_EQ(evals->front().outcome, Outcome::kCompiled) << evals->front().message;
}

TEST_F(RealServer, ATaskCancelledOnTheServerIsStoppedAndNotReported) {
  StartWorker();
  ASSERT_TRUE(Eventually([&] { return RegisteredWorker().has_value(); }, 20s));
  std::string variant;
  const std::string task = EnqueueCompile(kSlowSource, &variant);
  ASSERT_TRUE(Eventually(
      [&] {
        auto t = store_->GetTask(task);
        return t.ok() && t->state == TaskState::kLeased;
      },
      20s));
  auto cancelled = store_->CancelTasks(job_id_);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  ASSERT_TRUE(Eventually([&] { return worker_->Log().find("cancelled, not reported") != std::string::npos; },
                         30s))
      << worker_->Log();
  EXPECT_NE(worker_->Log().find("cancelled by the server"), std::string::npos);
  auto evals = store_->ListEvaluations(variant);
  ASSERT_TRUE(evals.ok());
  EXPECT_TRUE(evals->empty());
  // The worker goes on serving.
  std::string next;
  ASSERT_TRUE(WaitDone(EnqueueCompile(kGoodSource, &next)));
}

TEST_F(RealServer, WorkerComesBackAfterTheServerRestartsOnTheSamePort) {
  StartWorker();
  ASSERT_TRUE(Eventually([&] { return RegisteredWorker().has_value(); }, 20s));
  std::string v1;
  ASSERT_TRUE(WaitDone(EnqueueCompile(kGoodSource, &v1)));

  server_->Stop();
  std::this_thread::sleep_for(1500ms);  // the worker finds the server gone
  StartServer();
  std::string v2;
  const std::string after = EnqueueCompile(kBrokenSource, &v2);
  ASSERT_TRUE(WaitDone(after, 60s)) << "the worker did not serve the restarted server";
  auto evals = store_->ListEvaluations(v2);
  ASSERT_TRUE(evals.ok());
  ASSERT_EQ(evals->size(), 1u);
  EXPECT_EQ(evals->front().outcome, Outcome::kCompileError);
  // Still one worker, on its first session: it waited out the restart
  // instead of registering again.
  auto workers = store_->ListWorkers();
  ASSERT_TRUE(workers.ok());
  EXPECT_EQ(workers->size(), 1u);
  EXPECT_EQ(evals->front().worker_id, RegisteredWorker()->id);
  EXPECT_FALSE(RegisteredWorker()->session_hash.empty());
  const std::string log = worker_->Log();
  EXPECT_EQ(log.find("registered as worker"), log.rfind("registered as worker")) << log;
  EXPECT_EQ(log.find("registering again"), std::string::npos) << log;
}

// Over mutual TLS with a throwaway CA (deploy/make-certs.sh at test time):
// the worker registers and serves a task; without its client certificate it
// never gets in.
TEST_F(RealServer, TheWorkerServesOverMutualTls) {
  kforge::testing::TestPki pki;
  std::string log;
  ASSERT_TRUE(kforge::testing::MakeTestPki(dir_ / "pki", &pki, &log)) << log;
  server_->Stop();
  server_extra_ = {"--tls-cert", pki.server_cert(), "--tls-key", pki.server_key(),
                   "--tls-client-ca", pki.ca_cert()};
  StartServer();
  ASSERT_TRUE(Eventually([&] { return server_->Log().find("TLS with client certificates") !=
                                      std::string::npos; },
                         20s))
      << server_->Log();
  worker_extra_ = {"--tls-ca", pki.ca_cert(), "--tls-cert", pki.client_cert(), "--tls-key",
                   pki.client_key()};
  StartWorker();
  ASSERT_TRUE(Eventually([&] { return RegisteredWorker().has_value(); }, 20s)) << worker_->Log();
  std::string variant;
  const std::string task = EnqueueCompile(kGoodSource, &variant);
  ASSERT_TRUE(WaitDone(task)) << worker_->Log();
  EXPECT_NE(worker_->Log().find("TLS with a client certificate"), std::string::npos);
}

TEST_F(RealServer, WithoutItsClientCertificateTheWorkerNeverGetsIn) {
  kforge::testing::TestPki pki;
  std::string log;
  ASSERT_TRUE(kforge::testing::MakeTestPki(dir_ / "pki", &pki, &log)) << log;
  server_->Stop();
  server_extra_ = {"--tls-cert", pki.server_cert(), "--tls-key", pki.server_key(),
                   "--tls-client-ca", pki.ca_cert()};
  StartServer();
  worker_extra_ = {"--tls-ca", pki.ca_cert()};
  StartWorker();
  std::this_thread::sleep_for(3s);
  EXPECT_FALSE(RegisteredWorker().has_value()) << worker_->Log();
}

}  // namespace
}  // namespace kforge::worker
