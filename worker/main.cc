// kforge-worker: one per GPU. Registers with the server, leases evaluation
// tasks, compiles them with NVRTC, verifies and times them in a sandboxed
// child (this same binary, `--eval-child`), and reports the results.
//
//   kforge-worker --server HOST:PORT [--token-file PATH | $KFORGE_WORKER_TOKEN]
//                 [--tls-ca CA.pem [--tls-cert C.pem --tls-key K.pem]]
//                 [--gpu N] [--name NAME] [--cache-dir DIR] [--compile-threads N]
//
// Without a CUDA driver it serves compile-only tasks.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "core/logging.h"
#include "core/secrets.h"
#include "core/transport.h"
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

// Every flag of the command line, as CLI11 fills it.
struct WorkerFlags {
  std::string server = "127.0.0.1:50051";
  std::string token;  // from --token-file or $KFORGE_WORKER_TOKEN (TakeCredentials)
  std::string token_file;
  std::string flag_token;  // the old --token, refused
  kforge::ClientTlsFiles tls;
  bool allow_plaintext = false;
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
  std::vector<std::string> sanitizer_tools =
      std::vector<std::string>(std::begin(kSanitizerTools), std::end(kSanitizerTools));
  bool no_sanitizer_gate = false;
  std::string log_level = "info";
  std::string log_format = "text";
  std::string compile_archs = "all";
  // Hidden: the sandboxed children (evaluator, compiler).
  bool eval_child = false;
  bool compile_child = false;
  bool compile_child_unsealed = false;  // test only: see compile_child.h
  std::string request_dir;
  int result_fd = kChildResultFd;
  std::string self_test;  // test only: see child.h
};

