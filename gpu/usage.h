// GpuUsageMonitor: what a GPU is doing, from NVML (libnvidia-ml.so.1, which
// ships with the driver and is loaded with dlopen, never linked): the
// fraction of time a kernel ran and the memory in use. kforge-worker sends
// it with its heartbeats so operators see it on the dashboard.
//
// Thread-compatible: Sample() may be called from one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kforge::gpu {

struct GpuUsage {
  // Fraction (0 to 1) of NVML's last sample period (1/6 s to 1 s,
  // depending on the product) during which one or more kernels ran.
  double utilization = 0;
  int64_t memory_used_bytes = 0;
  int64_t memory_total_bytes = 0;
};

class GpuUsageMonitor {
 public:
  // Loads NVML and finds the device at `pci_bus_id` (DeviceInfo::pci_bus_id).
  // UNAVAILABLE naming the reason when NVML is missing or does not know it.
  static absl::StatusOr<std::unique_ptr<GpuUsageMonitor>> Open(const std::string& pci_bus_id);
  ~GpuUsageMonitor();  // shuts NVML down
  GpuUsageMonitor(const GpuUsageMonitor&) = delete;
  GpuUsageMonitor& operator=(const GpuUsageMonitor&) = delete;

  absl::StatusOr<GpuUsage> Sample() const;

  struct Api;

 private:
  GpuUsageMonitor(void* handle, std::unique_ptr<Api> api, void* device);
  void* handle_;
  std::unique_ptr<Api> api_;
  void* device_;  // nvmlDevice_t
};

}  // namespace kforge::gpu
