// The runtime's kernel sources end to end, with no GPU: the real kforge-server
// binary on loopback with a real SQLite file holding a verified best (put
// there through the Store API, as a worker's report would), the real NVRTC,
// libkforge_runtime.so through its C ABI, and `kforge export`:
//   - a server hit, then memory hits; a larger key of the bucket confirmed
//     with if_none_match (not modified);
//   - the server's seed for an untuned bucket has the content id the runtime
//     computes for its own seed, and is confirmed not-modified too;
//   - the disk cache serves a new runtime with no server;
//   - `kforge export` writes a pack that serves a runtime with no server;
//   - with the server gone, the fallback policy compiles the seed here and
//     the strict policy names the server that failed.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "gpu/compile.h"
#include "kernels/catalog.h"
#include "kforge/runtime.h"
#include "tests/runtime/store_fixture.h"
#include "tests/util/pki.h"

extern char** environ;

namespace kforge {
namespace {

using namespace std::chrono_literals;

constexpr char kClientToken[] = "runtime-test-client-token-0123456789ab";
constexpr char kWorkerToken[] = "runtime-test-worker-token-0123456789ab";

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

bool Connectable(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(uint16_t(port));
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}

// A child process writing to `log`; Run() waits for it, Stop() ends it.
class Process {
 public:
  Process(std::vector<std::string> args, const std::filesystem::path& log) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~Process() { Stop(); }
  int Wait() {
    int status = 0;
    if (pid_ > 0) waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 100 && waitpid(pid_, &status, WNOHANG) != pid_; ++i)
      std::this_thread::sleep_for(50ms);
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

std::string Read(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The batch of every call below: 3 sequences (300, 600, 100), self, causal.
ShapeKey Key() {
  ShapeKey k;
  k.head_dim = 128;
  k.heads = 4;
  k.kv_heads = 4;
  k.causal = true;
  k.arch = "sm_90a";
  k.batch = 3;
  k.max_len_q = k.max_len_k = 600;
  k.total_q = k.total_k = 1000;
  return k;
}

class ServerSourceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::filesystem::temp_directory_path() / fmt::format("kforge_server_source_{}", getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    // A tuned variant: the portable template with knobs of its own, compiled
    // by NVRTC for sm_90a, stored as the bucket's verified best.
    auto v = Instantiate("fwd_mma", {{"BLOCK_M", 64}, {"WARPS", 4}}, 128);
    ASSERT_TRUE(v.ok()) << v.status();
    gpu::CompileRequest req;
    req.source = v->source;
    req.arch = "sm_90a";
    auto compiled = gpu::Compile(req);
    ASSERT_TRUE(compiled.ok() && compiled->ok) << (compiled.ok() ? compiled->log : "");
    {
      auto store = OpenSqliteStore((dir_ / "kforge.db").string());
      ASSERT_TRUE(store.ok()) << store.status();
      best_ = testing::PutBest(**store, Key(), v->source, v->manifest_json, compiled->cubin);
    }
    port_ = FreePort();
    // Tokens in files: the server takes none from flags.
    std::ofstream(dir_ / "client.tokens") << kClientToken << "\n";
    std::ofstream(dir_ / "worker.tokens") << kWorkerToken << "\n";
    server_ = std::make_unique<Process>(
        std::vector<std::string>{KFORGE_SERVER_BIN, "--listen", Address(), "--db",
                                 (dir_ / "kforge.db").string(), "--client-tokens-file",
                                 (dir_ / "client.tokens").string(), "--worker-tokens-file",
                                 (dir_ / "worker.tokens").string()},
        dir_ / "server.log");
    for (int i = 0; i < 200 && !Connectable(port_); ++i) std::this_thread::sleep_for(50ms);
    ASSERT_TRUE(Connectable(port_)) << Read(dir_ / "server.log");
  }
  static void TearDownTestSuite() {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override {
    for (kf_runtime* rt : runtimes_) kf_runtime_destroy(rt);
  }

  static std::string Address() { return fmt::format("127.0.0.1:{}", port_); }

  struct Config {
    bool server = true;
    std::string cache;  // under dir_
    std::string pack;
    kf_policy policy = KF_POLICY_FALLBACK;
  };
  kf_runtime* Create(const Config& c) {
    const std::string address = Address();
    const std::string cache = c.cache.empty() ? "" : (dir_ / c.cache).string();
    const char* packs[] = {c.pack.c_str()};
    kf_runtime_options o;
    kf_runtime_options_init(&o);
    o.arch = "sm_90a";
    if (c.server) {
      o.server = address.c_str();
      o.token = kClientToken;
    }
    if (!cache.empty()) o.cache_dir = cache.c_str();
    if (!c.pack.empty()) {
      o.packs = packs;
      o.num_packs = 1;
    }
    o.policy = c.policy;
    o.server_timeout_ms = 30000;  // the server compiles a seed on first request
    kf_runtime* rt = nullptr;
    EXPECT_EQ(kf_runtime_create(&o, &rt), KF_OK) << kf_last_error();
    if (rt) runtimes_.push_back(rt);
    return rt;
  }

  kf_attention_args Args(const std::vector<int32_t>& cu) {
    kf_attention_args a;
    kf_attention_args_init(&a);
    a.batch = int(cu.size()) - 1;
    a.heads = 4;
    a.head_dim = 128;
    a.total_q = cu.back();
    a.causal = 1;
    a.cu_seqlens_q_host = cu.data();
    return a;
  }

  kf_kernel_info Prepare(kf_runtime* rt, const std::vector<int32_t>& cu,
                         kf_op op = KF_OP_FORWARD) {
    kf_attention_args a = Args(cu);
    kf_kernel_info info;
    info.struct_size = sizeof info;
    const kf_status s = kf_attention_prepare(rt, &a, op, &info);
    EXPECT_EQ(s, KF_OK) << kf_status_name(s) << ": " << kf_last_error();
    return info;
  }

  kf_runtime_stats Stats(kf_runtime* rt) {
    kf_runtime_stats s;
    s.struct_size = sizeof s;
    EXPECT_EQ(kf_runtime_get_stats(rt, &s), KF_OK);
    return s;
  }

  static inline std::filesystem::path dir_;
  static inline int port_ = 0;
  static inline std::unique_ptr<Process> server_;
  static inline testing::StoredBest best_;
  std::vector<kf_runtime*> runtimes_;
  const std::vector<int32_t> batch_ = {0, 300, 900, 1000};
  const std::vector<int32_t> larger_ = {0, 400, 1000, 1100};  // same bucket, larger total
};

TEST_F(ServerSourceTest, ServesTheStoredBestThenHoldsItAndConfirmsLargerKeys) {
  kf_runtime* rt = Create({.cache = "cache_a"});
  kf_kernel_info info = Prepare(rt, batch_);
  EXPECT_STREQ(info.source, "server");
  EXPECT_EQ(info.variant_id, best_.variant_id);
  EXPECT_EQ(info.bucket, best_.bucket);
  EXPECT_STREQ(info.kernel_bucket, best_.bucket.c_str());
  EXPECT_EQ(info.tuned, 1);
  EXPECT_GT(info.cubin_bytes, 1000);
  Prepare(rt, batch_);
  kf_runtime_stats s = Stats(rt);
  EXPECT_EQ(s.server_requests, 1u);
  EXPECT_EQ(s.server_kernels, 1u);
  EXPECT_EQ(s.memory_hits, 1u);
  info = Prepare(rt, larger_);
  EXPECT_EQ(info.variant_id, best_.variant_id);
  s = Stats(rt);
  EXPECT_EQ(s.server_requests, 2u);
  EXPECT_EQ(s.server_not_modified, 1u) << "if_none_match saved the download";
  EXPECT_EQ(s.server_kernels, 1u);

  // A new runtime on the same cache, with no server: the disk cache.
  kf_runtime* offline = Create({.server = false, .cache = "cache_a"});
  info = Prepare(offline, larger_);
  EXPECT_STREQ(info.source, "disk");
  EXPECT_EQ(info.variant_id, best_.variant_id);
}

TEST_F(ServerSourceTest, SeedIdsAgreeBetweenServerAndRuntimeAndAnswerIfNoneMatch) {
  kf_runtime* rt = Create({});
  // Backward: nothing tuned, so the server serves its seed.
  kf_kernel_info served = Prepare(rt, batch_, KF_OP_BACKWARD);
  EXPECT_STREQ(served.source, "server");
  EXPECT_EQ(served.tuned, 0);
  EXPECT_EQ(std::string(served.variant_id).rfind("s-", 0), 0u) << served.variant_id;
  Prepare(rt, larger_, KF_OP_BACKWARD);
  kf_runtime_stats s = Stats(rt);
  EXPECT_EQ(s.server_not_modified, 1u);
  EXPECT_EQ(s.server_kernels, 1u);
  // The runtime's own seed, compiled here: the same content, the same id.
  kf_runtime* local = Create({.server = false});
  kf_kernel_info own = Prepare(local, batch_, KF_OP_BACKWARD);
  EXPECT_STREQ(own.source, "seed");
  EXPECT_STREQ(own.variant_id, served.variant_id);
  EXPECT_EQ(Stats(local).seed_compiles, 1u);
}

// A TLS server: the runtime trusts the CA KFORGE_TLS_CA names; without it
// the handshake fails, and the fallback policy serves the seed instead.
TEST_F(ServerSourceTest, KforgeTlsCaConnectsToATlsServer) {
  testing::TestPki pki;
  std::string log;
  ASSERT_TRUE(testing::MakeTestPki(dir_ / "pki", &pki, &log)) << log;
  const int port = FreePort();
  Process tls({KFORGE_SERVER_BIN, "--listen", fmt::format("127.0.0.1:{}", port), "--db",
               (dir_ / "tls.db").string(), "--client-tokens-file",
               (dir_ / "client.tokens").string(), "--worker-tokens-file",
               (dir_ / "worker.tokens").string(), "--tls-cert", pki.server_cert().string(),
               "--tls-key", pki.server_key().string()},
              dir_ / "tls_server.log");
  for (int i = 0; i < 200 && !Connectable(port); ++i) std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(Connectable(port)) << Read(dir_ / "tls_server.log");
  const std::string address = fmt::format("localhost:{}", port);
  auto create = [&](kf_runtime** rt) {
    kf_runtime_options o;
    kf_runtime_options_init(&o);
    o.arch = "sm_90a";
    o.server = address.c_str();
    o.token = kClientToken;
    o.server_timeout_ms = 30000;
    return kf_runtime_create(&o, rt);
  };
  kf_runtime* plain = nullptr;
  ASSERT_EQ(create(&plain), KF_OK) << kf_last_error();
  runtimes_.push_back(plain);
  EXPECT_STREQ(Prepare(plain, batch_).source, "seed") << "no CA: no TLS, no server";
  EXPECT_GT(Stats(plain).server_errors, 0u);

  setenv("KFORGE_TLS_CA", pki.ca_cert().c_str(), 1);
  kf_runtime* rt = nullptr;
  const kf_status made = create(&rt);
  unsetenv("KFORGE_TLS_CA");
  ASSERT_EQ(made, KF_OK) << kf_last_error();
  runtimes_.push_back(rt);
  EXPECT_STREQ(Prepare(rt, batch_).source, "server");
  EXPECT_EQ(Stats(rt).server_errors, 0u);

  setenv("KFORGE_TLS_CA", (dir_ / "absent.pem").c_str(), 1);
  kf_runtime* bad = nullptr;
  EXPECT_EQ(create(&bad), KF_ERR_INVALID_ARGUMENT);
  unsetenv("KFORGE_TLS_CA");
  EXPECT_NE(std::string(kf_last_error()).find("KFORGE_TLS_CA"), std::string::npos)
      << kf_last_error();
}

TEST_F(ServerSourceTest, AnExportedPackServesARuntimeWithNoServer) {
  const std::filesystem::path pack = dir_ / "sm90.kfpack";
  const std::string token_file = (dir_ / "client.tokens").string();
  Process cli({KFORGE_CLI_BIN, "--server", Address(), "--token-file", token_file, "export",
               "--arch", "sm_90a", "--out", pack.string()},
              dir_ / "export.log");
  ASSERT_EQ(cli.Wait(), 0) << Read(dir_ / "export.log");
  const std::string out = Read(dir_ / "export.log");
  EXPECT_NE(out.find("exported 1 kernel(s)"), std::string::npos) << out;
  EXPECT_NE(out.find(best_.bucket), std::string::npos) << out;
  kf_runtime* rt = Create({.server = false, .pack = pack.string()});
  kf_kernel_info info = Prepare(rt, larger_);
  EXPECT_STREQ(info.source, "pack");
  EXPECT_EQ(info.variant_id, best_.variant_id);
  EXPECT_EQ(info.tuned, 1);
  EXPECT_EQ(Stats(rt).server_requests, 0u);

  Process other({KFORGE_CLI_BIN, "--server", Address(), "--token-file", token_file, "export",
                 "--arch", "sm_100a", "--out", (dir_ / "none.kfpack").string()},
                dir_ / "export_none.log");
  ASSERT_EQ(other.Wait(), 0) << Read(dir_ / "export_none.log");
  EXPECT_NE(Read(dir_ / "export_none.log").find("exported 0 kernel(s)"), std::string::npos);
  Process unauthorized({KFORGE_CLI_BIN, "--server", Address(), "export", "--out",
                        (dir_ / "x.kfpack").string()},
                       dir_ / "export_unauth.log");
  EXPECT_EQ(unauthorized.Wait(), 1);
  EXPECT_NE(Read(dir_ / "export_unauth.log").find("KFORGE_TOKEN"), std::string::npos);
}

// Last: stops the server.
TEST_F(ServerSourceTest, ZZWithTheServerGoneTheFallbackIsTheSeedAndStrictNamesTheServer) {
  server_->Stop();
  kf_runtime* rt = Create({});
  kf_kernel_info info = Prepare(rt, batch_);
  EXPECT_STREQ(info.source, "seed");
  EXPECT_EQ(Stats(rt).server_errors, 1u);
  kf_runtime* strict = Create({.policy = KF_POLICY_STRICT});
  kf_attention_args a = Args(batch_);
  EXPECT_EQ(kf_attention_prepare(strict, &a, KF_OP_FORWARD, nullptr), KF_ERR_SERVER);
  EXPECT_NE(std::string(kf_last_error()).find("kforge-server at " + Address()), std::string::npos)
      << kf_last_error();
}

}  // namespace
}  // namespace kforge
