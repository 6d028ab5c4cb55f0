// In-process evaluation of one compiled kernel variant: verify it against the
// GPU reference on fresh random jagged batches, then time it.
//
// What Evaluate() does, in order (see verification.md for why):
//  1. loads the cubin and finds the manifest's entry point;
//  2. builds `checks` hostile random batches from the seed (CheckBatch) and
//     the timing batch (TimingBatch), with fresh random inputs for each
//     (generated on the device), and runs the reference on all of them into
//     buffers the candidate is never given, fingerprinting its answers so a
//     candidate that overwrites them fails; times the reference's launch on
//     the timing batch and calls `on_reference(reference_ms, launches)`
//     before the first candidate launch (the sandbox arms its watchdog there);
//  3. per check batch: poisons every output with NaN, restores the inputs,
//     launches, compares every output (O and LSE; dQ, dK, dV) with the one
//     tolerance policy (compare.h, TOLERANCE.md); on the first batch runs the
//     same inputs again and demands bit-identical outputs (forward; backward
//     reports differences, since atomics are allowed there);
//  4. times it on the timing batch on the host's stream with CUDA events:
//     warm-up, L2 flushed and outputs poisoned before every launch (outside
//     the timed region), median/min/max of `iterations`; then checks the
//     output of the LAST timed launch too.
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
  int checks = 3;       // hostile batches verified before timing
  int warmup = 3;       // untimed launches on the timing batch
  int iterations = 20;  // timed launches
  bool flush_l2 = true;  // write a buffer of twice the L2 before every timed launch
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

struct Timing {
  double median_us = 0;
  double min_us = 0;
  double max_us = 0;
  double p25_us = 0;
  double p75_us = 0;
  int samples = 0;
};

struct EvalResult {
  Outcome outcome = Outcome::kCrashed;
  std::string message;  // one line: why it failed, or a summary
  std::optional<gpu::CompileResult> compile;  // when Evaluate compiled the source
  gpu::KernelAttributes attributes;           // from the loaded kernel
  ErrorMetrics errors;                        // worst output over all checks
  std::optional<Timing> timing;               // kVerified only
  std::optional<Timing> reference_timing;     // one reference launch (all its kernels)
  std::string reference_version;              // reference + tolerance policy
  bool context_lost = false;                  // a CUDA fault: stop using this process
};

struct RetimeResult {
  EvalResult candidate;  // kVerified with timing, or why it was not
  EvalResult incumbent;
  // The rule for replacing an incumbent: the candidate's median beats the
  // incumbent's by more than the measured spread, the larger of the two
  // interquartile ranges.
  bool candidate_wins = false;
  double spread_us = 0;
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

  // Steps 1-3 only: every check batch, no timing batch and no timing. For
  // the sanitizer gate, where memcheck makes every launch slow and a timing
  // would mean nothing. kVerified (without timing) when every check passes;
  // `on_reference` gets the reference's time on the last check batch.
  absl::StatusOr<EvalResult> CheckOnly(const EvalRequest& request,
                                       const ReferenceCallback& on_reference = {});

  // Verifies both (one check batch each) and times them interleaved on the
  // same timing batch (A B B A ...), checking each one's last timed output.
  absl::StatusOr<RetimeResult> Retime(const EvalRequest& candidate, const Candidate& incumbent,
                                      const ReferenceCallback& on_reference = {});

 private:
  struct Impl;
  explicit Evaluator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The reference version string results record: "<reference>+<tolerance>".
std::string ReferenceVersion();

// Median, min, max and quartiles of samples (microseconds).
Timing Summarize(std::vector<double> samples_us);

}  // namespace kforge::eval
