// kforge's GPU runtime: a thin, owning layer over the CUDA driver API.
//
// The driver (libcuda.so.1) is dlopen'ed, never linked, so every kforge binary
// starts on machines without a GPU; Driver::Load() then fails with a clear
// "no CUDA driver" status and callers fall back to compile-only work.
// No CUDA type (CUfunction, CUmodule, CUstream...) leaves this folder: the
// classes below hold them as opaque handles.
//
// Threading: a Driver is immutable after Load() and may be shared by threads.
// The CUDA context is per thread: call Context::MakeCurrent() on each thread
// before using buffers, streams, events or modules from it. The RAII objects
// themselves are not thread-safe; give each thread its own.
//
// Every failing driver call becomes an absl::Status whose message names the
// call and the driver's error name, e.g.
//   "cuLaunchKernel: CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access ...)".
// After such an error the context may be unusable (sticky errors): the
// evaluator runs candidates in a child process for that reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor_map.h"
#include "kforge/attn_params.h"

namespace kforge::gpu {

struct DriverApi;  // the resolved function table (driver_api.h, internal)
struct TensorMap;  // a TMA descriptor (below)

struct DeviceInfo {
  int ordinal = 0;
  std::string name;           // "NVIDIA H200"
  int cc_major = 0;
  int cc_minor = 0;
  int sm_count = 0;
  int64_t memory_bytes = 0;
  int l2_bytes = 0;
  int max_smem_per_block_optin = 0;  // bytes of dynamic shared memory allowed
  int driver_version = 0;            // e.g. 13000
  std::string arch;                  // NVRTC target: "sm_90a", "sm_100a", "sm_89"
  std::string pci_bus_id;            // "00000000:19:00.0": how NVML names the device

  std::string ComputeCapability() const;  // "9.0"
  std::string DriverVersionString() const;  // "13.0"
};

// The NVRTC target for a compute capability: the architecture-specific "a"
// targets where the fast paths need them (9.0 -> sm_90a, 10.0 -> sm_100a),
// plain "sm_XY" otherwise.
std::string ArchForComputeCapability(int major, int minor);

class Context;

class Driver {
 public:
  // dlopens libcuda.so.1, resolves the entry points and calls cuInit(0).
  // Fails with kUnavailable "no CUDA driver (libcuda.so.1 not found: ...)"
  // on machines without a driver, or when cuInit finds no device.
  static absl::StatusOr<std::unique_ptr<Driver>> Load();
  ~Driver();
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  absl::StatusOr<int> DeviceCount() const;
  absl::StatusOr<DeviceInfo> GetDeviceInfo(int ordinal) const;

  // Retains the primary context of device `ordinal` and makes it current on
  // the calling thread. The Driver must outlive the Context.
  absl::StatusOr<std::unique_ptr<Context>> OpenContext(int ordinal) const;

  // Internal: the resolved entry points, for the other classes of gpu/.
  const DriverApi& api() const { return *api_; }

 private:
  Driver(void* handle, std::unique_ptr<DriverApi> api);
  void* handle_;
  std::unique_ptr<DriverApi> api_;
};

// A device's primary context, retained for the object's lifetime.
class Context {
 public:
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  absl::Status MakeCurrent() const;  // on the calling thread
  absl::Status Synchronize() const;  // whole device; never inside timed code
  const Driver& driver() const { return *driver_; }
  int ordinal() const { return ordinal_; }

 private:
  friend class Driver;
  Context(const Driver* driver, int ordinal, void* ctx);
  const Driver* driver_;  // must outlive this
  int ordinal_;
  void* ctx_;
};

class Event;

// Puts back the calling thread's current context (or none) when it goes out
// of scope: library code that opens or makes its own context current leaves
// its caller's as it found it (a caller's current context is its current
// device to the CUDA runtime and to PyTorch).
class RestoreCurrentContext {
 public:
  explicit RestoreCurrentContext(const Driver& driver);
  ~RestoreCurrentContext();
  RestoreCurrentContext(const RestoreCurrentContext&) = delete;
  RestoreCurrentContext& operator=(const RestoreCurrentContext&) = delete;

 private:
  const Driver* driver_;  // must outlive this
  void* previous_ = nullptr;
  bool saved_ = false;
};

class Stream {
 public:
  // A non-blocking stream owned by the host code that creates it.
  static absl::StatusOr<Stream> Create(const Driver& driver);
  // A stream someone else owns (a library caller's cudaStream_t / CUstream;
  // nullptr is the legacy default stream): wrapping it neither creates nor
  // destroys it. The stream must outlive the wrapper's use.
  static Stream Borrow(const Driver& driver, void* handle);
  Stream() = default;
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  ~Stream();

  absl::Status Synchronize() const;
  // Makes later work on this stream wait for `event` (no host wait).
  absl::Status WaitEvent(const Event& event) const;
  void* handle() const { return stream_; }  // CUstream, for gpu/ internals

