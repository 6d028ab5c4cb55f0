// Test-only NVRTC helper: compiles a variant source for an arch (no GPU
// needed) and reads the ptxas resource report. The production compile path
// is gpu/'s Compile(); this exists so kernels/ can test its templates alone.
#pragma once

#include <string>

namespace kforge::testing {

struct CompileReport {
  bool ok = false;
  std::string log;
  int registers = -1;
  int spill_stores = -1;  // bytes
  int spill_loads = -1;   // bytes
  int stack_frame = -1;   // bytes
  size_t cubin_bytes = 0;
  std::string cubin;  // the image, when ok
  double seconds = 0;
};

// NVRTC's version, e.g. {13, 0}.
struct NvrtcVersion {
  int major = 0;
  int minor = 0;
};
NvrtcVersion GetNvrtcVersion();

// `arch` e.g. "sm_90a"; the source may #include "kforge/attn_params.h" only.
CompileReport CompileVariant(const std::string& source, const std::string& arch);

}  // namespace kforge::testing
