// In-process evaluation of one compiled kernel variant: verify it against the
// GPU reference on fresh random jagged problems, then time it.
//
// What an evaluation does (verification.md says why):
//  1. loads the cubin, finds the manifest's entry point, and refuses an image
//     with writable module-scope device memory (state between launches);
//  2. draws its problems from the task's seed (batches.h): check problems
//     covering every length up to twice the largest tile with varied softmax
//     scales, input magnitudes and (persistent grids) 1-3 CTA grids; for a
//     promotion, twice as many and the bucket's corner; and the timing
//     problem. Inputs are generated on the device, the reference answers
//     computed into buffers the candidate is never given, and both inputs and
//     answers fingerprinted; `on_reference(reference_ms, launches)` is called
//     before the first candidate launch (the sandbox arms its watchdog there);
//  3. launches the candidate in an order drawn from the seed (launches.h):
//     a random number of warm-up and timed launches on the timing problem,
//     with the other problems' launches at random places among them. Before
//     every launch every output is poisoned with NaN and the scratch zeroed;
//     timed launches get the L2 flushed and CUDA events around them;
//  4. checks EVERY launch: every output against the reference with the one
//     tolerance policy (compare.h, TOLERANCE.md), the inputs and the tile
//     list unchanged, the reference's answers unchanged, and (forward) the
//     outputs bit-identical to those of the previous launch on the same
//     problem. There is no launch a kernel could skip work on unseen.
//
// Messages say what was wrong (the output, the error size, where in a
// sequence), never which launch or problem: the schedule is not feedback.
// EvalResult::operator_note has those for the worker's own log.
//
// Backward candidates (shape.op == kBackward) are one launch of the
// manifest's entry point that reads q, k, v, o (bf16, the reference
// forward's output), lse (fp32) and dout, and writes dq, dk, dv (bf16); the
// host zeroes `delta` (heads * total_q fp32) and `dq_accum` (total_q * heads *
// head_dim fp32) before every launch for the kernel's own use.
//
// The candidate is device code only: the host owns allocation, the stream,
// the events and every synchronisation.
//
// A candidate that is wrong or faults is a result (outcome kWrong/kCrashed),
// not an error; absl errors mean the evaluator itself could not work (no
// memory for the batch, the reference failed). After a CUDA fault the
// context is unusable: EvalResult::context_lost says so, and the process
// (the sandbox child) must not launch anything more.
//
// Thread-compatible: one Evaluator per thread; it uses the calling thread's
// current context (Evaluator::Create makes it current).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/outcome.h"
#include "core/shape.h"
#include "core/timing.h"
#include "gpu/compile.h"
#include "gpu/compile_cache.h"
#include "gpu/gpu.h"
#include "kernels/manifest.h"

