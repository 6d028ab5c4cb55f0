#include "gpu/gpu.h"

#include <dlfcn.h>

#include <algorithm>
#include <utility>

#include "core/arch.h"
#include "fmt/format.h"
#include "gpu/driver_api.h"

namespace kforge::gpu {
namespace {

CUstream S(const Stream& s) { return static_cast<CUstream>(s.handle()); }

// Resolves `names` in order (versioned symbol first) into `slot`.
template <typename Fn>
bool Resolve(void* handle, Fn& slot, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (void* p = dlsym(handle, name)) {
      slot = reinterpret_cast<Fn>(p);
      return true;
    }
  }
  slot = nullptr;
  return false;
}

}  // namespace

std::string DescribeError(const DriverApi& api, CUresult r, const char* what) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.GetErrorName == nullptr || api.GetErrorName(r, &name) != CUDA_SUCCESS) name = nullptr;
  if (api.GetErrorString == nullptr || api.GetErrorString(r, &text) != CUDA_SUCCESS) {
    text = nullptr;
  }
  return fmt::format("{}: {} ({})", what, name ? name : fmt::format("CUresult {}", int(r)),
                     text ? text : "no description");
}

#define KF_CU(call, what)                                                   \
  do {                                                                      \
    CUresult kf_r = (call);                                                 \
    if (kf_r != CUDA_SUCCESS) {                                             \
      return absl::InternalError(DescribeError(api, kf_r, what));           \
    }                                                                       \
  } while (0)

std::string ArchForComputeCapability(int major, int minor) {
  const bool arch_specific = (major == 9 && minor == 0) || (major == 10 && minor == 0);
  return ArchName(Arch{major, minor, arch_specific});
}

std::string DeviceInfo::ComputeCapability() const {
  return fmt::format("{}.{}", cc_major, cc_minor);
}

std::string DeviceInfo::DriverVersionString() const {
  return fmt::format("{}.{}", driver_version / 1000, (driver_version % 1000) / 10);
}

// ---------------------------------------------------------------- Driver ---

Driver::Driver(void* handle, std::unique_ptr<DriverApi> api)
    : handle_(handle), api_(std::move(api)) {}

// The handle is deliberately not dlclose'd: driver threads may outlive us.
Driver::~Driver() = default;

