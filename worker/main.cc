// kforge-worker: one per GPU. Registers with the server, leases evaluation
// tasks, compiles them with NVRTC, verifies and times them in a sandboxed
// child (this same binary, `--eval-child`), and reports the results.
//
//   kforge-worker --server HOST:PORT [--token-file PATH | --token T | $KFORGE_WORKER_TOKEN]
//                 [--gpu N] [--name NAME] [--cache-dir DIR] [--compile-threads N]
//
// Without a CUDA driver it serves compile-only tasks.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "core/logging.h"
#include "core/secrets.h"
#include "kforge/version.h"
#include "core/shape.h"
#include "gpu/compile.h"
#include "gpu/compile_cache.h"
#include "gpu/gpu.h"
#include "gpu/usage.h"
#include "worker/child.h"
#include "worker/compile_child.h"
#include "worker/rpc_client.h"
#include "worker/sandbox.h"
#include "worker/task_runner.h"
#include "worker/worker.h"

namespace {

using namespace kforge::worker;

std::string DefaultName(int gpu) {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "worker");
  return fmt::format("{}-gpu{}", host, gpu);
}

std::filesystem::path DefaultCacheDir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    return std::filesystem::path(xdg) / "kforge";
  }
  if (const char* home = std::getenv("HOME"); home && *home) {
    return std::filesystem::path(home) / ".cache" / "kforge";
  }
  return std::filesystem::temp_directory_path() / "kforge-cache";
}



