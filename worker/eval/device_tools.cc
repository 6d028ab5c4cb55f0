#include "worker/eval/device_tools.h"

#include <algorithm>
#include <vector>

#include "fmt/format.h"
#include "gpu/compile.h"

namespace kforge::embedded {
extern const char kEvalKernelsSource[];
}  // namespace kforge::embedded

namespace kforge::eval {
namespace {

constexpr unsigned kThreads = 256;    // KF_TALLY_THREADS in eval_kernels.cu
constexpr unsigned kMaxBlocks = 1024;  // enough to fill any GPU with grid-stride loops

unsigned Blocks(size_t n) {
  return unsigned(std::clamp<size_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

}  // namespace

std::string_view EvalKernelsSource() { return embedded::kEvalKernelsSource; }

absl::StatusOr<std::unique_ptr<DeviceTools>> DeviceTools::Create(const gpu::Driver& driver,
                                                                  std::string_view arch,
                                                                  gpu::CompileCache* cache) {
  gpu::CompileRequest req;
  req.source = embedded::kEvalKernelsSource;
  req.arch = std::string(arch);
  req.name = "eval_kernels.cu";
  absl::StatusOr<gpu::CompileResult> compiled =
      cache != nullptr ? cache->GetOrCompile(req) : gpu::Compile(req);
  if (!compiled.ok()) return compiled.status();
  if (!compiled->ok) {
    return absl::InternalError(
        fmt::format("the evaluator's kernels do not compile for {}:\n{}", arch, compiled->log));
  }
  auto tools = std::unique_ptr<DeviceTools>(new DeviceTools());
  tools->driver_ = &driver;
  absl::StatusOr<gpu::Module> module = gpu::Module::Load(driver, compiled->cubin);
  if (!module.ok()) return module.status();
  tools->module_ = *std::move(module);
  for (auto [kernel, name] : {std::pair{&tools->fill_, "kf_fill_bf16"},
                              std::pair{&tools->style_, "kf_style_bf16"},
                              std::pair{&tools->to_bf16_, "kf_to_bf16_kernel"},
                              std::pair{&tools->tally_bf16_, "kf_tally_bf16"},
                              std::pair{&tools->tally_lse_, "kf_tally_lse"},
                              std::pair{&tools->fingerprint_, "kf_fingerprint"},
                              std::pair{&tools->count_nonzero_, "kf_count_nonzero32"}}) {
    absl::StatusOr<gpu::Kernel> k = tools->module_.GetKernel(name);
    if (!k.ok()) return k.status();
    *kernel = *std::move(k);
  }
  absl::StatusOr<gpu::DeviceBuffer> partials =
      gpu::DeviceBuffer::Allocate(driver, kMaxBlocks * sizeof(Tally));
  if (!partials.ok()) return partials.status();
  tools->partials_ = *std::move(partials);
  return tools;
}

absl::Status DeviceTools::FillRandomBf16(const gpu::DeviceBuffer& out, size_t n, uint64_t state0,
                                         const gpu::Stream& stream) const {
  if (n == 0) return absl::OkStatus();
  if (out.size() < n * 2) return absl::InvalidArgumentError("FillRandomBf16: buffer too small");
  void* ptr = out.get();
  long long count = static_cast<long long>(n);
  unsigned long long state = state0;
  void* args[] = {&ptr, &count, &state};
  return fill_.LaunchRaw(args, {Blocks(n)}, {kThreads}, 0, stream);
}

absl::Status DeviceTools::StyleBf16(const gpu::DeviceBuffer& buf, size_t n, float scale,
                                     uint64_t seed, uint32_t period, float magnitude,
                                     const gpu::Stream& stream) const {
  if (n == 0) return absl::OkStatus();
  if (buf.size() < n * 2) return absl::InvalidArgumentError("StyleBf16: buffer too small");
  void* ptr = buf.get();
  long long count = static_cast<long long>(n);
  unsigned long long s = seed;
  unsigned p = period;
  void* args[] = {&ptr, &count, &scale, &s, &p, &magnitude};
  return style_.LaunchRaw(args, {Blocks(n)}, {kThreads}, 0, stream);
}

absl::Status DeviceTools::ToBf16(const gpu::DeviceBuffer& out, const gpu::DeviceBuffer& in,
                                 size_t n, const gpu::Stream& stream) const {
  if (n == 0) return absl::OkStatus();
  if (out.size() < n * 2 || in.size() < n * 4) {
    return absl::InvalidArgumentError("ToBf16: buffer too small");
  }
  void* dst = out.get();
  void* src = in.get();
  long long count = static_cast<long long>(n);
  void* args[] = {&dst, &src, &count};
  return to_bf16_.LaunchRaw(args, {Blocks(n)}, {kThreads}, 0, stream);
}

absl::StatusOr<Tally> DeviceTools::RunTally(const gpu::Kernel& kernel, const gpu::DeviceBuffer& got,
                                            const gpu::DeviceBuffer& ref, size_t n,
                                            const gpu::Stream& stream) const {
  if (n == 0) return Tally{};
  const unsigned blocks = Blocks(n);
  void* got_ptr = got.get();
  void* ref_ptr = ref.get();
  long long count = static_cast<long long>(n);
  void* partials = partials_.get();
  void* args[] = {&got_ptr, &ref_ptr, &count, &partials};
  if (absl::Status s = kernel.LaunchRaw(args, {blocks}, {kThreads}, 0, stream); !s.ok()) return s;
  std::vector<Tally> host(blocks);
  if (absl::Status s = partials_.Download(std::span<Tally>(host), stream); !s.ok()) return s;
  Tally total = host[0];
  for (unsigned b = 1; b < blocks; ++b) MergeTally(total, host[b]);
  return total;
}

absl::StatusOr<Tally> DeviceTools::TallyBf16(const gpu::DeviceBuffer& got,
                                             const gpu::DeviceBuffer& ref, size_t n,
                                             const gpu::Stream& stream) const {
  if (got.size() < n * 2 || ref.size() < n * 4) {
    return absl::InvalidArgumentError("TallyBf16: buffer too small");
  }
  return RunTally(tally_bf16_, got, ref, n, stream);
}

absl::StatusOr<Tally> DeviceTools::TallyLse(const gpu::DeviceBuffer& got,
                                            const gpu::DeviceBuffer& ref, size_t n,
                                            const gpu::Stream& stream) const {
  if (got.size() < n * 4 || ref.size() < n * 4) {
    return absl::InvalidArgumentError("TallyLse: buffer too small");
  }
  return RunTally(tally_lse_, got, ref, n, stream);
}

absl::StatusOr<uint64_t> DeviceTools::Fingerprint(const gpu::DeviceBuffer& buf,
                                                  const gpu::Stream& stream) const {
  const size_t n = buf.size() / 2;
  if (buf.size() == 0) return uint64_t{0};
  if (absl::Status s = partials_.Fill8(0, stream); !s.ok()) return s;
  void* ptr = buf.get();
  long long count = static_cast<long long>(buf.size());
  void* out = partials_.get();
  void* args[] = {&ptr, &count, &out};
  if (absl::Status s = fingerprint_.LaunchRaw(args, {Blocks(n)}, {kThreads}, 0, stream); !s.ok()) {
    return s;
  }
  uint64_t sum = 0;
  if (absl::Status s = partials_.Download(std::span<uint64_t>(&sum, 1), stream); !s.ok()) return s;
  return sum;
}

absl::StatusOr<uint64_t> DeviceTools::CountNonZero32(gpu::DeviceRegion region,
                                                      const gpu::Stream& stream) const {
  const size_t n = region.bytes / 4;
  if (n == 0) return uint64_t{0};
  if (absl::Status s = partials_.Fill8(0, stream); !s.ok()) return s;
  void* ptr = reinterpret_cast<void*>(region.address);
  long long count = static_cast<long long>(n);
  void* out = partials_.get();
  void* args[] = {&ptr, &count, &out};
  if (absl::Status s = count_nonzero_.LaunchRaw(args, {Blocks(n)}, {kThreads}, 0, stream);
      !s.ok()) {
    return s;
  }
  uint64_t nonzero = 0;
  if (absl::Status s = partials_.Download(std::span<uint64_t>(&nonzero, 1), stream); !s.ok()) {
    return s;
  }
  return nonzero;
}

absl::StatusOr<std::vector<uint64_t>> DeviceTools::Fingerprints(
    std::span<const gpu::DeviceBuffer* const> bufs, const gpu::Stream& stream) const {
  std::vector<gpu::DeviceRegion> regions;
  regions.reserve(bufs.size());
  for (const gpu::DeviceBuffer* b : bufs) regions.push_back({b->address(), b->size()});
  return Fingerprints(regions, stream);
}

absl::StatusOr<std::vector<uint64_t>> DeviceTools::Fingerprints(
    std::span<const gpu::DeviceRegion> regions, const gpu::Stream& stream) const {
  if (regions.size() * sizeof(uint64_t) > partials_.size()) {
    return absl::InvalidArgumentError("Fingerprints: too many buffers at once");
  }
  if (absl::Status s = partials_.Fill8(0, stream); !s.ok()) return s;
  for (size_t i = 0; i < regions.size(); ++i) {
    const size_t n = regions[i].bytes / 2;
    if (regions[i].bytes == 0) continue;
    void* ptr = reinterpret_cast<void*>(regions[i].address);
    long long count = static_cast<long long>(regions[i].bytes);
    void* out = partials_.as<char>() + i * sizeof(uint64_t);
    void* args[] = {&ptr, &count, &out};
    if (absl::Status s = fingerprint_.LaunchRaw(args, {Blocks(n)}, {kThreads}, 0, stream); !s.ok()) {
      return s;
    }
  }
  std::vector<uint64_t> sums(regions.size());
  if (regions.empty()) return sums;
  if (absl::Status s = partials_.CopyToHost(sums.data(), sums.size() * sizeof(uint64_t), stream);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = stream.Synchronize(); !s.ok()) return s;
  return sums;
}

}  // namespace kforge::eval
