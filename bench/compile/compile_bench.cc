// kforge-compile-bench: how many seed variants a minute the worker compiles,
// with NVRTC in this process (what the worker did before) or in a fresh
// compile child per variant (what it does now), on N pool threads, no cache.
//
//   kforge-compile-bench [--mode child|in-process|both|all] [--threads N] [--limit K]
//                        [--rounds R] [--worker-bin PATH] [--empty N]
//
// The variants are the 168 fwd_mma settings of `kforge-kernels-compile --all`
// (sm_80, sm_90a, sm_100a; head dims 64 and 128), the set README's figures
// were measured on. `all` adds `child-unsealed` (the child without its
// Landlock seal and the empty compile before it), to see what the seal
// costs. With several modes the set is cut into R rounds and the
// modes alternate round by round, so a change in the machine's load hits
// both alike. Besides wall time it reports CPU seconds per variant (this
// process and its children): on a shared machine that is the steadier
// figure, and an idle machine compiles about threads × 60 / CPU-s variants
// a minute. --empty N also times N compiles of an empty kernel: the child's
// start-up plus NVRTC's fixed cost.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "gpu/compile_cache.h"
#include "kernels/catalog.h"
#include "worker/compile_child.h"

using namespace kforge;

namespace {

std::vector<gpu::CompileRequest> SeedRequests() {
  std::vector<gpu::CompileRequest> out;
  for (const char* arch : {"sm_80", "sm_90a", "sm_100a"}) {
    for (int d : {64, 128}) {
      for (int bm : {64, 128}) {
        for (int bn : {32, 64, 128}) {
          for (int st : {1, 2}) {
            std::vector<std::map<std::string, int>> knobs;
            for (int pers : {0, 1}) {
              knobs.push_back({{"BLOCK_M", bm}, {"WARPS", bm / 16}, {"BLOCK_N", bn},
                               {"STAGES", st}, {"PERSISTENT", pers}});
            }
            if (bn == 64 && st == 2) {
              for (int mb : {2, 3}) {
                knobs.push_back({{"BLOCK_M", bm}, {"WARPS", bm / 16}, {"BLOCK_N", bn},
                                 {"STAGES", st}, {"MIN_BLOCKS", mb}});
              }
            }
            for (const auto& k : knobs) {
              absl::StatusOr<Variant> v = Instantiate("fwd_mma", k, d);
              if (!v.ok()) continue;
              gpu::CompileRequest r;
              r.source = v->source;
              r.arch = arch;
              r.name = fmt::format("v{}.cu", out.size());
              out.push_back(std::move(r));
            }
          }
        }
      }
    }
  }
  return out;
}

struct Figures {
  int ok = 0, failed = 0;
  double seconds = 0;
  double cpu_seconds = 0;  // this process and its children
  void Add(const Figures& f) {
    ok += f.ok;
    failed += f.failed;
    seconds += f.seconds;
    cpu_seconds += f.cpu_seconds;
  }
};

double CpuSeconds() {
  auto seconds = [](const rusage& u) {
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  };
  rusage self{}, children{};
  getrusage(RUSAGE_SELF, &self);
  getrusage(RUSAGE_CHILDREN, &children);
  return seconds(self) + seconds(children);
}

Figures RunAll(const std::vector<gpu::CompileRequest>& requests, int threads,
               const gpu::Compiler& compiler) {
  gpu::CompilePool pool(threads, nullptr, compiler);
  const double cpu_start = CpuSeconds();
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::future<absl::StatusOr<gpu::CompileResult>>> futures;
  for (const auto& r : requests) futures.push_back(pool.Submit(r));
  Figures f;
  for (auto& fu : futures) {
    absl::StatusOr<gpu::CompileResult> r = fu.get();
    (r.ok() && r->ok) ? ++f.ok : ++f.failed;
  }
  f.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  f.cpu_seconds = CpuSeconds() - cpu_start;
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kforge-compile-bench: seed variants compiled per minute, in process or in the compile child"};
  std::string mode = "both";
  int threads = 1;
  int limit = 0;
  int empty = 0;
  int rounds = 6;
  std::string worker_bin = KFORGE_WORKER_BIN_DEFAULT;
  app.add_option("--mode", mode, "child | in-process | both | all")->capture_default_str();
  app.add_option("--threads", threads, "compile pool threads")->capture_default_str();
  app.add_option("--limit", limit, "compile only the first K variants (0: all 168)");
  app.add_option("--worker-bin", worker_bin, "the kforge-worker binary (the compile child)")
      ->capture_default_str();
  app.add_option("--empty", empty, "also time N compiles of an empty kernel");
  app.add_option("--rounds", rounds, "rounds the modes alternate over")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::vector<gpu::CompileRequest> requests = SeedRequests();
  if (limit > 0 && static_cast<size_t>(limit) < requests.size()) requests.resize(limit);
  worker::CompileChildOptions cco;
  cco.executable = worker_bin;
  const worker::CompileChild child(cco);
  cco.seal_filesystem = false;
  const worker::CompileChild unsealed(cco);
  const gpu::Compiler in_process = gpu::Compile;

  std::vector<std::pair<std::string, gpu::Compiler>> modes;
  const bool all = mode == "all";
  if (mode == "in-process" || mode == "both" || all) modes.emplace_back("in-process", in_process);
  if (mode == "child" || mode == "both" || all) modes.emplace_back("child", child.AsCompiler());
  if (all) modes.emplace_back("child-unsealed", unsealed.AsCompiler());
  if (empty > 0) {
    gpu::CompileRequest e;
    e.source = "extern \"C\" __global__ void kf_empty() {}\n";
    e.arch = "sm_90a";
    const std::vector<gpu::CompileRequest> es(static_cast<size_t>(empty), e);
    for (const auto& [name, compiler] : modes) {
      Figures f = RunAll(es, 1, compiler);
      std::printf("%-14s empty kernel: %.1f ms wall, %.1f ms CPU each (%d ok)\n", name.c_str(),
                  1000.0 * f.seconds / empty, 1000.0 * f.cpu_seconds / empty, f.ok);
    }
  }
  std::vector<Figures> totals(modes.size());
  const size_t per_round = (requests.size() + rounds - 1) / std::max(1, rounds);
  for (size_t begin = 0; begin < requests.size(); begin += per_round) {
    const std::vector<gpu::CompileRequest> chunk(
        requests.begin() + begin, requests.begin() + std::min(requests.size(), begin + per_round));
    for (size_t m = 0; m < modes.size(); ++m) totals[m].Add(RunAll(chunk, threads, modes[m].second));
  }
  for (size_t m = 0; m < modes.size(); ++m) {
    const Figures& f = totals[m];
    std::printf("%-14s %zu variants on %d thread(s): %.1f s, %.0f variants/min; %.2f CPU-s per "
                "variant (%d ok, %d failed)\n",
                modes[m].first.c_str(), requests.size(), threads, f.seconds, 60.0 * f.ok / f.seconds,
                f.cpu_seconds / std::max(1, f.ok + f.failed), f.ok, f.failed);
  }
  return 0;
}
