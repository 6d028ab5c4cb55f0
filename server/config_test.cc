#include "server/config.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <sys/stat.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server/auth.h"
#include "tests/util/pki.h"

namespace kforge::server {
namespace {

std::string WriteConfig(const std::string& text) {
  static int n = 0;
  auto path = std::filesystem::temp_directory_path() /
              ("kforge_config_test_" + std::to_string(getpid()) + "_" + std::to_string(n++) + ".json");
  std::ofstream(path) << text;
  return path.string();
}

TEST(ConfigTest, AppliesEveryKey) {
  ServerConfig cfg;
  const std::string path = WriteConfig(R"({
    "listen": "0.0.0.0:6000", "database": "/var/lib/kforge.db",
    "client_tokens": ["cccccccccccccccccccccccccccccccc"], "worker_tokens": ["wwwwwwwwwwwwwwwwwwwwwwwwwwwwwwww"],
    "lease_ttl_ms": 20000, "heartbeat_interval_ms": 5000, "max_lease_wait_ms": 1000,
    "reaper_interval_ms": 500, "shutdown_grace_ms": 0, "drain_timeout_ms": 3000,
    "http_port": 8080, "tune_max_variants": 8, "log_level": "debug",
    "allow_ungated_promotion": true, "confirm_on_another_worker": false,
    "require_distinct_confirmer": true, "allow_plaintext": true,
    "max_open_lease_polls": 64, "max_open_watch_streams": 32, "max_watch_ms": 60000,
    // comments say why a value is what it is
    "model_proposer": {"model": "m"}})");
  ASSERT_TRUE(ApplyConfigFile(path, cfg).ok());
  EXPECT_EQ(cfg.server.listen_address, "0.0.0.0:6000");
  EXPECT_EQ(cfg.database, "/var/lib/kforge.db");
  EXPECT_EQ(cfg.server.client_tokens.size(), 1u);
  EXPECT_EQ(cfg.server.api.lease_ttl_ms, 20000);
  EXPECT_EQ(cfg.server.api.heartbeat_interval_ms, 5000);
  EXPECT_EQ(cfg.http_port, 8080);
  EXPECT_EQ(cfg.log_level, "debug");
  EXPECT_EQ(cfg.model_proposer_json, R"({"model":"m"})");
  EXPECT_TRUE(cfg.server.api.allow_ungated_promotion);
  EXPECT_FALSE(cfg.server.api.confirm_on_another_worker);
  EXPECT_TRUE(cfg.server.api.require_distinct_confirmer);
  EXPECT_TRUE(cfg.server.allow_plaintext);
  EXPECT_EQ(cfg.server.max_open_lease_polls, 64);
  EXPECT_EQ(cfg.server.max_open_watch_streams, 32);
  EXPECT_EQ(cfg.server.max_watch_ms, 60000);
  EXPECT_TRUE(ValidateConfig(cfg).ok());
}

// deploy/kforge-server.jsonc is the sample operators start from: the real
// parser takes it, and it names every key the parser knows (so a new key
// cannot go undocumented).
TEST(ConfigTest, SampleParsesAndNamesEveryKey) {
  const std::string path = std::string(KFORGE_SOURCE_DIR) + "/deploy/kforge-server.jsonc";
  ServerConfig cfg;
  absl::Status s = ApplyConfigFile(path, cfg);
  ASSERT_TRUE(s.ok()) << s;
  std::ifstream in(path);
  const nlohmann::json sample = nlohmann::json::parse(in, nullptr, true, /*ignore_comments=*/true);
  const std::vector<std::string> keys = ConfigKeys();
  EXPECT_GE(keys.size(), 25u) << "ConfigKeys lost keys";
  for (const std::string& key : keys) EXPECT_TRUE(sample.contains(key)) << "the sample lacks " << key;
  // Every key is explained by a comment naming it, not just present.
  std::ifstream again(path);
  const std::string text((std::istreambuf_iterator<char>(again)), std::istreambuf_iterator<char>());
  for (const std::string& key : keys) {
    const size_t at = text.find("\"" + key + "\":");
    ASSERT_NE(at, std::string::npos) << key;
    const size_t line = text.rfind('\n', at);
    const size_t prev = text.rfind('\n', line - 1);
    EXPECT_NE(text.substr(prev + 1, line - prev - 1).find("//"), std::string::npos)
        << key << " has no comment on the line before it";
  }
}

TEST(ConfigTest, OperatorKeysApply) {
  ServerConfig cfg;
  EXPECT_EQ(cfg.log_format, "text");
  EXPECT_EQ(cfg.server.engine.stuck_timeout_ms, 0) << "jobs wait by default";
  const std::string path = WriteConfig(R"({
    "client_tokens": ["cccccccccccccccccccccccccccccccc"],
    "worker_tokens": ["wwwwwwwwwwwwwwwwwwwwwwwwwwwwwwww"],
    "viewer_tokens": ["vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv"], "stuck_job_timeout_ms": 600000,
    "log_format": "json", "anchors_file": "/etc/kforge/anchors.json"})");
  ASSERT_TRUE(ApplyConfigFile(path, cfg).ok());
  EXPECT_EQ(cfg.viewer_tokens, std::vector<std::string>{"vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv"});
  EXPECT_EQ(cfg.server.engine.stuck_timeout_ms, 600000);
  EXPECT_EQ(cfg.log_format, "json");
  EXPECT_EQ(cfg.anchors_file, "/etc/kforge/anchors.json");
  EXPECT_TRUE(ValidateConfig(cfg).ok());
  absl::Status s = ApplyConfigFile(WriteConfig(R"({"log_format": "xml"})"), cfg);
  EXPECT_NE(s.message().find("log_format: must be \"text\" or \"json\""), std::string::npos) << s;
  s = ApplyConfigFile(WriteConfig(R"({"viewer_tokens": ["short"]})"), cfg);
  EXPECT_NE(s.message().find("viewer_tokens[0]: the token has 5 characters, fewer than 32"),
            std::string::npos)
      << s;
}

