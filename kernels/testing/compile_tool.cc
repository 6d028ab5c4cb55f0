// kforge-kernels-compile: NVRTC-compiles template instances and prints the
// ptxas resource report (registers, spills) per configuration.
//   kforge-kernels-compile [--all] [template] [arch] [head_dim] [KNOB=V ...]
#include <cstdio>
#include <string>

#include "kernels/catalog.h"
#include "kernels/testing/nvrtc_util.h"

using namespace kforge;

namespace {

void Report(const std::string& name, const std::map<std::string, int>& knobs, int d,
            const std::string& arch, bool verbose) {
  auto v = Instantiate(name, knobs, d);
  std::string desc;
  for (const auto& [k, x] : knobs) desc += k + "=" + std::to_string(x) + " ";
  if (!v.ok()) {
    std::printf("%-8s d%-3d %-60s INVALID %s\n", arch.c_str(), d, desc.c_str(),
                std::string(v.status().message()).c_str());
    return;
  }
  auto r = testing::CompileVariant(v->source, arch);
  std::printf("%-8s d%-3d %-60s %s regs=%d spill_st=%d spill_ld=%d stack=%d smem=%d %.2fs\n",
              arch.c_str(), d, desc.c_str(), r.ok ? "OK " : "ERR", r.registers, r.spill_stores,
              r.spill_loads, r.stack_frame, v->manifest.dynamic_smem_bytes, r.seconds);
  if (!r.ok || verbose) std::printf("%s\n", r.log.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::string name = argc > 1 ? argv[1] : "fwd_mma";
  if (name == "--all") {
    for (const char* arch : {"sm_80", "sm_90a", "sm_100a"}) {
      for (int d : {64, 128}) {
        for (int bm : {64, 128}) {
          for (int bn : {32, 64, 128}) {
            for (int st : {1, 2}) {
              for (int pers : {0, 1}) {
                Report("fwd_mma",
                       {{"BLOCK_M", bm}, {"WARPS", bm / 16}, {"BLOCK_N", bn}, {"STAGES", st},
                        {"PERSISTENT", pers}},
                       d, arch, false);
              }
              if (bn == 64 && st == 2) {
                for (int mb : {2, 3}) {
                  Report("fwd_mma",
                         {{"BLOCK_M", bm}, {"WARPS", bm / 16}, {"BLOCK_N", bn}, {"STAGES", st},
                          {"MIN_BLOCKS", mb}},
                         d, arch, false);
                }
              }
            }
          }
        }
      }
    }
    return 0;
  }
  std::string arch = argc > 2 ? argv[2] : "sm_90a";
  int d = argc > 3 ? std::stoi(argv[3]) : 128;
  std::map<std::string, int> knobs;
  for (int i = 4; i < argc; ++i) {
    std::string a = argv[i];
    auto eq = a.find('=');
    if (eq != std::string::npos) knobs[a.substr(0, eq)] = std::stoi(a.substr(eq + 1));
  }
  auto v = Instantiate(name, knobs, d);
  if (!v.ok()) {
    std::fprintf(stderr, "%s\n", std::string(v.status().message()).c_str());
    return 1;
  }
  Report(name, v->knobs, d, arch, true);
  return 0;
}
