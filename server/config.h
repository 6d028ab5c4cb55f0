// kforge-server's configuration: defaults, then a JSON config file
// (--config), then environment variables, then command-line flags, each
// overriding the one before.
//
// The file is JSON; // and /* */ comments are allowed, so that a file can
// say why a value is what it is (deploy/kforge-server.jsonc, the sample that
// documents every key, is parsed by config_test). Keys (all optional):
//   listen               "127.0.0.1:50051"
//   database             "kforge.db"
//   client_tokens        ["..."]   bearer tokens for KernelService (they open the
//                                    dashboard and /metrics too)
//   viewer_tokens        ["..."]   bearer tokens for the dashboard and /metrics only
//                                    (also KFORGE_VIEWER_TOKEN, viewer_tokens_file)
//   worker_tokens        [...]     credentials for WorkerService, each one of
//                                    "name:token", {"name": "...", "token": "..."}
//                                    or a plain "token" (see below)
//   client_tokens_file   ""       a file of client tokens, one a line ('#' comments)
//   worker_tokens_file   ""       a file of worker credentials, one a line
//   viewer_tokens_file   ""       a file of viewer tokens, one a line
//   insecure_no_auth     false    only on a loopback listen address
//   tls_cert_file        ""       PEM certificate chain: serve TLS
//   tls_key_file         ""       its PEM private key
//   tls_client_ca_file   ""       PEM CA bundle: require client certificates it signed (mTLS)
//   allow_plaintext      false    serve without TLS on a non-loopback address
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
//   max_open_lease_polls 1024     LeaseTask long polls that may wait at once (they
//                                 hold no thread); past it RESOURCE_EXHAUSTED
//   max_open_watch_streams 1024   WatchJob streams that may be open at once; past it
//                                 RESOURCE_EXHAUSTED
//   max_watch_ms         900000   a WatchJob stream ends after this long with
//                                 UNAVAILABLE ("watch again"); clients re-watch
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
// (comma-separated lists) add to the tokens. Tokens are never taken from a
// flag (a flag shows in /proc/<pid>/cmdline and ps): the old
// --client-token, --worker-token and --viewer-token are refused with a
// message saying where tokens go.
//
// Every token, from whichever source, has at least 32 printable ASCII
// characters (core/transport.h CheckToken); messages never contain one.
// Transport (CheckAuthConfig): without TLS the listen address must be
// loopback unless allow_plaintext; insecure_no_auth is refused on any
// address that is not loopback, TLS or not. The dashboard (http_port)
// speaks plain HTTP: on a listen host that is not loopback it needs
// allow_plaintext (a proxy in front terminates TLS).
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
// repeated name, a repeated token, or a token CheckToken refuses is an
// error naming the entry. Without auth
// (insecure_no_auth) there is no principal: workers are told apart by
// session only.
#pragma once

#include <string>
#include <vector>

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
  // Files read by ReadConfigFiles, into `server` (tokens are added to the
  // lists, PEM text goes into the tls_* fields). "": none.
  std::string client_tokens_file;
  std::string worker_tokens_file;
  std::string viewer_tokens_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  // What ReadConfigFiles found worth saying but not refusing (a token file
  // other users can read); main logs them.
  std::vector<std::string> warnings;

  ServerConfig() {
    server.shutdown_grace_ms = 1000;
  }
};

// Every key ApplyConfigFile accepts, sorted (the sample configuration must
// name them all: config_test checks).
std::vector<std::string> ConfigKeys();

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

// Reads the files the configuration names: token files (one entry a line;
// blank lines and lines starting with '#' skipped; entries added to the
// lists) and the TLS certificate, key and client CA (PEM, checked: the key
// must be the certificate's). Errors name the key or flag and the file.
absl::Status ReadConfigFiles(ServerConfig& cfg);

// Checks ranges that the file, environment and flags together must meet.
absl::Status ValidateConfig(const ServerConfig& cfg);

}  // namespace kforge::server
