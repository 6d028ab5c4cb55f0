#include "core/logging.h"

#include <gtest/gtest.h>

#include <sstream>

#include <spdlog/sinks/ostream_sink.h>

namespace kforge {
namespace {

using nlohmann::json;

TEST(JsonLogLine, APlainMessageHasTimeLevelProcessThreadAndText) {
  const json j = json::parse(JsonLogLine(1764598511123, "info", 41, 42, "listening on \"x\""));
  EXPECT_EQ(j["ts"], "2025-12-01T14:15:11.123Z");
  EXPECT_EQ(j["level"], "info");
  EXPECT_EQ(j["pid"], 41);
  EXPECT_EQ(j["thread"], 42);
  EXPECT_EQ(j["msg"], "listening on \"x\"");
  EXPECT_FALSE(j.contains("event"));
}

TEST(JsonLogLine, EventFieldsFollowTheMessageAndCannotReplaceKforgesOwn) {
  const std::string payload =
      "job j3 submitted\x1e{\"event\":\"job_submitted\",\"job\":\"j3\",\"buckets\":2,"
      "\"level\":\"fake\",\"msg\":\"fake\"}";
  const std::string line = JsonLogLine(0, "info", 1, 2, payload);
  const json j = json::parse(line);
  EXPECT_EQ(j["msg"], "job j3 submitted");
  EXPECT_EQ(j["event"], "job_submitted");
  EXPECT_EQ(j["job"], "j3");
  EXPECT_EQ(j["buckets"], 2);
  EXPECT_EQ(j["level"], "info");
  EXPECT_LT(line.find("\"msg\""), line.find("\"event\"")) << line;
}

TEST(JsonLogLine, AMessageThatOnlyLooksLikeItHasFieldsIsKeptWhole) {
  const json j = json::parse(JsonLogLine(0, "warn", 1, 2, "odd\x1enot json"));
  EXPECT_EQ(j["msg"], "odd\x1enot json");
}

TEST(JsonLogLine, BytesThatAreNotUtf8StillMakeValidJson) {
  const std::string line = JsonLogLine(0, "error", 1, 2, "compile log \xff\xfe");
  const json j = json::parse(line);
  EXPECT_EQ(j["msg"].get<std::string>().substr(0, 12), "compile log ");
}

class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    previous_ = spdlog::default_logger();
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", sink));
  }
  void TearDown() override {
    spdlog::set_default_logger(previous_);
    (void)ConfigureLogging("text", "info");
  }
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

TEST_F(LoggingTest, JsonModeWritesOneObjectALineWithTheEventsFields) {
  ASSERT_TRUE(ConfigureLogging("json", "info").ok());
  spdlog::info("plain {}", 1);
  LogEvent(spdlog::level::warn, "worker_left", {{"worker", "w2"}, {"silent_s", 61}},
           "worker w2 left");
  spdlog::debug("not at info");
  std::istringstream lines(out_.str());
  std::string a, b, c;
  ASSERT_TRUE(std::getline(lines, a));
  ASSERT_TRUE(std::getline(lines, b));
  EXPECT_FALSE(std::getline(lines, c)) << c;
  EXPECT_EQ(json::parse(a)["msg"], "plain 1");
  const json ev = json::parse(b);
  EXPECT_EQ(ev["level"], "warning");
  EXPECT_EQ(ev["event"], "worker_left");
  EXPECT_EQ(ev["worker"], "w2");
  EXPECT_EQ(ev["silent_s"], 61);
}

TEST_F(LoggingTest, TextModePrintsTheEventsTextWithoutItsFields) {
  ASSERT_TRUE(ConfigureLogging("text", "info", "[%l] %v").ok());
  LogEvent(spdlog::level::info, "job_submitted", {{"job", "j1"}}, "job j1 submitted");
  EXPECT_EQ(out_.str(), "[info] job j1 submitted\n");
}

TEST_F(LoggingTest, AnUnknownFormatOrLevelIsAnErrorNamingTheFlag) {
  absl::Status s = ConfigureLogging("xml", "info");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--log-format: 'xml'"), std::string::npos) << s;
  s = ConfigureLogging("json", "loud");
  EXPECT_NE(s.message().find("--log-level: 'loud'"), std::string::npos) << s;
}

}  // namespace
}  // namespace kforge
