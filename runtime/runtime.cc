#include "runtime/runtime.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "core/transport.h"
#include "gpu/compile.h"
#include "runtime/request.h"

namespace kforge::runtime {
namespace {

std::string Join(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) {
    if (!out.empty()) out += ' ';
    out += p;
  }
  return out;
}

// The log's error lines (ptxas' resource lines come first in a log).
std::string ErrorLines(const std::string& log) {
  std::string out;
  size_t start = 0;
  while (start < log.size() && out.size() < 2000) {
    size_t end = log.find('\n', start);
    if (end == std::string::npos) end = log.size();
    std::string_view line(log.data() + start, end - start);
    if (line.find("error") != std::string_view::npos) out.append(line).push_back('\n');
    start = end + 1;
  }
  return out.empty() ? log.substr(0, 2000) : out;
}

Compiler NvrtcCompiler() {
  Compiler c;
  c.options = [](const std::string& arch) {
    gpu::CompileRequest req;
    req.arch = arch;
    return Join(gpu::CompileOptions(req));
  };
  c.compile = [](const std::string& source, const std::string& arch)
      -> absl::StatusOr<Compiler::Image> {
    gpu::CompileRequest req;
    req.source = source;
    req.arch = arch;
    req.name = "kforge_kernel.cu";
    auto r = gpu::Compile(req);
    if (!r.ok())
      return ToStatus(KF_ERR_COMPILE, fmt::format("NVRTC: {}", std::string(r.status().message())));
    if (!r->ok)
      return ToStatus(KF_ERR_COMPILE,
                      fmt::format("the kernel does not compile for {}: {}", arch, ErrorLines(r->log)));
    return Compiler::Image{std::move(r->cubin), std::move(r->options), std::move(r->nvrtc_version)};
  };
  return c;
}

void CopyString(char* dst, size_t size, std::string_view src) {
  const size_t n = std::min(size - 1, src.size());
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}

}  // namespace

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(const kf_runtime_options& o,
                                                         const ServerFactory& make_server) {
  std::unique_ptr<Runtime> rt(new Runtime());
  if (o.arch != nullptr && *o.arch != '\0') {
    if (absl::Status s = ValidateArch(o.arch); !s.ok())
      return ToStatus(KF_ERR_INVALID_ARGUMENT, "options." + std::string(s.message()));
    rt->arch_override_ = o.arch;
  }
  if (o.num_packs > 0 && o.packs == nullptr)
    return ToStatus(KF_ERR_INVALID_ARGUMENT,
                    fmt::format("options.packs: null with num_packs {}", o.num_packs));
  std::vector<pack::Pack> packs;
  for (size_t i = 0; i < o.num_packs; ++i) {
    if (o.packs[i] == nullptr)
      return ToStatus(KF_ERR_INVALID_ARGUMENT, fmt::format("options.packs[{}]: null", i));
    auto p = pack::ReadPackFile(o.packs[i]);
    if (!p.ok()) return ToStatus(KF_ERR_PACK, std::string(p.status().message()));
    packs.push_back(*std::move(p));
  }
  if (o.policy != KF_POLICY_FALLBACK && o.policy != KF_POLICY_STRICT)
    return ToStatus(KF_ERR_INVALID_ARGUMENT,
                    fmt::format("options.policy: {} is not a kf_policy", int(o.policy)));
  std::unique_ptr<KernelServer> server;
  if (o.server != nullptr && *o.server != '\0') {
    ServerOptions so;
    so.address = o.server;
    so.token = o.token != nullptr ? o.token : "";
    so.timeout = std::chrono::milliseconds(o.server_timeout_ms > 0 ? o.server_timeout_ms : 10000);
    // TLS to the server: the CA bundle named by KFORGE_TLS_CA, the variable
    // the kforge CLI reads too. The environment rather than an option, so
    // that kf_runtime_options keeps its layout for callers built against it.
    if (const char* ca = std::getenv("KFORGE_TLS_CA"); ca != nullptr && *ca != '\0') {
      absl::StatusOr<std::string> pem = ReadPemFile(ca, "KFORGE_TLS_CA");
      if (!pem.ok()) return ToStatus(KF_ERR_INVALID_ARGUMENT, std::string(pem.status().message()));
      so.tls_ca = *std::move(pem);
    }
    server = make_server(std::move(so));
  }
  ResolverOptions ro;
  ro.policy = o.policy;
  ro.cache_dir = o.cache_dir != nullptr ? o.cache_dir : "";
  ro.server_retry = std::chrono::seconds(o.server_retry_s > 0 ? o.server_retry_s : 30);
  ro.revalidate = std::chrono::seconds(o.revalidate_s >= 0 ? o.revalidate_s : 600);
  rt->resolver_ = std::make_unique<Resolver>(std::move(ro), std::move(packs), std::move(server),
                                             NvrtcCompiler(), &rt->counters_);
  auto driver = gpu::Driver::Load();
  if (driver.ok()) {
    rt->driver_ = *std::move(driver);
    rt->launcher_ = std::make_unique<Launcher>(rt->driver_.get(), &rt->counters_);
  } else {
    rt->no_driver_ = std::string(driver.status().message());
  }
  return rt;
}