void AddFlags(CLI::App& app, WorkerFlags& f) {
  app.set_version_flag("--version", "kforge-worker " KFORGE_VERSION, "print the version and exit");
  app.add_option("--server", f.server, "kforge server address (host:port)")->capture_default_str();
  app.add_option("--token-file", f.token_file,
                 "file whose first line is the worker token (default: $KFORGE_WORKER_TOKEN)");
  // A token on the command line shows in /proc/<pid>/cmdline and ps: the
  // old flag stays only to say so.
  app.add_option("--token", f.flag_token)->group("");
  app.add_option("--tls-ca", f.tls.ca_file,
                 "PEM CA bundle the server's certificate must chain to: connect with TLS");
  app.add_option("--tls-cert", f.tls.cert_file,
                 "PEM client certificate, for a server that requires one (mTLS)");
  app.add_option("--tls-key", f.tls.key_file, "PEM private key of --tls-cert");
  app.add_option("--tls-server-name", f.tls.server_name,
                 "name the server's certificate must carry (default: the --server host)");
  app.add_flag("--allow-plaintext", f.allow_plaintext,
               "connect without TLS to a server that is not on loopback (another layer encrypts)");
  app.footer("Environment: KFORGE_WORKER_TOKEN (the worker token, 32+ characters; taken out of "
             "the environment at start). Tokens are never taken from flags.");
  app.add_option("--gpu", f.gpu_ordinal, "CUDA device ordinal")->capture_default_str();
  app.add_option("--name", f.name, "worker name shown by the server (default: HOST-gpuN)");
  app.add_option("--cache-dir", f.cache_dir,
                 "compile cache and scratch folder (default: $XDG_CACHE_HOME/kforge or ~/.cache/kforge)");
  app.add_option("--compile-threads", f.compile_threads, "parallel NVRTC compiles")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_flag("--compile-only", f.force_compile_only, "serve compile tasks only, even with a GPU");
  app.add_option("--arch", f.compile_arch,
                 "NVRTC target a compile-only worker registers for (a GPU worker uses its device's)")
      ->capture_default_str();
  app.add_option("--lease-wait-ms", f.lease_wait_ms, "long-poll wait for a task")->capture_default_str();
  app.add_option("--nvrtc-option", f.nvrtc_options, "extra NVRTC option before each variant's own (repeatable)");
  app.add_option("--child-env", f.child_env,
                 "environment variable the compile and evaluator children keep, beyond PATH, "
                 "LD_LIBRARY_PATH, CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER and TMPDIR (repeatable)");
  app.add_option("--eval-setup-limit-s", f.eval_setup_limit_s,
                 "watchdog: seconds until the reference must have run")
      ->capture_default_str();
  app.add_option("--eval-min-limit-s", f.eval_min_limit_s,
                 "watchdog: least time allowed for the candidate's runs")
      ->capture_default_str();
  app.add_option("--eval-reference-factor", f.eval_reference_factor,
                 "watchdog: candidate runs may take this many times the reference")
      ->capture_default_str();
  app.add_option("--eval-absolute-limit-s", f.eval_absolute_limit_s,
                 "watchdog: hard cap on one evaluation")
      ->capture_default_str();
  app.add_option("--sanitizer", f.sanitizer,
                 "compute-sanitizer binary for the gates (default: $CUDA_HOME/bin or "
                 "/usr/local/cuda/bin/compute-sanitizer when it exists)");
  app.add_option("--sanitizer-gate", f.sanitizer_gate,
                 "like --sanitizer, and refuse to start unless memcheck works there");
  app.add_option("--sanitizer-tools", f.sanitizer_tools,
                 "tools every promotion candidate runs under (tools that do not work here are "
                 "dropped at start)")
      ->delimiter(',')
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(kSanitizerTools),
                                                     std::end(kSanitizerTools))));
  app.add_flag("--no-sanitizer-gate", f.no_sanitizer_gate,
               "run no sanitizer gates (the server then promotes nothing from this worker "
               "unless it allows ungated promotion)");
  app.add_option("--compile-archs", f.compile_archs,
                 "archs besides its own whose compile-only tasks this worker takes: 'all' (every "
                 "arch its NVRTC compiles for), 'none', or a comma-separated list")
      ->capture_default_str();
  app.add_option("--log-level", f.log_level, "trace|debug|info|warn|error")->capture_default_str();
  app.add_option("--log-format", f.log_format, "text | json (one JSON object a line)")
      ->capture_default_str();
  app.add_flag("--eval-child", f.eval_child)->group("");
  app.add_flag("--compile-child", f.compile_child)->group("");
  app.add_flag("--compile-child-unsealed", f.compile_child_unsealed)->group("");
  app.add_option("--request-dir", f.request_dir)->group("");
  app.add_option("--result-fd", f.result_fd)->group("");
  app.add_option("--self-test", f.self_test)->group("");
}

// The hidden child modes: the exit status when this process is one.
std::optional<int> RunAsChild(const WorkerFlags& f) {
  if (f.compile_child) return RunCompileChild(STDIN_FILENO, f.result_fd, !f.compile_child_unsealed);
  if (!f.eval_child) return std::nullopt;
  spdlog::set_pattern("[eval-child %P] %v");
  if (f.request_dir.empty()) {
    fmt::print(stderr, "--eval-child needs --request-dir\n");
    return 2;
  }
  return RunEvalChild(f.request_dir, f.result_fd, f.self_test);
}

// SIGINT/SIGTERM stop the worker; every thread started from here on (compile pool, gRPC)
// inherits the blocked mask, so only the waiter (ServeUntilStopped) sees them.
sigset_t BlockStopSignals() {
  signal(SIGPIPE, SIG_IGN);
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  return stop_signals;
}

