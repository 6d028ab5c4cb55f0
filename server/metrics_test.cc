#include "server/metrics.h"

#include <gtest/gtest.h>

#include <atomic>

namespace kforge::server {
namespace {

TEST(Histogram, CountsAreCumulativeAndTheOverflowCountsInTheTotalOnly) {
  Histogram h({1, 5, 10});
  for (double v : {0.5, 1.0, 3.0, 7.0, 50.0}) h.Observe(v);
  EXPECT_EQ(h.counts, (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_EQ(h.count, 5u);
  EXPECT_DOUBLE_EQ(h.sum, 61.5);
}

TEST(ServerMetrics, RpcsAreKeyedByMethodWithoutTheSlashAndByCodeName) {
  ServerMetrics m;
  m.RecordRpc("/kforge.v1.KernelService/GetJob", 5, 0.002);
  m.RecordRpc("/kforge.v1.KernelService/GetJob", 5, 0.004);
  m.RecordRpc("/kforge.v1.KernelService/GetJob", 0, 0.001);
  m.RecordRpc("/x.Y/Z", 99, 0.001);  // no such code
  const MetricsSnapshot s = m.Snapshot();
  ASSERT_EQ(s.rpcs.size(), 3u);
  const Histogram& nf = s.rpcs.at(RpcKey{"kforge.v1.KernelService/GetJob", "NOT_FOUND"});
  EXPECT_EQ(nf.count, 2u);
  EXPECT_DOUBLE_EQ(nf.sum, 0.006);
  EXPECT_EQ(nf.bounds, RpcLatencyBounds());
  EXPECT_EQ(s.rpcs.at(RpcKey{"kforge.v1.KernelService/GetJob", "OK"}).count, 1u);
  EXPECT_EQ(s.rpcs.count(RpcKey{"x.Y/Z", "UNKNOWN"}), 1u);
}

TEST(ServerMetrics, VerifiedVariantsAMinuteCountDistinctVariantsOfTheLastSixtySeconds) {
  std::atomic<int64_t> now{1'000'000};
  ServerMetrics m([&] { return now.load(); });
  m.RecordEvaluation(TaskKind::kEvaluate, Outcome::kVerified, 800, "v1");
  m.RecordEvaluation(TaskKind::kConfirm, Outcome::kVerified, 0, "v1");  // the same variant
  m.RecordEvaluation(TaskKind::kEvaluate, Outcome::kWrong, 900, "v2");
  now += 30'000;
  m.RecordEvaluation(TaskKind::kEvaluate, Outcome::kVerified, 700, "v3");
  MetricsSnapshot s = m.Snapshot();
  EXPECT_EQ(s.verified_last_minute, 2);
  EXPECT_EQ((s.evaluations[{TaskKind::kEvaluate, Outcome::kVerified}]), 2u);
  EXPECT_EQ((s.evaluations[{TaskKind::kConfirm, Outcome::kVerified}]), 1u);
  EXPECT_EQ((s.evaluations[{TaskKind::kEvaluate, Outcome::kWrong}]), 1u);
  EXPECT_EQ(s.compile_seconds.count, 3u) << "a result without a compile time is not observed";
  EXPECT_DOUBLE_EQ(s.compile_seconds.sum, 2.4);
  now += 31'000;
  EXPECT_EQ(m.Snapshot().verified_last_minute, 1) << "v1 is older than a minute now";
  now += 60'000;
  EXPECT_EQ(m.Snapshot().verified_last_minute, 0);
  EXPECT_EQ(m.Snapshot().started_unix_ms, 1'000'000);
}

TEST(ServerMetrics, LeasesPromotionsAndGivenUpTasksAreCounted) {
  ServerMetrics m;
  m.RecordLeasesExpired(3);
  m.RecordLeasesExpired(0);
  m.RecordPromotion();
  m.RecordGivenUp();
  const MetricsSnapshot s = m.Snapshot();
  EXPECT_EQ(s.leases_expired, 3u);
  EXPECT_EQ(s.promotions, 1u);
  EXPECT_EQ(s.tasks_given_up, 1u);
}

}  // namespace
}  // namespace kforge::server
