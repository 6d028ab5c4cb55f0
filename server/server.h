// Server: the running kforge-server. Wires the KernelCache, JobEngine and
// KforgeApi to a gRPC server with KernelService, WorkerService, the standard
// grpc.health.v1 health service and server reflection, plus the lease reaper.
//
// Shutdown order (Shutdown()): health NOT_SERVING for every service; long
// polls end (empty) and watch streams end (UNAVAILABLE); after `shutdown_grace_ms` (time
// for load balancers to notice) the listener closes and in-flight calls get
// `drain_timeout_ms` to finish before they are cancelled; then the job
// engine and the reaper stop. The store is the caller's and stays open.
//
// Thread-safe. gRPC types stay inside server.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/api.h"
#include "server/jobs.h"
#include "server/kernel_cache.h"
#include "server/metrics.h"
#include "storage/store.h"

namespace kforge::server {

struct ServerOptions {
  std::string listen_address = "127.0.0.1:50051";  // port 0 picks a free port
  std::vector<std::string> client_tokens;
  std::vector<std::string> worker_tokens;
  bool insecure_no_auth = false;  // see auth.h for the policy; loopback addresses only
  // TLS: the PEM certificate chain and key to serve with; empty: plaintext,
  // which a listen address that is not loopback refuses unless
  // allow_plaintext. A client CA makes every client present a certificate
  // it signed (mTLS), on top of the bearer tokens.
  std::string tls_cert_pem;
  std::string tls_key_pem;
  std::string tls_client_ca_pem;
  bool allow_plaintext = false;
  ApiOptions api;
  int reaper_interval_ms = 1000;
  int shutdown_grace_ms = 0;
  int drain_timeout_ms = 10000;
  int max_receive_message_bytes = 64 << 20;  // cubins come with results
  // Calls that wait hold no thread (server.cc), but each costs memory and a
  // wake-up: past these many open at once a new one is RESOURCE_EXHAUSTED.
  int max_open_lease_polls = 1024;
  int max_open_watch_streams = 1024;
  // A WatchJob stream ends after this long with UNAVAILABLE ("watch
  // again"); the client watches again and gets the current state first.
  int64_t max_watch_ms = 15 * 60 * 1000;
  JobEngineOptions engine;
  // Counts every RPC (method, code, latency) and what the api records; may
  // be null. Must outlive the server.
  ServerMetrics* metrics = nullptr;
};

class Server {
 public:
  // Loads the served kernels and registered workers, resumes active jobs and
  // starts listening. `store` must outlive the server. `seeds` may be empty.
  static absl::StatusOr<std::unique_ptr<Server>> Start(ServerOptions options, Store* store,
                                                       ProposerFactory proposers,
                                                       SeedProvider seeds);
  ~Server();  // Shutdown()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const;                     // the bound port
  std::string address() const;          // host:port actually bound
  void Shutdown();                      // idempotent
  void Wait();                          // until Shutdown() completed

  // For read-only operator views (server/http/): valid while the server is.
  KforgeApi& api();
  JobEngine& engine();
  // Calls waiting now, against max_open_lease_polls and
  // max_open_watch_streams.
  struct Waiting {
    int lease_polls = 0;
    int watch_streams = 0;
  };
  Waiting waiting() const;

  class Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The auth policy of auth.h and the transport policy of core/transport.h,
// applied to a configuration: an error naming what is missing or wrong when
// the server must not start (no tokens; a token too short; no TLS, or no
// auth, on an address other hosts can reach).
absl::Status CheckAuthConfig(const ServerOptions& options);

}  // namespace kforge::server
