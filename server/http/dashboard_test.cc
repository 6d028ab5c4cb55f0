// The dashboard's HTTP side over real loopback HTTP, in front of a real
// server (gRPC on loopback, SQLite file, scripted proposer): access with
// client, viewer and worker tokens, the JSON API against the job engine,
// bad requests, read-only methods, /metrics; and the pieces (the Prometheus
// text writer, the anchors file) on their own. The browser test
// (tests/e2e/dashboard_test.py) drives the page itself.
#include "server/http/dashboard.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include "agent/scripted_proposer.h"
#include "server/http/prometheus.h"

namespace kforge::server::http {
namespace {

using nlohmann::json;

constexpr char kClient[] = "client-token-0123456789abcdef012345";
constexpr char kViewer[] = "viewer-token-0123456789abcdef012345";
constexpr char kWorker[] = "worker-token-0123456789abcdef012345";

// ------------------------------------------------------------ prometheus

TEST(PrometheusText, ValuesAreWrittenAsTheFormatSpellsThem) {
  EXPECT_EQ(FormatValue(3), "3");
  EXPECT_EQ(FormatValue(0.25), "0.25");
  EXPECT_EQ(FormatValue(1796136041.565), "1796136041.565");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

TEST(PrometheusText, AFamilyIsHelpTypeThenItsSamples) {
  PrometheusText p;
  p.Gauge("kforge_x", "What x is.\nTwo lines.", {{{{"arch", "sm_90a"}}, 2}, {{}, 1}});
  p.Counter("kforge_y_total", "Ys.", {});
  EXPECT_EQ(p.text(),
            "# HELP kforge_x What x is.\\nTwo lines.\n# TYPE kforge_x gauge\n"
            "kforge_x{arch=\"sm_90a\"} 2\nkforge_x 1\n"
            "# HELP kforge_y_total Ys.\n# TYPE kforge_y_total counter\n");
}

TEST(PrometheusText, HistogramsHaveCumulativeBucketsAnInfBucketASumAndACount) {
  Histogram h({0.1, 1});
  h.Observe(0.05);
  h.Observe(0.5);
  h.Observe(5);
  PrometheusText p;
  p.Histograms("kforge_t_seconds", "T.", {{{{"method", "a/B"}}, h}});
  EXPECT_EQ(p.text(),
            "# HELP kforge_t_seconds T.\n# TYPE kforge_t_seconds histogram\n"
            "kforge_t_seconds_bucket{method=\"a/B\",le=\"0.1\"} 1\n"
            "kforge_t_seconds_bucket{method=\"a/B\",le=\"1\"} 2\n"
            "kforge_t_seconds_bucket{method=\"a/B\",le=\"+Inf\"} 3\n"
            "kforge_t_seconds_sum{method=\"a/B\"} 5.55\n"
            "kforge_t_seconds_count{method=\"a/B\"} 3\n");
}

// --------------------------------------------------------------- anchors

class TempDir {
 public:
  TempDir()
      : path_(std::filesystem::temp_directory_path() /
              fmt::format("kforge_dashboard_test_{}_{}", getpid(), counter_++)) {
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string File(const std::string& name, const std::string& text = "") const {
    const std::string p = (path_ / name).string();
    if (!text.empty()) std::ofstream(p) << text;
    return p;
  }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

const char kBucket[] = "fwd.bf16.d128.h4.kv4.causal.self.sm_90a.b4.mq1024.aq1024.mk1024.ak1024";

TEST(LoadAnchors, ReadsBucketNameAndTime) {
  TempDir dir;
  auto a = LoadAnchors(dir.File(
      "a.json", fmt::format(R"([{{"bucket": "{}", "name": "varlen_attn", "us": 812.5}}])", kBucket)));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->size(), 1u);
  EXPECT_EQ((*a)[0].bucket, kBucket);
  EXPECT_EQ((*a)[0].name, "varlen_attn");
  EXPECT_DOUBLE_EQ((*a)[0].us, 812.5);
}

TEST(LoadAnchors, ABadFileIsAnErrorNamingTheEntryAndWhatIsWrong) {
  TempDir dir;
  struct Case {
    std::string text, want;
  } cases[] = {
      {"{}", "must be a JSON array"},
      {"[1", "not valid JSON"},
      {R"([{"bucket": "nope", "name": "x", "us": 1}])", "[0].bucket: "},
      {fmt::format(R"([{{"bucket": "{}", "name": "x", "us": 0}}])", kBucket), "[0].us: must be a positive"},
      {fmt::format(R"([{{"bucket": "{}", "name": "", "us": 1}}])", kBucket), "[0].name: must be"},
      {fmt::format(R"([{{"bucket": "{}", "name": "x", "us": 1, "ms": 2}}])", kBucket), "[0].ms: unknown key"},
  };
  for (const Case& c : cases) {
    auto a = LoadAnchors(dir.File("bad.json", c.text));
    ASSERT_FALSE(a.ok()) << c.text;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(a.status().message().find(c.want), std::string::npos) << a.status();
  }
  EXPECT_EQ(LoadAnchors(dir.File("missing.json")).status().code(), absl::StatusCode::kNotFound);
}

// ------------------------------------------------------------- over HTTP

ShapeKey Shape() {
  ShapeKey k;
  k.head_dim = 128;
  k.heads = 4;
  k.kv_heads = 4;
  k.causal = true;
  k.arch = "sm_90a";
  k.batch = 4;
  k.max_len_q = 1000;
  k.total_q = 4000;
  k.max_len_k = 1000;
  k.total_k = 4000;
  return k;
}

class DashboardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = OpenSqliteStore(dir_.File("k.db"));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }
  void TearDown() override {
    dashboard_.reset();
    server_.reset();
    store_.reset();
  }
  void Start(bool open = false) {
    ServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.client_tokens = {kClient};
    o.worker_tokens = {kWorker};
    o.insecure_no_auth = open;
    o.metrics = &metrics_;
    o.api.limits.head_dims = {128};
    o.drain_timeout_ms = 1000;
    auto server = Server::Start(
        o, store_.get(),
        [](const std::string&, uint64_t) -> absl::StatusOr<std::unique_ptr<agent::Proposer>> {
          return std::make_unique<agent::ScriptedProposer>(
              2, R"({"entry_point":"kf_attn_fwd","threads":128})");
        },
        SeedProvider());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    DashboardOptions d;
    d.tokens = {kClient, kViewer};
    d.open = open;
    ViewSources s;
    s.store = store_.get();
    s.api = &server_->api();
    s.engine = &server_->engine();
    s.metrics = &metrics_;
    s.version = "9.9.9";
    s.anchors = {Anchor{BucketOf(Shape()).Id(), "varlen_attn", 900}};
    auto dashboard = Dashboard::Start(d, std::move(s));
    ASSERT_TRUE(dashboard.ok()) << dashboard.status();
    dashboard_ = *std::move(dashboard);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", dashboard_->port());
  }
  httplib::Result Get(const std::string& path, const std::string& token = kViewer) {
    httplib::Headers h;
    if (!token.empty()) h.emplace("Authorization", "Bearer " + token);
    return client_->Get(path.c_str(), h);
  }
  json GetJson(const std::string& path, int want = 200) {
    auto r = Get(path);
    EXPECT_TRUE(r) << path;
    if (!r) return json();
    EXPECT_EQ(r->status, want) << path << ": " << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
    return json::parse(r->body, nullptr, false);
  }

  TempDir dir_;
  ServerMetrics metrics_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<Dashboard> dashboard_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(DashboardTest, DataNeedsAClientOrViewerTokenAndThePageNone) {
  Start();
  for (const std::string path : {"/metrics", "/api/overview", "/api/jobs", "/api/spend"}) {
    auto none = Get(path, "");
    ASSERT_TRUE(none);
    EXPECT_EQ(none->status, 401) << path;
    EXPECT_EQ(none->get_header_value("WWW-Authenticate"), "Bearer realm=\"kforge\"");
    EXPECT_NE(json::parse(none->body)["error"].get<std::string>().find("client or viewer token"),
              std::string::npos);
    EXPECT_EQ(Get(path, kWorker)->status, 401) << "a worker token opens only WorkerService";
    EXPECT_EQ(Get(path, "not-a-token-of-this-server")->status, 401);
    EXPECT_EQ(Get(path, kClient)->status, 200) << path;
    EXPECT_EQ(Get(path, kViewer)->status, 200) << path;
  }
  auto page = Get("/", "");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(page->get_header_value("Content-Security-Policy").find("script-src 'self'"),
            std::string::npos);
  EXPECT_NE(page->body.find("<script src=\"/app.js\">"), std::string::npos);
  auto js = Get("/app.js", "");
  EXPECT_EQ(js->get_header_value("Content-Type"), "text/javascript; charset=utf-8");
  EXPECT_NE(js->body.find("sessionStorage"), std::string::npos);
  EXPECT_EQ(json::parse(Get("/api/auth", "")->body), (json{{"open", false}}));
}

TEST_F(DashboardTest, WithoutAuthEverythingIsOpen) {
  Start(/*open=*/true);
  EXPECT_EQ(Get("/api/overview", "")->status, 200);
  EXPECT_EQ(Get("/metrics", "")->status, 200);
  EXPECT_EQ(json::parse(Get("/api/auth", "")->body), (json{{"open", true}}));
}

TEST_F(DashboardTest, JobsAreShownAsTheEngineHasThemWithWhatTheyWaitFor) {
  Start();
  JobSpec spec;
  spec.name = "dash";
  spec.shapes = {Shape()};
  spec.max_variants = 2;
  auto job = server_->engine().Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->record.id;
  json j;
  for (int i = 0; i < 100; ++i) {
    j = GetJson("/api/jobs/" + id);
    if (!j["waiting_for"].get<std::string>().empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(j["id"], id);
  EXPECT_EQ(j["name"], "dash");
  EXPECT_EQ(j["state"], "running");
  EXPECT_EQ(j["waiting_for"], "waiting for a GPU worker of arch sm_90a");
  ASSERT_EQ(j["buckets"].size(), 1u);
  const json& b = j["buckets"][0];
  EXPECT_EQ(b["bucket"], BucketOf(Shape()).Id());
  EXPECT_EQ(b["tasks"]["queued"], 2);
  EXPECT_TRUE(b["points"].empty());
  EXPECT_TRUE(b["served"].is_null());
  ASSERT_EQ(b["anchors"].size(), 1u);
  EXPECT_TRUE(b["anchors"][0]["speedup"].is_null()) << "nothing to compare yet";
  EXPECT_EQ(j["progress"][0]["proposed"], 2);

  const json list = GetJson("/api/jobs?limit=10");
  ASSERT_EQ(list["jobs"].size(), 1u);
  EXPECT_EQ(list["jobs"][0]["waiting_for"], "waiting for a GPU worker of arch sm_90a");
  const json overview = GetJson("/api/overview");
  EXPECT_EQ(overview["jobs"]["running"], 1);
  EXPECT_EQ(overview["tasks"]["queued"], 2);
  EXPECT_EQ(overview["waiting_jobs"][0]["job"], id);
  EXPECT_EQ(overview["version"], "9.9.9");
  EXPECT_GT(overview["database_bytes"].get<int64_t>(), 0);
  const json buckets = GetJson("/api/buckets");
  ASSERT_EQ(buckets["buckets"].size(), 1u);
  EXPECT_EQ(buckets["buckets"][0]["jobs"], (json{id}));
  const json bucket = GetJson("/api/bucket?id=" + BucketOf(Shape()).Id());
  EXPECT_TRUE(bucket["best"].is_null());
  EXPECT_TRUE(bucket["variants"].empty()) << "proposed, and not evaluated on it yet";
  auto tasks = store_->ListTasks(id);
  ASSERT_TRUE(tasks.ok() && !tasks->empty());
  const std::string variant = (*tasks)[0].variant_id;
  const json v = GetJson("/api/variants/" + variant);
  EXPECT_NE(v["source"].get<std::string>().find("kf_attn_fwd"), std::string::npos);
  EXPECT_EQ(v["template"], "scripted");

  auto metrics = Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_NE(metrics->body.find("kforge_jobs{state=\"running\"} 1\n"), std::string::npos);
  EXPECT_NE(metrics->body.find("kforge_tasks_queued 2\n"), std::string::npos);
  EXPECT_NE(metrics->body.find("kforge_jobs_waiting_for_worker 1\n"), std::string::npos);
  EXPECT_NE(metrics->body.find(
                "kforge_tasks_open{state=\"queued\",kind=\"evaluate\",arch=\"sm_90a\"} 2\n"),
            std::string::npos);
  EXPECT_NE(metrics->body.find("kforge_build_info{version=\"9.9.9\"} 1\n"), std::string::npos);
}

TEST_F(DashboardTest, BadRequestsSayWhatIsWrongAndEverythingButGetIsRefused) {
  Start();
  EXPECT_EQ(GetJson("/api/jobs?limit=0", 400)["error"], "limit: '0' is not a number in [1, 1000]");
  EXPECT_EQ(GetJson("/api/jobs?limit=ten", 400)["error"], "limit: 'ten' is not a number in [1, 1000]");
  EXPECT_EQ(GetJson("/api/jobs/j999", 404)["code"], "NOT_FOUND");
  EXPECT_EQ(GetJson("/api/variants/v999", 404)["code"], "NOT_FOUND");
  EXPECT_EQ(GetJson("/api/bucket", 400)["error"], "id: a bucket id is required");
  EXPECT_NE(GetJson("/api/bucket?id=fwd.nonsense", 400)["error"].get<std::string>().find("bucket: "),
            std::string::npos);
  EXPECT_EQ(GetJson("/api/nothing", 404)["error"], "/api/nothing: no such page");
  httplib::Headers h{{"Authorization", std::string("Bearer ") + kClient}};
  auto refused = [](const httplib::Result& r) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 405);
    EXPECT_EQ(r->get_header_value("Allow"), "GET, HEAD");
  };
  refused(client_->Post("/api/jobs", h, "{}", "application/json"));
  refused(client_->Put("/api/jobs/j1", h, "{}", "application/json"));
  refused(client_->Delete("/api/jobs/j1", h));
}

}  // namespace
}  // namespace kforge::server::http
