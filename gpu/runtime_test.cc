// Driver, memory, streams, events, module load and launch. Needs a GPU: skips
// with the reason when there is no driver (CI, development machines).
#include "gpu/gpu.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "gpu/compile.h"
#include "gpu/usage.h"

namespace kforge::gpu {
namespace {

class GpuRuntime : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Driver>> d = Driver::Load();
    if (!d.ok()) GTEST_SKIP() << d.status().message();
    driver_ = *std::move(d);
    absl::StatusOr<std::unique_ptr<Context>> c = driver_->OpenContext(0);
    ASSERT_TRUE(c.ok()) << c.status();
    context_ = *std::move(c);
    absl::StatusOr<DeviceInfo> info = driver_->GetDeviceInfo(0);
    ASSERT_TRUE(info.ok()) << info.status();
    info_ = *info;
  }
  std::unique_ptr<Driver> driver_;
  std::unique_ptr<Context> context_;
  DeviceInfo info_;
};

TEST_F(GpuRuntime, ReportsDeviceInfo) {
  EXPECT_FALSE(info_.name.empty());
  EXPECT_GT(info_.sm_count, 0);
  EXPECT_GT(info_.memory_bytes, 0);
  EXPECT_GT(info_.l2_bytes, 0);
  EXPECT_GT(info_.driver_version, 0);
  EXPECT_EQ(info_.arch, ArchForComputeCapability(info_.cc_major, info_.cc_minor));
  std::cout << info_.name << " cc " << info_.ComputeCapability() << " " << info_.arch << " sms "
            << info_.sm_count << " driver " << info_.DriverVersionString() << "\n";
}

TEST_F(GpuRuntime, LoadsAndLaunchesAKernelWithTheContractParams) {
  CompileRequest req;
  req.arch = info_.arch;
  req.source = R"(
#include "kforge/attn_params.h"
extern "C" __global__ void kf_fill(const __grid_constant__ KfAttnParams p) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.total_q) p.lse[i] = i * p.softmax_scale;
}
)";
  absl::StatusOr<CompileResult> compiled = Compile(req);
  ASSERT_TRUE(compiled.ok() && compiled->ok) << compiled->log;
  absl::StatusOr<Module> module = Module::Load(*driver_, compiled->cubin);
  ASSERT_TRUE(module.ok()) << module.status();
  absl::StatusOr<Kernel> kernel = module->GetKernel("kf_fill");
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_EQ(module->GetKernel("nope").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<KernelAttributes> attrs = kernel->Attributes();
  ASSERT_TRUE(attrs.ok()) << attrs.status();
  EXPECT_GT(attrs->num_regs, 0);
  EXPECT_TRUE(kernel->SetMaxDynamicSharedMemory(64 * 1024).ok());
  absl::StatusOr<int> per_sm = kernel->MaxActiveBlocksPerSm(128, 0);
  ASSERT_TRUE(per_sm.ok()) << per_sm.status();
  EXPECT_GE(*per_sm, 1);

  absl::StatusOr<Stream> stream = Stream::Create(*driver_);
  ASSERT_TRUE(stream.ok()) << stream.status();
  constexpr int n = 1000;
  absl::StatusOr<DeviceBuffer> out = DeviceBuffer::Allocate(*driver_, n * sizeof(float));
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(out->Fill32(0x7fc00000u, *stream).ok());  // NaN
  KfAttnParams p{};
  p.lse = out->as<float>();
  p.total_q = n;
  p.softmax_scale = 0.5f;
  absl::StatusOr<Event> start = Event::Create(*driver_);
  absl::StatusOr<Event> end = Event::Create(*driver_);
  ASSERT_TRUE(start.ok() && end.ok());
  ASSERT_TRUE(start->Record(*stream).ok());
  absl::Status launched = kernel->Launch(p, {(n + 127) / 128}, {128}, 0, *stream);
  ASSERT_TRUE(launched.ok()) << launched;
  ASSERT_TRUE(end->Record(*stream).ok());
  std::vector<float> host(n);
  ASSERT_TRUE(out->Download(std::span<float>(host), *stream).ok());
  for (int i = 0; i < n; ++i) ASSERT_EQ(host[i], i * 0.5f) << i;
  absl::StatusOr<float> ms = Event::ElapsedMs(*start, *end);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GE(*ms, 0.0f);
}