TEST(ConfigTest, AViewerTokenThatIsAlsoAWorkerTokenIsRefused) {
  ServerConfig cfg;
  cfg.server.client_tokens = {"cccccccccccccccccccccccccccccccc"};
  cfg.server.worker_tokens = {"host-a:wwwwwwwwwwwwwwwwwwwwwwwwwwwwwwww"};
  cfg.viewer_tokens = {"wwwwwwwwwwwwwwwwwwwwwwwwwwwwwwww"};
  absl::Status s = ValidateConfig(cfg);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("both a viewer and a worker token (worker 'host-a')"),
            std::string::npos)
      << s;
  EXPECT_EQ(s.message().find("wwww"), std::string::npos) << "never the token";
}

TEST(ConfigTest, ModelConfigFileGivesTheModelProposersOptions) {
  ServerConfig cfg;
  ASSERT_TRUE(ApplyModelConfigFile(WriteConfig(R"({"model": "qwen3-coder", "base_url": "http://127.0.0.1:8000/v1"})"), cfg).ok());
  EXPECT_EQ(cfg.model_proposer_json, R"({"base_url":"http://127.0.0.1:8000/v1","model":"qwen3-coder"})");
  absl::Status s = ApplyModelConfigFile(WriteConfig("[1, 2]"), cfg);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("must be a JSON object"), std::string::npos) << s;
  s = ApplyModelConfigFile(WriteConfig("{"), cfg);
  EXPECT_NE(s.message().find("not valid JSON"), std::string::npos) << s;
  s = ApplyModelConfigFile("/nonexistent/model.json", cfg);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("--model-config /nonexistent/model.json"), std::string::npos) << s;
}

// Promotion is gated and confirmed elsewhere unless a config says otherwise.
TEST(ConfigTest, PromotionDefaultsAreTheSafeOnes) {
  ServerConfig cfg;
  EXPECT_FALSE(cfg.server.api.allow_ungated_promotion);
  EXPECT_TRUE(cfg.server.api.confirm_on_another_worker);
  EXPECT_FALSE(cfg.server.api.require_distinct_confirmer);
  const std::string path = WriteConfig(R"({"allow_ungated_promotion": "yes"})");
  absl::Status s = ApplyConfigFile(path, cfg);
  EXPECT_NE(s.message().find("allow_ungated_promotion"), std::string::npos) << s;
}

TEST(ConfigTest, ErrorsNameTheFileAndTheKey) {
  ServerConfig cfg;
  const std::string path = WriteConfig(R"({"lease_ttl_ms": "ten"})");
  absl::Status s = ApplyConfigFile(path, cfg);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(path), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("lease_ttl_ms"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("\"ten\""), absl::string_view::npos) << s;

  absl::Status unknown = ApplyConfigFile(WriteConfig(R"({"listn": "x:1"})"), cfg);
  EXPECT_NE(unknown.message().find("listn: unknown key"), absl::string_view::npos) << unknown;
  absl::Status json = ApplyConfigFile(WriteConfig("{not json"), cfg);
  EXPECT_NE(json.message().find("not valid JSON"), absl::string_view::npos) << json;
  absl::Status missing = ApplyConfigFile("/nonexistent/kforge.json", cfg);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  absl::Status token = ApplyConfigFile(WriteConfig(R"({"client_tokens": ["short"]})"), cfg);
  EXPECT_NE(token.message().find("client_tokens[0]"), absl::string_view::npos) << token;
}

TEST(ConfigTest, NoTokensIsRefusedUnlessInsecure) {
  ServerConfig cfg;
  absl::Status s = ValidateConfig(cfg);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("--insecure-no-auth"), absl::string_view::npos);
  cfg.server.insecure_no_auth = true;
  EXPECT_TRUE(ValidateConfig(cfg).ok());
}

TEST(ConfigTest, EnvironmentAddsTokens) {
  setenv("KFORGE_CLIENT_TOKEN", "a-client-token-0123456789abcdef0123,b-client-token-0123456789abcdef0123", 1);
  setenv("KFORGE_WORKER_TOKEN", "a-worker-token-0123456789abcdef0123", 1);
  ServerConfig cfg;
  ApplyEnvironment(cfg);
  EXPECT_EQ(cfg.server.client_tokens.size(), 2u);
  EXPECT_EQ(cfg.server.worker_tokens.size(), 1u);
  EXPECT_TRUE(ValidateConfig(cfg).ok());
  unsetenv("KFORGE_CLIENT_TOKEN");
  unsetenv("KFORGE_WORKER_TOKEN");
}

// Worker tokens are named credentials: "name:token" strings, objects, or
// plain tokens (their principal derived, never the token itself).
TEST(ConfigTest, WorkerTokensAreNamedCredentials) {
  ServerConfig cfg;
  const std::string path = WriteConfig(R"({"worker_tokens": [
      "host-a:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
      {"name": "host-b", "token": "bbbbbbbbbbbbbbbbbbbbbbbbbbbb:bbbb"},
      "pppppppppppppppppppppppppppppppp"]})");
  ASSERT_TRUE(ApplyConfigFile(path, cfg).ok());
  ASSERT_EQ(cfg.server.worker_tokens.size(), 3u);
  absl::StatusOr<std::vector<WorkerCredential>> c = ParseWorkerTokens(cfg.server.worker_tokens);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->size(), 3u);
  EXPECT_EQ((*c)[0].principal, "host-a");
  EXPECT_EQ((*c)[0].token, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
  EXPECT_EQ((*c)[1].principal, "host-b");
  EXPECT_EQ((*c)[1].token, "bbbbbbbbbbbbbbbbbbbbbbbbbbbb:bbbb") << "split at the first ':'";
  EXPECT_EQ((*c)[2].token, "pppppppppppppppppppppppppppppppp");
  EXPECT_EQ((*c)[2].principal, DerivedPrincipal("pppppppppppppppppppppppppppppppp"));
  EXPECT_EQ((*c)[2].principal.size(), 18u) << (*c)[2].principal;
  EXPECT_EQ((*c)[2].principal.rfind("token-", 0), 0u);
  EXPECT_EQ(DerivedPrincipal("pppppppppppppppppppppppppppppppp"), DerivedPrincipal("pppppppppppppppppppppppppppppppp"))
      << "stable";
  EXPECT_NE(DerivedPrincipal("pppppppppppppppppppppppppppppppp"), DerivedPrincipal("qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq"));
  cfg.server.client_tokens = {"cccccccccccccccccccccccccccccccc"};
  EXPECT_TRUE(ValidateConfig(cfg).ok());
}

