#include "gpu/compile.h"

#include <nvrtc.h>

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "fmt/format.h"
#include "kernels/attn_params_text.h"
#include "nlohmann/json.hpp"

namespace kforge::gpu {
namespace {

// Reads the integer right before `suffix` in `line` (e.g. "12 bytes spill
// stores" with suffix " bytes spill stores"); -1 when absent.
int NumberBefore(std::string_view line, std::string_view suffix) {
  size_t at = line.find(suffix);
  if (at == std::string_view::npos) return -1;
  size_t begin = at;
  while (begin > 0 && line[begin - 1] >= '0' && line[begin - 1] <= '9') --begin;
  int value = -1;
  std::from_chars(line.data() + begin, line.data() + at, value);
  return value;
}

// The text between the first pair of single quotes after `key`.
std::string QuotedAfter(std::string_view line, std::string_view key) {
  size_t at = line.find(key);
  if (at == std::string_view::npos) return "";
  size_t open = line.find('\'', at + key.size());
  if (open == std::string_view::npos) return "";
  size_t close = line.find('\'', open + 1);
  if (close == std::string_view::npos) return "";
  return std::string(line.substr(open + 1, close - open - 1));
}

std::string Trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

std::string Nvrtc(nvrtcResult r) { return nvrtcGetErrorString(r); }

// The compile itself (Compile() runs it on its own thread so a deadline can
// be enforced).
absl::StatusOr<CompileResult> CompileNow(const CompileRequest& request,
                                         const std::vector<std::string>& options) {
  CompileResult result;
  result.arch = request.arch;
  result.nvrtc_version = NvrtcVersion();
  for (const std::string& o : options) {
    if (!result.options.empty()) result.options += ' ';
    result.options += o;
  }
  const char* header_sources[] = {embedded::attn_params_h};
  const char* header_names[] = {"kforge/attn_params.h"};
  auto start = std::chrono::steady_clock::now();
  nvrtcProgram prog;
  nvrtcResult r = nvrtcCreateProgram(&prog, request.source.c_str(), request.name.c_str(), 1,
                                     header_sources, header_names);
  if (r != NVRTC_SUCCESS) {
    return absl::InternalError(fmt::format("nvrtcCreateProgram: {}", Nvrtc(r)));
  }
  std::unique_ptr<nvrtcProgram, void (*)(nvrtcProgram*)> guard(&prog, [](nvrtcProgram* p) {
    nvrtcDestroyProgram(p);
  });
  std::vector<const char*> argv;
  for (const std::string& o : options) argv.push_back(o.c_str());
  nvrtcResult compiled = nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());
  result.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

  size_t log_size = 0;
  if (nvrtcGetProgramLogSize(prog, &log_size) == NVRTC_SUCCESS && log_size > 1) {
    result.log.resize(log_size);
    nvrtcGetProgramLog(prog, result.log.data());
    result.log.resize(log_size - 1);  // drop the terminating NUL
  }
  if (compiled == NVRTC_ERROR_COMPILATION) {
    result.ok = false;
    return result;
  }
  if (compiled != NVRTC_SUCCESS) {
    // An option NVRTC rejects is the candidate's fault when the candidate
    // supplied extra options; record it as a compile error with the reason.
    if (compiled == NVRTC_ERROR_INVALID_OPTION && !request.extra_options.empty()) {
      result.ok = false;
      result.log = fmt::format("nvrtcCompileProgram: {} (options: {})\n{}", Nvrtc(compiled),
                               result.options, result.log);
      return result;
    }
    return absl::InternalError(fmt::format("nvrtcCompileProgram: {}\n{}", Nvrtc(compiled),
                                           result.log));
  }
  size_t cubin_size = 0;
  r = nvrtcGetCUBINSize(prog, &cubin_size);
  if (r != NVRTC_SUCCESS) return absl::InternalError(fmt::format("nvrtcGetCUBINSize: {}", Nvrtc(r)));
  if (cubin_size == 0) {
    result.ok = false;
    result.log += fmt::format("\nno cubin produced: '{}' is not a real architecture", request.arch);
    return result;
  }
  result.cubin.resize(cubin_size);
  r = nvrtcGetCUBIN(prog, result.cubin.data());
  if (r != NVRTC_SUCCESS) return absl::InternalError(fmt::format("nvrtcGetCUBIN: {}", Nvrtc(r)));
  result.ok = true;
  result.functions = ParsePtxasLog(result.log);
  result.resources_from_log = !result.functions.empty();
  if (result.functions.empty()) result.functions = ParseCubinResources(result.cubin, request.arch);
  result.total = MaxResources(result.functions);
  return result;
}

}  // namespace

