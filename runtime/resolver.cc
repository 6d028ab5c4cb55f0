#include "runtime/resolver.h"

#include <algorithm>
#include <filesystem>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/hash.h"
#include "kernels/catalog.h"
#include "runtime/request.h"

namespace kforge::runtime {
namespace {

constexpr size_t kMaxServerSlotsPerBucket = 4;

SizeExtent KeyExtent(const ShapeKey& k) {
  return SizeExtent{k.batch, k.max_len_q, k.cross ? k.max_len_k : k.max_len_q, k.total_q,
                    k.cross ? k.total_k : k.total_q};
}

SizeExtent Grow(const SizeExtent& a, const SizeExtent& b) {
  return SizeExtent{std::max(a.batch, b.batch), std::max(a.max_len_q, b.max_len_q),
                    std::max(a.max_len_k, b.max_len_k), std::max(a.total_q, b.total_q),
                    std::max(a.total_k, b.total_k)};
}

// Seeds are the server's default for every size: they serve any key.
SizeExtent Unlimited() {
  return SizeExtent{kMaxBatch, kMaxSeqLen, kMaxSeqLen, kMaxTotalTokens, kMaxTotalTokens};
}

template <typename T>
bool Contains(const std::vector<T>& v, const T& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

std::string_view SourceName(Source s) {
  switch (s) {
    case Source::kPack: return "pack";
    case Source::kDisk: return "disk";
    case Source::kServer: return "server";
    case Source::kSeed: return "seed";
  }
  return "?";
}

struct Resolver::Slot {
  std::shared_ptr<const ResolvedKernel> kernel;
  SizeExtent extent;
  // Server kernels (fetched now or earlier, from the disk cache): revalidated,
  // named in if_none_match, written to the disk cache.
  bool from_server = false;
  int64_t checked_ms = 0;  // when the server last confirmed it
  // A fallback for a server that failed: the server is asked again after this.
  int64_t retry_server_ms = 0;
};

// The on-disk cache: one pack per bucket with the server kernels it holds,
// and one per compiled seed. Damaged files are misses (and are replaced).
class Resolver::DiskCache {
 public:
  explicit DiskCache(std::string dir) : dir_(std::move(dir)) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(dir_) / "buckets", ec);
    std::filesystem::create_directories(std::filesystem::path(dir_) / "seeds", ec);
  }

  struct BucketFile {
    std::vector<pack::Entry> entries;
    int64_t written_ms = 0;
  };
  std::optional<BucketFile> ReadBucket(const std::string& bucket_id) const {
    const std::filesystem::path p = BucketPath(bucket_id);
    std::error_code ec;
    if (!std::filesystem::exists(p, ec)) return std::nullopt;
    auto pack = pack::ReadPackFile(p.string());
    if (!pack.ok()) {
      std::filesystem::remove(p, ec);
      return std::nullopt;
    }
    const auto mtime = std::filesystem::last_write_time(p, ec);
    BucketFile f;
    f.entries = std::move(pack->entries);
    if (!ec) {
      // file_clock to system_clock: C++20's clock_cast is not in GCC 12.
      const auto now_file = std::filesystem::file_time_type::clock::now();
      const auto age = now_file - mtime;
      f.written_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                         (std::chrono::system_clock::now() - age).time_since_epoch())
                         .count();
    }
    return f;
  }
  void WriteBucket(const std::string& bucket_id, std::vector<pack::Entry> entries) const {
    pack::Pack p;
    p.created_at = pack::NowRfc3339();
    p.origin = "kforge runtime disk cache";
    p.entries = std::move(entries);
    (void)pack::WritePackFile(BucketPath(bucket_id).string(), p);  // a cache: best effort
  }
  std::optional<pack::Entry> ReadSeed(const std::string& id, const std::string& arch) const {
    auto pack = pack::ReadPackFile(SeedPath(id, arch).string());
    if (!pack.ok() || pack->entries.size() != 1 || pack->entries[0].cubin.empty())
      return std::nullopt;
    return pack->entries[0];
  }
  void WriteSeed(const pack::Entry& e) const {
    pack::Pack p;
    p.created_at = pack::NowRfc3339();
    p.origin = "kforge runtime seed cache";
    p.entries = {e};
    (void)pack::WritePackFile(SeedPath(e.variant_id, e.arch).string(), p);
  }