 private:
  Stream(const Driver* driver, void* stream, bool owned = true)
      : driver_(driver), stream_(stream), owned_(owned) {}
  const Driver* driver_ = nullptr;  // must outlive this
  void* stream_ = nullptr;
  bool owned_ = true;  // false: Borrow()ed, not destroyed here
};

class Event {
 public:
  // timing = false makes recording cheaper (for ordering, not measuring).
  static absl::StatusOr<Event> Create(const Driver& driver, bool timing = true);
  Event() = default;
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  ~Event();

  absl::Status Record(const Stream& stream);
  absl::Status Synchronize() const;
  // True when the work before the last Record has completed (never waits).
  absl::StatusOr<bool> Query() const;
  void* handle() const { return event_; }  // CUevent, for gpu/ internals
  // Milliseconds between two recorded, completed events.
  static absl::StatusOr<float> ElapsedMs(const Event& start, const Event& end);

 private:
  Event(const Driver* driver, void* event) : driver_(driver), event_(event) {}
  const Driver* driver_ = nullptr;
  void* event_ = nullptr;
};

// Device memory. Copies and memsets are asynchronous on `stream` unless the
// name says otherwise; host memory must stay alive until the stream syncs.
class DeviceBuffer {
 public:
  // `bytes` from cuMemAlloc (256-byte aligned). With `offset`, the buffer
  // starts that many bytes into its allocation: memory at exactly the
  // alignment a contract promises, no more (the evaluator's tensors).
  static absl::StatusOr<DeviceBuffer> Allocate(const Driver& driver, size_t bytes,
                                               size_t offset = 0);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  ~DeviceBuffer();

  size_t size() const { return bytes_; }
  uint64_t address() const { return ptr_; }  // CUdeviceptr value
  void* get() const { return reinterpret_cast<void*>(ptr_); }
  template <typename T>
  T* as() const { return reinterpret_cast<T*>(ptr_); }

  absl::Status CopyFromHost(const void* src, size_t bytes, const Stream& stream,
                            size_t offset = 0);
  absl::Status CopyToHost(void* dst, size_t bytes, const Stream& stream,
                          size_t offset = 0) const;
  absl::Status CopyFromDevice(const DeviceBuffer& src, size_t bytes, const Stream& stream);
  absl::Status Fill8(uint8_t value, const Stream& stream);
  absl::Status Fill32(uint32_t value, const Stream& stream);  // size must be a multiple of 4

  // Synchronous conveniences for tests and setup code.
  template <typename T>
  absl::Status Upload(std::span<const T> host, const Stream& stream) {
    absl::Status s = CopyFromHost(host.data(), host.size_bytes(), stream);
    return s.ok() ? stream.Synchronize() : s;
  }
  template <typename T>
  absl::Status Download(std::span<T> host, const Stream& stream) const {
    absl::Status s = CopyToHost(host.data(), host.size_bytes(), stream);
    return s.ok() ? stream.Synchronize() : s;
  }

 private:
  DeviceBuffer(const Driver* driver, uint64_t base, uint64_t ptr, size_t bytes)
      : driver_(driver), base_(base), ptr_(ptr), bytes_(bytes) {}
  const Driver* driver_ = nullptr;
  uint64_t base_ = 0;  // what cuMemAlloc returned (and cuMemFree takes)
  uint64_t ptr_ = 0;   // base_ + the offset
  size_t bytes_ = 0;
};

// Device memory someone else owns (a module's globals): an address and a size.
struct DeviceRegion {
  uint64_t address = 0;
  size_t bytes = 0;
};

// Device memory by address, for memory the host code does not own (a
// library caller's tensors) or parts of a buffer. Asynchronous on `stream`;
// a pageable `src` may be reused as soon as the call returns (the driver
// stages it), without waiting for the device.
absl::Status FillAsync8(const Driver& driver, uint64_t address, uint8_t value, size_t bytes,
                        const Stream& stream);
absl::Status FillAsync32(const Driver& driver, uint64_t address, uint32_t value, size_t words,
                         const Stream& stream);
absl::Status CopyToDeviceAsync(const Driver& driver, uint64_t address, const void* src,
                               size_t bytes, const Stream& stream);

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

struct KernelAttributes {
  int num_regs = 0;
  int local_bytes = 0;        // per thread: spills and stack arrays
  int static_smem_bytes = 0;
  int max_threads_per_block = 0;
};

class Module;

// A function inside a loaded Module; the Module must outlive it.
class Kernel {
 public:
  Kernel() = default;
  const std::string& name() const { return name_; }
  absl::StatusOr<KernelAttributes> Attributes() const;
  // Needed above 48 KB of dynamic shared memory.
  absl::Status SetMaxDynamicSharedMemory(int bytes) const;

  // Blocks of `threads` that fit on one SM at once, by registers, shared
  // memory and threads (the occupancy calculator); 0 means it cannot launch.
  absl::StatusOr<int> MaxActiveBlocksPerSm(int threads, int dynamic_smem) const;