Runtime::~Runtime() {
  launcher_.reset();  // before the driver it uses
}

absl::StatusOr<std::string> Runtime::ArchFor(int device) {
  if (!arch_override_.empty()) return arch_override_;
  if (!launcher_)
    return ToStatus(KF_ERR_NO_DEVICE,
                    fmt::format("{}; set options.arch to resolve kernels without a GPU", no_driver_));
  {
    std::lock_guard lock(arch_mu_);
    if (auto it = arch_by_device_.find(device); it != arch_by_device_.end()) return it->second;
  }
  auto info = launcher_->Info(device);
  if (!info.ok()) return info.status();
  std::lock_guard lock(arch_mu_);
  arch_by_device_[device] = info->arch;
  return info->arch;
}

absl::Status Runtime::Run(const kf_attention_args* args, Op op) {
  ++counters_.calls;
  const int device = args != nullptr ? args->device : 0;
  auto arch = ArchFor(device < 0 ? 0 : device);
  if (!arch.ok()) {
    // Argument errors first: they are the caller's to fix whatever the machine.
    if (auto r = MakeRequest(args, op, "sm_90a"); !r.ok()) return r.status();
    return arch.status();
  }
  auto req = MakeRequest(args, op, *arch);
  if (!req.ok()) return req.status();
  if (!launcher_) return ToStatus(KF_ERR_NO_DEVICE, no_driver_);
  if (req->degenerate != Degenerate::kNone) return launcher_->RunDegenerate(*req);
  auto kernel = resolver_->Resolve(req->key);
  if (!kernel.ok()) return kernel.status();
  return launcher_->Run(*req, **kernel);
}

absl::Status Runtime::Forward(const kf_attention_args* args) { return Run(args, Op::kForward); }
absl::Status Runtime::Backward(const kf_attention_args* args) { return Run(args, Op::kBackward); }