 private:
  std::filesystem::path BucketPath(const std::string& bucket_id) const {
    return std::filesystem::path(dir_) / "buckets" / (bucket_id + ".kfpack");
  }
  std::filesystem::path SeedPath(const std::string& id, const std::string& arch) const {
    return std::filesystem::path(dir_) / "seeds" / fmt::format("{}.{}.kfpack", id, arch);
  }
  std::string dir_;
};

Resolver::Resolver(ResolverOptions options, std::vector<pack::Pack> packs,
                   std::unique_ptr<KernelServer> server, Compiler compiler, Counters* counters)
    : options_(std::move(options)),
      packs_(std::move(packs)),
      server_(std::move(server)),
      compiler_(std::move(compiler)),
      counters_(counters) {
  if (!options_.cache_dir.empty()) disk_ = std::make_unique<DiskCache>(options_.cache_dir);
}

Resolver::~Resolver() = default;

int64_t Resolver::Now() const {
  if (options_.now_ms) return options_.now_ms();
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool Resolver::ServerUsable() const { return server_ && Now() >= server_down_until_ms_.load(); }

bool Resolver::NeedsServer(const Slot& slot) const {
  if (!ServerUsable()) return false;
  if (slot.retry_server_ms > 0) return Now() >= slot.retry_server_ms;
  return slot.from_server && options_.revalidate.count() > 0 &&
         Now() - slot.checked_ms >= options_.revalidate.count();
}

std::optional<Resolver::Slot> Resolver::FindCovering(const std::string& bucket_id,
                                                     const ShapeKey& key) const {
  std::shared_lock lock(mu_);
  auto it = memory_.find(bucket_id);
  if (it == memory_.end()) return std::nullopt;
  // Packs and the server before fallbacks; the most recently confirmed first.
  const Slot* best = nullptr;
  for (const Slot& s : it->second) {
    if (!ExtentCovers(s.extent, key)) continue;
    auto rank = [](const Slot& x) { return x.retry_server_ms > 0 ? 0 : 1; };
    if (!best || rank(s) > rank(*best) ||
        (rank(s) == rank(*best) && s.checked_ms > best->checked_ms))
      best = &s;
  }
  if (!best) return std::nullopt;
  return *best;
}

absl::StatusOr<std::shared_ptr<const ResolvedKernel>> Resolver::Resolve(const ShapeKey& key) {
  const Bucket bucket = BucketOf(key);
  if (auto slot = FindCovering(bucket.Id(), key); slot && !NeedsServer(*slot)) {
    ++counters_->memory_hits;
    return slot->kernel;
  }
  return ResolveSlow(key, bucket);
}

absl::StatusOr<std::shared_ptr<const ResolvedKernel>> Resolver::ResolveSlow(const ShapeKey& key,
                                                                            const Bucket& bucket) {
  const std::string id = bucket.Id();
  std::shared_ptr<std::mutex> bucket_mu;
  {
    std::unique_lock lock(mu_);
    auto& m = bucket_locks_[id];
    if (!m) m = std::make_shared<std::mutex>();
    bucket_mu = m;
  }
  std::lock_guard bucket_lock(*bucket_mu);

  // Held, and due for a server check (revalidation, or a retry after the
  // server failed): ask, and keep using it if the server cannot answer.
  auto held = [&](bool count_hit) -> std::optional<absl::StatusOr<std::shared_ptr<const ResolvedKernel>>> {
    auto slot = FindCovering(id, key);
    if (!slot) return std::nullopt;
    if (!NeedsServer(*slot)) {
      if (count_hit) ++counters_->memory_hits;
      return slot->kernel;
    }
    auto fresh = FromServer(key, id);
    if (!fresh.ok()) return fresh.status();
    if (*fresh) return **fresh;
    if (slot->retry_server_ms > 0) {
      std::unique_lock lock(mu_);
      for (Slot& s : memory_[id])
        if (s.kernel == slot->kernel) s.retry_server_ms = Now() + options_.server_retry.count();
    }
    return slot->kernel;
  };
  if (auto h = held(/*count_hit=*/true)) return *h;

  if (auto entry = FromPacks(key, bucket)) {
    auto k = Finish(*std::move(entry), Source::kPack, key);
    if (!k.ok()) return k.status();
    ++counters_->pack_hits;
    Slot slot;
    slot.kernel = *k;
    slot.extent = (*k)->entry.extent;
    Remember(id, std::move(slot));
    return k;
  }

  if (disk_) {
    if (auto file = disk_->ReadBucket(id)) {
      for (pack::Entry& e : file->entries) {
        if (e.arch != key.arch) continue;
        auto k = Finish(e, Source::kDisk, key);
        if (!k.ok()) continue;  // a cache entry that no longer works is a miss
        Slot slot;
        slot.kernel = *k;
        slot.extent = e.extent;
        slot.from_server = true;
        slot.checked_ms = file->written_ms;
        Remember(id, std::move(slot));
      }
      if (FindCovering(id, key)) {
        ++counters_->disk_hits;
        if (auto h = held(/*count_hit=*/false)) return *h;
      }
    }
  }

  const bool asked = ServerUsable();
  if (asked) {
    auto fresh = FromServer(key, id);
    if (!fresh.ok()) return fresh.status();
    if (*fresh) return **fresh;
  }

  auto seed = FromSeed(key);
  if (!seed.ok()) return seed.status();
  Slot slot;
  slot.kernel = *seed;
  slot.extent = Unlimited();
  if (server_) slot.retry_server_ms = Now() + options_.server_retry.count();
  Remember(id, std::move(slot));
  return seed;
}

absl::Status Resolver::CanServe(const ShapeKey& key) const {
  const Bucket bucket = BucketOf(key);
  for (const pack::Pack& p : packs_) {
    for (const pack::Entry& e : p.entries) {
      auto b = ParseBucketId(e.bucket);
      if (b.ok() && BucketDistance(bucket, *b)) return absl::OkStatus();
    }
  }
  auto v = DefaultVariant(key);
  if (v.ok()) return absl::OkStatus();
  return ToStatus(KF_ERR_UNSUPPORTED,
                  fmt::format("no kforge kernel for {} head_dim {} on {}: {}", OpName(key.op),
                              key.head_dim, key.arch, std::string(v.status().message())));
}

std::optional<pack::Entry> Resolver::FromPacks(const ShapeKey& key, const Bucket& bucket) const {
  const std::string id = bucket.Id();
  const pack::Entry* nearest = nullptr;
  int nearest_distance = std::numeric_limits<int>::max();
  for (const pack::Pack& p : packs_) {
    for (const pack::Entry& e : p.entries) {
      if (!ExtentCovers(e.extent, key)) continue;
      if (e.bucket == id) return e;
      auto b = ParseBucketId(e.bucket);
      if (!b.ok()) continue;
      // The server's rule for buckets nothing was tuned for: the nearest
      // tuned bucket of the same class (within the kernel's extent).
      auto d = BucketDistance(bucket, *b);
      if (d && *d < nearest_distance) {
        nearest_distance = *d;
        nearest = &e;
      }
    }
  }
  if (!nearest) return std::nullopt;
  pack::Entry e = *nearest;
  e.tuned = false;  // not this bucket's own winner
  return e;
}

absl::StatusOr<std::optional<std::shared_ptr<const ResolvedKernel>>> Resolver::FromServer(
    const ShapeKey& key, const std::string& bucket_id) {
  // The kernel to name in if_none_match: the most recently confirmed one.
  std::optional<Slot> held;
  {
    std::shared_lock lock(mu_);
    auto it = memory_.find(bucket_id);
    if (it != memory_.end())
      for (const Slot& s : it->second)
        if (s.from_server && (!held || s.checked_ms > held->checked_ms)) held = s;
  }
  ++counters_->server_requests;
  using Result = absl::StatusOr<std::optional<std::shared_ptr<const ResolvedKernel>>>;
  // The server failed (down, refused, or sent a kernel that does not work
  // here): an error under the strict policy, the next source otherwise.
  auto failed = [&](const absl::Status& why, bool down) -> Result {
    ++counters_->server_errors;
    if (down) server_down_until_ms_ = Now() + options_.server_retry.count();
    if (options_.policy == KF_POLICY_STRICT) {
      const kf_status code = CodeOf(why);
      return ToStatus(code == KF_ERR_INTERNAL ? KF_ERR_SERVER : code,
                      fmt::format("{}: {}", server_->Describe(), std::string(why.message())));
    }
    return std::optional<std::shared_ptr<const ResolvedKernel>>();
  };
  auto answer = server_->Get(key, held ? held->kernel->entry.variant_id : "");
  if (!answer.ok()) {
    // Up, but serving nothing for this shape: as if there were no server.
    if (CodeOf(answer.status()) == KF_ERR_UNSUPPORTED)
      return std::optional<std::shared_ptr<const ResolvedKernel>>();
    return failed(answer.status(), /*down=*/true);
  }
  const int64_t now = Now();
  if (answer->not_modified) {
    if (!held)
      return failed(absl::InternalError("a not-modified answer to a request naming no kernel"),
                    /*down=*/false);
    ++counters_->server_not_modified;
    {
      std::unique_lock lock(mu_);
      for (Slot& s : memory_[bucket_id]) {
        if (s.kernel == held->kernel) {
          s.extent = Grow(s.extent, KeyExtent(key));
          s.checked_ms = now;
        }
      }
    }
    SaveServerSlots(bucket_id);
    return std::optional(held->kernel);
  }
  ++counters_->server_kernels;
  pack::Entry entry = std::move(answer->entry);
  entry.bucket = bucket_id;
  // The server chose it for this key; an extent it states is kept too.
  entry.extent = entry.extent.empty() ? KeyExtent(key) : Grow(entry.extent, KeyExtent(key));
  auto k = Finish(std::move(entry), Source::kServer, key);
  if (!k.ok()) return failed(k.status(), /*down=*/false);
  Slot slot;
  slot.kernel = *k;
  slot.extent = (*k)->entry.extent;
  slot.from_server = true;
  slot.checked_ms = now;
  Remember(bucket_id, std::move(slot));
  SaveServerSlots(bucket_id);
  return std::optional(*k);
}

absl::StatusOr<std::shared_ptr<const ResolvedKernel>> Resolver::FromSeed(const ShapeKey& key) {
  auto v = DefaultVariant(key);
  if (!v.ok())
    return ToStatus(KF_ERR_UNSUPPORTED,
                    fmt::format("no kforge kernel for {} head_dim {} on {}: {}", OpName(key.op),
                                key.head_dim, key.arch, std::string(v.status().message())));
  const std::string options = compiler_.options(key.arch);
  pack::Entry e;
  e.bucket = BucketOf(key).Id();
  e.arch = key.arch;
  e.variant_id = ContentVariantId(v->source, v->manifest_json, options);
  e.source = v->source;
  e.manifest_json = v->manifest_json;
  e.compile_options = options;
  e.extent = Unlimited();
  e.provenance.origin = "template";
  e.provenance.template_name = v->template_name;
  nlohmann::json knobs = nlohmann::json::object();
  for (const auto& [name, value] : v->knobs) knobs[name] = value;
  e.provenance.knobs_json = knobs.dump();
  if (disk_) {
    if (auto cached = disk_->ReadSeed(e.variant_id, key.arch); cached && cached->source == e.source) {
      ++counters_->seed_disk_hits;
      return Finish(*std::move(cached), Source::kSeed, key);
    }
  }
  auto image = compiler_.compile(e.source, key.arch);
  if (!image.ok()) return image.status();
  ++counters_->seed_compiles;
  e.cubin = std::move(image->cubin);
  e.nvrtc_version = image->nvrtc_version;
  if (disk_) disk_->WriteSeed(e);
  return Finish(std::move(e), Source::kSeed, key);
}

absl::StatusOr<std::shared_ptr<const ResolvedKernel>> Resolver::Finish(pack::Entry entry,
                                                                       Source source,
                                                                       const ShapeKey& key) {
  const std::string what = fmt::format("kernel {} ({})", entry.variant_id, SourceName(source));
  auto manifest = ParseManifest(entry.manifest_json);
  if (!manifest.ok())
    return ToStatus(KF_ERR_INTERNAL, fmt::format("{}: {}", what,
                                                 std::string(manifest.status().message())));
  const std::string op(OpName(key.op));
  if (!Contains(manifest->ops, op) ||
      (!manifest->head_dims.empty() && !Contains(manifest->head_dims, key.head_dim)))
    return ToStatus(KF_ERR_INTERNAL,
                    fmt::format("{}: its manifest does not serve {} head_dim {}", what, op,
                                key.head_dim));
  if (entry.cubin.empty() || entry.arch != key.arch) {
    auto image = compiler_.compile(entry.source, key.arch);
    if (!image.ok()) return image.status();
    entry.cubin = std::move(image->cubin);
    entry.arch = key.arch;
  }
  auto k = std::make_shared<ResolvedKernel>();
  k->key = fmt::format("{}:{}", entry.variant_id, Sha256Hex(entry.cubin).substr(0, 16));
  k->entry = std::move(entry);
  k->manifest = *std::move(manifest);
  k->source = source;
  return std::shared_ptr<const ResolvedKernel>(std::move(k));
}

void Resolver::Remember(const std::string& bucket_id, Slot slot) {
  std::unique_lock lock(mu_);
  std::vector<Slot>& slots = memory_[bucket_id];
  if (slot.from_server) {
    // A server kernel supersedes the fallbacks used while it was down, and
    // a kernel already held grows instead of being held twice.
    std::erase_if(slots, [](const Slot& s) { return s.retry_server_ms > 0; });
    for (Slot& s : slots) {
      if (s.from_server && s.kernel->key == slot.kernel->key) {
        s.extent = Grow(s.extent, slot.extent);
        s.checked_ms = std::max(s.checked_ms, slot.checked_ms);
        return;
      }
    }
    size_t server_slots = 0;
    for (const Slot& s : slots) server_slots += s.from_server;
    if (server_slots >= kMaxServerSlotsPerBucket) {
      auto oldest = slots.end();
      for (auto it = slots.begin(); it != slots.end(); ++it)
        if (it->from_server && (oldest == slots.end() || it->checked_ms < oldest->checked_ms))
          oldest = it;
      slots.erase(oldest);
    }
  }
  slots.push_back(std::move(slot));
}

void Resolver::SaveServerSlots(const std::string& bucket_id) {
  if (!disk_) return;
  std::vector<pack::Entry> entries;
  {
    std::shared_lock lock(mu_);
    auto it = memory_.find(bucket_id);
    if (it == memory_.end()) return;
    for (const Slot& s : it->second) {
      if (!s.from_server) continue;
      pack::Entry e = s.kernel->entry;
      e.extent = s.extent;
      entries.push_back(std::move(e));
    }
  }
  disk_->WriteBucket(bucket_id, std::move(entries));
}

}  // namespace kforge::runtime