// A kernel that declares a parameter the contract's launch does not pass
// (the driver would copy it from past the arguments it was given), or a
// first one larger than KfAttnParams, is refused at launch by name; the
// same kernel with a tensor-map parameter launches when its maps are passed.
TEST_F(GpuRuntime, AKernelDeclaringMoreParametersThanALaunchPassesIsRefused) {
  CompileRequest req;
  req.arch = info_.arch;
  req.source = R"(
#include "kforge/attn_params.h"
struct alignas(64) Map { unsigned long long w[16]; };
struct Maps { Map a, b; };
struct Big { KfAttnParams p; int more[64]; };
extern "C" __global__ void two(const __grid_constant__ KfAttnParams p,
                               const __grid_constant__ Maps m) {
  if (threadIdx.x == 0 && p.lse != nullptr) p.lse[0] = (float)m.a.w[0];
}
extern "C" __global__ void big(const __grid_constant__ Big b) {
  if (threadIdx.x == 0 && b.p.lse != nullptr) b.p.lse[0] = (float)b.more[63];
}
)";
  absl::StatusOr<CompileResult> compiled = Compile(req);
  ASSERT_TRUE(compiled.ok() && compiled->ok) << compiled->log;
  absl::StatusOr<Module> module = Module::Load(*driver_, compiled->cubin);
  ASSERT_TRUE(module.ok()) << module.status();
  absl::StatusOr<Stream> stream = Stream::Create(*driver_);
  ASSERT_TRUE(stream.ok()) << stream.status();
  KfAttnParams p{};
  absl::StatusOr<Kernel> two = module->GetKernel("two");
  ASSERT_TRUE(two.ok()) << two.status();
  absl::Status s = two->Launch(p, {1}, {32}, 0, *stream);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("kernel two declares 2 parameter(s)"), std::string::npos) << s;
  const TensorMap maps[2] = {};
  EXPECT_TRUE(two->Launch(p, maps, {1}, {32}, 0, *stream).ok());
  absl::StatusOr<Kernel> big = module->GetKernel("big");
  ASSERT_TRUE(big.ok()) << big.status();
  s = big->Launch(p, {1}, {32}, 0, *stream);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("kernel big declares 1 parameter(s)"), std::string::npos) << s;
  EXPECT_TRUE(stream->Synchronize().ok());
}

TEST_F(GpuRuntime, CopiesRoundTripAndBoundsAreChecked) {
  absl::StatusOr<Stream> stream = Stream::Create(*driver_);
  ASSERT_TRUE(stream.ok());
  std::vector<int> in = {1, 2, 3, 4, 5};
  absl::StatusOr<DeviceBuffer> a = DeviceBuffer::Allocate(*driver_, in.size() * sizeof(int));
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(*driver_, in.size() * sizeof(int));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(a->Upload(std::span<const int>(in), *stream).ok());
  ASSERT_TRUE(b->CopyFromDevice(*a, a->size(), *stream).ok());
  std::vector<int> back(in.size());
  ASSERT_TRUE(b->Download(std::span<int>(back), *stream).ok());
  EXPECT_EQ(back, in);
  EXPECT_EQ(a->CopyFromHost(in.data(), 100, *stream).code(), absl::StatusCode::kOutOfRange);
}

TEST_F(GpuRuntime, ABorrowedStreamStaysWithItsOwner) {
  absl::StatusOr<Stream> owner = Stream::Create(*driver_);
  ASSERT_TRUE(owner.ok()) << owner.status();
  { Stream borrowed = Stream::Borrow(*driver_, owner->handle()); }
  // Still usable after the borrowed wrapper is gone.
  EXPECT_TRUE(owner->Synchronize().ok());
  Stream legacy = Stream::Borrow(*driver_, nullptr);  // the legacy default stream
  EXPECT_TRUE(legacy.Synchronize().ok());
}

TEST_F(GpuRuntime, FillsAndCopiesByAddressAndOrdersStreamsWithEvents) {
  absl::StatusOr<Stream> a = Stream::Create(*driver_);
  absl::StatusOr<Stream> b = Stream::Create(*driver_);
  ASSERT_TRUE(a.ok() && b.ok());
  absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::Allocate(*driver_, 64);
  ASSERT_TRUE(buf.ok());
  ASSERT_TRUE(FillAsync32(*driver_, buf->address(), 0x01020304u, 16, *a).ok());
  ASSERT_TRUE(FillAsync8(*driver_, buf->address() + 8, 0xff, 8, *a).ok());
  const uint32_t words[2] = {7, 9};
  ASSERT_TRUE(CopyToDeviceAsync(*driver_, buf->address() + 56, words, sizeof words, *a).ok());
  absl::StatusOr<Event> done = Event::Create(*driver_, /*timing=*/false);
  ASSERT_TRUE(done.ok());
  ASSERT_TRUE(done->Record(*a).ok());
  ASSERT_TRUE(b->WaitEvent(*done).ok());  // b's download runs after a's writes
  std::vector<uint32_t> host(16);
  ASSERT_TRUE(buf->Download(std::span<uint32_t>(host), *b).ok());
  EXPECT_EQ(host[0], 0x01020304u);
  EXPECT_EQ(host[2], 0xffffffffu);
  EXPECT_EQ(host[3], 0xffffffffu);
  EXPECT_EQ(host[4], 0x01020304u);
  EXPECT_EQ(host[14], 7u);
  EXPECT_EQ(host[15], 9u);
  absl::StatusOr<bool> finished = done->Query();
  ASSERT_TRUE(finished.ok());
  EXPECT_TRUE(*finished);
}

