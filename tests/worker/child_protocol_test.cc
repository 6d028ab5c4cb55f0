// The JSON spoken between the worker and its evaluator child.
#include "worker/child_protocol.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "worker/task_runner.h"

namespace kforge::worker {
namespace {

ChildRequest SampleRequest() {
  ChildRequest r;
  r.mode = ChildRequest::Mode::kRetime;
  r.gpu_ordinal = 3;
  r.seed = 0xfeedfacecafebeefULL;
  ShapeKey& k = r.shape.key;
  k.op = Op::kForward;
  k.head_dim = 128;
  k.heads = 8;
  k.kv_heads = 2;
  k.causal = true;
  k.cross = true;
  k.arch = "sm_90a";
  k.batch = 2;
  k.max_len_q = 7;
  k.total_q = 10;
  k.max_len_k = 9;
  k.total_k = 12;
  r.shape.cu_seqlens_q = {0, 3, 10};
  r.shape.cu_seqlens_k = {0, 9, 12};
  r.candidate = {"cand", R"({"threads":128})", std::string("\0\1\2binary\xff", 10)};
  r.incumbent = ChildKernel{"inc", R"({"threads":256})", "incumbent-image"};
  r.compile_cache_dir = "/var/cache/kforge/cubins";
  return r;
}

TEST(ChildProtocol, EveryModeRoundTrips) {
  for (ChildRequest::Mode mode : {ChildRequest::Mode::kEvaluate, ChildRequest::Mode::kRetime,
                                  ChildRequest::Mode::kCheck, ChildRequest::Mode::kProbe}) {
    ChildRequest in = SampleRequest();
    in.mode = mode;
    absl::StatusOr<ChildRequest> out = RequestFromJson(RequestToJson(in));
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->mode, mode);
  }
}

TEST(ChildProtocol, RequestDirectoryRoundTripsEveryField) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kforge-proto-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  ChildRequest in = SampleRequest();
  ASSERT_TRUE(WriteRequestDir(dir.string(), in).ok());
  absl::StatusOr<ChildRequest> out = ReadRequestDir(dir.string());
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->mode, ChildRequest::Mode::kRetime);
  EXPECT_EQ(out->gpu_ordinal, 3);
  EXPECT_EQ(out->seed, in.seed);
  EXPECT_EQ(out->shape.key.kv_heads, 2);
  EXPECT_TRUE(out->shape.key.causal);
  EXPECT_TRUE(out->shape.key.cross);
  EXPECT_EQ(out->shape.key.total_k, 12);
  EXPECT_EQ(out->shape.cu_seqlens_q, in.shape.cu_seqlens_q);
  EXPECT_EQ(out->shape.cu_seqlens_k, in.shape.cu_seqlens_k);
  EXPECT_EQ(out->candidate.cubin, in.candidate.cubin);  // binary-safe
  EXPECT_EQ(out->candidate.manifest_json, in.candidate.manifest_json);
  ASSERT_TRUE(out->incumbent.has_value());
  EXPECT_EQ(out->incumbent->cubin, "incumbent-image");
  EXPECT_EQ(out->incumbent->variant_id, "inc");
  EXPECT_EQ(out->compile_cache_dir, "/var/cache/kforge/cubins");
}

TEST(ChildProtocol, RequestOfAnotherVersionIsRejected) {
  std::string json = RequestToJson(SampleRequest());
  json.replace(json.find("\"version\":1"), 11, "\"version\":9");
  absl::StatusOr<ChildRequest> r = RequestFromJson(json);
  EXPECT_FALSE(r.ok());
}

TEST(ChildProtocol, ResultEventRoundTripsAndNaNStaysNaN) {
  ChildReport r;
  r.outcome = Outcome::kWrong;
  r.message = "O differs";
  r.reference_version = "ref-1";
  r.errors = ErrorStats{std::numeric_limits<double>::quiet_NaN(), 0.5, "O", "row 3: NaN"};
  r.timing = Timing{1.5, 1.0, 2.0, 30};
  absl::StatusOr<ChildEvent> e = ParseChildEvent(ResultEventJson(r));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->kind, ChildEvent::Kind::kResult);
  EXPECT_EQ(e->report.outcome, Outcome::kWrong);
  EXPECT_TRUE(std::isnan(e->report.errors->max_abs_error));
  EXPECT_EQ(e->report.errors->rel_l2_error, 0.5);
  EXPECT_EQ(e->report.timing->samples, 30);
  EXPECT_FALSE(e->report.incumbent_timing.has_value());
}

// A RETIME's per-launch samples reach the worker exactly, in launch order:
// the server decides on the pairs and stores them.
TEST(ChildProtocol, RetimeSamplesRoundTripExactly) {
  ChildReport r;
  r.outcome = Outcome::kVerified;
  r.timing = Summarize({1554.8123456789, 1601.25, 1499.0000001});
  r.incumbent_timing = Summarize({1700.7, 1750.3333333333, 1640.1});
  absl::StatusOr<ChildEvent> e = ParseChildEvent(ResultEventJson(r));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->report.timing && e->report.incumbent_timing);
  EXPECT_EQ(e->report.timing->samples_us, r.timing->samples_us);
  EXPECT_EQ(e->report.incumbent_timing->samples_us, r.incumbent_timing->samples_us);
  EXPECT_EQ(e->report.timing->p75_us, r.timing->p75_us);
}

TEST(ChildProtocol, ReferenceAndFaultEvents) {
  absl::StatusOr<ChildEvent> ref = ParseChildEvent(ReferenceEventJson(2.5, 40));
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(ref->kind, ChildEvent::Kind::kReference);
  EXPECT_EQ(ref->reference_ms, 2.5);
  EXPECT_EQ(ref->launches, 40);
  absl::StatusOr<ChildEvent> fault = ParseChildEvent(FaultEventJson("bad \xff bytes"));
  ASSERT_TRUE(fault.ok()) << fault.status();
  EXPECT_EQ(fault->kind, ChildEvent::Kind::kFault);
}

TEST(ChildProtocol, MalformedEventsAreRejectedWithAReason) {
  for (std::string_view bad : {"", "garbage", "[1,2]", R"({"event":"party"})",
                               R"({"event":"result","outcome":"great"})",
                               R"({"event":"reference","reference_ms":-1,"launches":3})",
                               R"({"event":"reference","reference_ms":"x","launches":3})",
                               R"({"noevent":1})"}) {
    absl::StatusOr<ChildEvent> e = ParseChildEvent(bad);
    EXPECT_FALSE(e.ok()) << bad;
    EXPECT_FALSE(e.status().message().empty());
  }
}

TEST(TaskRunnerOptions, SplitsNvrtcOptionsAtWhitespace) {
  EXPECT_EQ(SplitOptions("  -O3\t--use_fast_math \n -DX=1 "),
            (std::vector<std::string>{"-O3", "--use_fast_math", "-DX=1"}));
  EXPECT_TRUE(SplitOptions("   ").empty());
}

}  // namespace
}  // namespace kforge::worker
