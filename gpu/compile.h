// JIT compilation of kernel sources with NVRTC (linked; needs no GPU).
//
// A source that does not compile is a result (CompileResult::ok == false,
// with the log), not an error: absl::Status errors are reserved for broken
// infrastructure (NVRTC missing, out of memory, invalid options the worker
// itself added).
//
// Every compile gets the same base options, in this order, followed by the
// request's extra options:
//   -arch=<arch> -default-device --std=c++17 --ptxas-options=-v
// and the kforge contract header as an in-memory header, so sources include
// it as `#include "kforge/attn_params.h"` without any file on disk.
//
// Thread-safe: Compile() may run on any number of threads at once.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kforge::gpu {

struct CompileRequest {
  std::string source;
  std::string arch = "sm_90a";             // "sm_90a", "sm_100a", "sm_80", ...
  std::vector<std::string> extra_options;  // after the base options
  std::string name = "kernel.cu";          // program name in the log
  // NVRTC cannot be interrupted: a compile that overruns this is reported as
  // a compile error ("compile exceeded N s") and its thread is abandoned
  // (detached; it finishes or not in the background and its result is
  // dropped). Workers that see many of these should be restarted.
  std::chrono::milliseconds time_limit{60000};
};

// Resources ptxas reported for one entry point (from --ptxas-options=-v).
struct FunctionResources {
  std::string function;
  int registers = 0;
  int spill_stores_bytes = 0;
  int spill_loads_bytes = 0;
  int stack_frame_bytes = 0;
  int static_smem_bytes = 0;
};

struct CompileResult {
  bool ok = false;          // false: compile error; `log` says why
  std::string cubin;        // the image, when ok
  std::string log;          // NVRTC's program log (includes ptxas -v output)
  std::string options;      // exact options, space-separated, as passed to NVRTC
  std::string arch;
  std::string nvrtc_version;
  double compile_ms = 0;
  bool from_cache = false;  // set by CompileCache
  // Per entry point, in log order; the maxima over them are in `total`.
  // From the ptxas -v log; when the log has none (some NVRTC builds omit it),
  // from the cubin's ELF sections, which know no spill figures.
  std::vector<FunctionResources> functions;
  bool resources_from_log = false;
  FunctionResources total;  // function = "" ; each field the max over `functions`
};

// "13.0".
std::string NvrtcVersion();

// The option list Compile() passes for `request`.
std::vector<std::string> CompileOptions(const CompileRequest& request);

absl::StatusOr<CompileResult> Compile(const CompileRequest& request);

// Parses the ptxas -v part of an NVRTC log. Lines it does not know are
// ignored; cmem figures are not recorded.
std::vector<FunctionResources> ParsePtxasLog(std::string_view log);
// Registers, stack frame and static shared memory of the entry points of a
// cubin compiled for `arch`, read from its ELF sections (cubin.cc). Spill
// figures are not in the image (0). Empty when `cubin` is no ELF image.
std::vector<FunctionResources> ParseCubinResources(std::string_view cubin, std::string_view arch);

FunctionResources MaxResources(const std::vector<FunctionResources>& functions);

}  // namespace kforge::gpu
