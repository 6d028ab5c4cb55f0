#include "core/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <memory>

#include <fmt/format.h>
#include <spdlog/formatter.h>

namespace kforge {
namespace {

// In JSON mode LogEvent appends its fields to the message after this
// separator (ASCII record separator): spdlog carries one string, and the
// JSON formatter splits it off again.
constexpr char kFieldsMark = '\x1e';

struct Split {
  std::string_view text;
  std::string_view fields;  // JSON object text, or empty
};

Split SplitPayload(std::string_view payload) {
  const size_t mark = payload.rfind(kFieldsMark);
  if (mark == std::string_view::npos) return {payload, {}};
  return {payload.substr(0, mark), payload.substr(mark + 1)};
}

std::string Rfc3339Ms(int64_t unix_ms) {
  const std::time_t secs = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     static_cast<int>(unix_ms % 1000));
}

// Set by ConfigureLogging: only JSON mode carries an event's fields, so a
// process that never configured logging (a test) prints the text alone.
std::atomic<bool> json_mode{false};

class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                           msg.time.time_since_epoch())
                           .count();
    const auto level = spdlog::level::to_string_view(msg.level);
    const std::string line =
        JsonLogLine(ms, std::string_view(level.data(), level.size()), pid_, msg.thread_id,
                    std::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(line.data(), line.data() + line.size());
    dest.push_back('\n');
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }

 private:
  const int pid_ = static_cast<int>(getpid());
};

}  // namespace

std::string JsonLogLine(int64_t unix_ms, std::string_view level, int pid, size_t thread,
                        std::string_view payload) {
  const Split s = SplitPayload(payload);
  nlohmann::ordered_json j;
  j["ts"] = Rfc3339Ms(unix_ms);
  j["level"] = level;
  j["pid"] = pid;
  j["thread"] = thread;
  j["msg"] = s.text;
  if (!s.fields.empty()) {
    const nlohmann::ordered_json fields = nlohmann::ordered_json::parse(s.fields, nullptr, false);
    if (fields.is_object()) {
      for (auto it = fields.begin(); it != fields.end(); ++it)
        if (!j.contains(it.key())) j[it.key()] = it.value();
    } else {
      // A message that happened to contain the mark: keep all of it.
      j["msg"] = payload;
    }
  }
  // Messages carry worker-reported text, which need not be UTF-8.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

absl::Status ConfigureLogging(std::string_view format, std::string_view level,
                              const std::string& text_pattern) {
  static constexpr std::string_view kLevels[] = {"trace", "debug", "info", "warn",
                                                 "error", "critical", "off"};
  bool known = false;
  for (std::string_view l : kLevels) known |= l == level;
  if (!known)
    return absl::InvalidArgumentError(fmt::format(
        "--log-level: '{}' is not trace, debug, info, warn, error or off", level));
  if (format == "json") {
    spdlog::set_formatter(std::make_unique<JsonFormatter>());
    json_mode = true;
  } else if (format == "text") {
    spdlog::set_pattern(text_pattern);
    json_mode = false;
  } else {
    return absl::InvalidArgumentError(
        fmt::format("--log-format: '{}' is not text or json", format));
  }
  spdlog::set_level(spdlog::level::from_str(std::string(level)));
  return absl::OkStatus();
}

void LogEvent(spdlog::level::level_enum level, std::string_view event,
              const nlohmann::json& fields, std::string_view text) {
  if (!spdlog::should_log(level)) return;
  if (!json_mode) {
    spdlog::log(level, "{}", text);
    return;
  }
  nlohmann::ordered_json f;
  f["event"] = event;
  if (fields.is_object())
    for (auto it = fields.begin(); it != fields.end(); ++it)
      if (it.key() != "event") f[it.key()] = it.value();
  spdlog::log(level, "{}{}{}", text, kFieldsMark,
              f.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

}  // namespace kforge