absl::StatusOr<std::unique_ptr<Driver>> Driver::Load() {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* err = dlerror();
    return absl::UnavailableError(fmt::format("no CUDA driver (libcuda.so.1 not found: {})",
                                              err ? err : "dlopen failed"));
  }
  auto api = std::make_unique<DriverApi>();
  std::string missing;
  auto need = [&](auto& slot, std::initializer_list<const char*> names) {
    if (!Resolve(h, slot, names)) missing += fmt::format(" {}", *names.begin());
  };
  need(api->Init, {"cuInit"});
  need(api->DriverGetVersion, {"cuDriverGetVersion"});
  need(api->GetErrorName, {"cuGetErrorName"});
  need(api->GetErrorString, {"cuGetErrorString"});
  need(api->DeviceGetCount, {"cuDeviceGetCount"});
  need(api->DeviceGet, {"cuDeviceGet"});
  need(api->DeviceGetName, {"cuDeviceGetName"});
  need(api->DeviceGetAttribute, {"cuDeviceGetAttribute"});
  need(api->DeviceTotalMem, {"cuDeviceTotalMem_v2"});
  need(api->DevicePrimaryCtxRetain, {"cuDevicePrimaryCtxRetain"});
  need(api->DevicePrimaryCtxRelease, {"cuDevicePrimaryCtxRelease_v2"});
  need(api->CtxSetCurrent, {"cuCtxSetCurrent"});
  need(api->CtxGetCurrent, {"cuCtxGetCurrent"});
  need(api->CtxSynchronize, {"cuCtxSynchronize"});
  need(api->ModuleLoadData, {"cuModuleLoadData"});
  need(api->ModuleUnload, {"cuModuleUnload"});
  need(api->ModuleGetFunction, {"cuModuleGetFunction"});
  need(api->ModuleGetGlobal, {"cuModuleGetGlobal_v2"});
  need(api->FuncGetAttribute, {"cuFuncGetAttribute"});
  need(api->FuncSetAttribute, {"cuFuncSetAttribute"});
  need(api->OccupancyMaxActiveBlocksPerMultiprocessor,
       {"cuOccupancyMaxActiveBlocksPerMultiprocessor"});
  need(api->LaunchKernel, {"cuLaunchKernel"});
  need(api->MemAlloc, {"cuMemAlloc_v2"});
  need(api->MemFree, {"cuMemFree_v2"});
  need(api->MemcpyHtoD, {"cuMemcpyHtoD_v2"});
  need(api->MemcpyDtoH, {"cuMemcpyDtoH_v2"});
  need(api->MemcpyHtoDAsync, {"cuMemcpyHtoDAsync_v2"});
  need(api->MemcpyDtoHAsync, {"cuMemcpyDtoHAsync_v2"});
  need(api->MemcpyDtoDAsync, {"cuMemcpyDtoDAsync_v2"});
  need(api->MemsetD8, {"cuMemsetD8_v2"});
  need(api->MemsetD32, {"cuMemsetD32_v2"});
  need(api->MemsetD8Async, {"cuMemsetD8Async"});
  need(api->MemsetD32Async, {"cuMemsetD32Async"});
  need(api->StreamCreate, {"cuStreamCreate"});
  need(api->StreamDestroy, {"cuStreamDestroy_v2"});
  need(api->StreamSynchronize, {"cuStreamSynchronize"});
  need(api->EventCreate, {"cuEventCreate"});
  need(api->EventDestroy, {"cuEventDestroy_v2"});
  need(api->EventRecord, {"cuEventRecord"});
  need(api->EventSynchronize, {"cuEventSynchronize"});
  need(api->EventElapsedTime, {"cuEventElapsedTime_v2", "cuEventElapsedTime"});
  need(api->EventQuery, {"cuEventQuery"});
  need(api->StreamWaitEvent, {"cuStreamWaitEvent"});
  Resolve(h, api->TensorMapEncodeTiled, {"cuTensorMapEncodeTiled"});  // optional
  Resolve(h, api->FuncGetParamInfo, {"cuFuncGetParamInfo"});          // optional
  if (!missing.empty()) {
    return absl::UnavailableError(
        fmt::format("CUDA driver too old: libcuda.so.1 lacks{}", missing));
  }
  const DriverApi& a = *api;
  CUresult r = a.Init(0);
  if (r != CUDA_SUCCESS) {
    return absl::UnavailableError(
        fmt::format("no usable CUDA device: {}", DescribeError(a, r, "cuInit")));
  }
  return std::unique_ptr<Driver>(new Driver(h, std::move(api)));
}

absl::StatusOr<int> Driver::DeviceCount() const {
  const DriverApi& api = *api_;
  int n = 0;
  KF_CU(api.DeviceGetCount(&n), "cuDeviceGetCount");
  return n;
}

