// EvaluateInChild for builds without worker/eval (kforge_eval): every
// evaluation ends in a fault naming what is missing, so the parent reports
// the candidate as crashed with a clear reason instead of pretending.
#include "worker/child.h"

namespace kforge::worker {

absl::StatusOr<ChildReport> EvaluateInChild(const ChildRequest&, const ReferenceCallback&) {
  return absl::UnimplementedError(
      "this kforge-worker was built without the evaluator (worker/eval): cannot run kernels");
}

}  // namespace kforge::worker
