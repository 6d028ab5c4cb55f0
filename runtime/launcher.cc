#include "runtime/launcher.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace kforge::runtime {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr uint32_t kMinusInfF32 = 0xff800000u;
constexpr size_t kAlign = 256;

size_t AlignUp(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

absl::Status Cuda(const absl::Status& s) {
  if (s.ok()) return s;
  return ToStatus(KF_ERR_CUDA, std::string(s.message()));
}

// Kernels that take their work from a tile list (or size their workspace
// by it) need the batch's offsets on the host.
bool NeedsTileList(const Manifest& m) {
  return m.grid == GridPolicy::kPersistent || m.workspace_per_tile_bytes > 0;
}

// A per_tile launch needs only the sizes: grid (query tiles of the longest
// sequence, heads, batch), as PlanLaunch makes it.
absl::StatusOr<LaunchPlan> PlanFromSizes(const Manifest& m, const ShapeKey& k) {
  if (k.batch > 65535)
    return ToStatus(KF_ERR_INVALID_ARGUMENT,
                    fmt::format("args.batch: {} sequences exceed the per_tile grid's limit of "
                                "65535 (pass host offsets for a persistent kernel)",
                                k.batch));
  LaunchPlan plan;
  plan.threads = unsigned(m.threads);
  plan.dynamic_smem_bytes = m.dynamic_smem_bytes;
  plan.grid = {unsigned(std::max<int64_t>(1, (k.max_len_q + m.tile_m - 1) / m.tile_m)),
               unsigned(k.heads), unsigned(k.batch)};
  plan.num_tiles = int(plan.grid[0] * plan.grid[1] * plan.grid[2]);
  plan.workspace_bytes = m.workspace_fixed_bytes;
  return plan;
}

}  // namespace

struct Launcher::Loaded {
  gpu::Module module;
  gpu::Kernel kernel;
  int ctas_per_sm = 0;
};

struct Launcher::Device {
  explicit Device(const gpu::Driver* driver) : scratch(driver) {}
  std::unique_ptr<gpu::Context> context;
  gpu::DeviceInfo info;
  std::mutex mu;
  std::map<std::string, std::unique_ptr<Loaded>> loaded;  // by ResolvedKernel::key; guarded by mu
  PlanCache plans;
  ScratchArenas scratch;
};

Launcher::Launcher(const gpu::Driver* driver, Counters* counters)
    : driver_(driver), counters_(counters) {}

Launcher::~Launcher() {
  // Modules, scratch and events go in their own context: each device's is
  // current while its state is freed (the context itself is released last).
  gpu::RestoreCurrentContext restore(*driver_);
  std::lock_guard lock(mu_);
  for (auto& [ordinal, d] : devices_) {
    (void)d->context->MakeCurrent();
    d.reset();
  }
}

absl::StatusOr<Launcher::Device*> Launcher::DeviceFor(int ordinal) {
  Device* d = nullptr;
  {
    std::lock_guard lock(mu_);
    auto it = devices_.find(ordinal);
    if (it == devices_.end()) {
      auto count = driver_->DeviceCount();
      if (!count.ok()) return Cuda(count.status());
      if (ordinal >= *count)
        return ToStatus(KF_ERR_INVALID_ARGUMENT,
                        fmt::format("args.device: {} but there are {} CUDA devices", ordinal,
                                    *count));
      auto dev = std::make_unique<Device>(driver_);
      auto ctx = driver_->OpenContext(ordinal);
      if (!ctx.ok()) return Cuda(ctx.status());
      dev->context = *std::move(ctx);
      auto info = driver_->GetDeviceInfo(ordinal);
      if (!info.ok()) return Cuda(info.status());
      dev->info = *std::move(info);
      it = devices_.emplace(ordinal, std::move(dev)).first;
    }
    d = it->second.get();
  }
  // The calling thread may be new to this device (callers restore its own).
  if (absl::Status s = d->context->MakeCurrent(); !s.ok()) return Cuda(s);
  return d;
}

absl::StatusOr<gpu::DeviceInfo> Launcher::Info(int ordinal) {
  gpu::RestoreCurrentContext restore(*driver_);  // the caller's current device stays
  auto d = DeviceFor(ordinal);
  if (!d.ok()) return d.status();
  return (*d)->info;
}

