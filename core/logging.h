// Log output of kforge's binaries: spdlog's default logger, as text for
// people or as JSON lines for log pipelines (`--log-format json`).
//
// JSON mode writes one object a line:
//   {"ts":"2026-12-01T14:25:11.123Z","level":"info","pid":41,"thread":42,
//    "msg":"job j3 submitted: ...","event":"job_submitted","job":"j3",...}
// where "event" and the fields after it come from LogEvent; plain spdlog
// calls give ts, level, pid, thread and msg. Text mode (and a process that
// never called ConfigureLogging) prints the message alone, as before.
//
// Events are the things operators alert on and count (a job submitted or
// finished, a promotion, a worker joining or leaving): their fields are
// machine-readable so that no one parses the English of `text`.
//
// Thread-safe once configured; ConfigureLogging itself runs in main()
// before other threads start.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "absl/status/status.h"

namespace kforge {

// `format`: "text" or "json"; `level`: trace|debug|info|warn|error|off;
// `text_pattern`: spdlog's pattern for text mode. INVALID_ARGUMENT naming
// the flag for anything else.
absl::Status ConfigureLogging(std::string_view format, std::string_view level,
                              const std::string& text_pattern = "[%Y-%m-%d %H:%M:%S.%e] [%l] %v");

// Logs `text` at `level`, with `event` and `fields` (an object; other values
// are ignored) as JSON fields in JSON mode. Field names "ts", "level",
// "pid", "thread", "msg" and "event" are kforge's: fields of those names
// are dropped.
void LogEvent(spdlog::level::level_enum level, std::string_view event,
              const nlohmann::json& fields, std::string_view text);

// The JSON line a message is written as (without the newline); exposed for
// tests. `payload` is what spdlog was handed.
std::string JsonLogLine(int64_t unix_ms, std::string_view level, int pid, size_t thread,
                        std::string_view payload);

}  // namespace kforge
