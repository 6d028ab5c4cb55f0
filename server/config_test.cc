#include "server/config.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "server/auth.h"

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
    "client_tokens": ["cccccccccccccccccccc"], "worker_tokens": ["wwwwwwwwwwwwwwwwwwww"],
    "lease_ttl_ms": 20000, "heartbeat_interval_ms": 5000, "max_lease_wait_ms": 1000,
    "reaper_interval_ms": 500, "shutdown_grace_ms": 0, "drain_timeout_ms": 3000,
    "http_port": 8080, "tune_max_variants": 8, "log_level": "debug",
    "allow_ungated_promotion": true, "confirm_on_another_worker": false,
    "require_distinct_confirmer": true,
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
  EXPECT_TRUE(ValidateConfig(cfg).ok());
}

TEST(ConfigTest, OperatorKeysApply) {
  ServerConfig cfg;
  EXPECT_EQ(cfg.log_format, "text");
  EXPECT_EQ(cfg.server.engine.stuck_timeout_ms, 0) << "jobs wait by default";
  const std::string path = WriteConfig(R"({
    "client_tokens": ["cccccccccccccccccccc"], "worker_tokens": ["wwwwwwwwwwwwwwwwwwww"],
    "viewer_tokens": ["vvvvvvvvvvvvvvvvvvvv"], "stuck_job_timeout_ms": 600000,
    "log_format": "json", "anchors_file": "/etc/kforge/anchors.json"})");
  ASSERT_TRUE(ApplyConfigFile(path, cfg).ok());
  EXPECT_EQ(cfg.viewer_tokens, std::vector<std::string>{"vvvvvvvvvvvvvvvvvvvv"});
  EXPECT_EQ(cfg.server.engine.stuck_timeout_ms, 600000);
  EXPECT_EQ(cfg.log_format, "json");
  EXPECT_EQ(cfg.anchors_file, "/etc/kforge/anchors.json");
  EXPECT_TRUE(ValidateConfig(cfg).ok());
  absl::Status s = ApplyConfigFile(WriteConfig(R"({"log_format": "xml"})"), cfg);
  EXPECT_NE(s.message().find("log_format: must be \"text\" or \"json\""), std::string::npos) << s;
  s = ApplyConfigFile(WriteConfig(R"({"viewer_tokens": ["short"]})"), cfg);
  EXPECT_NE(s.message().find("viewer_tokens[0]: is shorter than 16"), std::string::npos) << s;
}

TEST(ConfigTest, AViewerTokenThatIsAlsoAWorkerTokenIsRefused) {
  ServerConfig cfg;
  cfg.server.client_tokens = {"cccccccccccccccccccc"};
  cfg.server.worker_tokens = {"host-a:wwwwwwwwwwwwwwwwwwww"};
  cfg.viewer_tokens = {"wwwwwwwwwwwwwwwwwwww"};
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
  setenv("KFORGE_CLIENT_TOKEN", "a-client-token,b-client-token", 1);
  setenv("KFORGE_WORKER_TOKEN", "a-worker-token", 1);
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
      "host-a:aaaaaaaaaaaaaaaaaaaa",
      {"name": "host-b", "token": "bbbbbbbbbbbbbbbb:bbbb"},
      "pppppppppppppppppppp"]})");
  ASSERT_TRUE(ApplyConfigFile(path, cfg).ok());
  ASSERT_EQ(cfg.server.worker_tokens.size(), 3u);
  absl::StatusOr<std::vector<WorkerCredential>> c = ParseWorkerTokens(cfg.server.worker_tokens);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->size(), 3u);
  EXPECT_EQ((*c)[0].principal, "host-a");
  EXPECT_EQ((*c)[0].token, "aaaaaaaaaaaaaaaaaaaa");
  EXPECT_EQ((*c)[1].principal, "host-b");
  EXPECT_EQ((*c)[1].token, "bbbbbbbbbbbbbbbb:bbbb") << "split at the first ':'";
  EXPECT_EQ((*c)[2].token, "pppppppppppppppppppp");
  EXPECT_EQ((*c)[2].principal, DerivedPrincipal("pppppppppppppppppppp"));
  EXPECT_EQ((*c)[2].principal.size(), 18u) << (*c)[2].principal;
  EXPECT_EQ((*c)[2].principal.rfind("token-", 0), 0u);
  EXPECT_EQ(DerivedPrincipal("pppppppppppppppppppp"), DerivedPrincipal("pppppppppppppppppppp"))
      << "stable";
  EXPECT_NE(DerivedPrincipal("pppppppppppppppppppp"), DerivedPrincipal("qqqqqqqqqqqqqqqqqqqq"));
  cfg.server.client_tokens = {"cccccccccccccccccccc"};
  EXPECT_TRUE(ValidateConfig(cfg).ok());
}

TEST(ConfigTest, BadWorkerTokensAreErrorsNamingTheEntryNotTheToken) {
  const std::string secret = "s3cret-s3cret-s3cret";
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
      {R"(["host-a:short"])", "worker_tokens[0]", "shorter than 16"},
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

// Tokens from the environment and flags follow the same rules when the
// lists are put together (no minimum length there, as before).
TEST(ConfigTest, EnvironmentWorkerTokensMayBeNamedAndAreChecked) {
  setenv("KFORGE_CLIENT_TOKEN", "a-client-token", 1);
  setenv("KFORGE_WORKER_TOKEN", "gpu0:tok-zero,gpu1:tok-one", 1);
  ServerConfig cfg;
  ApplyEnvironment(cfg);
  EXPECT_TRUE(ValidateConfig(cfg).ok());
  absl::StatusOr<std::vector<WorkerCredential>> c = ParseWorkerTokens(cfg.server.worker_tokens);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)[1].principal, "gpu1");
  EXPECT_EQ((*c)[1].token, "tok-one");
  setenv("KFORGE_WORKER_TOKEN", "gpu0:tok-zero,gpu0:tok-one", 1);
  ServerConfig dup;
  ApplyEnvironment(dup);
  absl::Status s = ValidateConfig(dup);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("worker tokens[1]: the name 'gpu0'"), absl::string_view::npos) << s;
  setenv("KFORGE_WORKER_TOKEN", "gpu0:a-client-token", 1);
  ServerConfig both;
  ApplyEnvironment(both);
  s = ValidateConfig(both);
  EXPECT_NE(s.message().find("both a client and a worker token (worker 'gpu0')"),
            absl::string_view::npos)
      << s;
  unsetenv("KFORGE_CLIENT_TOKEN");
  unsetenv("KFORGE_WORKER_TOKEN");
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