absl::StatusOr<const Launcher::Loaded*> Launcher::LoadOn(Device& d, const ResolvedKernel& k) {
  std::lock_guard lock(d.mu);
  if (auto it = d.loaded.find(k.key); it != d.loaded.end()) return it->second.get();
  const std::string what = fmt::format("kernel {}", k.entry.variant_id);
  auto module = gpu::Module::Load(*driver_, k.entry.cubin);
  if (!module.ok())
    return ToStatus(KF_ERR_CUDA, fmt::format("{}: cubin for {} does not load: {}", what,
                                             k.entry.arch, std::string(module.status().message())));
  auto loaded = std::make_unique<Loaded>();
  loaded->module = *std::move(module);
  auto kernel = loaded->module.GetKernel(k.manifest.entry_point);
  if (!kernel.ok()) return ToStatus(KF_ERR_CUDA, fmt::format("{}: {}", what, std::string(kernel.status().message())));
  loaded->kernel = *std::move(kernel);
  // Static shared memory counts against the 48 KB a launch gets without
  // opting in: opt in whenever there is any dynamic (as the evaluator does).
  if (k.manifest.dynamic_smem_bytes > 0) {
    if (absl::Status s = loaded->kernel.SetMaxDynamicSharedMemory(k.manifest.dynamic_smem_bytes);
        !s.ok())
      return ToStatus(KF_ERR_CUDA, fmt::format("{}: {} B of dynamic shared memory: {}", what,
                                               k.manifest.dynamic_smem_bytes,
                                               std::string(s.message())));
  }
  loaded->ctas_per_sm = k.manifest.ctas_per_sm;
  if (loaded->ctas_per_sm <= 0 && k.manifest.grid == GridPolicy::kPersistent) {
    auto fit = loaded->kernel.MaxActiveBlocksPerSm(k.manifest.threads, k.manifest.dynamic_smem_bytes);
    if (fit.ok() && *fit == 0)
      return ToStatus(KF_ERR_CUDA, fmt::format("{}: {} threads with {} B of shared memory do not "
                                               "fit on one SM",
                                               what, k.manifest.threads,
                                               k.manifest.dynamic_smem_bytes));
    if (fit.ok()) loaded->ctas_per_sm = *fit;
  }
  ++counters_->module_loads;
  const Loaded* out = loaded.get();
  d.loaded.emplace(k.key, std::move(loaded));
  return out;
}

absl::Status Launcher::Load(int ordinal, const ResolvedKernel& kernel) {
  gpu::RestoreCurrentContext restore(*driver_);  // the caller's current device stays
  auto d = DeviceFor(ordinal);
  if (!d.ok()) return d.status();
  auto loaded = LoadOn(**d, kernel);
  return loaded.ok() ? absl::OkStatus() : loaded.status();
}

absl::Status Launcher::RunDegenerate(const Request& r) {
  gpu::RestoreCurrentContext restore(*driver_);  // the caller's current device stays
  auto dev = DeviceFor(r.args->device);
  if (!dev.ok()) return dev.status();
  const kf_attention_args& a = *r.args;
  const gpu::Stream stream = gpu::Stream::Borrow(*driver_, a.stream);
  auto address = [](const void* p) { return reinterpret_cast<uint64_t>(p); };
  const ShapeKey& k = r.key;
  if (r.op == Op::kForward) {
    if (r.degenerate != Degenerate::kNoKeys) return absl::OkStatus();
    // Rows that see no key: o = 0, lse = -inf (the contract's rule).
    if (absl::Status s = gpu::FillAsync8(*driver_, address(a.o), 0, size_t(r.q_elems()) * 2, stream);
        !s.ok())
      return Cuda(s);
    if (a.lse != nullptr)
      return Cuda(gpu::FillAsync32(*driver_, address(a.lse), kMinusInfF32,
                                   size_t(k.heads) * size_t(k.total_q), stream));
    return absl::OkStatus();
  }
  // Backward: queries that see no key and keys no query sees get zero gradients.
  if (r.degenerate == Degenerate::kNoKeys)
    return Cuda(gpu::FillAsync8(*driver_, address(a.dq), 0, size_t(r.q_elems()) * 2, stream));
  for (void* p : {a.dk, a.dv}) {
    if (absl::Status s = gpu::FillAsync8(*driver_, address(p), 0, size_t(r.k_elems()) * 2, stream);
        !s.ok())
      return Cuda(s);
  }
  return absl::OkStatus();
}

