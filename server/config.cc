#include "server/config.h"

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "server/auth.h"

namespace kforge::server {
namespace {

using nlohmann::json;

// Tokens in a config file: long enough that guessing is hopeless.
constexpr size_t kMinTokenLength = 16;

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

}  // namespace

absl::Status ApplyConfigFile(const std::string& path, ServerConfig& cfg) {
  auto bad = [&](std::string_view key, std::string_view why) {
    return absl::InvalidArgumentError(fmt::format("config {}: {}: {}", path, key, why));
  };
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(fmt::format("config {}: cannot open the file", path));
  std::stringstream buf;
  buf << in.rdbuf();
  json j;
  try {
    j = json::parse(buf.str());
  } catch (const json::parse_error& e) {
    return absl::InvalidArgumentError(fmt::format("config {}: not valid JSON: {}", path, e.what()));
  }
  if (!j.is_object()) return absl::InvalidArgumentError(fmt::format("config {}: must be a JSON object", path));

  using Setter = std::function<absl::Status(const std::string&, const json&)>;
  auto int_key = [&](int64_t lo, int64_t hi, auto& field) -> Setter {
    return [&, lo, hi](const std::string& key, const json& v) -> absl::Status {
      if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
        return bad(key, fmt::format("must be an integer in [{}, {}], got {}", lo, hi, v.dump()));
      field = static_cast<std::remove_reference_t<decltype(field)>>(v.get<int64_t>());
      return absl::OkStatus();
    };
  };
  auto string_key = [&](std::string& field) -> Setter {
    return [&](const std::string& key, const json& v) -> absl::Status {
      if (!v.is_string() || v.get<std::string>().empty())
        return bad(key, fmt::format("must be a non-empty string, got {}", v.dump()));
      field = v.get<std::string>();
      return absl::OkStatus();
    };
  };
  auto tokens_key = [&](std::vector<std::string>& field) -> Setter {
    return [&](const std::string& key, const json& v) -> absl::Status {
      if (!v.is_array()) return bad(key, "must be an array of strings");
      std::vector<std::string> out;
      for (size_t i = 0; i < v.size(); ++i) {
        if (!v[i].is_string() || v[i].get<std::string>().empty())
          return bad(fmt::format("{}[{}]", key, i), "must be a non-empty string");
        if (v[i].get<std::string>().size() < kMinTokenLength)
          return bad(fmt::format("{}[{}]", key, i),
                     fmt::format("is shorter than {} characters; use a long random token",
                                 kMinTokenLength));
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
    return [&](const std::string& key, const json& v) -> absl::Status {
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
                                   name.substr(0, 64)));
          out.push_back(name + ":" + v[i]["token"].get<std::string>());
        } else {
          return bad(at, "must be a \"token\" or \"name:token\" string or a {\"name\", "
                         "\"token\"} object");
        }
      }
      if (absl::StatusOr<std::vector<WorkerCredential>> c =
              ParseWorkerTokens(out, key, kMinTokenLength);
          !c.ok())
        return absl::InvalidArgumentError(
            fmt::format("config {}: {}", path, std::string(c.status().message())));
      field = std::move(out);
      return absl::OkStatus();
    };
  };
  auto bool_key = [&](bool& field) -> Setter {
    return [&](const std::string& key, const json& v) -> absl::Status {
      if (!v.is_boolean()) return bad(key, fmt::format("must be true or false, got {}", v.dump()));
      field = v.get<bool>();
      return absl::OkStatus();
    };
  };
  constexpr int64_t kDay = 24 * 3600 * 1000;
  std::map<std::string, Setter> keys = {
      {"listen", string_key(cfg.server.listen_address)},
      {"database", string_key(cfg.database)},
      {"anchors_file", string_key(cfg.anchors_file)},
      {"client_tokens", tokens_key(cfg.server.client_tokens)},
      {"viewer_tokens", tokens_key(cfg.viewer_tokens)},
      {"worker_tokens", worker_tokens_key(cfg.server.worker_tokens)},
      {"insecure_no_auth", bool_key(cfg.server.insecure_no_auth)},
      {"allow_ungated_promotion", bool_key(cfg.server.api.allow_ungated_promotion)},
      {"confirm_on_another_worker", bool_key(cfg.server.api.confirm_on_another_worker)},
      {"require_distinct_confirmer", bool_key(cfg.server.api.require_distinct_confirmer)},
      {"lease_ttl_ms", int_key(100, kDay, cfg.server.api.lease_ttl_ms)},
      {"heartbeat_interval_ms", int_key(10, 3600 * 1000, cfg.server.api.heartbeat_interval_ms)},
      {"max_lease_wait_ms", int_key(0, 600 * 1000, cfg.server.api.max_lease_wait_ms)},
      {"max_task_attempts", int_key(1, 1000, cfg.server.api.max_task_attempts)},
      {"reaper_interval_ms", int_key(10, 3600 * 1000, cfg.server.reaper_interval_ms)},
      {"shutdown_grace_ms", int_key(0, 600 * 1000, cfg.server.shutdown_grace_ms)},
      {"drain_timeout_ms", int_key(0, 3600 * 1000, cfg.server.drain_timeout_ms)},
      {"http_port", int_key(0, 65535, cfg.http_port)},
      {"stuck_job_timeout_ms", int_key(0, 7 * kDay, cfg.server.engine.stuck_timeout_ms)},
      {"log_format",
       [&](const std::string& key, const json& v) -> absl::Status {
         if (!v.is_string() || (v.get<std::string>() != "text" && v.get<std::string>() != "json"))
           return bad(key, fmt::format("must be \"text\" or \"json\", got {}", v.dump()));
         cfg.log_format = v.get<std::string>();
         return absl::OkStatus();
       }},
      {"tune_max_variants", int_key(1, kMaxVariantsLimit, cfg.server.api.tune_max_variants)},
      {"model_proposer",
       [&](const std::string& key, const json& v) -> absl::Status {
         if (!v.is_object()) return bad(key, "must be an object (see agent/model_proposer.h)");
         cfg.model_proposer_json = v.dump();
         return absl::OkStatus();
       }},
      {"log_level",
       [&](const std::string& key, const json& v) -> absl::Status {
         static const std::set<std::string> kLevels = {"trace", "debug", "info", "warn", "error", "off"};
         if (!v.is_string() || !kLevels.count(v.get<std::string>()))
           return bad(key, fmt::format("must be one of trace, debug, info, warn, error, off; got {}", v.dump()));
         cfg.log_level = v.get<std::string>();
         return absl::OkStatus();
       }},
  };
  for (auto it = j.begin(); it != j.end(); ++it) {
    auto k = keys.find(it.key());
    if (k == keys.end()) return bad(it.key(), "unknown key");
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
  // A viewer token opens only the read-only dashboard: one that is also a
  // worker token would let a worker host read it, and the other way round.
  absl::StatusOr<std::vector<WorkerCredential>> workers =
      ParseWorkerTokens(cfg.server.worker_tokens, "worker tokens");
  for (const std::string& v : cfg.viewer_tokens) {
    if (v.empty()) return absl::InvalidArgumentError("viewer tokens: an entry is empty");
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