TEST(ConfigTest, BadWorkerTokensAreErrorsNamingTheEntryNotTheToken) {
  const std::string secret = "s3cret-s3cret-s3cret-s3cret-s3cret";
  struct Case {
    std::string tokens;   // the worker_tokens JSON array
    std::string key;      // the entry named
    std::string why;      // part of the message
  };
  const std::vector<Case> cases = {
      {R"([":)" + secret + R"("])", "worker_tokens[0]", "name before ':' is empty"},
      {R"(["host a:)" + secret + R"("])", "worker_tokens[0]", "not 1-64 letters"},
      {R"(["host-a:"])", "worker_tokens[0]", "token after 'host-a:' is empty"},
      {R"([""])", "worker_tokens[0]", "is empty"},
      {R"(["host-a:short"])", "worker_tokens[0]", "5 characters, fewer than 32"},
      {R"(["host-a:)" + secret + R"(", "host-a:)" + secret + R"(x"])", "worker_tokens[1]",
       "name 'host-a' is also worker_tokens[0]'s"},
      {R"(["host-a:)" + secret + R"(", "host-b:)" + secret + R"("])", "worker_tokens[1]",
       "token of 'host-b' is also worker_tokens[0]'s ('host-a')"},
      {R"([")" + secret + R"(", ")" + secret + R"("])", "worker_tokens[1]", "is also"},
      {R"([{"name": "", "token": ")" + secret + R"("}])", "worker_tokens[0].name",
       "non-empty string"},
      {R"([{"name": "h"}])", "worker_tokens[0].token", "non-empty string"},
      {R"([{"name": "h/1", "token": ")" + secret + R"("}])", "worker_tokens[0].name",
       "not 1-64 letters"},
      {R"([{"name": "h", "token": ")" + secret + R"(", "tok": 1}])", "worker_tokens[0].tok",
       "unknown key"},
      {R"([{"name": "h", "token": ")" + secret + R"("}, "h:)" + secret + R"(y"])",
       "worker_tokens[1]", "name 'h' is also"},
      {R"([7])", "worker_tokens[0]", "must be a"},
      {R"("host-a:)" + secret + R"(")", "worker_tokens", "must be an array"},
  };
  for (const Case& c : cases) {
    ServerConfig cfg;
    absl::Status s =
        ApplyConfigFile(WriteConfig(R"({"worker_tokens": )" + c.tokens + "}"), cfg);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.tokens;
    EXPECT_NE(s.message().find(c.key + ":"), absl::string_view::npos) << c.tokens << ": " << s;
    EXPECT_NE(s.message().find(c.why), absl::string_view::npos) << c.tokens << ": " << s;
    EXPECT_EQ(s.message().find(secret), absl::string_view::npos) << "a token in: " << s;
    EXPECT_TRUE(cfg.server.worker_tokens.empty()) << c.tokens;
  }
}

