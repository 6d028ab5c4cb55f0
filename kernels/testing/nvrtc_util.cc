#include "kernels/testing/nvrtc_util.h"

#include <nvrtc.h>

#include <chrono>
#include <regex>
#include <vector>

#include "kernels/attn_params_text.h"

namespace kforge::testing {

CompileReport CompileVariant(const std::string& source, const std::string& arch) {
  CompileReport rep;
  const auto t0 = std::chrono::steady_clock::now();
  nvrtcProgram prog;
  const char* headers[] = {embedded::attn_params_h};
  const char* names[] = {"kforge/attn_params.h"};
  if (nvrtcCreateProgram(&prog, source.c_str(), "variant.cu", 1, headers, names) != NVRTC_SUCCESS) {
    rep.log = "nvrtcCreateProgram failed";
    return rep;
  }
  const std::string arch_opt = "--gpu-architecture=" + arch;
  std::vector<const char*> opts = {arch_opt.c_str(), "--std=c++17", "-default-device",
                                   "--ptxas-options=-v"};
  const nvrtcResult r = nvrtcCompileProgram(prog, static_cast<int>(opts.size()), opts.data());
  size_t log_size = 0;
  nvrtcGetProgramLogSize(prog, &log_size);
  rep.log.resize(log_size);
  if (log_size > 0) nvrtcGetProgramLog(prog, rep.log.data());
  if (r == NVRTC_SUCCESS) {
    rep.ok = true;
    nvrtcGetCUBINSize(prog, &rep.cubin_bytes);
    rep.cubin.resize(rep.cubin_bytes);
    if (rep.cubin_bytes > 0) nvrtcGetCUBIN(prog, rep.cubin.data());
  }
  nvrtcDestroyProgram(&prog);
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::smatch m;
  static const std::regex kRegs(R"(Used (\d+) registers)");
  static const std::regex kSpill(R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)");
  if (std::regex_search(rep.log, m, kRegs)) rep.registers = std::stoi(m[1]);
  if (std::regex_search(rep.log, m, kSpill)) {
    rep.stack_frame = std::stoi(m[1]);
    rep.spill_stores = std::stoi(m[2]);
    rep.spill_loads = std::stoi(m[3]);
  }
  return rep;
}

NvrtcVersion GetNvrtcVersion() {
  NvrtcVersion v;
  nvrtcVersion(&v.major, &v.minor);
  return v;
}

}  // namespace kforge::testing