absl::StatusOr<DeviceInfo> Driver::GetDeviceInfo(int ordinal) const {
  const DriverApi& api = *api_;
  CUdevice dev;
  KF_CU(api.DeviceGet(&dev, ordinal), "cuDeviceGet");
  DeviceInfo info;
  info.ordinal = ordinal;
  char name[256] = {};
  KF_CU(api.DeviceGetName(name, sizeof(name) - 1, dev), "cuDeviceGetName");
  info.name = name;
  auto attr = [&](CUdevice_attribute a, int& out) -> absl::Status {
    KF_CU(api.DeviceGetAttribute(&out, a, dev), "cuDeviceGetAttribute");
    return absl::OkStatus();
  };
  for (auto [a, out] : {std::pair{CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &info.cc_major},
                        std::pair{CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &info.cc_minor},
                        std::pair{CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, &info.sm_count},
                        std::pair{CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, &info.l2_bytes},
                        std::pair{CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                  &info.max_smem_per_block_optin}}) {
    if (absl::Status s = attr(a, *out); !s.ok()) return s;
  }
  size_t mem = 0;
  KF_CU(api.DeviceTotalMem(&mem, dev), "cuDeviceTotalMem");
  info.memory_bytes = static_cast<int64_t>(mem);
  KF_CU(api.DriverGetVersion(&info.driver_version), "cuDriverGetVersion");
  info.arch = ArchForComputeCapability(info.cc_major, info.cc_minor);
  int domain = 0, bus = 0, device = 0;
  for (auto [a, out] : {std::pair{CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, &domain},
                        std::pair{CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, &bus},
                        std::pair{CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, &device}}) {
    if (absl::Status s = attr(a, *out); !s.ok()) return s;
  }
  info.pci_bus_id = fmt::format("{:08x}:{:02x}:{:02x}.0", domain, bus, device);
  return info;
}

absl::StatusOr<std::unique_ptr<Context>> Driver::OpenContext(int ordinal) const {
  const DriverApi& api = *api_;
  CUdevice dev;
  KF_CU(api.DeviceGet(&dev, ordinal), "cuDeviceGet");
  CUcontext ctx;
  KF_CU(api.DevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  auto context = std::unique_ptr<Context>(new Context(this, ordinal, ctx));
  if (absl::Status s = context->MakeCurrent(); !s.ok()) return s;
  return context;
}

// --------------------------------------------------------------- Context ---

Context::Context(const Driver* driver, int ordinal, void* ctx)
    : driver_(driver), ordinal_(ordinal), ctx_(ctx) {}

Context::~Context() {
  const DriverApi& api = driver_->api();
  CUdevice dev;
  if (api.DeviceGet(&dev, ordinal_) == CUDA_SUCCESS) api.DevicePrimaryCtxRelease(dev);
}

absl::Status Context::MakeCurrent() const {
  const DriverApi& api = driver_->api();
  KF_CU(api.CtxSetCurrent(static_cast<CUcontext>(ctx_)), "cuCtxSetCurrent");
  return absl::OkStatus();
}

absl::Status Context::Synchronize() const {
  const DriverApi& api = driver_->api();
  KF_CU(api.CtxSynchronize(), "cuCtxSynchronize");
  return absl::OkStatus();
}

RestoreCurrentContext::RestoreCurrentContext(const Driver& driver) : driver_(&driver) {
  CUcontext current = nullptr;
  saved_ = driver.api().CtxGetCurrent(&current) == CUDA_SUCCESS;
  previous_ = current;
}

RestoreCurrentContext::~RestoreCurrentContext() {
  if (saved_) driver_->api().CtxSetCurrent(static_cast<CUcontext>(previous_));
}

// ---------------------------------------------------------------- Stream ---

absl::StatusOr<Stream> Stream::Create(const Driver& driver) {
  const DriverApi& api = driver.api();
  CUstream s;
  KF_CU(api.StreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  return Stream(&driver, s);
}

Stream Stream::Borrow(const Driver& driver, void* handle) {
  return Stream(&driver, handle, /*owned=*/false);
}

Stream::Stream(Stream&& o) noexcept
    : driver_(std::exchange(o.driver_, nullptr)),
      stream_(std::exchange(o.stream_, nullptr)),
      owned_(std::exchange(o.owned_, true)) {}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    this->~Stream();
    driver_ = std::exchange(o.driver_, nullptr);
    stream_ = std::exchange(o.stream_, nullptr);
    owned_ = std::exchange(o.owned_, true);
  }
  return *this;
}