// Tokens from the environment follow the same rules when the lists are
// put together, the minimum length included.
TEST(ConfigTest, EnvironmentWorkerTokensMayBeNamedAndAreChecked) {
  setenv("KFORGE_CLIENT_TOKEN", "a-client-token-0123456789abcdef0123", 1);
  setenv("KFORGE_WORKER_TOKEN", "gpu0:tok-zero-0123456789abcdef0123456,gpu1:tok-one-0123456789abcdef01234567", 1);
  ServerConfig cfg;
  ApplyEnvironment(cfg);
  EXPECT_TRUE(ValidateConfig(cfg).ok());
  absl::StatusOr<std::vector<WorkerCredential>> c = ParseWorkerTokens(cfg.server.worker_tokens);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)[1].principal, "gpu1");
  EXPECT_EQ((*c)[1].token, "tok-one-0123456789abcdef01234567");
  setenv("KFORGE_WORKER_TOKEN", "gpu0:tok-zero-0123456789abcdef0123456,gpu0:tok-one-0123456789abcdef01234567", 1);
  ServerConfig dup;
  ApplyEnvironment(dup);
  absl::Status s = ValidateConfig(dup);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("worker tokens[1]: the name 'gpu0'"), absl::string_view::npos) << s;
  setenv("KFORGE_WORKER_TOKEN", "gpu0:a-client-token-0123456789abcdef0123", 1);
  ServerConfig both;
  ApplyEnvironment(both);
  s = ValidateConfig(both);
  EXPECT_NE(s.message().find("both a client and a worker token (worker 'gpu0')"),
            absl::string_view::npos)
      << s;
  unsetenv("KFORGE_CLIENT_TOKEN");
  unsetenv("KFORGE_WORKER_TOKEN");
}

