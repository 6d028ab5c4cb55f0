// The worker's plain domain types: what a task asks for and what the worker
// reports. These are the only types the worker's logic sees; the gRPC adapter
// (rpc_client.cc) is the one place that converts them to and from protobuf,
// and child_protocol.cc the one place that converts them to and from the JSON
// spoken with the sandboxed evaluator child.
//
// Thread-safety: plain values; copy freely.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/outcome.h"
#include "core/shape.h"
#include "core/task_kind.h"
#include "core/timing.h"

namespace kforge::worker {

// What this worker runs on. On a compile-only worker (no CUDA driver) only
// `arch` (empty: compile for whatever the task's shape names) and
// `nvrtc_version` are set.
struct GpuDescription {
  std::string name;                // "NVIDIA H200"
  std::string compute_capability;  // "9.0"
  std::string arch;                // NVRTC target: "sm_90a"
  int sm_count = 0;
  int64_t memory_bytes = 0;
  std::string driver_version;      // "13.0"
  std::string nvrtc_version;       // "13.0"
};

struct Registration {
  std::string worker_name;
  GpuDescription gpu;
  bool compile_only = false;
  // The compute-sanitizer tools every promotion candidate runs under on this
  // worker before its result is reported ("memcheck", "racecheck",
  // "synccheck", "initcheck"); empty when this worker does not gate. The
  // server promotes only gated results unless configured otherwise.
  std::vector<std::string> sanitizer_tools;
  // Archs beyond gpu.arch whose COMPILE tasks this worker takes (what its
  // NVRTC compiles for); the task runner compiles a COMPILE task for the
  // task's own arch.
  std::vector<std::string> compile_archs;
};

// What the server answered to Register.
struct Session {
  std::string worker_id;
  // Secret the server issued at Register: sent with every later call, it is
  // what ties a report to this registration (a worker id is only a name).
  std::string session_token;
  int heartbeat_interval_ms = 5000;
  int lease_ttl_ms = 30000;
};

struct VariantSpec {
  std::string variant_id;
  std::string source;
  std::string manifest_json;
  std::string compile_options;  // extra NVRTC options, space-separated
};

// The workload to verify and time on: the shape key plus, when the server
// sent them, the exact jagged offsets (B+1 prefix sums). Without offsets the
// evaluator draws lengths matching the key's statistics.
struct ShapeSpec {
  ShapeKey key;
  std::vector<int32_t> cu_seqlens_q;
  std::vector<int32_t> cu_seqlens_k;  // cross-attention only
};

struct TaskSpec {
  std::string task_id;
  TaskKind kind = TaskKind::kEvaluate;
  std::string job_id;
  ShapeSpec shape;
  VariantSpec variant;
  std::optional<VariantSpec> incumbent;  // RETIME only
  int64_t lease_expires_unix_ms = 0;
  uint64_t seed = 0;
};

struct CompileStats {
  double compile_ms = 0;
  int registers = 0;
  int spill_stores_bytes = 0;
  int spill_loads_bytes = 0;
  int static_smem_bytes = 0;
  int dynamic_smem_bytes = 0;  // what the manifest asks for
  int local_bytes = 0;         // stack frame per thread
  std::string log;
  std::string cubin;  // bytes; empty on a compile error
  std::string options;
};

struct ErrorStats {
  double max_abs_error = 0;
  double rel_l2_error = 0;
  std::string worst_output;  // "O", "LSE", ...
  std::string detail;        // where and why, for the proposer's feedback
};

struct TaskResult {
  Outcome outcome = Outcome::kCrashed;
  CompileStats compile;
  std::optional<ErrorStats> errors;
  // core/timing.h, samples in launch order; RETIME: sample i of each ran
  // back to back (the server decides on the pairs).
  std::optional<Timing> timing;
  std::optional<Timing> incumbent_timing;  // RETIME only
  // RETIME: set when the incumbent failed the same run's checks (kWrong,
  // kCrashed, kTimeout) while the candidate passed; no incumbent timing then.
  std::optional<Outcome> incumbent_failed;
  // EVALUATE / RETIME / CONFIRM: the largest sizes the candidate was verified
  // at (core/shape.h); a kernel is never served past them.
  std::optional<SizeExtent> verified;
  GpuDescription gpu;
  std::string message;  // one line: why it failed, or a summary
  std::string reference_version;
  // The worker, not the candidate, failed (no GPU, driver or evaluator
  // broken, sandbox could not start): not reported, so the task is retried
  // when its lease expires; `message` says why.
  bool worker_fault = false;
};

}  // namespace kforge::worker