namespace kforge::eval {

struct Candidate {
  std::string cubin;   // the compiled image; empty: compile `source` for the device
  std::string source;  // used only when cubin is empty
  std::vector<std::string> extra_options;  // NVRTC options beyond the base set
  Manifest manifest;
};

struct EvalOptions {
  int checks = 3;       // check problems (at least 3; twice as many for a promotion)
  int warmup = 3;       // nominal warm-up launches (each evaluation draws within [w-1, w+2])
  int iterations = 20;  // nominal timed launches (each evaluation draws within [n, 3n/2])
  // Retime: the pairs it takes follow this rule's schedule (core/timing.h):
  // a look every rule.look_pairs pairs, stopping at the look that decides,
  // at most rule.max_pairs. The rule decides the comparison too; the server
  // decides again with the rule it stores, the same by default.
  WinRule rule;
  bool flush_l2 = true;  // write a buffer of twice the L2 before every timing-problem launch
  // A kernel about to be served (CONFIRM and RETIME tasks; Retime always):
  // twice the check problems and the bucket's corner (batches.h), so that
  // the extent it is verified at covers its whole bucket.
  bool promotion = false;
  // CheckOnly under racecheck and synccheck, whose cost grows with every
  // tile a launch runs: one check problem holding the awkward lengths (0, 1,
  // around each tile multiple, some drawn at random) instead of every
  // length, run on a persistent kernel's small grid and on the whole GPU's,
  // and a smaller gate problem. memcheck and initcheck, which look
  // at addresses a particular length may reach, keep every length.
  bool sampled_checks = false;
};

struct EvalRequest {
  ShapeKey shape;  // op, head layout, mask, cross, batch statistics
  // Exact timing batch offsets when known (cu_seqlens_k empty: self).
  std::vector<int32_t> cu_seqlens_q;
  std::vector<int32_t> cu_seqlens_k;
  uint64_t seed = 0;
  Candidate candidate;
  EvalOptions options;
};

struct ErrorMetrics {
  double max_abs = 0;
  double rel_l2 = 0;
  std::string worst_output;  // "O", "LSE", "dQ", "dK", "dV"
  std::string detail;        // where the first mismatch was, and why
};

struct EvalResult {
  Outcome outcome = Outcome::kCrashed;
  std::string message;  // one line: why it failed, or a summary
  std::optional<gpu::CompileResult> compile;  // when Evaluate compiled the source
  gpu::KernelAttributes attributes;           // from the loaded kernel
  ErrorMetrics errors;                        // worst output over all checks
  std::optional<Timing> timing;               // kVerified only
  std::optional<Timing> reference_timing;     // one reference launch (all its kernels)
  std::string reference_version;              // reference + tolerance policy + checks
  // kVerified: the largest sizes every problem together checked it at.
  std::optional<SizeExtent> verified;
  // Which problem and launch failed, for the worker's log only: feedback to
  // a proposer must not describe the check schedule.
  std::string operator_note;
  bool context_lost = false;                  // a CUDA fault: stop using this process
};

struct RetimeResult {
  EvalResult candidate;  // kVerified with timing, or why it was not
  EvalResult incumbent;
  // The rule for replacing an incumbent (core/timing.h CompareTimings) on
  // the two timings, whose samples are paired launch by launch; the server
  // decides again with the same rule.
  Comparison comparison;
};

// reference_ms: one reference launch on the timing batch; launches: the
// candidate launches still to come.
using ReferenceCallback = std::function<void(double reference_ms, int launches)>;

class Evaluator {
 public:
  // Opens device `ordinal`'s primary context (current on the calling thread),
  // compiles the reference for it (through `cache` when given: a worker's
  // on-disk cache saves the ~1 s compile in every sandbox child) and
  // allocates the L2 flush buffer. `driver` must outlive the Evaluator;
  // `cache` is only used during Create.
  static absl::StatusOr<std::unique_ptr<Evaluator>> Create(const gpu::Driver& driver,
                                                           int ordinal = 0,
                                                           gpu::CompileCache* cache = nullptr);
  ~Evaluator();

  const gpu::DeviceInfo& device() const;

  absl::StatusOr<EvalResult> Evaluate(const EvalRequest& request,
                                      const ReferenceCallback& on_reference = {});

  // The check problems and the gate problem (the timing batch scaled down,
  // batches.h), each launch checked, nothing timed. For the sanitizer gate,
  // where the sanitizer makes every launch slow and a timing would mean
  // nothing. kVerified (without timing) when every check passes;
  // `on_reference` gets the reference's time on the gate problem.
  absl::StatusOr<EvalResult> CheckOnly(const EvalRequest& request,
                                       const ReferenceCallback& on_reference = {});

  // Both kernels through the same promotion-strength evaluation, every
  // launch of each checked, their timed launches interleaved on the same
  // timing problem (A B B A ...), as many pairs as options.rule's schedule
  // takes to decide.
  absl::StatusOr<RetimeResult> Retime(const EvalRequest& candidate, const Candidate& incumbent,
                                      const ReferenceCallback& on_reference = {});

 private:
  struct Impl;
  explicit Evaluator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// What results record as the reference version:
// "<reference>+<tolerance policy>+<checks>"; a change to any of them means
// stored winners were verified by weaker rules.
std::string ReferenceVersion();


}  // namespace kforge::eval