// The token, and every other kforge credential this process was handed,
// leave argv and the environment now, before any thread or child starts.
// Sets f.token; returns every secret seen (for redaction).
absl::StatusOr<std::vector<std::string>> TakeCredentials(WorkerFlags& f, int argc, char** argv) {
  std::string env_token;
  std::vector<std::string> secrets;
  for (auto& [name, value] : kforge::TakeSecretEnvironment(kforge::IsKforgeTokenVariable)) {
    if (name == "KFORGE_WORKER_TOKEN") env_token = value;
    if (!value.empty()) secrets.push_back(value);
  }
  if (!f.flag_token.empty()) {
    kforge::ScrubFromProcessMemory(argc, argv, f.flag_token);
    return absl::InvalidArgumentError(
        "--token is gone: a token on the command line shows in /proc/<pid>/cmdline and ps; "
        "put it in a file (--token-file) or in KFORGE_WORKER_TOKEN");
  }
  std::string source = "KFORGE_WORKER_TOKEN";
  if (!f.token_file.empty()) {
    absl::StatusOr<std::string> t = kforge::ReadTokenFile(f.token_file);
    if (!t.ok()) return absl::InvalidArgumentError(fmt::format("--token-file: {}", std::string(t.status().message())));
    f.token = *t;
    source = "--token-file " + f.token_file;
  } else {
    f.token = env_token;
  }
  if (!f.token.empty()) secrets.push_back(f.token);
  for (const std::string& s : secrets) kforge::ScrubFromProcessMemory(argc, argv, s);
  // Empty is allowed: a server started with --insecure-no-auth takes none.
  if (!f.token.empty()) {
    if (absl::Status s = kforge::CheckToken(f.token, source); !s.ok()) return s;
  }
  if (absl::Status s = kforge::MakeUndumpable(); !s.ok()) {
    spdlog::warn("{}: the worker's memory is readable by processes of its user",
                 std::string(s.message()));
  }
  return secrets;
}

absl::StatusOr<std::filesystem::path> MakeCacheDir(const std::string& flag) {
  const std::filesystem::path cache =
      flag.empty() ? DefaultCacheDir() : std::filesystem::path(flag);
  std::error_code ec;
  std::filesystem::create_directories(cache / "cubins", ec);
  if (ec) {
    return absl::InternalError(
        fmt::format("cannot create cache dir {}: {}", cache.string(), ec.message()));
  }
  return cache;
}

// Fills the GPU part of `registration` from the device (compile-only when
// there is no driver). The parent never opens a context: each evaluation's
// child opens its own and takes it down with it. `driver` keeps the loaded
// driver, if any; `pci_bus_id` the device's, for NVML ("" without a GPU).
absl::Status DetectGpu(const WorkerFlags& f, Registration& registration,
                       std::unique_ptr<kforge::gpu::Driver>& driver, std::string& pci_bus_id) {
  registration.gpu.nvrtc_version = kforge::gpu::NvrtcVersion();
  absl::StatusOr<std::unique_ptr<kforge::gpu::Driver>> loaded = kforge::gpu::Driver::Load();
  if (!loaded.ok()) {
    spdlog::warn("no CUDA driver: serving compile-only tasks ({})", std::string(loaded.status().message()));
    registration.compile_only = true;
    return absl::OkStatus();
  }
  driver = *std::move(loaded);
  absl::StatusOr<int> count = driver->DeviceCount();
  if (!count.ok() || f.gpu_ordinal < 0 || f.gpu_ordinal >= *count) {
    return absl::InvalidArgumentError(
        fmt::format("--gpu {}: {}", f.gpu_ordinal,
                    count.ok() ? fmt::format("this machine has {} CUDA device(s)", *count)
                               : std::string(count.status().message())));
  }
  absl::StatusOr<kforge::gpu::DeviceInfo> info = driver->GetDeviceInfo(f.gpu_ordinal);
  if (!info.ok()) {
    return absl::InternalError(
        fmt::format("GPU {}: {}", f.gpu_ordinal, std::string(info.status().message())));
  }
  registration.gpu.name = info->name;
  registration.gpu.compute_capability = info->ComputeCapability();
  registration.gpu.arch = info->arch;
  registration.gpu.sm_count = info->sm_count;
  registration.gpu.memory_bytes = info->memory_bytes;
  registration.gpu.driver_version = info->DriverVersionString();
  pci_bus_id = info->pci_bus_id;
  registration.compile_only = f.force_compile_only;
  spdlog::info("GPU {}: {} (cc {}, {}, {} SMs, {:.0f} GiB), driver {}, NVRTC {}{}", f.gpu_ordinal,
               info->name, registration.gpu.compute_capability, info->arch, info->sm_count,
               static_cast<double>(info->memory_bytes) / (1 << 30),
               registration.gpu.driver_version, registration.gpu.nvrtc_version,
               f.force_compile_only ? "; compile-only by request" : "");
  return absl::OkStatus();
}