absl::Status Launcher::Run(const Request& r, const ResolvedKernel& k) {
  gpu::RestoreCurrentContext restore(*driver_);  // the caller's current device stays
  auto dev = DeviceFor(r.args->device);
  if (!dev.ok()) return dev.status();
  Device& d = **dev;
  auto loaded = LoadOn(d, k);
  if (!loaded.ok()) return loaded.status();
  const kf_attention_args& a = *r.args;
  const ShapeKey& key = r.key;
  const Manifest& m = k.manifest;
  const bool backward = r.op == Op::kBackward;

  // 1. The launch plan: from the host offsets (cached per batch), or from
  //    the sizes alone for a per_tile kernel.
  std::shared_ptr<const LaunchPlan> plan;
  if (r.has_host_offsets) {
    PlanRequest pr;
    pr.kernel_key = k.key;
    pr.manifest = &m;
    pr.cu_q = r.cu_q_host;
    pr.cu_k = r.cu_k_host;
    pr.heads = key.heads;
    pr.kv_heads = key.kv_heads;
    pr.causal = key.causal;
    pr.arch = d.info.arch;
    pr.num_sms = d.info.sm_count;
    pr.ctas_per_sm = (*loaded)->ctas_per_sm;
    bool built = false;
    auto p = d.plans.Get(pr, &built);
    if (!p.ok())
      return ToStatus(KF_ERR_INVALID_ARGUMENT,
                      fmt::format("launch plan: {}", std::string(p.status().message())));
    ++(built ? counters_->plans_built : counters_->plan_hits);
    plan = *std::move(p);
  } else if (NeedsTileList(m)) {
    return ToStatus(
        KF_ERR_NEEDS_HOST_OFFSETS,
        fmt::format("kernel {} takes its work from a tile list built on the host from the "
                    "offsets: pass cu_seqlens_q_host{} (the runtime does not copy device offsets "
                    "back: that would synchronise the stream)",
                    k.entry.variant_id, key.cross ? " and cu_seqlens_k_host" : ""));
  } else {
    auto p = PlanFromSizes(m, key);
    if (!p.ok()) return p.status();
    plan = std::make_shared<const LaunchPlan>(*std::move(p));
  }

  // 2. Scratch: what is zeroed before the launch first, in one range, then
  //    what is uploaded (tile list, offsets the caller has only on the
  //    host) and what is written (lse the caller does not want).
  const size_t counter_bytes = 16;
  const size_t workspace_bytes = size_t(plan->workspace_bytes);
  const size_t delta_bytes = backward ? size_t(key.heads) * size_t(key.total_q) * 4 : 0;
  const size_t accum_bytes = backward ? size_t(r.q_elems()) * 4 : 0;
  const size_t tiles_bytes = plan->tiles.size() * sizeof(int32_t);
  const size_t offsets_bytes = (size_t(key.batch) + 1) * sizeof(int32_t);
  const bool upload_q = a.cu_seqlens_q == nullptr;
  const bool upload_k = key.cross && a.cu_seqlens_k == nullptr;
  const bool lse_scratch = !backward && a.lse == nullptr;
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t off = at;
    at += AlignUp(bytes);
    return off;
  };
  const size_t counter_at = take(counter_bytes);
  const size_t workspace_at = take(workspace_bytes);
  const size_t delta_at = take(delta_bytes);
  // dq_accum is zeroed too, unless the variant writes each element before
  // it reads it (manifest zero_dq_accum false): then it lies past the
  // zeroed range and keeps whatever the last launch left. A variant that
  // gives its zeros back (restores_dq_accum) has it past the range as well,
  // zeroed only when the scratch's last use did not leave it zero.
  const bool accum_kept = backward && m.restores_dq_accum;
  const bool accum_each_launch = m.zero_dq_accum && !accum_kept;
  size_t accum_at = accum_each_launch ? take(accum_bytes) : 0;
  const size_t zeroed_bytes = at;
  if (!accum_each_launch) accum_at = take(accum_bytes);
  const size_t tiles_at = take(tiles_bytes);
  const size_t cu_q_at = take(upload_q ? offsets_bytes : 0);
  const size_t cu_k_at = take(upload_k ? offsets_bytes : 0);
  const size_t lse_at = take(lse_scratch ? size_t(key.heads) * size_t(key.total_q) * 4 : 0);

  const gpu::Stream stream = gpu::Stream::Borrow(*driver_, a.stream);
  const gpu::Kernel& kernel = (*loaded)->kernel;
  using ZeroRange = ScratchArenas::ZeroRange;
  return d.scratch.Use(stream, at, [&](uint64_t base, ZeroRange& zeroed) -> absl::Status {
    auto ptr = [&](size_t off) { return reinterpret_cast<void*>(base + off); };
    if (absl::Status s = gpu::FillAsync8(*driver_, base, 0, zeroed_bytes, stream); !s.ok())
      return Cuda(s);
    const bool accum_zero = zeroed.Covers(accum_at, accum_at + accum_bytes);
    zeroed = {};  // this launch writes the scratch: known zero again only below
    if (accum_kept && !accum_zero) {
      if (absl::Status s = gpu::FillAsync8(*driver_, base + accum_at, 0, accum_bytes, stream);
          !s.ok())
        return Cuda(s);
    }
    // Pageable sources are staged by the driver before these return: the
    // cached plan and the caller's arrays may change right after.
    if (absl::Status s = gpu::CopyToDeviceAsync(*driver_, base + tiles_at, plan->tiles.data(),
                                                tiles_bytes, stream);
        !s.ok())
      return Cuda(s);
    if (upload_q) {
      if (absl::Status s = gpu::CopyToDeviceAsync(*driver_, base + cu_q_at, r.cu_q_host.data(),
                                                  offsets_bytes, stream);
          !s.ok())
        return Cuda(s);
    }
    if (upload_k) {
      if (absl::Status s = gpu::CopyToDeviceAsync(*driver_, base + cu_k_at, r.cu_k_host.data(),
                                                  offsets_bytes, stream);
          !s.ok())
        return Cuda(s);
    }
    KfAttnParams p;
    std::memset(&p, 0, sizeof(p));
    p.q = a.q;
    p.k = a.k;
    p.v = a.v;
    p.cu_seqlens_q = upload_q ? static_cast<const int*>(ptr(cu_q_at)) : a.cu_seqlens_q;
    p.cu_seqlens_k = !key.cross ? p.cu_seqlens_q
                     : upload_k ? static_cast<const int*>(ptr(cu_k_at))
                                : a.cu_seqlens_k;
    p.batch = int(key.batch);
    p.heads = key.heads;
    p.kv_heads = key.kv_heads;
    p.head_dim = key.head_dim;
    p.max_seqlen_q = int(key.max_len_q);
    p.max_seqlen_k = int(key.max_len_k);
    p.total_q = int(key.total_q);
    p.total_k = int(key.total_k);
    p.softmax_scale = r.scale;
    p.softmax_scale_log2 = r.scale * kLog2e;
    p.causal = key.causal ? 1 : 0;
    p.tiles = plan->tiles.empty() ? nullptr : static_cast<const int*>(ptr(tiles_at));
    p.num_tiles = plan->num_tiles;
    p.tile_counter = static_cast<int*>(ptr(counter_at));
    p.workspace = workspace_bytes > 0 ? ptr(workspace_at) : nullptr;
    p.workspace_bytes = int64_t(workspace_bytes);
    if (backward) {
      p.o = a.o;
      p.lse = a.lse;
      p.dout = a.dout;
      p.dq = a.dq;
      p.dk = a.dk;
      p.dv = a.dv;
      p.delta = static_cast<float*>(ptr(delta_at));
      p.dq_accum = static_cast<float*>(ptr(accum_at));
    } else {
      p.o = a.o;
      p.lse = lse_scratch ? static_cast<float*>(ptr(lse_at)) : a.lse;
    }
    // (an empty plan launches nothing, and leaves dq_accum as it was: zero)
    if (accum_kept) zeroed = {accum_at, accum_at + accum_bytes};
    if (plan->empty) return absl::OkStatus();
    // TMA variants: the maps of the caller's tensors, encoded for this call
    // (a host call; a tensor TMA cannot address is the caller's error).
    auto maps = gpu::EncodeAttnTensorMaps(*driver_, p, m.tensor_maps);
    if (!maps.ok()) {
      return maps.status().code() == absl::StatusCode::kInvalidArgument
                 ? ToStatus(KF_ERR_INVALID_ARGUMENT,
                            fmt::format("kernel {}: {}", k.entry.variant_id,
                                        std::string(maps.status().message())))
                 : Cuda(maps.status());
    }
    if (absl::Status s = kernel.Launch(p, *maps, {plan->grid[0], plan->grid[1], plan->grid[2]},
                                       {plan->threads}, plan->dynamic_smem_bytes, stream);
        !s.ok())
      return Cuda(s);  // (Use forgets `zeroed`)
    ++counters_->launches;
    return absl::OkStatus();
  });
}

}  // namespace kforge::runtime
