// Each in-process-safe corpus kernel, evaluated on the GPU, gets the outcome
// expected.json names. Crash and hang kernels are left to the sandbox tests
// (worker), since they kill or stall the process that runs them.
#include <gtest/gtest.h>

#include "core/outcome.h"
#include "fmt/format.h"
#include "gpu/compile.h"
#include "kernels/manifest.h"
#include "tests/bad_kernels/corpus.h"
#include "worker/eval/eval.h"

namespace kforge::bad_kernels {
namespace {

class BadKernels : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<gpu::Driver>> d = gpu::Driver::Load();
    if (!d.ok()) {
      skip_reason_ = std::string(d.status().message());
      return;
    }
    driver_ = d->release();
    absl::StatusOr<std::unique_ptr<eval::Evaluator>> e = eval::Evaluator::Create(*driver_);
    if (!e.ok()) {
      skip_reason_ = fmt::format("evaluator: {}", std::string(e.status().message()));
      return;
    }
    evaluator_ = e->release();
  }
  void SetUp() override {
    if (evaluator_ == nullptr) GTEST_SKIP() << skip_reason_;
  }
  static gpu::Driver* driver_;
  static eval::Evaluator* evaluator_;
  static std::string skip_reason_;
};

gpu::Driver* BadKernels::driver_ = nullptr;
eval::Evaluator* BadKernels::evaluator_ = nullptr;
std::string BadKernels::skip_reason_;

TEST_F(BadKernels, EachInProcessKernelGetsItsExpectedOutcome) {
  nlohmann::json expected = nlohmann::json::parse(ExpectedJson());
  uint64_t seed = 1000;
  for (const auto& k : expected.at("kernels")) {
    if (!k.at("in_process").get<bool>()) continue;
    const std::string file = k.at("file").get<std::string>();
    SCOPED_TRACE(file);
    const nlohmann::json& shape_json = k.contains("shape") ? k["shape"] : expected["shape"];
    const nlohmann::json& manifest_json =
        k.contains("manifest") ? k["manifest"] : expected["manifest"];
    absl::StatusOr<Manifest> manifest = ParseManifest(manifest_json.dump());
    ASSERT_TRUE(manifest.ok()) << manifest.status();

    eval::EvalRequest req;
    req.shape = ShapeFromJson(shape_json);
    req.shape.arch = evaluator_->device().arch;
    req.seed = ++seed;
    req.candidate.source = Source(file);  // Evaluate compiles it for the device
    req.candidate.manifest = *manifest;
    req.options.iterations = 5;
    double reference_ms = -1;
    absl::StatusOr<eval::EvalResult> r = evaluator_->Evaluate(
        req, [&](double ms, int launches) {
          reference_ms = ms;
          EXPECT_GT(launches, 0);
        });
    ASSERT_TRUE(r.ok()) << r.status();
    const std::string want = k.at("expected").get<std::string>();
    EXPECT_EQ(OutcomeName(r->outcome), want) << r->message << "\n" << r->errors.detail;
    std::cout << fmt::format("{:22} {:14} {}\n", file, OutcomeName(r->outcome), r->message);
    ASSERT_FALSE(r->context_lost);
    if (want != "compile_error") EXPECT_GE(reference_ms, 0);
    if (want == "verified") {
      ASSERT_TRUE(r->timing.has_value());
      EXPECT_GT(r->timing->median_us, 0);
      // The count is drawn per evaluation: the nominal 5 up to half again.
      EXPECT_GE(r->timing->samples, 5);
      EXPECT_LE(r->timing->samples, 7);
      ASSERT_TRUE(r->verified.has_value());
      EXPECT_TRUE(ExtentCovers(*r->verified, req.shape));
    }
    if (want == "wrong") {
      EXPECT_FALSE(r->errors.detail.empty());
      // Feedback says what was wrong, never which launch or problem.
      for (const char* schedule_word : {"launch ", "timed", "check ", "problem", "B="}) {
        EXPECT_EQ(r->message.find(schedule_word), std::string::npos)
            << "'" << schedule_word << "' in: " << r->message;
      }
      EXPECT_FALSE(r->operator_note.empty());
    }

    // The promotion-strength evaluation (no sanitizer in-process): more
    // checks and the bucket's corner. A kernel that faults there is left to
    // the sandboxed worker test: a fault ends this process's context.
    if (want != "verified" || k.contains("gate") || k.value("promoted", want) == "crashed") continue;
    req.options.promotion = true;
    req.seed = ++seed;
    absl::StatusOr<eval::EvalResult> p = evaluator_->Evaluate(req);
    ASSERT_TRUE(p.ok()) << p.status();
    const std::string promoted = k.value("promoted", want);
    EXPECT_EQ(OutcomeName(p->outcome), promoted) << p->message;
    std::cout << fmt::format("{:22} {:14} (promotion) {}\n", file, OutcomeName(p->outcome),
                             p->message);
    if (promoted == "verified") {
      ASSERT_TRUE(p->verified.has_value());
      EXPECT_TRUE(ExtentCovers(*p->verified, req.shape));
    }
  }
}

}  // namespace
}  // namespace kforge::bad_kernels
