// kforge-server's configuration: defaults, then a JSON config file
// (--config), then environment variables, then command-line flags, each
// overriding the one before.
//
// Config file keys (all optional):
//   listen               "127.0.0.1:50051"
//   database             "kforge.db"
//   client_tokens        ["..."]   bearer tokens for KernelService
//   worker_tokens        ["..."]   bearer tokens for WorkerService
//   insecure_no_auth     false
//   allow_ungated_promotion  false   promote CONFIRM/RETIME results of workers that
//                                    registered without the memcheck gate
//   confirm_on_another_worker true   a candidate's CONFIRM/RETIME goes to another
//                                    worker than its EVALUATE's while one can take it
//   require_distinct_confirmer false with confirm_on_another_worker: never the same
//                                    worker (a single-worker fleet then never promotes)
//   lease_ttl_ms         60000
//   heartbeat_interval_ms 10000
//   max_lease_wait_ms    30000
//   max_task_attempts    5        leases without a result before a task is given up
//   reaper_interval_ms   1000
//   shutdown_grace_ms    1000
//   drain_timeout_ms     10000
//   http_port            0        reserved for the dashboard (not served yet)
//   tune_max_variants    16       budget of jobs GetKernel enqueues
//   log_level            "info"
//   model_proposer       {...}    OpenAI-compatible endpoint for proposer
//                                 "model" (agent/model_proposer.h keys)
// Environment: KFORGE_CLIENT_TOKEN, KFORGE_WORKER_TOKEN (comma-separated
// lists) add to the tokens.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "server/server.h"

namespace kforge::server {

struct ServerConfig {
  ServerOptions server;
  std::string database = "kforge.db";
  int http_port = 0;
  std::string log_level = "info";
  std::string model_proposer_json;  // "" = the model proposer is off

  ServerConfig() {
    server.shutdown_grace_ms = 1000;
  }
};

// Applies the file's keys to `cfg`. Errors name the file, the key and what
// is wrong, e.g. "config /etc/kforge.json: lease_ttl_ms: must be a positive
// integer, got \"ten\"".
absl::Status ApplyConfigFile(const std::string& path, ServerConfig& cfg);

// Adds tokens from KFORGE_CLIENT_TOKEN / KFORGE_WORKER_TOKEN.
void ApplyEnvironment(ServerConfig& cfg);

// Checks ranges that the file, environment and flags together must meet.
absl::Status ValidateConfig(const ServerConfig& cfg);

}  // namespace kforge::server
