// Every kernel of the bad-kernel corpus passes the worker's static source
// check: the corpus tests what the evaluator catches, so none of its kernels
// may be stopped earlier by the check (compile_error.cu fails in NVRTC).
#include <gtest/gtest.h>

#include "kernels/source_check.h"
#include "tests/bad_kernels/corpus.h"

namespace kforge {
namespace {

TEST(CorpusCheck, EveryCorpusKernelPassesTheSourceCheck) {
  ASSERT_FALSE(bad_kernels::Files().empty());
  for (const bad_kernels::CorpusFile& f : bad_kernels::Files()) {
    absl::Status s = CheckSource(f.source);
    EXPECT_TRUE(s.ok()) << f.name << ": " << s.message();
  }
}

}  // namespace
}  // namespace kforge
