#include "server/config.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "core/status.h"
#include "core/transport.h"
#include "server/auth.h"

namespace kforge::server {
namespace {

using nlohmann::json;

std::vector<std::string> SplitList(const char* value) {
  std::vector<std::string> out;
  if (!value) return out;
  std::string s(value);
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

using Setter = std::function<absl::Status(const std::string&, const json&)>;

// Every key of the file and what it sets in `cfg`; `path` names the file in
// errors. The one list of keys: ApplyConfigFile and ConfigKeys both use it.
std::map<std::string, Setter> KeyTable(const std::string& path, ServerConfig& cfg) {
  // The setters outlive this call: they capture `bad` (and `path`) by value.
  auto bad = [path](std::string_view key, std::string_view why) {
    return absl::InvalidArgumentError(fmt::format("config {}: {}: {}", path, key, why));
  };
  auto int_key = [&](int64_t lo, int64_t hi, auto& field) -> Setter {
    return [bad, lo, hi, &field](const std::string& key, const json& v) -> absl::Status {
      if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
        return bad(key, fmt::format("must be an integer in [{}, {}], got {}", lo, hi, Excerpt(v.dump())));
      field = static_cast<std::remove_reference_t<decltype(field)>>(v.get<int64_t>());
      return absl::OkStatus();
    };
  };
  auto string_key = [&](std::string& field) -> Setter {
    return [bad, &field](const std::string& key, const json& v) -> absl::Status {
      if (!v.is_string() || v.get<std::string>().empty())
        return bad(key, fmt::format("must be a non-empty string, got {}", Excerpt(v.dump())));
      field = v.get<std::string>();
      return absl::OkStatus();
    };
  };
  auto tokens_key = [&](std::vector<std::string>& field) -> Setter {
    return [bad, path, &field](const std::string& key, const json& v) -> absl::Status {
      if (!v.is_array()) return bad(key, "must be an array of strings");
      std::vector<std::string> out;
      for (size_t i = 0; i < v.size(); ++i) {
        if (!v[i].is_string() || v[i].get<std::string>().empty())
          return bad(fmt::format("{}[{}]", key, i), "must be a non-empty string");
        if (absl::Status s = CheckToken(v[i].get<std::string>(), fmt::format("{}[{}]", key, i));
            !s.ok())
          return absl::InvalidArgumentError(
              fmt::format("config {}: {}", path, std::string(s.message())));
        out.push_back(v[i].get<std::string>());
      }
      field = std::move(out);
      return absl::OkStatus();
    };
  };
  // Worker tokens are credentials with a name: "name:token" or
  // {"name": ..., "token": ...}, or a plain "token" (a derived principal).
  // Objects become "name:token" entries; ParseWorkerTokens checks them all.
  auto worker_tokens_key = [&](std::vector<std::string>& field) -> Setter {
    return [bad, path, &field](const std::string& key, const json& v) -> absl::Status {
      if (!v.is_array())
        return bad(key, "must be an array of \"token\" or \"name:token\" strings or "
                        "{\"name\": ..., \"token\": ...} objects");
      std::vector<std::string> out;
      for (size_t i = 0; i < v.size(); ++i) {
        const std::string at = fmt::format("{}[{}]", key, i);
        if (v[i].is_string()) {
          out.push_back(v[i].get<std::string>());
        } else if (v[i].is_object()) {
          for (auto it = v[i].begin(); it != v[i].end(); ++it)
            if (it.key() != "name" && it.key() != "token")
              return bad(fmt::format("{}.{}", at, it.key()), "unknown key (name, token)");
          for (const char* k : {"name", "token"}) {
            if (!v[i].contains(k) || !v[i][k].is_string() || v[i][k].get<std::string>().empty())
              return bad(fmt::format("{}.{}", at, k), "must be a non-empty string");
          }
          const std::string name = v[i]["name"].get<std::string>();
          if (!IsPrincipalName(name))
            return bad(fmt::format("{}.name", at),
                       fmt::format("'{}' is not 1-64 letters, digits, '.', '_' or '-'",
                                   Excerpt(name)));
          out.push_back(name + ":" + v[i]["token"].get<std::string>());
        } else {
          return bad(at, "must be a \"token\" or \"name:token\" string or a {\"name\", "
                         "\"token\"} object");
        }
      }
      if (absl::StatusOr<std::vector<WorkerCredential>> c =
              ParseWorkerTokens(out, key);
          !c.ok())
        return absl::InvalidArgumentError(
            fmt::format("config {}: {}", path, std::string(c.status().message())));
      field = std::move(out);
      return absl::OkStatus();
    };
  };
  // A file a key may leave out: "" is none, as when the key is absent, so
  // that a sample can name the key at its default.
  auto optional_path_key = [&](std::string& field) -> Setter {
    return [bad, &field](const std::string& key, const json& v) -> absl::Status {
      if (!v.is_string())
        return bad(key, fmt::format("must be a path or \"\" (none), got {}", Excerpt(v.dump())));
      field = v.get<std::string>();
      return absl::OkStatus();
    };
  };
  auto bool_key = [&](bool& field) -> Setter {
    return [bad, &field](const std::string& key, const json& v) -> absl::Status {
      if (!v.is_boolean()) return bad(key, fmt::format("must be true or false, got {}", Excerpt(v.dump())));
      field = v.get<bool>();
      return absl::OkStatus();
    };
  };
  constexpr int64_t kDay = 24 * 3600 * 1000;
  return {
      {"listen", string_key(cfg.server.listen_address)},
      {"database", string_key(cfg.database)},
      {"anchors_file", optional_path_key(cfg.anchors_file)},
      {"client_tokens", tokens_key(cfg.server.client_tokens)},
      {"viewer_tokens", tokens_key(cfg.viewer_tokens)},
      {"worker_tokens", worker_tokens_key(cfg.server.worker_tokens)},
      {"client_tokens_file", optional_path_key(cfg.client_tokens_file)},
      {"worker_tokens_file", optional_path_key(cfg.worker_tokens_file)},
      {"viewer_tokens_file", optional_path_key(cfg.viewer_tokens_file)},
      {"insecure_no_auth", bool_key(cfg.server.insecure_no_auth)},
      {"tls_cert_file", optional_path_key(cfg.tls_cert_file)},
      {"tls_key_file", optional_path_key(cfg.tls_key_file)},
      {"tls_client_ca_file", optional_path_key(cfg.tls_client_ca_file)},
      {"allow_plaintext", bool_key(cfg.server.allow_plaintext)},
      {"allow_ungated_promotion", bool_key(cfg.server.api.allow_ungated_promotion)},
      {"confirm_on_another_worker", bool_key(cfg.server.api.confirm_on_another_worker)},
      {"require_distinct_confirmer", bool_key(cfg.server.api.require_distinct_confirmer)},
      {"lease_ttl_ms", int_key(100, kDay, cfg.server.api.lease_ttl_ms)},
      {"heartbeat_interval_ms", int_key(10, 3600 * 1000, cfg.server.api.heartbeat_interval_ms)},
      {"max_lease_wait_ms", int_key(0, 600 * 1000, cfg.server.api.max_lease_wait_ms)},
      {"max_task_attempts", int_key(1, 1000, cfg.server.api.max_task_attempts)},
      {"max_open_lease_polls", int_key(1, 1000000, cfg.server.max_open_lease_polls)},
      {"max_open_watch_streams", int_key(1, 1000000, cfg.server.max_open_watch_streams)},
      {"max_watch_ms", int_key(1000, 7 * kDay, cfg.server.max_watch_ms)},
      {"reaper_interval_ms", int_key(10, 3600 * 1000, cfg.server.reaper_interval_ms)},
      {"shutdown_grace_ms", int_key(0, 600 * 1000, cfg.server.shutdown_grace_ms)},
      {"drain_timeout_ms", int_key(0, 3600 * 1000, cfg.server.drain_timeout_ms)},
      {"http_port", int_key(0, 65535, cfg.http_port)},
      {"stuck_job_timeout_ms", int_key(0, 7 * kDay, cfg.server.engine.stuck_timeout_ms)},
      {"log_format",
       [bad, &cfg](const std::string& key, const json& v) -> absl::Status {
         if (!v.is_string() || (v.get<std::string>() != "text" && v.get<std::string>() != "json"))
           return bad(key, fmt::format("must be \"text\" or \"json\", got {}", v.dump()));
         cfg.log_format = v.get<std::string>();
         return absl::OkStatus();
       }},
      {"tune_max_variants", int_key(1, kMaxVariantsLimit, cfg.server.api.tune_max_variants)},
      {"model_proposer",
       [bad, &cfg](const std::string& key, const json& v) -> absl::Status {
         // null: off, as when the key is absent.
         if (v.is_null()) {
           cfg.model_proposer_json.clear();
           return absl::OkStatus();
         }
         if (!v.is_object())
           return bad(key, "must be an object (see agent/model_proposer.h) or null (off)");
         cfg.model_proposer_json = v.dump();
         return absl::OkStatus();
       }},
      {"log_level",
       [bad, &cfg](const std::string& key, const json& v) -> absl::Status {
         static const std::set<std::string> kLevels = {"trace", "debug", "info", "warn", "error", "off"};
         if (!v.is_string() || !kLevels.count(v.get<std::string>()))
           return bad(key, fmt::format("must be one of trace, debug, info, warn, error, off; got {}", Excerpt(v.dump())));
         cfg.log_level = v.get<std::string>();
         return absl::OkStatus();
       }},
  };
}

}  // namespace

std::vector<std::string> ConfigKeys() {
  ServerConfig scratch;
  std::vector<std::string> out;
  for (const auto& [key, setter] : KeyTable("", scratch)) out.push_back(key);
  return out;
}

absl::Status ApplyConfigFile(const std::string& path, ServerConfig& cfg) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(fmt::format("config {}: cannot open the file", path));
  std::stringstream buf;
  buf << in.rdbuf();
  json j;
  try {
    // Comments are allowed: a configuration says why as well as what.
    j = json::parse(buf.str(), /*cb=*/nullptr, /*allow_exceptions=*/true,
                    /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    // The parser quotes what it last read, which may be a token: a little only.
    return absl::InvalidArgumentError(
        fmt::format("config {}: not valid JSON: {}", path, Excerpt(e.what(), 160)));
  }
  if (!j.is_object()) return absl::InvalidArgumentError(fmt::format("config {}: must be a JSON object", path));
  const std::map<std::string, Setter> keys = KeyTable(path, cfg);
  for (auto it = j.begin(); it != j.end(); ++it) {
    auto k = keys.find(it.key());
    if (k == keys.end())
      return absl::InvalidArgumentError(
          fmt::format("config {}: {}: unknown key", path, Excerpt(it.key())));
    if (absl::Status s = k->second(it.key(), it.value()); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ApplyModelConfigFile(const std::string& path, ServerConfig& cfg) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(fmt::format("--model-config {}: cannot open the file", path));
  std::stringstream buf;
  buf << in.rdbuf();
  const json j = json::parse(buf.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return absl::InvalidArgumentError(fmt::format("--model-config {}: not valid JSON", path));
  if (!j.is_object())
    return absl::InvalidArgumentError(fmt::format(
        "--model-config {}: must be a JSON object (the keys of agent/model_proposer.h)", path));
  cfg.model_proposer_json = j.dump();
  return absl::OkStatus();
}

void ApplyEnvironment(ServerConfig& cfg) {
  for (auto& t : SplitList(std::getenv("KFORGE_CLIENT_TOKEN"))) cfg.server.client_tokens.push_back(t);
  for (auto& t : SplitList(std::getenv("KFORGE_WORKER_TOKEN"))) cfg.server.worker_tokens.push_back(t);
  for (auto& t : SplitList(std::getenv("KFORGE_VIEWER_TOKEN"))) cfg.viewer_tokens.push_back(t);
}

namespace {

// A file of tokens: one entry a line, surrounding whitespace dropped, blank
// lines and '#' comments skipped. Errors name `what` and the file, and the
// line, never the text of an entry.
absl::StatusOr<std::vector<std::string>> ReadTokenList(const std::string& path,
                                                       std::string_view what) {
  std::ifstream in(path);
  if (!in)
    return absl::NotFoundError(
        fmt::format("{} {}: cannot open the file: {}", what, path, std::strerror(errno)));
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    const size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] == '#') continue;
    const size_t e = line.find_last_not_of(" \t\r");
    out.push_back(line.substr(b, e - b + 1));
  }
  if (out.empty())
    return absl::InvalidArgumentError(
        fmt::format("{} {}: the file has no token (one a line; '#' starts a comment)", what, path));
  return out;
}

// Secrets in a file that every user can read are not secret. Group access
// is allowed: it is how a service user is given a file root owns (a
// Kubernetes Secret volume with fsGroup, an ssl-cert group).
void WarnIfReadableByOthers(const std::string& path, std::string_view what,
                            std::vector<std::string>& warnings) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || (st.st_mode & 007) == 0) return;
  warnings.push_back(fmt::format("{} {} is open to other users (mode {:03o}); chmod o= it",
                                 what, path, st.st_mode & 0777));
}

// The certificate and key must be a pair, and the certificate current: gRPC
// would only tell each client that its handshake failed.
absl::Status CheckCertificateAndKey(const ServerConfig& cfg) {
  auto bio_of = [](const std::string& pem) {
    return std::unique_ptr<BIO, decltype(&BIO_free)>(
        BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
  };
  auto cert_bio = bio_of(cfg.server.tls_cert_pem);
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr), &X509_free);
  if (!cert)
    return absl::InvalidArgumentError(fmt::format(
        "tls_cert_file {}: holds no PEM certificate that OpenSSL can read", cfg.tls_cert_file));
  auto key_bio = bio_of(cfg.server.tls_key_pem);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr), &EVP_PKEY_free);
  if (!key)
    return absl::InvalidArgumentError(fmt::format(
        "tls_key_file {}: holds no unencrypted PEM private key that OpenSSL can read",
        cfg.tls_key_file));
  if (X509_check_private_key(cert.get(), key.get()) != 1)
    return absl::InvalidArgumentError(
        fmt::format("tls_key_file {} is not the key of tls_cert_file {}", cfg.tls_key_file,
                    cfg.tls_cert_file));
  ERR_clear_error();
  if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0)
    return absl::FailedPreconditionError(fmt::format(
        "tls_cert_file {}: the certificate has expired; renew it", cfg.tls_cert_file));
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadConfigFiles(ServerConfig& cfg) {
  struct TokenFile {
    const std::string& path;
    std::string_view what;
    std::vector<std::string>& into;
  };
  for (const TokenFile& f : {TokenFile{cfg.client_tokens_file, "client_tokens_file",
                                       cfg.server.client_tokens},
                             TokenFile{cfg.worker_tokens_file, "worker_tokens_file",
                                       cfg.server.worker_tokens},
                             TokenFile{cfg.viewer_tokens_file, "viewer_tokens_file",
                                       cfg.viewer_tokens}}) {
    if (f.path.empty()) continue;
    absl::StatusOr<std::vector<std::string>> tokens = ReadTokenList(f.path, f.what);
    if (!tokens.ok()) return tokens.status();
    WarnIfReadableByOthers(f.path, f.what, cfg.warnings);
    f.into.insert(f.into.end(), tokens->begin(), tokens->end());
  }
  if (cfg.tls_cert_file.empty() != cfg.tls_key_file.empty())
    return absl::InvalidArgumentError(
        "tls_cert_file and tls_key_file (--tls-cert, --tls-key) go together: a certificate "
        "needs its key");
  if (!cfg.tls_client_ca_file.empty() && cfg.tls_cert_file.empty())
    return absl::InvalidArgumentError(
        "tls_client_ca_file (--tls-client-ca) needs tls_cert_file and tls_key_file: client "
        "certificates are checked inside TLS");
  if (!cfg.tls_cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadPemFile(cfg.tls_cert_file, "tls_cert_file");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPemFile(cfg.tls_key_file, "tls_key_file");
    if (!key.ok()) return key.status();
    WarnIfReadableByOthers(cfg.tls_key_file, "tls_key_file", cfg.warnings);
    cfg.server.tls_cert_pem = *std::move(cert);
    cfg.server.tls_key_pem = *std::move(key);
    if (absl::Status s = CheckCertificateAndKey(cfg); !s.ok()) return s;
  }
  if (!cfg.tls_client_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadPemFile(cfg.tls_client_ca_file, "tls_client_ca_file");
    if (!ca.ok()) return ca.status();
    cfg.server.tls_client_ca_pem = *std::move(ca);
  }
  return absl::OkStatus();
}