// A compile-only worker without a device registers for --arch.
absl::Status ChooseCompileArch(const WorkerFlags& f, Registration& registration) {
  if (!registration.compile_only || !registration.gpu.arch.empty()) return absl::OkStatus();
  if (absl::Status s = kforge::ValidateArch(f.compile_arch); !s.ok()) {
    return absl::InvalidArgumentError(fmt::format("--arch: {}", std::string(s.message())));
  }
  registration.gpu.arch = f.compile_arch;
  return absl::OkStatus();
}

// Compile-only tasks of other archs: a CPU-only machine (or a GPU worker
// between its own tasks) screens candidates for every arch its compiler
// knows, so a compile-only job never waits for a worker of its arch.
absl::Status ChooseCompileArchs(const WorkerFlags& f, Registration& registration) {
  const std::vector<std::string> nvrtc_archs = kforge::gpu::NvrtcTargetArchs();
  if (f.compile_archs == "all") {
    registration.compile_archs = nvrtc_archs;
  } else if (f.compile_archs != "none") {
    for (size_t start = 0; start <= f.compile_archs.size();) {
      size_t comma = f.compile_archs.find(',', start);
      if (comma == std::string::npos) comma = f.compile_archs.size();
      const std::string a = f.compile_archs.substr(start, comma - start);
      start = comma + 1;
      if (a.empty()) continue;
      if (std::find(nvrtc_archs.begin(), nvrtc_archs.end(), a) == nvrtc_archs.end()) {
        return absl::InvalidArgumentError(
            fmt::format("--compile-archs: NVRTC {} does not compile for '{}' (it does for: {})",
                        registration.gpu.nvrtc_version, a, fmt::join(nvrtc_archs, " ")));
      }
      registration.compile_archs.push_back(a);
    }
  }
  std::erase(registration.compile_archs, registration.gpu.arch);
  return absl::OkStatus();
}

// The GPU's utilisation and memory, read from NVML at each heartbeat, for the
// dashboard; empty (nothing reported) for a compile-only worker or a GPU
// NVML does not know.
std::function<std::optional<kforge::gpu::GpuUsage>()> GpuUsageSampler(
    const Registration& registration, const std::string& pci_bus_id) {
  if (registration.compile_only || pci_bus_id.empty()) return {};
  absl::StatusOr<std::unique_ptr<kforge::gpu::GpuUsageMonitor>> m =
      kforge::gpu::GpuUsageMonitor::Open(pci_bus_id);
  if (!m.ok()) {
    spdlog::info("GPU utilisation is not reported: {}", std::string(m.status().message()));
    return {};
  }
  std::shared_ptr<kforge::gpu::GpuUsageMonitor> usage = *std::move(m);
  return [usage]() -> std::optional<kforge::gpu::GpuUsage> {
    absl::StatusOr<kforge::gpu::GpuUsage> u = usage->Sample();
    if (u.ok()) return *u;
    return std::nullopt;
  };
}

