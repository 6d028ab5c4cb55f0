#include "gpu/usage.h"

#include <dlfcn.h>

#include <algorithm>

#include <fmt/format.h>

namespace kforge::gpu {
namespace {

// The few NVML types this file needs, as NVML's C API defines them (the
// toolkit on the build machine ships no nvml.h; the ABI is stable).
using NvmlReturn = int;  // nvmlReturn_t; 0 is NVML_SUCCESS
using NvmlDevice = void*;
struct NvmlUtilization {
  unsigned int gpu;     // percent of the sample period a kernel ran
  unsigned int memory;  // percent of it memory was read or written
};
struct NvmlMemory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
constexpr NvmlReturn kNvmlSuccess = 0;

}  // namespace

struct GpuUsageMonitor::Api {
  NvmlReturn (*Init)();
  NvmlReturn (*Shutdown)();
  const char* (*ErrorString)(NvmlReturn);
  NvmlReturn (*DeviceGetHandleByPciBusId)(const char*, NvmlDevice*);
  NvmlReturn (*DeviceGetUtilizationRates)(NvmlDevice, NvmlUtilization*);
  NvmlReturn (*DeviceGetMemoryInfo)(NvmlDevice, NvmlMemory*);

  std::string Describe(NvmlReturn r, const char* what) const {
    return fmt::format("{}: NVML error {} ({})", what, r, ErrorString ? ErrorString(r) : "?");
  }
};

absl::StatusOr<std::unique_ptr<GpuUsageMonitor>> GpuUsageMonitor::Open(
    const std::string& pci_bus_id) {
  void* handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    return absl::UnavailableError(
        fmt::format("no NVML (libnvidia-ml.so.1 not found: {})", dlerror()));
  auto api = std::make_unique<Api>();
  bool resolved = true;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    resolved = resolved && fn != nullptr;
  };
  sym(api->Init, "nvmlInit_v2");
  sym(api->Shutdown, "nvmlShutdown");
  sym(api->ErrorString, "nvmlErrorString");
  sym(api->DeviceGetHandleByPciBusId, "nvmlDeviceGetHandleByPciBusId_v2");
  sym(api->DeviceGetUtilizationRates, "nvmlDeviceGetUtilizationRates");
  sym(api->DeviceGetMemoryInfo, "nvmlDeviceGetMemoryInfo");
  if (!resolved) {
    dlclose(handle);
    return absl::UnavailableError("NVML lacks an entry point kforge uses");
  }
  if (NvmlReturn r = api->Init(); r != kNvmlSuccess) {
    const std::string why = api->Describe(r, "nvmlInit");
    dlclose(handle);
    return absl::UnavailableError(why);
  }
  NvmlDevice device = nullptr;
  if (NvmlReturn r = api->DeviceGetHandleByPciBusId(pci_bus_id.c_str(), &device);
      r != kNvmlSuccess) {
    const std::string why =
        api->Describe(r, fmt::format("nvmlDeviceGetHandleByPciBusId({})", pci_bus_id).c_str());
    api->Shutdown();
    dlclose(handle);
    return absl::UnavailableError(why);
  }
  return std::unique_ptr<GpuUsageMonitor>(new GpuUsageMonitor(handle, std::move(api), device));
}

GpuUsageMonitor::GpuUsageMonitor(void* handle, std::unique_ptr<Api> api, void* device)
    : handle_(handle), api_(std::move(api)), device_(device) {}

GpuUsageMonitor::~GpuUsageMonitor() {
  api_->Shutdown();
  dlclose(handle_);
}

absl::StatusOr<GpuUsage> GpuUsageMonitor::Sample() const {
  NvmlUtilization u{};
  if (NvmlReturn r = api_->DeviceGetUtilizationRates(device_, &u); r != kNvmlSuccess)
    return absl::UnavailableError(api_->Describe(r, "nvmlDeviceGetUtilizationRates"));
  NvmlMemory m{};
  if (NvmlReturn r = api_->DeviceGetMemoryInfo(device_, &m); r != kNvmlSuccess)
    return absl::UnavailableError(api_->Describe(r, "nvmlDeviceGetMemoryInfo"));
  GpuUsage out;
  out.utilization = std::min(100u, u.gpu) / 100.0;
  out.memory_used_bytes = static_cast<int64_t>(m.used);
  out.memory_total_bytes = static_cast<int64_t>(m.total);
  return out;
}

}  // namespace kforge::gpu