std::string NvrtcVersion() {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return "unknown";
  return fmt::format("{}.{}", major, minor);
}

namespace {

// Whether NVRTC makes a cubin of an empty kernel for `arch`.
bool CompilesFor(const std::string& arch) {
  nvrtcProgram prog;
  if (nvrtcCreateProgram(&prog, "extern \"C\" __global__ void kf_arch_probe() {}\n", "probe.cu", 0,
                         nullptr, nullptr) != NVRTC_SUCCESS)
    return false;
  const std::string option = fmt::format("-arch={}", arch);
  const char* argv[] = {option.c_str()};
  size_t cubin = 0;
  const bool ok = nvrtcCompileProgram(prog, 1, argv) == NVRTC_SUCCESS &&
                  nvrtcGetCUBINSize(prog, &cubin) == NVRTC_SUCCESS && cubin > 0;
  nvrtcDestroyProgram(&prog);
  return ok;
}

}  // namespace

std::vector<std::string> NvrtcTargetArchs() {
  int n = 0;
  if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0) return {};
  std::vector<int> numbers(static_cast<size_t>(n));
  if (nvrtcGetSupportedArchs(numbers.data()) != NVRTC_SUCCESS) return {};
  std::sort(numbers.begin(), numbers.end());
  std::vector<std::string> out;
  for (int number : numbers) {
    out.push_back(fmt::format("sm_{}", number));
    // Architecture-specific targets began with Hopper (sm_90a).
    if (number >= 90) {
      const std::string specific = fmt::format("sm_{}a", number);
      if (CompilesFor(specific)) out.push_back(specific);
    }
  }
  return out;
}

std::vector<std::string> CompileOptions(const CompileRequest& request) {
  std::vector<std::string> options = {fmt::format("-arch={}", request.arch), "-default-device",
                                      "--std=c++17", "--ptxas-options=-v", "-no-source-include"};
  options.insert(options.end(), request.extra_options.begin(), request.extra_options.end());
  return options;
}