constexpr char kClientToken[] = "client-token-0123456789abcdef0123456789";
constexpr char kWorkerToken[] = "worker-token-0123456789abcdef0123456789";

ServerConfig WithTokens() {
  ServerConfig cfg;
  cfg.server.client_tokens = {kClientToken};
  cfg.server.worker_tokens = {kWorkerToken};
  return cfg;
}

TEST(ConfigTest, ShortTokensAreRefusedFromEverySourceWithoutEchoingThem) {
  ServerConfig cfg = WithTokens();
  cfg.server.client_tokens.push_back("short-client-token");
  absl::Status s = ValidateConfig(cfg);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("client tokens[1]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("fewer than 32"), std::string::npos) << s;
  EXPECT_EQ(s.message().find("short-client-token"), std::string::npos) << s;
  ServerConfig worker = WithTokens();
  worker.server.worker_tokens = {"gpu0:short-worker-token"};
  s = ValidateConfig(worker);
  EXPECT_NE(s.message().find("worker tokens[0]: the token of 'gpu0'"), std::string::npos) << s;
  EXPECT_EQ(s.message().find("short-worker-token"), std::string::npos) << s;
  ServerConfig spaced = WithTokens();
  spaced.server.client_tokens = {std::string(20, 'x') + " " + std::string(20, 'y')};
  EXPECT_NE(ValidateConfig(spaced).message().find("a space"), std::string::npos);
}

TEST(ConfigTest, PlaintextOnlyOnLoopbackUnlessAllowed) {
  ServerConfig cfg = WithTokens();
  EXPECT_TRUE(ValidateConfig(cfg).ok()) << "127.0.0.1 by default";
  cfg.server.listen_address = "0.0.0.0:50051";
  absl::Status s = ValidateConfig(cfg);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("0.0.0.0:50051 is not a loopback address"), std::string::npos) << s;
  EXPECT_NE(s.message().find("--tls-cert"), std::string::npos) << s;
  EXPECT_NE(s.message().find("--allow-plaintext"), std::string::npos) << s;
  cfg.server.allow_plaintext = true;
  EXPECT_TRUE(ValidateConfig(cfg).ok());
  cfg.server.allow_plaintext = false;
  cfg.server.tls_cert_pem = "cert";
  cfg.server.tls_key_pem = "key";
  EXPECT_TRUE(ValidateConfig(cfg).ok()) << "TLS serves any address";
}

TEST(ConfigTest, InsecureNoAuthRefusesEveryAddressButLoopback) {
  for (const char* ok : {"127.0.0.1:0", "localhost:50051", "[::1]:50051"}) {
    ServerConfig cfg;
    cfg.server.insecure_no_auth = true;
    cfg.server.listen_address = ok;
    EXPECT_TRUE(ValidateConfig(cfg).ok()) << ok;
  }
  for (const char* bad : {"0.0.0.0:50051", "[::]:50051", "10.1.2.3:50051", ":50051"}) {
    ServerConfig cfg;
    cfg.server.insecure_no_auth = true;
    cfg.server.allow_plaintext = true;  // forcing plaintext does not force no-auth
    cfg.server.tls_cert_pem = "cert";
    cfg.server.tls_key_pem = "key";
    cfg.server.listen_address = bad;
    absl::Status s = ValidateConfig(cfg);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << bad;
    EXPECT_NE(s.message().find("--insecure-no-auth listens on loopback addresses only"),
              std::string::npos)
        << s;
  }
}

class ConfigFilesTest : public ::testing::Test {
 protected:
  void SetUp() override { std::filesystem::create_directories(dir_); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text, int mode = 0600) {
    const auto p = dir_ / name;
    std::ofstream(p) << text;
    chmod(p.c_str(), mode);
    return p.string();
  }
  std::filesystem::path dir_ = std::filesystem::temp_directory_path() /
                               ("kforge_config_files_test_" + std::to_string(getpid()));
};

