// Dashboard: kforge-server's HTTP side for operators (--http-port): a
// read-only web dashboard (HTML and JS embedded in the binary: no CDN,
// works offline), its JSON API and /metrics in Prometheus text format.
//
//   GET /                  the dashboard (index.html, app.js, style.css)
//   GET /metrics           every metric (server/http/views.h Metrics)
//   GET /api/overview      workers, job and task counts
//   GET /api/jobs[?limit]  newest jobs;  GET /api/jobs/<id>  one job
//   GET /api/buckets       every bucket; GET /api/bucket?id=<bucket>
//   GET /api/variants/<id> a variant's source and evaluations
//   GET /api/spend         model tokens by job and proposer
//
// Access: /metrics and /api/* need "Authorization: Bearer <token>" with a
// client token or a viewer token; without auth (insecure_no_auth, local
// development) they are open. The page and its script carry no data and
// are served to anyone: the page asks for a token and keeps it in
// sessionStorage. Everything is GET; other methods are 405.
//
// cpp-httplib's types stay in dashboard.cc. Thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/config.h"
#include "server/http/views.h"
#include "server/server.h"

namespace kforge::server::http {

struct DashboardOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: a free port (see Dashboard::port)
  // Bearer tokens that open /metrics and /api/*: the client tokens and the
  // viewer tokens.
  std::vector<std::string> tokens;
  bool open = false;  // no authentication (insecure_no_auth)
  int threads = 4;
};

class Dashboard {
 public:
  // Binds and starts serving. UNAVAILABLE naming the address when it
  // cannot bind. The sources must outlive the dashboard.
  static absl::StatusOr<std::unique_ptr<Dashboard>> Start(DashboardOptions options,
                                                          ViewSources sources);
  ~Dashboard();  // Stop()s
  Dashboard(const Dashboard&) = delete;
  Dashboard& operator=(const Dashboard&) = delete;

  int port() const;
  // Stops accepting, finishes the requests in progress. Idempotent.
  void Stop();

  class Impl;

 private:
  explicit Dashboard(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The dashboard kforge-server's configuration asks for: on cfg.http_port,
// on the host of cfg.server.listen_address, opened by the client and viewer
// tokens (open under insecure_no_auth), with the anchors of
// cfg.anchors_file. `store`, `server` and `metrics` must outlive it.
absl::StatusOr<std::unique_ptr<Dashboard>> StartDashboard(const ServerConfig& cfg, Store* store,
                                                          Server* server, ServerMetrics* metrics,
                                                          std::string version);

}  // namespace kforge::server::http
