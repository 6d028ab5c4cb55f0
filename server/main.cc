// kforge-server: the composition root. Reads the configuration, opens the
// store, builds the proposer factory and seed provider, starts the server
// and shuts it down gracefully on SIGTERM/SIGINT.
#include <sys/stat.h>

#include <csignal>
#include <cstdio>
#include <memory>
#include <thread>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "core/logging.h"
#include "core/secrets.h"
#include "server/auth.h"
#include "server/components.h"
#include "kforge/version.h"
#include "server/config.h"
#include "server/http/dashboard.h"
#include "server/metrics.h"
#include "server/server.h"
#include "storage/sqlite_store.h"

namespace {

// A database made by an older kforge (or copied in) may be readable by
// everyone; its worker sessions and results are not for them.
void WarnIfOthersCanRead(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 007) != 0)
    spdlog::warn("database {} is open to other users (mode {:03o}); chmod 600 it and its -wal "
                 "and -shm files",
                 path, st.st_mode & 0777);
}

}  // namespace

int main(int argc, char** argv) {
  using kforge::server::ServerConfig;
  CLI::App app{"kforge-server: finds, verifies and serves the fastest jagged attention kernels"};
  app.set_version_flag("--version", "kforge-server " KFORGE_VERSION, "print the version and exit");
  std::string config_path, listen, database, log_level, log_format, model_config;
  std::string client_tokens_file, worker_tokens_file, viewer_tokens_file, tls_cert, tls_key,
      tls_client_ca;
  std::vector<std::string> flag_tokens;
  int64_t stuck_timeout_ms = -1;
  bool insecure = false, allow_ungated = false, allow_plaintext = false, init = false;
  int64_t lease_ttl_ms = 0;
  int heartbeat_ms = 0, http_port = -1;
  app.add_option("--config", config_path, "JSON config file (see server/config.h for keys)");
  app.add_option("--listen", listen, "gRPC listen address (default 127.0.0.1:50051)");
  app.add_option("--db", database,
                 "SQLite database path (default kforge.db; created mode 600 when missing)");
  app.add_flag("--init", init,
               "accept an empty or foreign database file and initialise it (refused otherwise)");
  app.add_option("--client-tokens-file", client_tokens_file,
                 "file of client bearer tokens, one a line (also: $KFORGE_CLIENT_TOKEN, "
                 "config client_tokens)");
  app.add_option("--worker-tokens-file", worker_tokens_file,
                 "file of worker credentials, one \"name:token\" a line (also: "
                 "$KFORGE_WORKER_TOKEN, config worker_tokens)");
  // Tokens on the command line show in /proc/<pid>/cmdline and ps: the old
  // flags stay only to say so.
  app.add_option("--client-token,--worker-token,--viewer-token", flag_tokens)->group("");
  app.add_option("--tls-cert", tls_cert, "PEM certificate chain: serve TLS");
  app.add_option("--tls-key", tls_key, "PEM private key of --tls-cert");
  app.add_option("--tls-client-ca", tls_client_ca,
                 "PEM CA bundle: require client certificates it signed (mTLS)");
  app.add_flag("--allow-plaintext", allow_plaintext,
               "serve without TLS on an address that is not loopback (another layer encrypts)");
  app.add_flag("--insecure-no-auth", insecure,
               "run without authentication, on a loopback address only (local development)");
  app.add_flag("--allow-ungated-promotion", allow_ungated,
               "promote CONFIRM/RETIME results of workers without the memcheck sanitizer gate "
               "(for machines where compute-sanitizer cannot run)");
  app.add_option("--lease-ttl-ms", lease_ttl_ms, "task lease time to live")->check(CLI::Range(int64_t{100}, int64_t{86400000}));
  app.add_option("--heartbeat-ms", heartbeat_ms, "heartbeat interval told to workers")->check(CLI::Range(10, 3600000));
  app.add_option("--http-port", http_port,
                 "serve the dashboard and /metrics on this port, on the --listen host (0: off)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--viewer-tokens-file", viewer_tokens_file,
                 "file of bearer tokens that open the dashboard and /metrics only, one a line "
                 "(also: $KFORGE_VIEWER_TOKEN, config viewer_tokens)");
  app.add_option("--stuck-job-timeout-ms", stuck_timeout_ms,
                 "fail a job that waited this long for a worker able to run its tasks (0: wait)")
      ->check(CLI::Range(int64_t{0}, int64_t{7} * 86400000));
  app.add_option("--model-config", model_config,
                 "JSON file with the model proposer's options (agent/model_proposer.h)");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off");
  app.add_option("--log-format", log_format, "text | json (one JSON object a line)");
  app.footer(
      "Environment: KFORGE_CLIENT_TOKEN, KFORGE_WORKER_TOKEN, KFORGE_VIEWER_TOKEN "
      "(comma-separated tokens of 32+ characters, added to the configured ones; worker "
      "entries may be name:token).\n"
      "Tokens are never taken from flags.");
  CLI11_PARSE(app, argc, argv);
  if (!flag_tokens.empty()) {
    for (const std::string& t : flag_tokens) kforge::ScrubFromProcessMemory(argc, argv, t);
    std::fprintf(stderr,
                 "kforge-server: --client-token, --worker-token and --viewer-token are gone: a "
                 "token on the command line shows in /proc/<pid>/cmdline and ps. Put tokens in "
                 "KFORGE_CLIENT_TOKEN / KFORGE_WORKER_TOKEN / KFORGE_VIEWER_TOKEN, in files "
                 "(--client-tokens-file, --worker-tokens-file, --viewer-tokens-file) or in the "
                 "config file (client_tokens, worker_tokens, viewer_tokens)\n");
    return 2;
  }

  ServerConfig cfg;
  if (!config_path.empty()) {
    if (absl::Status s = kforge::server::ApplyConfigFile(config_path, cfg); !s.ok()) {
      std::fprintf(stderr, "kforge-server: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  if (!model_config.empty()) {
    if (absl::Status s = kforge::server::ApplyModelConfigFile(model_config, cfg); !s.ok()) {
      std::fprintf(stderr, "kforge-server: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  kforge::server::ApplyEnvironment(cfg);
  if (!listen.empty()) cfg.server.listen_address = listen;
  if (!database.empty()) cfg.database = database;
  if (!client_tokens_file.empty()) cfg.client_tokens_file = client_tokens_file;
  if (!worker_tokens_file.empty()) cfg.worker_tokens_file = worker_tokens_file;
  if (!viewer_tokens_file.empty()) cfg.viewer_tokens_file = viewer_tokens_file;
  if (!tls_cert.empty()) cfg.tls_cert_file = tls_cert;
  if (!tls_key.empty()) cfg.tls_key_file = tls_key;
  if (!tls_client_ca.empty()) cfg.tls_client_ca_file = tls_client_ca;
  if (allow_plaintext) cfg.server.allow_plaintext = true;
  if (stuck_timeout_ms >= 0) cfg.server.engine.stuck_timeout_ms = stuck_timeout_ms;
  if (insecure) cfg.server.insecure_no_auth = true;
  if (allow_ungated) cfg.server.api.allow_ungated_promotion = true;
  if (lease_ttl_ms > 0) cfg.server.api.lease_ttl_ms = lease_ttl_ms;
  if (heartbeat_ms > 0) cfg.server.api.heartbeat_interval_ms = heartbeat_ms;
  if (http_port >= 0) cfg.http_port = http_port;
  if (!log_level.empty()) cfg.log_level = log_level;
  if (!log_format.empty()) cfg.log_format = log_format;
  if (absl::Status s = kforge::ConfigureLogging(cfg.log_format, cfg.log_level); !s.ok()) {
    std::fprintf(stderr, "kforge-server: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (absl::Status s = kforge::server::ReadConfigFiles(cfg); !s.ok()) {
    std::fprintf(stderr, "kforge-server: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  for (const std::string& w : cfg.warnings) spdlog::warn("{}", w);
  if (absl::Status s = kforge::server::ValidateConfig(cfg); !s.ok()) {
    std::fprintf(stderr, "kforge-server: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  // The tokens live in this process's memory now: take them out of what
  // /proc/<pid>/cmdline and environ show, and out of reach of other
  // processes of this user.
  for (const auto* list : {&cfg.server.client_tokens, &cfg.server.worker_tokens, &cfg.viewer_tokens}) {
    for (const std::string& t : *list) kforge::ScrubFromProcessMemory(argc, argv, t);
  }
  if (auto creds = kforge::server::ParseWorkerTokens(cfg.server.worker_tokens); creds.ok()) {
    for (const auto& c : *creds) kforge::ScrubFromProcessMemory(argc, argv, c.token);
  }
  if (absl::Status s = kforge::MakeUndumpable(); !s.ok())
    spdlog::warn("kforge-server: {}", std::string(s.message()));

  if (cfg.server.insecure_no_auth)
    spdlog::warn("authentication is OFF (--insecure-no-auth): anyone who can reach {} can use it",
                 cfg.server.listen_address);
  if (cfg.server.api.allow_ungated_promotion)
    spdlog::warn("ungated promotion is ON: results of workers without the sanitizer gate can "
                 "become a bucket's best");

  // Signals are taken by a dedicated thread (sigwait), so block them before
  // any other thread exists; every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  WarnIfOthersCanRead(cfg.database);
  auto store = kforge::OpenSqliteStore(cfg.database, kforge::SqliteOptions{.init = init});
  if (!store.ok()) {
    std::fprintf(stderr, "kforge-server: opening %s: %s\n", cfg.database.c_str(),
                 std::string(store.status().message()).c_str());
    return 1;
  }
  cfg.server.api.limits.head_dims = kforge::server::CatalogHeadDims();
  cfg.server.api.limits.backward = kforge::server::CatalogServesBackward();
  auto proposers = kforge::server::DefaultProposerFactory(cfg.model_proposer_json, store->get());
  if (!proposers.ok()) {
    std::fprintf(stderr, "kforge-server: config %s: %s\n", config_path.c_str(),
                 std::string(proposers.status().message()).c_str());
    return 2;
  }
  kforge::server::ServerMetrics metrics;
  cfg.server.metrics = &metrics;
  auto server = kforge::server::Server::Start(cfg.server, store->get(), *std::move(proposers),
                                              kforge::server::DefaultSeedProvider());
  if (!server.ok()) {
    std::fprintf(stderr, "kforge-server: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<kforge::server::http::Dashboard> dashboard;
  if (cfg.http_port > 0) {
    auto d = kforge::server::http::StartDashboard(cfg, store->get(), server->get(), &metrics,
                                                  KFORGE_VERSION);
    if (!d.ok()) {
      std::fprintf(stderr, "kforge-server: %s\n", std::string(d.status().message()).c_str());
      return 1;
    }
    dashboard = *std::move(d);
  }
  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    spdlog::info("received {}", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    (*server)->Shutdown();
  });
  (*server)->Wait();
  // Shutdown came from elsewhere (not a signal): wake the signal thread.
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  if (dashboard) dashboard->Stop();  // it reads through the server's api and engine
  server->reset();
  store->reset();  // closes the database after every call has drained
  return 0;
}