Stream::~Stream() {
  if (stream_ != nullptr && owned_) driver_->api().StreamDestroy(static_cast<CUstream>(stream_));
  stream_ = nullptr;
}

absl::Status Stream::WaitEvent(const Event& event) const {
  const DriverApi& api = driver_->api();
  KF_CU(api.StreamWaitEvent(static_cast<CUstream>(stream_), static_cast<CUevent>(event.handle()),
                            0),
        "cuStreamWaitEvent");
  return absl::OkStatus();
}

absl::Status Stream::Synchronize() const {
  const DriverApi& api = driver_->api();
  KF_CU(api.StreamSynchronize(static_cast<CUstream>(stream_)), "cuStreamSynchronize");
  return absl::OkStatus();
}

// ----------------------------------------------------------------- Event ---

absl::StatusOr<Event> Event::Create(const Driver& driver, bool timing) {
  const DriverApi& api = driver.api();
  CUevent e;
  KF_CU(api.EventCreate(&e, timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING),
        "cuEventCreate");
  return Event(&driver, e);
}

Event::Event(Event&& o) noexcept
    : driver_(std::exchange(o.driver_, nullptr)), event_(std::exchange(o.event_, nullptr)) {}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    this->~Event();
    driver_ = std::exchange(o.driver_, nullptr);
    event_ = std::exchange(o.event_, nullptr);
  }
  return *this;
}

Event::~Event() {
  if (event_ != nullptr) driver_->api().EventDestroy(static_cast<CUevent>(event_));
  event_ = nullptr;
}

absl::Status Event::Record(const Stream& stream) {
  const DriverApi& api = driver_->api();
  KF_CU(api.EventRecord(static_cast<CUevent>(event_), S(stream)), "cuEventRecord");
  return absl::OkStatus();
}

absl::Status Event::Synchronize() const {
  const DriverApi& api = driver_->api();
  KF_CU(api.EventSynchronize(static_cast<CUevent>(event_)), "cuEventSynchronize");
  return absl::OkStatus();
}

absl::StatusOr<bool> Event::Query() const {
  const DriverApi& api = driver_->api();
  CUresult r = api.EventQuery(static_cast<CUevent>(event_));
  if (r == CUDA_ERROR_NOT_READY) return false;
  KF_CU(r, "cuEventQuery");
  return true;
}

absl::StatusOr<float> Event::ElapsedMs(const Event& start, const Event& end) {
  const DriverApi& api = start.driver_->api();
  float ms = 0;
  KF_CU(api.EventElapsedTime(&ms, static_cast<CUevent>(start.event_),
                             static_cast<CUevent>(end.event_)),
        "cuEventElapsedTime");
  return ms;
}