TEST_F(ConfigFilesTest, TokenFilesAddOneEntryALine) {
  ServerConfig cfg;
  cfg.client_tokens_file = Write("client.tokens", std::string("# clients\n\n  ") + kClientToken +
                                                      "  \n" + std::string(40, 'k') + "\r\n");
  cfg.worker_tokens_file =
      Write("worker.tokens", std::string("host-a:") + kWorkerToken + "\n# host-b retired\n");
  ASSERT_TRUE(ReadConfigFiles(cfg).ok());
  EXPECT_EQ(cfg.server.client_tokens,
            (std::vector<std::string>{kClientToken, std::string(40, 'k')}));
  EXPECT_EQ(cfg.server.worker_tokens, (std::vector<std::string>{std::string("host-a:") + kWorkerToken}));
  EXPECT_TRUE(cfg.warnings.empty());
  EXPECT_TRUE(ValidateConfig(cfg).ok());
}

TEST_F(ConfigFilesTest, TokenFileProblemsAreNamed) {
  ServerConfig empty;
  empty.client_tokens_file = Write("empty", "# nothing here\n");
  absl::Status s = ReadConfigFiles(empty);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("client_tokens_file"), std::string::npos) << s;
  ServerConfig missing;
  missing.worker_tokens_file = (dir_ / "absent").string();
  s = ReadConfigFiles(missing);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("worker_tokens_file"), std::string::npos) << s;
  ServerConfig loose;
  loose.client_tokens_file = Write("loose", std::string(kClientToken) + "\n", 0644);
  ASSERT_TRUE(ReadConfigFiles(loose).ok());
  ASSERT_EQ(loose.warnings.size(), 1u);
  EXPECT_NE(loose.warnings[0].find("open to other users (mode 644)"), std::string::npos)
      << loose.warnings[0];
  ServerConfig group;
  group.client_tokens_file = Write("group", std::string(kClientToken) + "\n", 0640);
  ASSERT_TRUE(ReadConfigFiles(group).ok());
  EXPECT_TRUE(group.warnings.empty()) << "a group (fsGroup, ssl-cert) may read it";
}

TEST_F(ConfigFilesTest, TlsNeedsAMatchingCertificateAndKey) {
  testing::TestPki pki, other;
  std::string log;
  ASSERT_TRUE(testing::MakeTestPki(dir_ / "pki", &pki, &log)) << log;
  ASSERT_TRUE(testing::MakeTestPki(dir_ / "other", &other, &log)) << log;
  ServerConfig good = WithTokens();
  good.tls_cert_file = pki.server_cert();
  good.tls_key_file = pki.server_key();
  good.tls_client_ca_file = pki.ca_cert();
  good.server.listen_address = "0.0.0.0:50051";
  ASSERT_TRUE(ReadConfigFiles(good).ok());
  EXPECT_NE(good.server.tls_cert_pem.find("BEGIN CERTIFICATE"), std::string::npos);
  EXPECT_NE(good.server.tls_key_pem.find("PRIVATE KEY"), std::string::npos);
  EXPECT_FALSE(good.server.tls_client_ca_pem.empty());
  EXPECT_TRUE(ValidateConfig(good).ok());

  ServerConfig mismatch;
  mismatch.tls_cert_file = pki.server_cert();
  mismatch.tls_key_file = other.server_key();
  absl::Status s = ReadConfigFiles(mismatch);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("is not the key of tls_cert_file"), std::string::npos) << s;

  ServerConfig alone;
  alone.tls_cert_file = pki.server_cert();
  EXPECT_NE(ReadConfigFiles(alone).message().find("go together"), std::string::npos);
  ServerConfig ca_only;
  ca_only.tls_client_ca_file = pki.ca_cert();
  EXPECT_NE(ReadConfigFiles(ca_only).message().find("needs tls_cert_file"), std::string::npos);
  ServerConfig not_pem;
  not_pem.tls_cert_file = Write("cert.txt", "hello");
  not_pem.tls_key_file = pki.server_key();
  EXPECT_NE(ReadConfigFiles(not_pem).message().find("not a PEM file"), std::string::npos);
  ServerConfig swapped;
  swapped.tls_cert_file = pki.server_key();
  swapped.tls_key_file = pki.server_cert();
  EXPECT_NE(ReadConfigFiles(swapped).message().find("holds no PEM certificate"),
            std::string::npos);
}

TEST(ConfigTest, HeartbeatMustFitTwiceIntoTheLease) {
  ServerConfig cfg;
  cfg.server.insecure_no_auth = true;
  cfg.server.api.lease_ttl_ms = 1000;
  cfg.server.api.heartbeat_interval_ms = 800;
  EXPECT_FALSE(ValidateConfig(cfg).ok());
}

}  // namespace
}  // namespace kforge::server
