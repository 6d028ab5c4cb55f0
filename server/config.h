// kforge-server's configuration: defaults, then a JSON config file
// (--config), then environment variables, then command-line flags, each
// overriding the one before.
//
// Config file keys (all optional):
//   listen               "127.0.0.1:50051"
//   database             "kforge.db"
//   client_tokens        ["..."]   bearer tokens for KernelService (they open the
//                                    dashboard and /metrics too)
//   viewer_tokens        ["..."]   bearer tokens for the dashboard and /metrics only
//   worker_tokens        [...]     credentials for WorkerService, each one of
//                                    "name:token", {"name": "...", "token": "..."}
//                                    or a plain "token" (see below)
//   insecure_no_auth     false
//   allow_ungated_promotion  false   promote CONFIRM/RETIME results of workers that
//                                    registered without the memcheck gate
//   confirm_on_another_worker true   a candidate's CONFIRM/RETIME goes to another
//                                    worker than its EVALUATE's while one can take it
//   require_distinct_confirmer false with confirm_on_another_worker: never the same
//                                    principal (a single-principal fleet then never
//                                    promotes)
//   lease_ttl_ms         60000
//   heartbeat_interval_ms 10000
//   max_lease_wait_ms    30000
//   max_task_attempts    5        leases without a result before a task is given up
//   reaper_interval_ms   1000
//   shutdown_grace_ms    1000
//   drain_timeout_ms     10000
//   http_port            0        dashboard and /metrics on this port, on the host of
//                                 `listen` (0: not served; server/http/)
//   stuck_job_timeout_ms 0        a job that waited this long for a worker that can run
//                                 its tasks fails saying so (0: it waits)
//   log_format           "text"   "json": one JSON object a line (core/logging.h)
//   anchors_file         ""       reference times the dashboard compares bests with:
//                                 [{"bucket": "...", "name": "varlen_attn", "us": 812.5}]
//   tune_max_variants    16       budget of jobs GetKernel enqueues
//   log_level            "info"
//   model_proposer       {...}    OpenAI-compatible endpoint for proposer
//                                 "model" (agent/model_proposer.h keys)
// Environment: KFORGE_CLIENT_TOKEN, KFORGE_WORKER_TOKEN, KFORGE_VIEWER_TOKEN
// (comma-separated lists) add to the tokens.
//
// Worker tokens and principals. A worker token is a credential and its name
// is the principal of every worker that registers with it (bound by the
// server from the token presented, never from what a worker declares;
// stored with the worker). "Another worker" for confirm_on_another_worker
// and require_distinct_confirmer means another principal: a holder of one
// token can register as many workers as it likes, and all of them are one
// principal, which cannot confirm its own candidates. So per-host tokens
// ("host-a:<random>", "host-b:<random>"; the worker is given the token
// part only) are what makes a confirmation on another worker mean anything.
// With one shared token every worker is one principal: with
// require_distinct_confirmer nothing is ever promoted; without it a
// CONFIRM/RETIME runs on any worker, the candidate's own included (the
// server logs which at startup). A plain "token" (no ':') is its own
// principal, "token-" + the first 12 hex digits of its SHA-256, so existing
// configurations keep working; a token containing ':' must be written as
// name:token. Names are 1-64 of [A-Za-z0-9._-]; an empty, malformed or
// repeated name, a repeated token, or (in the file) a token shorter than 16
// characters is an error naming the entry. Without auth
// (insecure_no_auth) there is no principal: workers are told apart by
// session only.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "server/server.h"

namespace kforge::server {

struct ServerConfig {
  ServerOptions server;
  std::string database = "kforge.db";
  int http_port = 0;
  std::vector<std::string> viewer_tokens;
  std::string log_level = "info";
  std::string log_format = "text";
  std::string anchors_file;  // "" = none (server/http/views.h LoadAnchors)
  std::string model_proposer_json;  // "" = the model proposer is off

  ServerConfig() {
    server.shutdown_grace_ms = 1000;
  }
};

// Applies the file's keys to `cfg`. Errors name the file, the key and what
// is wrong, e.g. "config /etc/kforge.json: lease_ttl_ms: must be a positive
// integer, got \"ten\"".
absl::Status ApplyConfigFile(const std::string& path, ServerConfig& cfg);

// --model-config: the model proposer's options (the "model_proposer" key's
// object, agent/model_proposer.h) from a file of their own. Errors name the
// file; the keys themselves are checked when the proposer factory is built.
absl::Status ApplyModelConfigFile(const std::string& path, ServerConfig& cfg);

// Adds tokens from KFORGE_CLIENT_TOKEN / KFORGE_WORKER_TOKEN /
// KFORGE_VIEWER_TOKEN.
void ApplyEnvironment(ServerConfig& cfg);

// Checks ranges that the file, environment and flags together must meet.
absl::Status ValidateConfig(const ServerConfig& cfg);

}  // namespace kforge::server