  // Launches the kernel with `params` as its single (by value) argument:
  // kernels are declared `__global__ void f(const __grid_constant__ KfAttnParams p)`.
  // A kernel that declares more parameters, or a larger one, than a launch
  // passes would have the driver copy them from memory past what it was
  // given: both Launch forms refuse it (CheckKernelParams), where the
  // driver can list a kernel's parameters.
  absl::Status Launch(const KfAttnParams& params, Dim3 grid, Dim3 block, int dynamic_smem,
                      const Stream& stream) const;
  // A variant with tensor maps (manifest "tensor_maps"): `maps` follow
  // `params` as the kernel's second parameter, in order (CONTRACT.md
  // "Tensor maps"). An empty `maps` is the single-argument launch above.
  absl::Status Launch(const KfAttnParams& params, std::span<const TensorMap> maps,
                      Dim3 grid, Dim3 block, int dynamic_smem, const Stream& stream) const;
  // General form: `args` as cuLaunchKernel's kernelParams.
  absl::Status LaunchRaw(void** args, Dim3 grid, Dim3 block, int dynamic_smem,
                         const Stream& stream) const;

 private:
  friend class Module;
  Kernel(const Driver* driver, void* function, std::string name)
      : driver_(driver), function_(function), name_(std::move(name)) {}
  // The sizes of the parameters the kernel declares, when the driver can
  // tell (cuFuncGetParamInfo): the contract's launches check them.
  std::vector<size_t> param_sizes_;
  bool params_known_ = false;
  const Driver* driver_ = nullptr;
  void* function_ = nullptr;
  std::string name_;
};

class Module {
 public:
  // Loads a cubin (or PTX) image into the current context. A cubin for the
  // wrong architecture fails here with CUDA_ERROR_NO_BINARY_FOR_GPU.
  static absl::StatusOr<Module> Load(const Driver& driver, std::span<const char> image);
  Module() = default;
  Module(Module&& other) noexcept;
  Module& operator=(Module&& other) noexcept;
  ~Module();

  // An `extern "C"` entry point; kNotFound when the image has no such symbol.
  absl::StatusOr<Kernel> GetKernel(std::string_view name) const;
  // Where module-scope device variable `name` (its symbol, mangled) lives;
  // kNotFound when the image has no such symbol.
  absl::StatusOr<DeviceRegion> GetGlobal(std::string_view name) const;

 private:
  Module(const Driver* driver, void* module) : driver_(driver), module_(module) {}
  const Driver* driver_ = nullptr;
  void* module_ = nullptr;
};

// OK when a kernel declaring parameters of `declared` bytes may be launched
// with `passed` (one buffer of that many bytes a parameter): no more of them,
// none larger. INVALID_ARGUMENT names the kernel and both lists otherwise.
// Needs no driver.
absl::Status CheckKernelParams(std::string_view kernel, std::span<const size_t> declared,
                               std::span<const size_t> passed);

// A TMA descriptor (CUtensorMap): 128 bytes, 64-byte aligned, passed to
// kernels by value inside their parameters or copied to device memory.
struct alignas(64) TensorMap {
  uint64_t words[16];
};

struct TensorMapSpec {
  enum class DType { kBF16, kFloat32 };
  DType dtype = DType::kBF16;
  int rank = 2;                    // 1..5
  const void* global_address = nullptr;
  uint64_t dims[5] = {};           // innermost first
  uint64_t strides_bytes[4] = {};  // strides of dims 1..rank-1, multiples of 16
  uint32_t box[5] = {};            // innermost first
  int swizzle_bytes = 128;         // 0, 32, 64 or 128
};

// cuTensorMapEncodeTiled (element strides 1, no interleave, L2 promotion
// 128B, out-of-bounds elements read as zero).
absl::StatusOr<TensorMap> EncodeTensorMapTiled(const Driver& driver, const TensorMapSpec& spec);

// The contract's map of one tensor of `params` (CONTRACT.md "Tensor maps"):
// 2-D bf16 over the packed tensor, dims {heads * head_dim (kv_heads for k
// and v), total rows}, boxes of 64 columns x box_rows rows, 128-byte
// swizzle; std::nullopt for a tensor of no rows (nothing can be read
// through its map). INVALID_ARGUMENT names the tensor when the request is
// not the contract's, or its address is null or not 16-byte aligned.
// Needs no driver.
absl::StatusOr<std::optional<TensorMapSpec>> AttnTensorMapSpec(const KfAttnParams& params,
                                                              const TensorMapRequest& request);
// That map, encoded; a tensor of no rows gets an all-zero map.
absl::StatusOr<TensorMap> EncodeAttnTensorMap(const Driver& driver, const KfAttnParams& params,
                                              const TensorMapRequest& request);
// Every map a manifest asks for, in its order.
absl::StatusOr<std::vector<TensorMap>> EncodeAttnTensorMaps(
    const Driver& driver, const KfAttnParams& params, std::span<const TensorMapRequest> requests);

}  // namespace kforge::gpu