absl::Status CheckChildEnv(const std::vector<std::string>& names) {
  for (const std::string& n : names) {
    if (absl::Status s = CheckChildEnvName(n); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// A compile child that cannot run at all would make every task a worker
// fault, so find out now, on an empty kernel.
absl::Status ProbeCompileChild(const CompileChild& compiler, const std::string& arch) {
  kforge::gpu::CompileRequest probe;
  probe.source = "extern \"C\" __global__ void kf_probe() {}\n";
  probe.arch = arch;
  probe.name = "probe.cu";
  absl::StatusOr<kforge::gpu::CompileResult> r = compiler.Compile(probe);
  if (!r.ok() || !r->ok) {
    return absl::InternalError(fmt::format("the compile child does not work here: {}",
                                           r.ok() ? r->log : std::string(r.status().message())));
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
  return absl::OkStatus();
}

SandboxOptions EvalSandboxOptions(const WorkerFlags& f, const std::filesystem::path& cache) {
  SandboxOptions so;
  so.scratch_dir = cache / "sandbox";
  auto ms = [](double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); };
  so.setup_limit = ms(f.eval_setup_limit_s);
  so.min_run_limit = ms(f.eval_min_limit_s);
  so.absolute_limit = ms(f.eval_absolute_limit_s);
  so.reference_factor = f.eval_reference_factor;
  so.child_env = f.child_env;
  return so;
}

// The sanitizer gates: which tools work here (probed on a seed kernel) go
// into `ro`; --sanitizer-gate refuses to start without memcheck.
absl::Status SetUpSanitizerGates(const WorkerFlags& f, const SandboxOptions& so,
                                 const Registration& registration,
                                 const std::filesystem::path& cache, RunnerOptions& ro) {
  const std::string path = f.no_sanitizer_gate          ? ""
                           : !f.sanitizer_gate.empty() ? f.sanitizer_gate
                           : !f.sanitizer.empty()      ? f.sanitizer
                                                       : DefaultSanitizer();
  if (!path.empty()) {
    ro.sanitizer = path;
    ro.gate_sandbox = GateSandboxOptions(so);
    const std::string cubins = (cache / "cubins").string();
    ro.sanitizer_tools =
        ProbeSanitizerTools(path, f.sanitizer_tools, ro.gate_sandbox, f.gpu_ordinal, cubins,
                            SeedCalibration(registration.gpu.arch, f.gpu_ordinal, cubins));
    const bool memcheck = std::find(ro.sanitizer_tools.begin(), ro.sanitizer_tools.end(),
                                    "memcheck") != ro.sanitizer_tools.end();
    if (!f.sanitizer_gate.empty() && !memcheck) {
      return absl::FailedPreconditionError(
          fmt::format("--sanitizer-gate {}: memcheck does not run on this machine", path));
    }
  }
  if (ro.sanitizer_tools.empty()) {
    spdlog::warn("no sanitizer gates: the server will not promote this worker's results unless "
                 "its configuration allows ungated promotion");
  }
  return absl::OkStatus();
}

// Runs `worker` until it stops by itself or SIGINT/SIGTERM (blocked in
// `stop_signals`) stops it.
void ServeUntilStopped(Worker& worker, const sigset_t& stop_signals) {
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
  worker.Run();
  done.store(true);
  signal_waiter.join();
}

// How to reach the server: the token, and TLS unless the target is on
// loopback (or plaintext is forced).
absl::StatusOr<GrpcClientOptions> ConnectionOptions(const WorkerFlags& f) {
  GrpcClientOptions co;
  co.target = f.server;
  co.token = f.token;
  absl::StatusOr<kforge::ClientTlsPem> tls = kforge::ReadClientTls(f.tls);
  if (!tls.ok()) return tls.status();
  co.tls = *std::move(tls);
  if (absl::Status s = kforge::CheckPlaintext(f.server, f.tls.enabled(), f.allow_plaintext,
                                              "--tls-ca (and --tls-cert/--tls-key for mTLS)");
      !s.ok())
    return absl::FailedPreconditionError(fmt::format("--server {}", std::string(s.message())));
  return co;
}

// What main() does with an error: log it and exit 2.
int Fail(const absl::Status& s) {
  spdlog::error("{}", std::string(s.message()));
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kforge-worker: compiles, verifies and times kernel variants for a kforge server"};
  WorkerFlags f;
  AddFlags(app, f);
  CLI11_PARSE(app, argc, argv);

  spdlog::set_level(spdlog::level::from_str(f.log_level));
  if (std::optional<int> child = RunAsChild(f)) return *child;
  if (absl::Status s = kforge::ConfigureLogging(f.log_format, f.log_level,
                                                "[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
      !s.ok()) {
    fmt::print(stderr, "kforge-worker: {}\n", std::string(s.message()));
    return 2;
  }
  const sigset_t stop_signals = BlockStopSignals();

  absl::StatusOr<std::vector<std::string>> secrets = TakeCredentials(f, argc, argv);
  if (!secrets.ok()) return Fail(secrets.status());
  absl::StatusOr<GrpcClientOptions> connection = ConnectionOptions(f);
  if (!connection.ok()) return Fail(connection.status());
  if (f.name.empty()) f.name = DefaultName(f.gpu_ordinal);
  absl::StatusOr<std::filesystem::path> cache_dir = MakeCacheDir(f.cache_dir);
  if (!cache_dir.ok()) return Fail(cache_dir.status());
  const std::filesystem::path& cache = *cache_dir;

  Registration registration;
  registration.worker_name = f.name;
  std::unique_ptr<kforge::gpu::Driver> driver;
  std::string pci_bus_id;
  if (absl::Status s = DetectGpu(f, registration, driver, pci_bus_id); !s.ok()) return Fail(s);
  if (absl::Status s = ChooseCompileArch(f, registration); !s.ok()) return Fail(s);
  if (absl::Status s = ChooseCompileArchs(f, registration); !s.ok()) return Fail(s);
  if (absl::Status s = CheckChildEnv(f.child_env); !s.ok()) return Fail(s);

  // Candidate sources are compiled in children that hold no secret; the
  // cache stays here.
  CompileChildOptions cco;
  cco.child_env = f.child_env;
  cco.secrets = *secrets;
  const CompileChild compiler(cco);
  if (absl::Status s = ProbeCompileChild(
          compiler, registration.gpu.arch.empty() ? f.compile_arch : registration.gpu.arch);
      !s.ok()) {
    return Fail(s);
  }
  kforge::gpu::CompileCache compile_cache(cache / "cubins");
  kforge::gpu::CompilePool compile_pool(f.compile_threads, &compile_cache, compiler.AsCompiler());

  std::unique_ptr<Sandbox> sandbox;
  RunnerOptions ro;
  if (!registration.compile_only) {
    const SandboxOptions so = EvalSandboxOptions(f, cache);
    sandbox = std::make_unique<Sandbox>(so);
    if (absl::Status s = SetUpSanitizerGates(f, so, registration, cache, ro); !s.ok()) return Fail(s);
  }
  registration.sanitizer_tools = ro.sanitizer_tools;

  ro.gpu = registration.gpu;
  ro.compile_only = registration.compile_only;
  ro.gpu_ordinal = f.gpu_ordinal;
  ro.extra_compile_options = f.nvrtc_options;
  ro.secrets = *secrets;
  ro.compile_cache_dir = (cache / "cubins").string();
  LocalTaskRunner runner(&compile_pool, sandbox.get(), ro);

  std::unique_ptr<ServerClient> client = MakeGrpcServerClient(*connection);

  WorkerOptions wo;
  wo.registration = registration;
  wo.lease_wait = std::chrono::milliseconds(f.lease_wait_ms);
  wo.gpu_usage = GpuUsageSampler(registration, pci_bus_id);
  Worker worker(client.get(), &runner, wo);

  spdlog::info("kforge-worker {} serving {} ({}, {}{}), cache {}", f.name, f.server,
               (registration.compile_only ? "compile-only, " : "") + registration.gpu.arch,
               f.tls.enabled() ? (f.tls.cert_file.empty() ? "TLS" : "TLS with a client certificate")
                               : "plaintext",
               registration.compile_archs.empty()
                   ? std::string()
                   : fmt::format("; compile tasks for {} too",
                                 fmt::join(registration.compile_archs, " ")),
               cache.string());
  ServeUntilStopped(worker, stop_signals);
  WorkerStats s = worker.stats();
  spdlog::info("stopped: {} tasks, {} results accepted, {} rejected, {} dropped", s.tasks_leased,
               s.results_accepted, s.results_rejected, s.results_dropped);
  return 0;
}