// compute-sanitizer next to the CUDA toolkit, if there is one.
std::string DefaultSanitizer() {
  std::vector<std::filesystem::path> candidates;
  if (const char* home = std::getenv("CUDA_HOME")) candidates.emplace_back(home);
  candidates.emplace_back("/usr/local/cuda");
  for (const auto& dir : candidates) {
    const std::filesystem::path p = dir / "bin" / "compute-sanitizer";
    std::error_code ec;
    if (std::filesystem::is_regular_file(p, ec)) return p.string();
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kforge-worker: compiles, verifies and times kernel variants for a kforge server"};
  app.set_version_flag("--version", "kforge-worker " KFORGE_VERSION, "print the version and exit");
  std::string server = "127.0.0.1:50051";
  std::string token;
  std::string token_file;
  int gpu_ordinal = 0;
  std::string name;
  std::string cache_dir;
  int compile_threads = 2;
  bool force_compile_only = false;
  std::string compile_arch = "sm_90a";
  int lease_wait_ms = 20000;
  double eval_setup_limit_s = 120;
  double eval_min_limit_s = 5;
  double eval_absolute_limit_s = 600;
  double eval_reference_factor = 50;
  std::vector<std::string> nvrtc_options;
  std::vector<std::string> child_env;
  std::string sanitizer_gate;
  std::string sanitizer;
  std::vector<std::string> sanitizer_tools(std::begin(kSanitizerTools), std::end(kSanitizerTools));
  bool no_sanitizer_gate = false;
  std::string log_level = "info";
  std::string log_format = "text";
  std::string compile_archs_flag = "all";
  // Hidden: the sandboxed children (evaluator, compiler).
  bool eval_child = false;
  bool compile_child = false;
  bool compile_child_unsealed = false;  // test only: see compile_child.h
  std::string request_dir;
  int result_fd = kChildResultFd;
  std::string self_test;  // test only: see child.h

  app.add_option("--server", server, "kforge server address (host:port)")->capture_default_str();
  auto* token_opt = app.add_option(
      "--token", token,
      "worker token (default: $KFORGE_WORKER_TOKEN); prefer --token-file, which no /proc file shows");
  app.add_option("--token-file", token_file, "file whose first line is the worker token")
      ->excludes(token_opt);
  app.add_option("--gpu", gpu_ordinal, "CUDA device ordinal")->capture_default_str();
  app.add_option("--name", name, "worker name shown by the server (default: HOST-gpuN)");
  app.add_option("--cache-dir", cache_dir,
                 "compile cache and scratch folder (default: $XDG_CACHE_HOME/kforge or ~/.cache/kforge)");
  app.add_option("--compile-threads", compile_threads, "parallel NVRTC compiles")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_flag("--compile-only", force_compile_only, "serve compile tasks only, even with a GPU");
  app.add_option("--arch", compile_arch,
                 "NVRTC target a compile-only worker registers for (a GPU worker uses its device's)")
      ->capture_default_str();
  app.add_option("--lease-wait-ms", lease_wait_ms, "long-poll wait for a task")->capture_default_str();
  app.add_option("--nvrtc-option", nvrtc_options, "extra NVRTC option before each variant's own (repeatable)");
  app.add_option("--child-env", child_env,
                 "environment variable the compile and evaluator children keep, beyond PATH, "
                 "LD_LIBRARY_PATH, CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER and TMPDIR (repeatable)");
  app.add_option("--eval-setup-limit-s", eval_setup_limit_s,
                 "watchdog: seconds until the reference must have run")
      ->capture_default_str();
  app.add_option("--eval-min-limit-s", eval_min_limit_s,
                 "watchdog: least time allowed for the candidate's runs")
      ->capture_default_str();
  app.add_option("--eval-reference-factor", eval_reference_factor,
                 "watchdog: candidate runs may take this many times the reference")
      ->capture_default_str();
  app.add_option("--eval-absolute-limit-s", eval_absolute_limit_s,
                 "watchdog: hard cap on one evaluation")
      ->capture_default_str();
  app.add_option("--sanitizer", sanitizer,
                 "compute-sanitizer binary for the gates (default: $CUDA_HOME/bin or "
                 "/usr/local/cuda/bin/compute-sanitizer when it exists)");
  app.add_option("--sanitizer-gate", sanitizer_gate,
                 "like --sanitizer, and refuse to start unless memcheck works there");
  app.add_option("--sanitizer-tools", sanitizer_tools,
                 "tools every promotion candidate runs under (tools that do not work here are "
                 "dropped at start)")
      ->delimiter(',')
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(kSanitizerTools),
                                                     std::end(kSanitizerTools))));
  app.add_flag("--no-sanitizer-gate", no_sanitizer_gate,
               "run no sanitizer gates (the server then promotes nothing from this worker "
               "unless it allows ungated promotion)");
  app.add_option("--compile-archs", compile_archs_flag,
                 "archs besides its own whose compile-only tasks this worker takes: 'all' (every "
                 "arch its NVRTC compiles for), 'none', or a comma-separated list")
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error")->capture_default_str();
  app.add_option("--log-format", log_format, "text | json (one JSON object a line)")
      ->capture_default_str();
  app.add_flag("--eval-child", eval_child)->group("");
  app.add_flag("--compile-child", compile_child)->group("");
  app.add_flag("--compile-child-unsealed", compile_child_unsealed)->group("");
  app.add_option("--request-dir", request_dir)->group("");
  app.add_option("--result-fd", result_fd)->group("");
  app.add_option("--self-test", self_test)->group("");
  CLI11_PARSE(app, argc, argv);

  spdlog::set_level(spdlog::level::from_str(log_level));
  if (compile_child) return RunCompileChild(STDIN_FILENO, result_fd, !compile_child_unsealed);
  if (eval_child) {
    spdlog::set_pattern("[eval-child %P] %v");
    if (request_dir.empty()) {
      fmt::print(stderr, "--eval-child needs --request-dir\n");
      return 2;
    }
    return RunEvalChild(request_dir, result_fd, self_test);
  }
  if (absl::Status s = kforge::ConfigureLogging(log_format, log_level,
                                                "[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
      !s.ok()) {
    fmt::print(stderr, "kforge-worker: {}\n", std::string(s.message()));
    return 2;
  }
  // SIGINT/SIGTERM stop the worker; every thread started from here on (compile pool, gRPC)
  // inherits the blocked mask, so only the waiter below sees them.
  signal(SIGPIPE, SIG_IGN);
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // The token, and every other kforge credential this process was handed,
  // leave argv and the environment now, before any thread or child starts.
  std::string env_token;
  std::vector<std::string> secrets;
  for (auto& [name, value] : kforge::TakeSecretEnvironment(kforge::IsKforgeTokenVariable)) {
    if (name == "KFORGE_WORKER_TOKEN") env_token = value;
    if (!value.empty()) secrets.push_back(value);
  }
  if (!token_file.empty()) {
    absl::StatusOr<std::string> t = kforge::ReadTokenFile(token_file);
    if (!t.ok()) {
      spdlog::error("--token-file: {}", std::string(t.status().message()));
      return 2;
    }
    token = *t;
  } else if (token.empty()) {
    token = env_token;
  }
  if (!token.empty()) secrets.push_back(token);
  for (const std::string& s : secrets) kforge::ScrubFromProcessMemory(argc, argv, s);
  if (absl::Status s = kforge::MakeUndumpable(); !s.ok()) {
    spdlog::warn("{}: the worker's memory is readable by processes of its user",
                 std::string(s.message()));
  }
  if (name.empty()) name = DefaultName(gpu_ordinal);
  const std::filesystem::path cache =
      cache_dir.empty() ? DefaultCacheDir() : std::filesystem::path(cache_dir);
  std::error_code ec;
  std::filesystem::create_directories(cache / "cubins", ec);
  if (ec) {
    spdlog::error("cannot create cache dir {}: {}", cache.string(), ec.message());
    return 2;
  }

  // The GPU, if any. The parent never opens a context: each evaluation's
  // child opens its own and takes it down with it.
  Registration registration;
  std::string pci_bus_id;  // for NVML; "" without a GPU
  registration.worker_name = name;
  registration.gpu.nvrtc_version = kforge::gpu::NvrtcVersion();
  std::unique_ptr<kforge::gpu::Driver> driver;
  absl::StatusOr<std::unique_ptr<kforge::gpu::Driver>> loaded = kforge::gpu::Driver::Load();
  if (!loaded.ok()) {
    spdlog::warn("no CUDA driver: serving compile-only tasks ({})", std::string(loaded.status().message()));
    registration.compile_only = true;
  } else {
    driver = *std::move(loaded);
    absl::StatusOr<int> count = driver->DeviceCount();
    if (!count.ok() || gpu_ordinal < 0 || gpu_ordinal >= *count) {
      spdlog::error("--gpu {}: {}", gpu_ordinal,
                    count.ok() ? fmt::format("this machine has {} CUDA device(s)", *count)
                               : std::string(count.status().message()));
      return 2;
    }
    absl::StatusOr<kforge::gpu::DeviceInfo> info = driver->GetDeviceInfo(gpu_ordinal);
    if (!info.ok()) {
      spdlog::error("GPU {}: {}", gpu_ordinal, std::string(info.status().message()));
      return 2;
    }
    registration.gpu.name = info->name;
    registration.gpu.compute_capability = info->ComputeCapability();
    registration.gpu.arch = info->arch;
    registration.gpu.sm_count = info->sm_count;
    registration.gpu.memory_bytes = info->memory_bytes;
    registration.gpu.driver_version = info->DriverVersionString();
    pci_bus_id = info->pci_bus_id;
    registration.compile_only = force_compile_only;
    spdlog::info("GPU {}: {} (cc {}, {}, {} SMs, {:.0f} GiB), driver {}, NVRTC {}{}", gpu_ordinal,
                 info->name, registration.gpu.compute_capability, info->arch, info->sm_count,
                 static_cast<double>(info->memory_bytes) / (1 << 30),
                 registration.gpu.driver_version, registration.gpu.nvrtc_version,
                 force_compile_only ? "; compile-only by request" : "");
  }

  if (registration.compile_only && registration.gpu.arch.empty()) {
    if (absl::Status s = kforge::ValidateArch(compile_arch); !s.ok()) {
      spdlog::error("--arch: {}", std::string(s.message()));
      return 2;
    }
    registration.gpu.arch = compile_arch;
  }

  // Compile-only tasks of other archs: a CPU-only machine (or a GPU worker
  // between its own tasks) screens candidates for every arch its compiler
  // knows, so a compile-only job never waits for a worker of its arch.
  const std::vector<std::string> nvrtc_archs = kforge::gpu::NvrtcTargetArchs();
  if (compile_archs_flag == "all") {
    registration.compile_archs = nvrtc_archs;
  } else if (compile_archs_flag != "none") {
    for (size_t start = 0; start <= compile_archs_flag.size();) {
      size_t comma = compile_archs_flag.find(',', start);
      if (comma == std::string::npos) comma = compile_archs_flag.size();
      const std::string a = compile_archs_flag.substr(start, comma - start);
      start = comma + 1;
      if (a.empty()) continue;
      if (std::find(nvrtc_archs.begin(), nvrtc_archs.end(), a) == nvrtc_archs.end()) {
        spdlog::error("--compile-archs: NVRTC {} does not compile for '{}' (it does for: {})",
                      registration.gpu.nvrtc_version, a, fmt::join(nvrtc_archs, " "));
        return 2;
      }
      registration.compile_archs.push_back(a);
    }
  }
  std::erase(registration.compile_archs, registration.gpu.arch);

  for (const std::string& n : child_env) {
    if (absl::Status s = CheckChildEnvName(n); !s.ok()) {
      spdlog::error("{}", std::string(s.message()));
      return 2;
    }
  }

  // Candidate sources are compiled in children that hold no secret; the
  // cache stays here. A child that cannot run at all would make every task a
  // worker fault, so find out now.
  CompileChildOptions cco;
  cco.child_env = child_env;
  cco.secrets = secrets;
  const CompileChild compiler(cco);
  {
    kforge::gpu::CompileRequest probe;
    probe.source = "extern \"C\" __global__ void kf_probe() {}\n";
    probe.arch = registration.gpu.arch.empty() ? compile_arch : registration.gpu.arch;
    probe.name = "probe.cu";
    absl::StatusOr<kforge::gpu::CompileResult> r = compiler.Compile(probe);
    if (!r.ok() || !r->ok) {
      spdlog::error("the compile child does not work here: {}",
                    r.ok() ? r->log : std::string(r.status().message()));
      return 2;
    }
    if (compiler.sealed().value_or(false)) {
      spdlog::info("compile child ready ({:.0f} ms for an empty kernel); it can open no file",
                   r->compile_ms);
    } else {
      spdlog::warn("compile child ready ({:.0f} ms for an empty kernel), but this kernel has no "
                   "Landlock: it could open files, and only the source check and redaction "
                   "keep them out of logs",
                   r->compile_ms);
    }
  }
  kforge::gpu::CompileCache compile_cache(cache / "cubins");
  kforge::gpu::CompilePool compile_pool(compile_threads, &compile_cache, compiler.AsCompiler());

  std::unique_ptr<Sandbox> sandbox;
  RunnerOptions ro;
  if (!registration.compile_only) {
    SandboxOptions so;
    so.scratch_dir = cache / "sandbox";
    auto ms = [](double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); };
    so.setup_limit = ms(eval_setup_limit_s);
    so.min_run_limit = ms(eval_min_limit_s);
    so.absolute_limit = ms(eval_absolute_limit_s);
    so.reference_factor = eval_reference_factor;
    so.child_env = child_env;
    sandbox = std::make_unique<Sandbox>(so);
    const std::string path = no_sanitizer_gate          ? ""
                             : !sanitizer_gate.empty() ? sanitizer_gate
                             : !sanitizer.empty()      ? sanitizer
                                                       : DefaultSanitizer();
    if (!path.empty()) {
      ro.sanitizer = path;
      ro.gate_sandbox = GateSandboxOptions(so);
      const std::string cubins = (cache / "cubins").string();
      ro.sanitizer_tools =
          ProbeSanitizerTools(path, sanitizer_tools, ro.gate_sandbox, gpu_ordinal, cubins,
                              SeedCalibration(registration.gpu.arch, gpu_ordinal, cubins));
      const bool memcheck = std::find(ro.sanitizer_tools.begin(), ro.sanitizer_tools.end(),
                                      "memcheck") != ro.sanitizer_tools.end();
      if (!sanitizer_gate.empty() && !memcheck) {
        spdlog::error("--sanitizer-gate {}: memcheck does not run on this machine", path);
        return 2;
      }
    }
    if (ro.sanitizer_tools.empty()) {
      spdlog::warn("no sanitizer gates: the server will not promote this worker's results unless "
                   "its configuration allows ungated promotion");
    }
  }
  registration.sanitizer_tools = ro.sanitizer_tools;

  ro.gpu = registration.gpu;
  ro.compile_only = registration.compile_only;
  ro.gpu_ordinal = gpu_ordinal;
  ro.extra_compile_options = nvrtc_options;
  ro.secrets = secrets;
  ro.compile_cache_dir = (cache / "cubins").string();
  LocalTaskRunner runner(&compile_pool, sandbox.get(), ro);

  GrpcClientOptions co;
  co.target = server;
  co.token = token;
  std::unique_ptr<ServerClient> client = MakeGrpcServerClient(co);

  WorkerOptions wo;
  wo.registration = registration;
  wo.lease_wait = std::chrono::milliseconds(lease_wait_ms);
  // The GPU's utilisation and memory, read from NVML at each heartbeat, for
  // the dashboard; a GPU NVML does not know is reported as unknown.
  std::shared_ptr<kforge::gpu::GpuUsageMonitor> usage;
  if (!registration.compile_only && !pci_bus_id.empty()) {
    absl::StatusOr<std::unique_ptr<kforge::gpu::GpuUsageMonitor>> m =
        kforge::gpu::GpuUsageMonitor::Open(pci_bus_id);
    if (m.ok()) {
      usage = *std::move(m);
      wo.gpu_usage = [usage]() -> std::optional<kforge::gpu::GpuUsage> {
        absl::StatusOr<kforge::gpu::GpuUsage> u = usage->Sample();
        if (u.ok()) return *u;
        return std::nullopt;
      };
    } else {
      spdlog::info("GPU utilisation is not reported: {}", std::string(m.status().message()));
    }
  }
  Worker worker(client.get(), &runner, wo);

  std::atomic<bool> done{false};
  std::thread signal_waiter([&] {
    timespec tick{0, 200 * 1000 * 1000};
    while (!done.load()) {
      int sig = sigtimedwait(&stop_signals, nullptr, &tick);
      if (sig > 0) {
        spdlog::info("{} received: stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
        worker.Stop();
        return;
      }
    }
  });

  spdlog::info("kforge-worker {} serving {} ({}{}), cache {}", name, server,
               (registration.compile_only ? "compile-only, " : "") + registration.gpu.arch,
               registration.compile_archs.empty()
                   ? std::string()
                   : fmt::format("; compile tasks for {} too",
                                 fmt::join(registration.compile_archs, " ")),
               cache.string());
  worker.Run();
  done.store(true);
  signal_waiter.join();
  WorkerStats s = worker.stats();
  spdlog::info("stopped: {} tasks, {} results accepted, {} rejected, {} dropped", s.tasks_leased,
               s.results_accepted, s.results_rejected, s.results_dropped);
  return 0;
}
