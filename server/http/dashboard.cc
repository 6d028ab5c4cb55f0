// The only translation unit with cpp-httplib: routing, authentication, the
// one absl::Status -> HTTP status mapping and the response headers.
#include "server/http/dashboard.h"

#include <cstdlib>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>

#include "server/auth.h"

namespace kforge::embedded {
extern const char dashboard_index_html[];
extern const char dashboard_app_js[];
extern const char dashboard_style_css[];
}  // namespace kforge::embedded

namespace kforge::server::http {
namespace {

using nlohmann::json;

int HttpStatus(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk: return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange: return 400;
    case absl::StatusCode::kUnauthenticated: return 401;
    case absl::StatusCode::kPermissionDenied: return 403;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kUnavailable: return 503;
    default: return 500;
  }
}

// The page loads only what the server itself serves: no CDN, no inline
// script, nothing framed.
void SecurityHeaders(httplib::Response& res) {
  res.set_header("Content-Security-Policy",
                 "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                 "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Referrer-Policy", "no-referrer");
  res.set_header("X-Frame-Options", "DENY");
}

void SendError(httplib::Response& res, const absl::Status& s) {
  res.status = HttpStatus(s);
  res.set_header("Cache-Control", "no-store");
  res.set_content(json{{"error", std::string(s.message())}, {"code", absl::StatusCodeToString(s.code())}}
                      .dump(-1, ' ', false, json::error_handler_t::replace),
                  "application/json");
}

void SendJson(httplib::Response& res, const absl::StatusOr<json>& body) {
  if (!body.ok()) return SendError(res, body.status());
  res.set_header("Cache-Control", "no-store");
  // Stored texts (worker messages, sources) need not be UTF-8.
  res.set_content(body->dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

}  // namespace

class Dashboard::Impl {
 public:
  Impl(DashboardOptions options, ViewSources sources)
      : options_(std::move(options)),
        // A client or viewer token is one role here: it may read everything
        // the dashboard shows.
        auth_(options_.tokens, {}, options_.open),
        views_(std::move(sources)) {}

  absl::Status Start() {
    const int threads = std::max(1, options_.threads);
    server_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    server_.set_read_timeout(10, 0);
    server_.set_write_timeout(30, 0);
    server_.set_payload_max_length(64 * 1024);  // GETs only: nothing large comes in
    Routes();
    port_ = options_.port == 0 ? server_.bind_to_any_port(options_.host)
                               : (server_.bind_to_port(options_.host, options_.port)
                                      ? options_.port
                                      : -1);
    if (port_ <= 0)
      return absl::UnavailableError(fmt::format(
          "dashboard: cannot listen on {}:{} (address in use or not valid)", options_.host,
          options_.port));
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    spdlog::info("dashboard and /metrics on http://{}:{}/ ({})", options_.host, port_,
                 options_.open ? "open: no authentication"
                               : "a client or viewer token opens /metrics and /api");
    return absl::OkStatus();
  }

  void Stop() {
    std::lock_guard lock(stop_mu_);
    if (stopped_) return;
    stopped_ = true;
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }

  int port_ = 0;

 private:
  // OK when the request may read data.
  absl::Status Authorize(const httplib::Request& req) const {
    const bool sent = req.has_header("Authorization");
    const std::string value = sent ? req.get_header_value("Authorization") : std::string();
    std::optional<std::string_view> header;
    if (sent) header = value;
    if (absl::Status s = auth_.Check(Role::kClient, header); !s.ok())
      return absl::UnauthenticatedError(
          header ? "the token is not a client or viewer token of this server"
                 : "send 'Authorization: Bearer <token>' with a client or viewer token");
    return absl::OkStatus();
  }

  // Registers an authenticated GET handler producing JSON.
  template <typename Fn>
  void Api(const std::string& pattern, Fn fn) {
    server_.Get(pattern, [this, fn](const httplib::Request& req, httplib::Response& res) {
      SecurityHeaders(res);
      if (absl::Status s = Authorize(req); !s.ok()) {
        res.set_header("WWW-Authenticate", "Bearer realm=\"kforge\"");
        return SendError(res, s);
      }
      SendJson(res, fn(req));
    });
  }

  void Static(const std::string& path, const char* body, const char* type) {
    server_.Get(path, [body, type](const httplib::Request&, httplib::Response& res) {
      SecurityHeaders(res);
      res.set_header("Cache-Control", "no-cache");
      res.set_content(body, type);
    });
  }

  void Routes() {
    Static("/", embedded::dashboard_index_html, "text/html; charset=utf-8");
    Static("/index.html", embedded::dashboard_index_html, "text/html; charset=utf-8");
    Static("/app.js", embedded::dashboard_app_js, "text/javascript; charset=utf-8");
    Static("/style.css", embedded::dashboard_style_css, "text/css; charset=utf-8");

    server_.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
      if (absl::Status s = Authorize(req); !s.ok()) {
        res.set_header("WWW-Authenticate", "Bearer realm=\"kforge\"");
        return SendError(res, s);
      }
      absl::StatusOr<std::string> text = views_.Metrics();
      if (!text.ok()) return SendError(res, text.status());
      res.set_header("Cache-Control", "no-store");
      res.set_content(*text, "text/plain; version=0.0.4; charset=utf-8");
    });

    // Whether a token is needed, so the page knows to ask for one; says
    // nothing else.
    server_.Get("/api/auth", [this](const httplib::Request&, httplib::Response& res) {
      SecurityHeaders(res);
      SendJson(res, json{{"open", options_.open}});
    });
    Api("/api/overview", [this](const httplib::Request&) { return views_.Overview(); });
    Api("/api/jobs", [this](const httplib::Request& req) -> absl::StatusOr<json> {
      int limit = 100;
      if (req.has_param("limit")) {
        const std::string v = req.get_param_value("limit");
        char* end = nullptr;
        const long n = std::strtol(v.c_str(), &end, 10);
        if (v.empty() || *end != '\0' || n < 1 || n > 1000)
          return absl::InvalidArgumentError(
              fmt::format("limit: '{}' is not a number in [1, 1000]", v.substr(0, 32)));
        limit = static_cast<int>(n);
      }
      return views_.Jobs(limit);
    });
    Api(R"(/api/jobs/([A-Za-z0-9]{1,64}))",
        [this](const httplib::Request& req) { return views_.Job(req.matches[1]); });
    Api("/api/buckets", [this](const httplib::Request&) { return views_.Buckets(); });
    Api("/api/bucket", [this](const httplib::Request& req) -> absl::StatusOr<json> {
      if (!req.has_param("id")) return absl::InvalidArgumentError("id: a bucket id is required");
      return views_.Bucket(req.get_param_value("id"));
    });
    Api(R"(/api/variants/([A-Za-z0-9]{1,64}))",
        [this](const httplib::Request& req) { return views_.Variant(req.matches[1]); });
    Api("/api/spend", [this](const httplib::Request&) { return views_.Spend(); });

    // Read-only: every other method is refused, whatever the path.
    auto refuse = [](const httplib::Request& req, httplib::Response& res) {
      SecurityHeaders(res);
      res.set_header("Allow", "GET, HEAD");
      SendError(res, absl::InvalidArgumentError(
                         fmt::format("{}: the dashboard is read-only (GET only)", req.method)));
      res.status = 405;
    };
    server_.Post(".*", refuse);
    server_.Put(".*", refuse);
    server_.Patch(".*", refuse);
    server_.Delete(".*", refuse);
    server_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (res.status != 404 || !res.body.empty()) return;
      SecurityHeaders(res);
      SendError(res, absl::NotFoundError(fmt::format("{}: no such page", req.path.substr(0, 200))));
    });
  }

  DashboardOptions options_;
  Authenticator auth_;
  DashboardViews views_;
  httplib::Server server_;
  std::thread thread_;
  std::mutex stop_mu_;
  bool stopped_ = false;  // guarded by stop_mu_
};