absl::StatusOr<CompileResult> Compile(const CompileRequest& request) {
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    absl::StatusOr<CompileResult> result = absl::UnknownError("not run");
  };
  auto shared = std::make_shared<Shared>();
  auto options = CompileOptions(request);
  // The worker thread owns copies of everything it reads, so abandoning it
  // on a deadline leaves it nothing dangling.
  std::thread worker([shared, request, options] {
    absl::StatusOr<CompileResult> r = CompileNow(request, options);
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->result = std::move(r);
    shared->done = true;
    shared->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(shared->mu);
  if (!shared->cv.wait_for(lock, request.time_limit, [&] { return shared->done; })) {
    lock.unlock();
    worker.detach();  // see CompileRequest::time_limit
    CompileResult timed_out;
    timed_out.ok = false;
    timed_out.arch = request.arch;
    timed_out.nvrtc_version = NvrtcVersion();
    timed_out.compile_ms = static_cast<double>(request.time_limit.count());
    for (const std::string& o : options) {
      if (!timed_out.options.empty()) timed_out.options += ' ';
      timed_out.options += o;
    }
    timed_out.log = CompileTimeoutLog(request.time_limit);
    timed_out.transient = true;
    return timed_out;
  }
  absl::StatusOr<CompileResult> result = std::move(shared->result);
  lock.unlock();
  worker.join();
  return result;
}

absl::StatusOr<CompileResult> CompileBlocking(const CompileRequest& request) {
  return CompileNow(request, CompileOptions(request));
}

std::string CompileTimeoutLog(std::chrono::milliseconds limit) {
  return fmt::format("compile exceeded {} s", static_cast<double>(limit.count()) / 1000.0);
}

std::string CompileResultToJson(const CompileResult& r) {
  nlohmann::json functions = nlohmann::json::array();
  for (const auto& f : r.functions) {
    functions.push_back({{"function", f.function},
                         {"registers", f.registers},
                         {"spill_stores_bytes", f.spill_stores_bytes},
                         {"spill_loads_bytes", f.spill_loads_bytes},
                         {"stack_frame_bytes", f.stack_frame_bytes},
                         {"static_smem_bytes", f.static_smem_bytes}});
  }
  nlohmann::json j = {{"ok", r.ok},
                      {"log", r.log},
                      {"options", r.options},
                      {"arch", r.arch},
                      {"nvrtc_version", r.nvrtc_version},
                      {"compile_ms", r.compile_ms},
                      {"resources_from_log", r.resources_from_log},
                      {"functions", functions}};
  // A log is whatever NVRTC printed, not necessarily UTF-8: bad bytes become
  // U+FFFD rather than an exception.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

absl::StatusOr<CompileResult> CompileResultFromJson(std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("compile result: not a JSON object");
  }
  CompileResult r;
  try {
    r.ok = j.at("ok").get<bool>();
    r.log = j.at("log").get<std::string>();
    r.options = j.at("options").get<std::string>();
    r.arch = j.at("arch").get<std::string>();
    r.nvrtc_version = j.at("nvrtc_version").get<std::string>();
    r.compile_ms = j.at("compile_ms").get<double>();
    r.resources_from_log = j.value("resources_from_log", false);
    for (const auto& f : j.at("functions")) {
      r.functions.push_back(FunctionResources{
          .function = f.at("function").get<std::string>(),
          .registers = f.at("registers").get<int>(),
          .spill_stores_bytes = f.at("spill_stores_bytes").get<int>(),
          .spill_loads_bytes = f.at("spill_loads_bytes").get<int>(),
          .stack_frame_bytes = f.at("stack_frame_bytes").get<int>(),
          .static_smem_bytes = f.at("static_smem_bytes").get<int>()});
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("compile result: {}", e.what()));
  }
  r.total = MaxResources(r.functions);
  return r;
}

std::vector<FunctionResources> ParsePtxasLog(std::string_view log) {
  std::vector<FunctionResources> out;
  auto find_or_add = [&](const std::string& name) -> FunctionResources& {
    for (auto& f : out) {
      if (f.function == name) return f;
    }
    out.push_back(FunctionResources{.function = name});
    return out.back();
  };
  std::string current_entry;      // set by "Compiling entry function"
  std::string current_properties;  // set by "Function properties for"
  size_t pos = 0;
  while (pos <= log.size()) {
    size_t end = log.find('\n', pos);
    if (end == std::string_view::npos) end = log.size();
    std::string_view line = log.substr(pos, end - pos);
    pos = end + 1;
    if (line.find("Compiling entry function") != std::string_view::npos) {
      current_entry = QuotedAfter(line, "Compiling entry function");
      if (!current_entry.empty()) find_or_add(current_entry);
      current_properties.clear();
    } else if (size_t at = line.find("Function properties for "); at != std::string_view::npos) {
      current_properties = Trim(line.substr(at + std::string_view("Function properties for ").size()));
    } else if (line.find("bytes stack frame") != std::string_view::npos) {
      const std::string& name = !current_properties.empty() ? current_properties : current_entry;
      if (name.empty()) continue;
      FunctionResources& f = find_or_add(name);
      f.stack_frame_bytes = std::max(0, NumberBefore(line, " bytes stack frame"));
      f.spill_stores_bytes = std::max(0, NumberBefore(line, " bytes spill stores"));
      f.spill_loads_bytes = std::max(0, NumberBefore(line, " bytes spill loads"));
    } else if (line.find(" registers") != std::string_view::npos &&
               line.find("Used ") != std::string_view::npos) {
      if (current_entry.empty()) continue;
      FunctionResources& f = find_or_add(current_entry);
      f.registers = std::max(0, NumberBefore(line, " registers"));
      f.static_smem_bytes = std::max(0, NumberBefore(line, " bytes smem"));
    }
  }
  return out;
}

FunctionResources MaxResources(const std::vector<FunctionResources>& functions) {
  FunctionResources m;
  for (const auto& f : functions) {
    m.registers = std::max(m.registers, f.registers);
    m.spill_stores_bytes = std::max(m.spill_stores_bytes, f.spill_stores_bytes);
    m.spill_loads_bytes = std::max(m.spill_loads_bytes, f.spill_loads_bytes);
    m.stack_frame_bytes = std::max(m.stack_frame_bytes, f.stack_frame_bytes);
    m.static_smem_bytes = std::max(m.static_smem_bytes, f.static_smem_bytes);
  }
  return m;
}

}  // namespace kforge::gpu
