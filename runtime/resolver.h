// Resolver: which kernel a call runs, and where it comes from.
//
// For a shape key it returns a kernel with a cubin for the key's arch, taken
// from, in order: the in-process cache; the packs it was given, then the
// disk cache; the server (GetKernel with if_none_match); the seed of the
// catalog compiled here. No GPU is needed for any of it.
//
// Extents. A kernel is used only for keys inside the sizes it may be served
// for. Pack entries carry theirs. For a kernel from the server the runtime
// knows only that the server chose it for the keys it asked about; as the
// server's rule is a box of per-statistic maxima (ExtentCovers), the
// per-statistic maximum of those keys is inside it too, so that is the
// kernel's extent here. A key outside it asks the server again, sending the
// kernel's id: a not-modified answer grows the extent for a few hundred
// bytes. Seeds serve every size.
//
// Policy. Under KF_POLICY_FALLBACK a failing server is skipped (and not
// asked again for `server_retry`); the kernel used meanwhile is asked about
// again after that. Under KF_POLICY_STRICT the failure is the call's error.
//
// Thread-safe. Hits take a shared lock; resolving a bucket (which may wait
// for the server or NVRTC) holds that bucket's lock only, so other buckets
// and hits proceed.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/shape.h"
#include "kernels/manifest.h"
#include "kforge/runtime.h"
#include "pack/pack.h"

namespace kforge::runtime {

enum class Source { kPack, kDisk, kServer, kSeed };
std::string_view SourceName(Source s);  // "pack" | "disk" | "server" | "seed"

struct ResolvedKernel {
  pack::Entry entry;  // cubin always set (compiled here when the source had none)
  Manifest manifest;
  Source source = Source::kSeed;
  std::string key;  // identity for module and plan caches: variant id + cubin hash
};

// The kforge server as the resolver sees it (GrpcKernelServer; fakes in tests).
class KernelServer {
 public:
  struct Answer {
    bool not_modified = false;  // the kernel named by if_none_match is still the answer
    pack::Entry entry;          // the kernel, when not_modified is false
  };
  virtual ~KernelServer() = default;
  virtual absl::StatusOr<Answer> Get(const ShapeKey& key, const std::string& if_none_match) = 0;
  virtual std::string Describe() const = 0;  // "kforge-server at 127.0.0.1:50051"
};

// NVRTC, as the resolver sees it (gpu::Compile; fakes in tests).
struct Compiler {
  struct Image {
    std::string cubin;
    std::string options;
    std::string nvrtc_version;
  };
  // The options a compile for `arch` uses (part of a seed's content id).
  std::function<std::string(const std::string& arch)> options;
  // KF_ERR_COMPILE (with the log's first lines) when the source does not compile.
  std::function<absl::StatusOr<Image>(const std::string& source, const std::string& arch)> compile;
};

// What the runtime did, for kf_runtime_get_stats (tests and operators).
struct Counters {
  std::atomic<uint64_t> calls{0}, memory_hits{0}, pack_hits{0}, disk_hits{0},
      server_requests{0}, server_not_modified{0}, server_kernels{0}, server_errors{0},
      seed_compiles{0}, seed_disk_hits{0}, module_loads{0}, plans_built{0}, plan_hits{0},
      launches{0};
};

struct ResolverOptions {
  kf_policy policy = KF_POLICY_FALLBACK;
  std::string cache_dir;  // "" = no disk cache
  std::chrono::milliseconds server_retry{30000};
  std::chrono::milliseconds revalidate{600000};  // 0 = never
  std::function<int64_t()> now_ms;              // wall clock when empty
};

class Resolver {
 public:
  // `server` may be null (no server). `counters` must outlive the resolver.
  Resolver(ResolverOptions options, std::vector<pack::Pack> packs,
           std::unique_ptr<KernelServer> server, Compiler compiler, Counters* counters);
  ~Resolver();

  // The kernel for a validated key. KF_ERR_UNSUPPORTED when no source has
  // one (e.g. head_dim 96), KF_ERR_SERVER (strict), KF_ERR_COMPILE.
  absl::StatusOr<std::shared_ptr<const ResolvedKernel>> Resolve(const ShapeKey& key);

  // OK when a kernel of key's kind (op, dtype, head layout, mask, arch) can
  // be had whatever its sizes: a pack holds one, or the catalog has a seed.
  // KF_ERR_UNSUPPORTED with the reason otherwise. Cheap: builds no kernel.
  absl::Status CanServe(const ShapeKey& key) const;

 private:
  struct Slot;
  struct BucketState;
  class DiskCache;

  int64_t Now() const;
  bool ServerUsable() const;
  bool NeedsServer(const Slot& slot) const;
  // Looks in memory: the slot covering `key`, if any (under a lock).
  std::optional<Slot> FindCovering(const std::string& bucket_id, const ShapeKey& key) const;
  absl::StatusOr<std::shared_ptr<const ResolvedKernel>> ResolveSlow(const ShapeKey& key,
                                                                    const Bucket& bucket);
  std::optional<pack::Entry> FromPacks(const ShapeKey& key, const Bucket& bucket) const;
  // Asks the server; nullopt (fallback) or an error (strict) when it fails.
  absl::StatusOr<std::optional<std::shared_ptr<const ResolvedKernel>>> FromServer(
      const ShapeKey& key, const std::string& bucket_id);
  absl::StatusOr<std::shared_ptr<const ResolvedKernel>> FromSeed(const ShapeKey& key);
  absl::StatusOr<std::shared_ptr<const ResolvedKernel>> Finish(pack::Entry entry, Source source,
                                                               const ShapeKey& key);
  void Remember(const std::string& bucket_id, Slot slot);
  void SaveServerSlots(const std::string& bucket_id);

  ResolverOptions options_;
  std::vector<pack::Pack> packs_;
  std::unique_ptr<KernelServer> server_;  // may be null
  Compiler compiler_;
  Counters* counters_;  // must outlive this
  std::unique_ptr<DiskCache> disk_;

  mutable std::shared_mutex mu_;
  std::map<std::string, std::vector<Slot>> memory_;  // by bucket id; guarded by mu_
  std::map<std::string, std::shared_ptr<std::mutex>> bucket_locks_;  // guarded by mu_
  std::atomic<int64_t> server_down_until_ms_{0};
};

}  // namespace kforge::runtime
