// An out-of-bounds kernel evaluated in-process ends as a `crashed` result with
// context_lost set, not as an error or a dead test process. Its own binary:
// the CUDA context is unusable afterwards. (The sandbox's tests run the
// crash and hang kernels in a child, as production does.)
#include <gtest/gtest.h>

#include "core/outcome.h"
#include "kernels/manifest.h"
#include "tests/bad_kernels/corpus.h"
#include "worker/eval/eval.h"

namespace kforge::bad_kernels {
namespace {

TEST(BadKernelCrash, OutOfBoundsWriteIsACrashedResultAndLosesTheContext) {
  absl::StatusOr<std::unique_ptr<gpu::Driver>> driver = gpu::Driver::Load();
  if (!driver.ok()) GTEST_SKIP() << driver.status().message();
  absl::StatusOr<std::unique_ptr<eval::Evaluator>> evaluator = eval::Evaluator::Create(**driver);
  ASSERT_TRUE(evaluator.ok()) << evaluator.status();
  nlohmann::json expected = nlohmann::json::parse(ExpectedJson());
  eval::EvalRequest req;
  req.shape = ShapeFromJson(expected["shape"]);
  req.seed = 3;
  req.candidate.source = Source("oob_write.cu");
  req.candidate.manifest = *ParseManifest(expected["manifest"].dump());
  absl::StatusOr<eval::EvalResult> r = (*evaluator)->Evaluate(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, Outcome::kCrashed) << r->message;
  EXPECT_TRUE(r->context_lost);
  EXPECT_NE(r->message.find("CUDA_ERROR"), std::string::npos) << r->message;
  std::cout << r->message << "\n";
  // The evaluator is deliberately leaked: tearing down a faulted context can abort.
  evaluator->release();
  driver->release();
}

}  // namespace
}  // namespace kforge::bad_kernels
