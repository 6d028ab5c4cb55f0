// kforge-server: the composition root. Reads the configuration, opens the
// store, builds the proposer factory and seed provider, starts the server
// and shuts it down gracefully on SIGTERM/SIGINT.
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
#include "storage/store.h"

int main(int argc, char** argv) {
  using kforge::server::ServerConfig;
  CLI::App app{"kforge-server: finds, verifies and serves the fastest jagged attention kernels"};
  app.set_version_flag("--version", "kforge-server " KFORGE_VERSION, "print the version and exit");
  std::string config_path, listen, database, log_level, log_format, model_config;
  std::vector<std::string> client_tokens, worker_tokens, viewer_tokens;
  int64_t stuck_timeout_ms = -1;
  bool insecure = false, allow_ungated = false;
  int64_t lease_ttl_ms = 0;
  int heartbeat_ms = 0, http_port = -1;
  app.add_option("--config", config_path, "JSON config file (see server/config.h for keys)");
  app.add_option("--listen", listen, "gRPC listen address (default 127.0.0.1:50051)");
  app.add_option("--db", database, "SQLite database path (default kforge.db)");
  app.add_option("--client-token", client_tokens, "client bearer token (repeatable)");
  app.add_option("--worker-token", worker_tokens, "worker bearer token (repeatable)");
  app.add_flag("--insecure-no-auth", insecure,
               "run without authentication (refused otherwise when no tokens are configured)");
  app.add_flag("--allow-ungated-promotion", allow_ungated,
               "promote CONFIRM/RETIME results of workers without the memcheck sanitizer gate "
               "(for machines where compute-sanitizer cannot run)");
  app.add_option("--lease-ttl-ms", lease_ttl_ms, "task lease time to live")->check(CLI::Range(int64_t{100}, int64_t{86400000}));
  app.add_option("--heartbeat-ms", heartbeat_ms, "heartbeat interval told to workers")->check(CLI::Range(10, 3600000));
  app.add_option("--http-port", http_port,
                 "serve the dashboard and /metrics on this port, on the --listen host (0: off)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--viewer-token", viewer_tokens,
                 "bearer token that opens the dashboard and /metrics only (repeatable)");
  app.add_option("--stuck-job-timeout-ms", stuck_timeout_ms,
                 "fail a job that waited this long for a worker able to run its tasks (0: wait)")
      ->check(CLI::Range(int64_t{0}, int64_t{7} * 86400000));
  app.add_option("--model-config", model_config,
                 "JSON file with the model proposer's options (agent/model_proposer.h)");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off");
  app.add_option("--log-format", log_format, "text | json (one JSON object a line)");
  CLI11_PARSE(app, argc, argv);

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
  if (!client_tokens.empty()) cfg.server.client_tokens = client_tokens;
  if (!worker_tokens.empty()) cfg.server.worker_tokens = worker_tokens;
  if (!viewer_tokens.empty()) cfg.viewer_tokens = viewer_tokens;
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
  if (absl::Status s = kforge::server::ValidateConfig(cfg); !s.ok()) {
    std::fprintf(stderr, "kforge-server: %s\n", std::string(s.message()).c_str());
    return 2;
  }  // The tokens live in this process's memory now: take them out of what
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

  auto store = kforge::OpenSqliteStore(cfg.database);
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