absl::Status Runtime::Prepare(const kf_attention_args* args, Op op, kf_kernel_info* info) {
  ++counters_.calls;
  if (info != nullptr && info->struct_size < sizeof(kf_kernel_info))
    return ToStatus(KF_ERR_INVALID_ARGUMENT,
                    fmt::format("info.struct_size: {} is smaller than this library's "
                                "kf_kernel_info ({} bytes)",
                                info->struct_size, sizeof(kf_kernel_info)));
  const int device = args != nullptr && args->device >= 0 ? args->device : 0;
  auto arch = ArchFor(device);
  if (!arch.ok()) {
    if (auto r = MakeRequest(args, op, "sm_90a", /*sizes_only=*/true); !r.ok()) return r.status();
    return arch.status();
  }
  auto req = MakeRequest(args, op, *arch, /*sizes_only=*/true);
  if (!req.ok()) return req.status();
  if (info != nullptr) {
    const uint32_t size = info->struct_size;
    std::memset(info, 0, sizeof(kf_kernel_info));
    info->struct_size = size;
    CopyString(info->arch, sizeof(info->arch), *arch);
  }
  if (req->degenerate != Degenerate::kNone) {
    if (info != nullptr) CopyString(info->source, sizeof(info->source), "none");
    return absl::OkStatus();
  }
  auto kernel = resolver_->Resolve(req->key);
  if (!kernel.ok()) return kernel.status();
  if (launcher_ && arch_override_.empty()) {
    if (absl::Status s = launcher_->Load(device, **kernel); !s.ok()) return s;
  }
  if (info != nullptr) {
    const ResolvedKernel& k = **kernel;
    const std::string bucket = BucketOf(req->key).Id();
    CopyString(info->variant_id, sizeof(info->variant_id), k.entry.variant_id);
    CopyString(info->bucket, sizeof(info->bucket), bucket);
    CopyString(info->kernel_bucket, sizeof(info->kernel_bucket), k.entry.kernel_bucket);
    CopyString(info->source, sizeof(info->source), SourceName(k.source));
    CopyString(info->entry_point, sizeof(info->entry_point), k.manifest.entry_point);
    info->tuned = k.entry.tuned && (k.entry.kernel_bucket.empty() || k.entry.kernel_bucket == bucket);
    info->persistent = k.manifest.grid == GridPolicy::kPersistent || k.manifest.workspace_per_tile_bytes > 0;
    info->cubin_bytes = int(k.entry.cubin.size());
  }
  return absl::OkStatus();
}

absl::Status Runtime::Supported(const kf_attention_args* args, Op op) {
  if (args == nullptr) return ToStatus(KF_ERR_INVALID_ARGUMENT, "args: null");
  if (args->struct_size < kArgsMinSize) return MakeRequest(args, op, "sm_90a").status();
  // Any batch will do: what decides is the kind of kernel, not its sizes.
  // (Only the caller's struct_size bytes are read: it may end before the
  // fields added since the first release, which then read as 0.)
  kf_attention_args canonical;
  std::memset(&canonical, 0, sizeof(canonical));
  std::memcpy(&canonical, args, std::min<size_t>(args->struct_size, sizeof(canonical)));
  canonical.struct_size = sizeof(canonical);
  static const int32_t kOffsets[2] = {0, 128};
  canonical.batch = 1;
  canonical.total_q = canonical.total_k = 128;
  canonical.max_seqlen_q = canonical.max_seqlen_k = 128;
  canonical.cu_seqlens_q_host = kOffsets;
  canonical.cu_seqlens_q = nullptr;
  const bool cross = (args->cu_seqlens_k != nullptr && args->cu_seqlens_k != args->cu_seqlens_q) ||
                     (args->cu_seqlens_k_host != nullptr &&
                      args->cu_seqlens_k_host != args->cu_seqlens_q_host);
  // A distinct array (same content) keeps the key cross-attention.
  static const int32_t kOffsetsK[2] = {0, 128};
  canonical.cu_seqlens_k = nullptr;
  canonical.cu_seqlens_k_host = cross ? kOffsetsK : nullptr;
  const int device = args->device >= 0 ? args->device : 0;
  auto arch = ArchFor(device);
  if (!arch.ok()) return arch.status();
  auto req = MakeRequest(&canonical, op, *arch, /*sizes_only=*/true);
  if (!req.ok()) return req.status();
  return resolver_->CanServe(req->key);
}

void Runtime::Stats(kf_runtime_stats* s) const {
  const Counters& c = counters_;
  s->calls = c.calls;
  s->memory_hits = c.memory_hits;
  s->pack_hits = c.pack_hits;
  s->disk_hits = c.disk_hits;
  s->server_requests = c.server_requests;
  s->server_not_modified = c.server_not_modified;
  s->server_kernels = c.server_kernels;
  s->server_errors = c.server_errors;
  s->seed_compiles = c.seed_compiles;
  s->seed_disk_hits = c.seed_disk_hits;
  s->module_loads = c.module_loads;
  s->plans_built = c.plans_built;
  s->plan_hits = c.plan_hits;
  s->launches = c.launches;
}

}  // namespace kforge::runtime
