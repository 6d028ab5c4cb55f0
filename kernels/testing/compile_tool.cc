// kforge-kernels-compile: NVRTC-compiles template instances and prints the
// ptxas resource report (registers, spills) per configuration.
//   kforge-kernels-compile [--all] [template] [arch] [head_dim] [KNOB=V ...]
//   kforge-kernels-compile --cubin-sha256 template [arch]
//   kforge-kernels-compile --cubin-sha256 template arch head_dim KNOB=V ...  (one setting)
//       sha256 of the cubin of every valid knob setting at each head dim (the
//       table in templates_compile_test.cc's cubin pin)
//   kforge-kernels-compile --text fwd_sm90
//       fwd_sm90's source without the knob prelude (parts + kernel), for
//       kernels/dev/ scripts that prepend their own #defines
#include <cstdio>
#include <string>

#include "core/hash.h"
#include "kernels/catalog.h"
#include "kernels/templates/sm90/parts.h"
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

// Every combination of the template's knob values.
std::vector<std::map<std::string, int>> KnobProduct(const TemplateInfo& t) {
  std::vector<std::map<std::string, int>> out = {{}};
  for (const auto& k : t.knobs) {
    std::vector<std::map<std::string, int>> next;
    for (const auto& partial : out) {
      for (int v : k.values) {
        auto m = partial;
        m[k.name] = v;
        next.push_back(m);
      }
    }
    out = std::move(next);
  }
  return out;
}

int CubinHashes(const std::string& name, const std::string& arch) {
  for (const auto& t : ListTemplates()) {
    if (t.name != name) continue;
    const auto v = testing::GetNvrtcVersion();
    std::printf("// NVRTC %d.%d, %s\n", v.major, v.minor, arch.c_str());
    for (int d : t.head_dims) {
      for (const auto& knobs : KnobProduct(t)) {
        auto var = Instantiate(name, knobs, d);
        if (!var.ok()) continue;
        auto r = testing::CompileVariant(var->source, arch);
        std::string desc = "d" + std::to_string(d);
        for (const auto& [k, x] : var->knobs) desc += " " + k + "=" + std::to_string(x);
        std::printf("{\"%s\", \"%s\"},\n", desc.c_str(),
                    r.ok ? Sha256Hex(r.cubin).c_str() : "compile error");
      }
    }
    return 0;
  }
  std::fprintf(stderr, "no template %s\n", name.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string name = argc > 1 ? argv[1] : "fwd_mma";
  if (name == "--cubin-sha256" && argc > 4) {
    // one setting: --cubin-sha256 template arch head_dim KNOB=V ...
    std::map<std::string, int> knobs;
    for (int i = 5; i < argc; ++i) {
      std::string a = argv[i];
      const auto eq = a.find('=');
      if (eq == std::string::npos) return 2;
      knobs[a.substr(0, eq)] = std::stoi(a.substr(eq + 1));
    }
    auto var = Instantiate(argv[2], knobs, std::stoi(argv[4]));
    if (!var.ok()) {
      std::fprintf(stderr, "%s\n", std::string(var.status().message()).c_str());
      return 1;
    }
    auto r = testing::CompileVariant(var->source, argv[3]);
    std::printf("%s\n", r.ok ? Sha256Hex(r.cubin).c_str() : "compile error");
    return r.ok ? 0 : 1;
  }
  if (name == "--cubin-sha256" && argc > 2) {
    return CubinHashes(argv[2], argc > 3 ? argv[3] : "sm_90a");
  }
  if (name == "--text" && argc > 2 && std::string(argv[2]) == "fwd_sm90") {
    std::fputs(templates::sm90::Assemble(templates::sm90::FwdSm90Parts()).c_str(), stdout);
    return 0;
  }
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