// ---------------------------------------------------------- DeviceBuffer ---

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(const Driver& driver, size_t bytes,
                                                   size_t offset) {
  const DriverApi& api = driver.api();
  CUdeviceptr p = 0;
  // cuMemAlloc rejects 0 bytes; keep empty tensors addressable instead.
  KF_CU(api.MemAlloc(&p, std::max<size_t>(bytes + offset, 256)), "cuMemAlloc");
  return DeviceBuffer(&driver, p, p + offset, bytes);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : driver_(std::exchange(o.driver_, nullptr)),
      base_(std::exchange(o.base_, 0)),
      ptr_(std::exchange(o.ptr_, 0)),
      bytes_(std::exchange(o.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    this->~DeviceBuffer();
    driver_ = std::exchange(o.driver_, nullptr);
    base_ = std::exchange(o.base_, 0);
    ptr_ = std::exchange(o.ptr_, 0);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (base_ != 0) driver_->api().MemFree(base_);
  base_ = ptr_ = 0;
}

absl::Status DeviceBuffer::CopyFromHost(const void* src, size_t bytes, const Stream& stream,
                                        size_t offset) {
  if (offset + bytes > bytes_) {
    return absl::OutOfRangeError(
        fmt::format("CopyFromHost: {} bytes at {} past a {}-byte buffer", bytes, offset, bytes_));
  }
  if (bytes == 0) return absl::OkStatus();
  const DriverApi& api = driver_->api();
  KF_CU(api.MemcpyHtoDAsync(ptr_ + offset, src, bytes, S(stream)), "cuMemcpyHtoDAsync");
  return absl::OkStatus();
}

absl::Status DeviceBuffer::CopyToHost(void* dst, size_t bytes, const Stream& stream,
                                      size_t offset) const {
  if (offset + bytes > bytes_) {
    return absl::OutOfRangeError(
        fmt::format("CopyToHost: {} bytes at {} past a {}-byte buffer", bytes, offset, bytes_));
  }
  if (bytes == 0) return absl::OkStatus();
  const DriverApi& api = driver_->api();
  KF_CU(api.MemcpyDtoHAsync(dst, ptr_ + offset, bytes, S(stream)), "cuMemcpyDtoHAsync");
  return absl::OkStatus();
}

absl::Status DeviceBuffer::CopyFromDevice(const DeviceBuffer& src, size_t bytes,
                                          const Stream& stream) {
  if (bytes > bytes_ || bytes > src.bytes_) {
    return absl::OutOfRangeError(fmt::format("CopyFromDevice: {} bytes past a buffer", bytes));
  }
  if (bytes == 0) return absl::OkStatus();
  const DriverApi& api = driver_->api();
  KF_CU(api.MemcpyDtoDAsync(ptr_, src.ptr_, bytes, S(stream)), "cuMemcpyDtoDAsync");
  return absl::OkStatus();
}

absl::Status DeviceBuffer::Fill8(uint8_t value, const Stream& stream) {
  if (bytes_ == 0) return absl::OkStatus();
  const DriverApi& api = driver_->api();
  KF_CU(api.MemsetD8Async(ptr_, value, bytes_, S(stream)), "cuMemsetD8Async");
  return absl::OkStatus();
}

absl::Status DeviceBuffer::Fill32(uint32_t value, const Stream& stream) {
  if (bytes_ % 4 != 0) {
    return absl::InvalidArgumentError(
        fmt::format("Fill32: buffer of {} bytes is not a multiple of 4", bytes_));
  }
  if (bytes_ == 0) return absl::OkStatus();
  const DriverApi& api = driver_->api();
  KF_CU(api.MemsetD32Async(ptr_, value, bytes_ / 4, S(stream)), "cuMemsetD32Async");
  return absl::OkStatus();
}

absl::Status FillAsync8(const Driver& driver, uint64_t address, uint8_t value, size_t bytes,
                        const Stream& stream) {
  if (bytes == 0) return absl::OkStatus();
  const DriverApi& api = driver.api();
  KF_CU(api.MemsetD8Async(address, value, bytes, S(stream)), "cuMemsetD8Async");
  return absl::OkStatus();
}

absl::Status FillAsync32(const Driver& driver, uint64_t address, uint32_t value, size_t words,
                         const Stream& stream) {
  if (words == 0) return absl::OkStatus();
  const DriverApi& api = driver.api();
  KF_CU(api.MemsetD32Async(address, value, words, S(stream)), "cuMemsetD32Async");
  return absl::OkStatus();
}

absl::Status CopyToDeviceAsync(const Driver& driver, uint64_t address, const void* src,
                               size_t bytes, const Stream& stream) {
  if (bytes == 0) return absl::OkStatus();
  const DriverApi& api = driver.api();
  KF_CU(api.MemcpyHtoDAsync(address, src, bytes, S(stream)), "cuMemcpyHtoDAsync");
  return absl::OkStatus();
}

// ---------------------------------------------------------- Module/Kernel ---

absl::StatusOr<Module> Module::Load(const Driver& driver, std::span<const char> image) {
  if (image.empty()) return absl::InvalidArgumentError("Module::Load: empty image");
  const DriverApi& api = driver.api();
  CUmodule m;
  KF_CU(api.ModuleLoadData(&m, image.data()), "cuModuleLoadData");
  return Module(&driver, m);
}

Module::Module(Module&& o) noexcept
    : driver_(std::exchange(o.driver_, nullptr)), module_(std::exchange(o.module_, nullptr)) {}

Module& Module::operator=(Module&& o) noexcept {
  if (this != &o) {
    this->~Module();
    driver_ = std::exchange(o.driver_, nullptr);
    module_ = std::exchange(o.module_, nullptr);
  }
  return *this;
}

Module::~Module() {
  if (module_ != nullptr) driver_->api().ModuleUnload(static_cast<CUmodule>(module_));
  module_ = nullptr;
}

absl::StatusOr<Kernel> Module::GetKernel(std::string_view name) const {
  const DriverApi& api = driver_->api();
  std::string n(name);
  CUfunction f;
  CUresult r = api.ModuleGetFunction(&f, static_cast<CUmodule>(module_), n.c_str());
  if (r == CUDA_ERROR_NOT_FOUND) {
    return absl::NotFoundError(fmt::format("no entry point '{}' in the module", n));
  }
  KF_CU(r, "cuModuleGetFunction");
  Kernel k(driver_, f, std::move(n));
  // The parameters the kernel declares, read once here: a launch passes
  // only the contract's, and the driver copies each declared one from what
  // it is given (cuFuncGetParamInfo answers INVALID_VALUE past the last).
  if (api.FuncGetParamInfo != nullptr) {
    std::vector<size_t> sizes;
    for (size_t i = 0; i <= 64; ++i) {
      size_t offset = 0, size = 0;
      const CUresult q = api.FuncGetParamInfo(f, i, &offset, &size);
      if (q == CUDA_ERROR_INVALID_VALUE) {
        k.param_sizes_ = std::move(sizes);
        k.params_known_ = true;
        break;
      }
      if (q != CUDA_SUCCESS) break;  // the driver cannot tell: no check
      sizes.push_back(size);
    }
  }
  return k;
}

absl::StatusOr<DeviceRegion> Module::GetGlobal(std::string_view name) const {
  const DriverApi& api = driver_->api();
  std::string n(name);
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  CUresult r = api.ModuleGetGlobal(&ptr, &bytes, static_cast<CUmodule>(module_), n.c_str());
  if (r == CUDA_ERROR_NOT_FOUND) {
    return absl::NotFoundError(fmt::format("no global '{}' in the module", n));
  }
  KF_CU(r, "cuModuleGetGlobal");
  return DeviceRegion{static_cast<uint64_t>(ptr), bytes};
}

absl::StatusOr<KernelAttributes> Kernel::Attributes() const {
  const DriverApi& api = driver_->api();
  auto f = static_cast<CUfunction>(function_);
  KernelAttributes a;
  KF_CU(api.FuncGetAttribute(&a.num_regs, CU_FUNC_ATTRIBUTE_NUM_REGS, f), "cuFuncGetAttribute");
  KF_CU(api.FuncGetAttribute(&a.local_bytes, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f),
        "cuFuncGetAttribute");
  KF_CU(api.FuncGetAttribute(&a.static_smem_bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f),
        "cuFuncGetAttribute");
  KF_CU(api.FuncGetAttribute(&a.max_threads_per_block, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                             f),
        "cuFuncGetAttribute");
  return a;
}

absl::Status Kernel::SetMaxDynamicSharedMemory(int bytes) const {
  const DriverApi& api = driver_->api();
  KF_CU(api.FuncSetAttribute(static_cast<CUfunction>(function_),
                             CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes),
        "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
  return absl::OkStatus();
}

absl::StatusOr<int> Kernel::MaxActiveBlocksPerSm(int threads, int dynamic_smem) const {
  const DriverApi& api = driver_->api();
  int blocks = 0;
  KF_CU(api.OccupancyMaxActiveBlocksPerMultiprocessor(&blocks, static_cast<CUfunction>(function_),
                                                      threads, static_cast<size_t>(dynamic_smem)),
        "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  return blocks;
}

absl::Status CheckKernelParams(std::string_view kernel, std::span<const size_t> declared,
                               std::span<const size_t> passed) {
  bool ok = declared.size() <= passed.size();
  for (size_t i = 0; ok && i < declared.size(); ++i) ok = declared[i] <= passed[i];
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(fmt::format(
      "kernel {} declares {} parameter(s) of [{}] bytes, but a launch passes [{}]: the "
      "contract's KfAttnParams, then the manifest's tensor maps if it asks for any",
      kernel, declared.size(), fmt::join(declared, ", "), fmt::join(passed, ", ")));
}

absl::Status Kernel::Launch(const KfAttnParams& params, Dim3 grid, Dim3 block, int dynamic_smem,
                            const Stream& stream) const {
  return Launch(params, {}, grid, block, dynamic_smem, stream);
}

absl::Status Kernel::Launch(const KfAttnParams& params, std::span<const TensorMap> maps,
                            Dim3 grid, Dim3 block, int dynamic_smem, const Stream& stream) const {
  // The maps are one parameter: n x 128 contiguous bytes, as the kernel
  // declares them (a struct of n maps), copied by the driver at launch.
  const size_t passed[] = {sizeof(KfAttnParams), maps.size() * sizeof(TensorMap)};
  if (params_known_) {
    if (absl::Status s =
            CheckKernelParams(name_, param_sizes_, std::span(passed, maps.empty() ? 1 : 2));
        !s.ok())
      return s;
  }
  void* args[] = {const_cast<KfAttnParams*>(&params), const_cast<TensorMap*>(maps.data())};
  return LaunchRaw(args, grid, block, dynamic_smem, stream);
}

absl::Status Kernel::LaunchRaw(void** args, Dim3 grid, Dim3 block, int dynamic_smem,
                               const Stream& stream) const {
  const DriverApi& api = driver_->api();
  KF_CU(api.LaunchKernel(static_cast<CUfunction>(function_), grid.x, grid.y, grid.z, block.x,
                         block.y, block.z, static_cast<unsigned>(dynamic_smem), S(stream), args,
                         nullptr),
        "cuLaunchKernel");
  return absl::OkStatus();
}

// ------------------------------------------------------------- TensorMap ---

absl::StatusOr<TensorMap> EncodeTensorMapTiled(const Driver& driver, const TensorMapSpec& spec) {
  const DriverApi& api = driver.api();
  if (api.TensorMapEncodeTiled == nullptr) {
    return absl::UnimplementedError("this CUDA driver has no cuTensorMapEncodeTiled");
  }
  if (spec.rank < 1 || spec.rank > 5) {
    return absl::InvalidArgumentError(fmt::format("tensor map rank {} not in 1..5", spec.rank));
  }
  CUtensorMapSwizzle swizzle;
  switch (spec.swizzle_bytes) {
    case 0: swizzle = CU_TENSOR_MAP_SWIZZLE_NONE; break;
    case 32: swizzle = CU_TENSOR_MAP_SWIZZLE_32B; break;
    case 64: swizzle = CU_TENSOR_MAP_SWIZZLE_64B; break;
    case 128: swizzle = CU_TENSOR_MAP_SWIZZLE_128B; break;
    default:
      return absl::InvalidArgumentError(fmt::format("swizzle {} not 0/32/64/128", spec.swizzle_bytes));
  }
  static_assert(sizeof(TensorMap) == sizeof(CUtensorMap));
  TensorMap map{};
  cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  KF_CU(api.TensorMapEncodeTiled(
            reinterpret_cast<CUtensorMap*>(&map),
            spec.dtype == TensorMapSpec::DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                      : CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
            static_cast<cuuint32_t>(spec.rank), const_cast<void*>(spec.global_address),
            spec.dims, spec.strides_bytes, spec.box, element_strides,
            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        "cuTensorMapEncodeTiled");
  return map;
}

absl::StatusOr<std::optional<TensorMapSpec>> AttnTensorMapSpec(const KfAttnParams& p,
                                                              const TensorMapRequest& r) {
  if (!IsMappableTensor(r.tensor)) {
    return absl::InvalidArgumentError(
        fmt::format("tensor map of \"{}\": not q, k, v, o, dout, dk or dv", r.tensor));
  }
  if (r.box_rows < 1 || r.box_rows > 256) {
    return absl::InvalidArgumentError(
        fmt::format("tensor map of {}: box_rows {} is outside [1, 256]", r.tensor, r.box_rows));
  }
  const bool kv = r.tensor == "k" || r.tensor == "v" || IsBackwardOutputTensor(r.tensor);
  const void* address = r.tensor == "q"    ? p.q
                        : r.tensor == "k"  ? p.k
                        : r.tensor == "v"  ? p.v
                        : r.tensor == "o"  ? static_cast<const void*>(p.o)
                        : r.tensor == "dk" ? static_cast<const void*>(p.dk)
                        : r.tensor == "dv" ? static_cast<const void*>(p.dv)
                                           : p.dout;
  const int64_t rows = kv ? p.total_k : p.total_q;
  const int64_t cols = int64_t(kv ? p.kv_heads : p.heads) * p.head_dim;
  if (rows <= 0) return std::nullopt;  // nothing to read: no box is ever loaded
  if (address == nullptr || reinterpret_cast<uintptr_t>(address) % 16 != 0) {
    return absl::InvalidArgumentError(fmt::format(
        "tensor map of {}: address {} is {} (TMA needs a 16-byte aligned tensor)", r.tensor,
        address, address == nullptr ? "null" : "not 16-byte aligned"));
  }
  if (cols <= 0 || cols % 64 != 0) {
    return absl::InvalidArgumentError(fmt::format(
        "tensor map of {}: {} columns (heads x head_dim) are not a multiple of the 64-column box",
        r.tensor, cols));
  }
  TensorMapSpec spec;
  spec.dtype = TensorMapSpec::DType::kBF16;
  spec.rank = 2;
  spec.global_address = address;
  spec.dims[0] = uint64_t(cols);
  spec.dims[1] = uint64_t(rows);
  spec.strides_bytes[0] = uint64_t(cols) * 2;
  spec.box[0] = 64;
  spec.box[1] = uint32_t(r.box_rows);
  spec.swizzle_bytes = 128;
  return spec;
}

absl::StatusOr<TensorMap> EncodeAttnTensorMap(const Driver& driver, const KfAttnParams& p,
                                              const TensorMapRequest& r) {
  absl::StatusOr<std::optional<TensorMapSpec>> spec = AttnTensorMapSpec(p, r);
  if (!spec.ok()) return spec.status();
  if (!spec->has_value()) return TensorMap{};
  auto map = EncodeTensorMapTiled(driver, **spec);
  if (!map.ok()) {
    return absl::Status(map.status().code(),
                        fmt::format("tensor map of {}: {}", r.tensor, std::string(map.status().message())));
  }
  return map;
}

absl::StatusOr<std::vector<TensorMap>> EncodeAttnTensorMaps(
    const Driver& driver, const KfAttnParams& params, std::span<const TensorMapRequest> requests) {
  std::vector<TensorMap> maps;
  maps.reserve(requests.size());
  for (const TensorMapRequest& r : requests) {
    auto m = EncodeAttnTensorMap(driver, params, r);
    if (!m.ok()) return m.status();
    maps.push_back(*m);
  }
  return maps;
}

}  // namespace kforge::gpu