TEST_F(GpuRuntime, RestoresTheCallersCurrentContext) {
  // The fixture's context is current; a scope that switches to none puts it back.
  {
    RestoreCurrentContext restore(*driver_);
    absl::StatusOr<std::unique_ptr<Context>> again = driver_->OpenContext(0);
    ASSERT_TRUE(again.ok());
  }
  absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::Allocate(*driver_, 16);
  EXPECT_TRUE(buf.ok()) << "a context is still current: " << buf.status();
}

TEST_F(GpuRuntime, WrongArchitectureCubinFailsToLoadWithTheDriverError) {
  CompileRequest req;
  req.arch = info_.arch == "sm_100a" ? "sm_90a" : "sm_100a";
  req.source = "extern \"C\" __global__ void k() {}";
  absl::StatusOr<CompileResult> compiled = Compile(req);
  ASSERT_TRUE(compiled.ok() && compiled->ok);
  absl::StatusOr<Module> module = Module::Load(*driver_, compiled->cubin);
  ASSERT_FALSE(module.ok());
  EXPECT_NE(module.status().message().find("CUDA_ERROR"), std::string::npos) << module.status();
}

// The figures kforge-worker sends with its heartbeats (the dashboard's GPU
// column) come from NVML for the device the driver opened: its memory total
// matches the driver's, and a kernel that keeps the GPU busy shows as
// utilisation while it runs.
TEST_F(GpuRuntime, UsageMonitorReadsThisDeviceFromNvml) {
  ASSERT_FALSE(info_.pci_bus_id.empty());
  absl::StatusOr<std::unique_ptr<GpuUsageMonitor>> monitor = GpuUsageMonitor::Open(info_.pci_bus_id);
  ASSERT_TRUE(monitor.ok()) << monitor.status();
  absl::StatusOr<GpuUsage> idle = (*monitor)->Sample();
  ASSERT_TRUE(idle.ok()) << idle.status();
  EXPECT_GE(idle->utilization, 0.0);
  EXPECT_LE(idle->utilization, 1.0);
  // NVML's total may leave out memory the driver reserves; within 10%.
  EXPECT_NEAR(double(idle->memory_total_bytes), double(info_.memory_bytes), 0.1 * info_.memory_bytes);
  EXPECT_GT(idle->memory_used_bytes, 0) << "this process holds a context";
  EXPECT_LE(idle->memory_used_bytes, idle->memory_total_bytes);

  CompileRequest req;
  req.arch = info_.arch;
  req.source = R"(
#include "kforge/attn_params.h"
// Spins for total_q milliseconds (%globaltimer counts nanoseconds).
extern "C" __global__ void kf_spin(const __grid_constant__ KfAttnParams p) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); }
  while (t - t0 < 1000000ull * (unsigned long long)p.total_q);
}
)";
  absl::StatusOr<CompileResult> compiled = Compile(req);
  ASSERT_TRUE(compiled.ok() && compiled->ok) << compiled->log;
  absl::StatusOr<Module> module = Module::Load(*driver_, compiled->cubin);
  ASSERT_TRUE(module.ok()) << module.status();
  absl::StatusOr<Kernel> spin = module->GetKernel("kf_spin");
  ASSERT_TRUE(spin.ok()) << spin.status();
  absl::StatusOr<Stream> stream = Stream::Create(*driver_);
  ASSERT_TRUE(stream.ok());
  KfAttnParams p{};
  p.total_q = 2500;  // 2.5 s: longer than NVML's longest sample period (1 s)
  ASSERT_TRUE(spin->Launch(p, {1}, {32}, 0, *stream).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  absl::StatusOr<GpuUsage> busy = (*monitor)->Sample();
  ASSERT_TRUE(stream->Synchronize().ok());
  ASSERT_TRUE(busy.ok()) << busy.status();
  std::cout << "NVML: idle " << idle->utilization << ", busy " << busy->utilization << ", memory "
            << busy->memory_used_bytes << " of " << busy->memory_total_bytes << " bytes\n";
  EXPECT_GT(busy->utilization, 0.5) << "a kernel ran for the whole sample period";
}

}  // namespace
}  // namespace kforge::gpu
