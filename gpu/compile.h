// JIT compilation of kernel sources with NVRTC (linked; needs no GPU).
//
// A source that does not compile is a result (CompileResult::ok == false,
// with the log), not an error: absl::Status errors are reserved for broken
// infrastructure (NVRTC missing, out of memory, invalid options the worker
// itself added).
//
// Every compile gets the same base options, in this order, followed by the
// request's extra options:
//   -arch=<arch> -default-device --std=c++17 --ptxas-options=-v -no-source-include
// and the kforge contract header as an in-memory header, so sources include
// it as `#include "kforge/attn_params.h"` without any file on disk. NVRTC is
// given no include path, and -no-source-include stops it from searching the
// directory of the source (the current one, for a name without a folder).
// That alone does not stop an absolute path: candidate sources are checked
// first (kernels/source_check.h) and compiled in a child that holds no
// secret (worker/compile_child.h).
//
// Thread-safe: Compile() may run on any number of threads at once.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kforge::gpu {

struct CompileRequest {
  std::string source;
  std::string arch = "sm_90a";             // "sm_90a", "sm_100a", "sm_80", ...
  std::vector<std::string> extra_options;  // after the base options
  std::string name = "kernel.cu";          // program name in the log
  // NVRTC cannot be interrupted: a compile that overruns this is reported as
  // a transient compile error ("compile exceeded N s") and its thread is abandoned
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
  // Another run may end differently (the compile overran its time limit, or
  // the process compiling it died): such a result is never cached.
  bool transient = false;
  // Per entry point, in log order; the maxima over them are in `total`.
  // From the ptxas -v log; when the log has none (some NVRTC builds omit it),
  // from the cubin's ELF sections, which know no spill figures.
  std::vector<FunctionResources> functions;
  bool resources_from_log = false;
  FunctionResources total;  // function = "" ; each field the max over `functions`
};

// "13.0".
std::string NvrtcVersion();

// The archs this NVRTC compiles cubins for, as kforge names them (core/
// arch.h), ascending: "sm_N" for each of nvrtcGetSupportedArchs and "sm_Na"
// where NVRTC accepts the architecture-specific target. NVRTC's API does
// not list those, so each is probed by compiling an empty kernel (a few
// tens of ms each; call it once). Empty when NVRTC lists nothing.
std::vector<std::string> NvrtcTargetArchs();

// The option list Compile() passes for `request`.
std::vector<std::string> CompileOptions(const CompileRequest& request);

absl::StatusOr<CompileResult> Compile(const CompileRequest& request);

// Compile() on the calling thread without its deadline: for a process whose
// parent enforces the time limit by killing it (worker/compile_child.h).
absl::StatusOr<CompileResult> CompileBlocking(const CompileRequest& request);

// Something that compiles: Compile() in this process, or a compile in a
// child process. Must be callable from several threads at once.
using Compiler = std::function<absl::StatusOr<CompileResult>(const CompileRequest&)>;

// A result without its cubin as one JSON object (the compile cache's .json
// files, the compile child's report), and back. Resources are kept per
// function; `total` is recomputed.
std::string CompileResultToJson(const CompileResult& result);
absl::StatusOr<CompileResult> CompileResultFromJson(std::string_view json);

// The log of the (transient) result of a compile that overran `limit`.
std::string CompileTimeoutLog(std::chrono::milliseconds limit);

// Parses the ptxas -v part of an NVRTC log. Lines it does not know are
// ignored; cmem figures are not recorded.
std::vector<FunctionResources> ParsePtxasLog(std::string_view log);
// Registers, stack frame and static shared memory of the entry points of a
// cubin compiled for `arch`, read from its ELF sections (cubin.cc). Spill
// figures are not in the image (0). Empty when `cubin` is no ELF image.
std::vector<FunctionResources> ParseCubinResources(std::string_view cubin, std::string_view arch);

FunctionResources MaxResources(const std::vector<FunctionResources>& functions);

}  // namespace kforge::gpu