absl::StatusOr<std::unique_ptr<Dashboard>> Dashboard::Start(DashboardOptions options,
                                                            ViewSources sources) {
  auto impl = std::make_unique<Impl>(std::move(options), std::move(sources));
  if (absl::Status s = impl->Start(); !s.ok()) return s;
  return std::unique_ptr<Dashboard>(new Dashboard(std::move(impl)));
}

Dashboard::Dashboard(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Dashboard::~Dashboard() {
  if (impl_) impl_->Stop();
}
int Dashboard::port() const { return impl_->port_; }

absl::StatusOr<std::unique_ptr<Dashboard>> StartDashboard(const ServerConfig& cfg, Store* store,
                                                          Server* server, ServerMetrics* metrics,
                                                          std::string version) {
  DashboardOptions o;
  const std::string& listen = cfg.server.listen_address;
  o.host = listen.substr(0, listen.rfind(':'));
  if (o.host.size() >= 2 && o.host.front() == '[' && o.host.back() == ']')
    o.host = o.host.substr(1, o.host.size() - 2);  // "[::1]:50051"
  o.port = cfg.http_port;
  o.open = cfg.server.insecure_no_auth;
  o.tokens = cfg.server.client_tokens;
  o.tokens.insert(o.tokens.end(), cfg.viewer_tokens.begin(), cfg.viewer_tokens.end());
  ViewSources s;
  s.store = store;
  s.api = &server->api();
  s.engine = &server->engine();
  s.metrics = metrics;
  s.version = std::move(version);
  if (!cfg.anchors_file.empty()) {
    absl::StatusOr<std::vector<Anchor>> anchors = LoadAnchors(cfg.anchors_file);
    if (!anchors.ok()) return anchors.status();
    s.anchors = *std::move(anchors);
  }
  return Dashboard::Start(std::move(o), std::move(s));
}
void Dashboard::Stop() { impl_->Stop(); }

}  // namespace kforge::server::http