absl::Status ValidateConfig(const ServerConfig& cfg) {
  const auto& api = cfg.server.api;
  if (api.heartbeat_interval_ms * 2 > api.lease_ttl_ms)
    return absl::InvalidArgumentError(fmt::format(
        "heartbeat_interval_ms ({}) must be at most half of lease_ttl_ms ({}), or leases "
        "expire between heartbeats",
        api.heartbeat_interval_ms, api.lease_ttl_ms));
  if (cfg.server.listen_address.find(':') == std::string::npos)
    return absl::InvalidArgumentError(
        fmt::format("listen: '{}' is not host:port", cfg.server.listen_address));
  if (cfg.log_format != "text" && cfg.log_format != "json")
    return absl::InvalidArgumentError(
        fmt::format("log_format: '{}' is not text or json", cfg.log_format));
  if (absl::Status s = CheckAuthConfig(cfg.server); !s.ok()) return s;
  // The dashboard is plain HTTP on the gRPC listen host, and its callers
  // send bearer tokens: the transport rule applies to it as well.
  if (cfg.http_port > 0 && !cfg.server.allow_plaintext &&
      !IsLoopbackAddress(cfg.server.listen_address))
    return absl::FailedPreconditionError(fmt::format(
        "http_port: the dashboard serves plain HTTP on the host of {}, which is not loopback; "
        "pass --allow-plaintext (allow_plaintext) if a TLS proxy sits in front of it, or serve "
        "it on loopback only",
        cfg.server.listen_address));
  // A viewer token opens only the read-only dashboard: one that is also a
  // worker token would let a worker host read it, and the other way round.
  absl::StatusOr<std::vector<WorkerCredential>> workers =
      ParseWorkerTokens(cfg.server.worker_tokens, "worker tokens");
  for (size_t i = 0; i < cfg.viewer_tokens.size(); ++i) {
    const std::string& v = cfg.viewer_tokens[i];
    if (absl::Status s = CheckToken(v, fmt::format("viewer tokens[{}]", i)); !s.ok()) return s;
    if (workers.ok())
      for (const WorkerCredential& w : *workers)
        if (w.token == v)
          return absl::InvalidArgumentError(fmt::format(
              "a token is configured as both a viewer and a worker token (worker '{}'); use "
              "distinct tokens",
              w.principal));
  }
  return absl::OkStatus();
}

}  // namespace kforge::server
