#include "server/kernel_cache.h"

#include <limits>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/hash.h"
#include "server/convert.h"
#include "server/jobs.h"

namespace kforge::server {

KernelCache::KernelCache(Store* store, SeedProvider seeds)
    : store_(store), seeds_(std::move(seeds)) {}

absl::Status KernelCache::LoadAll() {
  Page page;
  page.limit = 1000;
  for (;;) {
    auto bests = store_->ListBest("", page);
    if (!bests.ok()) return bests.status();
    for (const auto& b : bests->items) {
      if (absl::Status s = Refresh(b.bucket, b.arch); !s.ok())
        spdlog::warn("best of {} not served: {}", b.bucket, std::string(s.message()));
    }
    if (bests->next_token.empty()) break;
    page.token = bests->next_token;
  }
  return absl::OkStatus();
}

absl::Status KernelCache::Refresh(const std::string& bucket_id, const std::string& arch) {
  auto bucket = ParseBucketId(bucket_id);
  if (!bucket.ok()) return bucket.status();
  auto best = store_->GetBest(bucket_id, arch);
  if (!best.ok()) return best.status();
  SizeExtent verified;
  auto kernel = Build(*best, &verified);
  if (!kernel.ok()) {
    // Whatever was served for the bucket is no longer its best: untuned
    // until a best can be built.
    std::unique_lock lock(mu_);
    best_.erase(bucket_id);
    return kernel.status();
  }
  v1::GetKernelResponse resp;
  *resp.mutable_kernel() = **kernel;
  resp.mutable_kernel()->set_tuned(true);
  resp.mutable_kernel()->set_requested_bucket(bucket_id);
  auto bytes = std::make_shared<const std::string>(resp.SerializeAsString());
  MarkNotModified(resp);
  auto not_modified = std::make_shared<const std::string>(resp.SerializeAsString());
  std::unique_lock lock(mu_);
  best_[bucket_id] = Entry{*std::move(bucket), verified, *std::move(kernel), std::move(bytes),
                           std::move(not_modified)};
  return absl::OkStatus();
}

SizeExtent KernelCache::ExtentOfBest(const BestRecord& best, const EvaluationRecord& winner) {
  if (!best.verified.empty()) return best.verified;
  // A best from before extents were recorded: the evaluator of its time
  // verified (and timed) it on its task's shape, so that much it covers.
  auto task = store_->GetTask(winner.task_id);
  if (task.ok()) {
    auto shape = DecodeTaskShape(task->shape_json);
    if (shape.ok()) return ExtentOf(shape->key);
  }
  spdlog::warn("best of {}: no verified extent and no task shape to take one from: it serves "
               "no request until re-tuned",
               best.bucket);
  return SizeExtent{};
}

absl::StatusOr<std::shared_ptr<const v1::Kernel>> KernelCache::Build(const BestRecord& best,
                                                                     SizeExtent* verified) {
  auto variant = store_->GetVariant(best.variant_id);
  if (!variant.ok()) return variant.status();
  auto evals = store_->ListEvaluations(best.variant_id);
  if (!evals.ok()) return evals.status();
  // The promoting evaluation names the GPU and toolchain, and its cubin is
  // the one served: the bytes its worker compiled and gated, nothing
  // another evaluation of the variant reported.
  const EvaluationRecord* winner = nullptr;
  for (const auto& e : *evals)
    if (e.id == best.evaluation_id) winner = &e;
  if (winner == nullptr)
    return absl::DataLossError(fmt::format("best of {}: its evaluation {} is not stored",
                                           best.bucket, best.evaluation_id));
  *verified = ExtentOfBest(best, *winner);
  auto k = std::make_shared<v1::Kernel>();
  k->set_variant_id(variant->id);
  k->set_source_hash(variant->source_hash);
  k->set_source(variant->source);
  k->set_arch(best.arch);
  ManifestToProto(variant->manifest_json, k->mutable_manifest());
  if (!k->manifest().entry_point().empty()) k->add_entry_points(k->manifest().entry_point());
  TimingToProto(best.timing, k->mutable_timing(), best.measured_by);
  ProvenanceToProto(*variant, k->mutable_provenance());
  k->set_served_bucket(best.bucket);
  k->set_compile_options(winner->compile_options);
  k->set_gpu_name(winner->gpu_name);
  k->set_nvrtc_version(winner->nvrtc_version);
  k->set_driver_version(winner->driver_version);
  if (!winner->cubin_hash.empty()) {
    auto cubin = store_->GetCubin(winner->cubin_hash);
    if (!cubin.ok() && absl::IsDataLoss(cubin.status())) {
      // The store found the bytes no longer match their hash.
      spdlog::error("best of {}: {}: not served", best.bucket,
                    std::string(cubin.status().message()));
      return cubin.status();
    }
    if (cubin.ok()) {
      // Re-checked on the way out: bytes changed in the database after they
      // were checked in are not served.
      if (Sha256Hex(*cubin) != winner->cubin_hash) {
        spdlog::error("best of {}: cubin {} of variant {} does not match its hash: not served",
                      best.bucket, winner->cubin_hash, variant->id);
        return absl::DataLossError(fmt::format(
            "best of {}: its cubin does not match its hash {}", best.bucket, winner->cubin_hash));
      }
      k->set_cubin(*std::move(cubin));
    } else {
      // Served without a cubin (clients can compile the source).
      spdlog::warn("variant {}: cubin {} unreadable: {}", variant->id, winner->cubin_hash,
                   std::string(cubin.status().message()));
    }
  }
  return std::shared_ptr<const v1::Kernel>(std::move(k));
}

absl::StatusOr<Served> KernelCache::Lookup(const ShapeKey& key, const Bucket& bucket) {
  const std::string id = bucket.Id();
  {
    std::shared_lock lock(mu_);
    // A kernel is served only inside the sizes it was verified at, its own
    // bucket's too.
    if (auto it = best_.find(id); it != best_.end() && ExtentCovers(it->second.verified, key))
      return Served{it->second.kernel, true, it->second.response_bytes};
    const Entry* nearest = nullptr;
    int best_distance = std::numeric_limits<int>::max();
    for (const auto& [other_id, e] : best_) {
      if (other_id == id || !ExtentCovers(e.verified, key)) continue;
      auto d = BucketDistance(bucket, e.bucket);
      if (d && *d < best_distance) {
        best_distance = *d;
        nearest = &e;
      }
    }
    if (nearest) return Served{nearest->kernel, false, nullptr};
  }
  auto seed = Seed(key, id);
  if (!seed.ok()) return seed.status();
  return Served{*std::move(seed), false, nullptr};
}

absl::StatusOr<std::shared_ptr<const v1::Kernel>> KernelCache::Seed(const ShapeKey& key,
                                                                    const std::string& bucket_id) {
  using Result = absl::StatusOr<std::shared_ptr<const v1::Kernel>>;
  if (!seeds_)
    return absl::NotFoundError(
        fmt::format("no tuned kernel near bucket {} and no seed kernels configured", bucket_id));
  std::shared_future<Result> fut;
  std::promise<Result> promise;
  bool compile_here = false;
  {
    std::lock_guard lock(seed_mu_);
    auto it = seeds_cache_.find(bucket_id);
    if (it == seeds_cache_.end()) {
      fut = promise.get_future().share();
      seeds_cache_[bucket_id] = fut;
      compile_here = true;
    } else {
      fut = it->second;
    }
  }
  if (compile_here) {
    Result result = [&]() -> Result {
      auto seed = seeds_(key);
      if (!seed.ok()) return seed.status();
      auto k = std::make_shared<v1::Kernel>();
      // Seeds are not in the store: a content id keeps them stable across
      // restarts and servers, so a client holding one can send if_none_match.
      k->set_variant_id(
          ContentVariantId(seed->source, seed->manifest_json, seed->compile_options));
      k->set_source_hash(Sha256Hex(seed->source));
      k->set_source(seed->source);
      k->set_arch(key.arch);
      ManifestToProto(seed->manifest_json, k->mutable_manifest());
      if (!k->manifest().entry_point().empty()) k->add_entry_points(k->manifest().entry_point());
      k->set_cubin(seed->cubin);
      k->set_compile_options(seed->compile_options);
      k->set_nvrtc_version(seed->nvrtc_version);
      k->mutable_provenance()->set_origin("template");
      k->mutable_provenance()->set_template_name(seed->template_name);
      k->mutable_provenance()->set_knobs_json(seed->knobs_json);
      return std::shared_ptr<const v1::Kernel>(std::move(k));
    }();
    if (!result.ok()) {
      // Do not cache failures: the next request tries again.
      std::lock_guard lock(seed_mu_);
      seeds_cache_.erase(bucket_id);
    }
    promise.set_value(result);
    return result;
  }
  return fut.get();
}

void MarkNotModified(v1::GetKernelResponse& resp) {
  resp.mutable_kernel()->clear_source();
  resp.mutable_kernel()->clear_cubin();
  resp.set_not_modified(true);
}

std::shared_ptr<const std::string> KernelCache::Cached(const ShapeKey& key, const Bucket& bucket,
                                                       const std::string& if_none_match) const {
  std::shared_lock lock(mu_);
  auto it = best_.find(bucket.Id());
  if (it == best_.end() || !ExtentCovers(it->second.verified, key)) return nullptr;
  if (!if_none_match.empty() && it->second.kernel->variant_id() == if_none_match)
    return it->second.not_modified_bytes;
  return it->second.response_bytes;
}

std::vector<KernelCache::BestEntry> KernelCache::Bests() const {
  std::shared_lock lock(mu_);
  std::vector<BestEntry> out;
  out.reserve(best_.size());
  for (const auto& [id, e] : best_) out.push_back(BestEntry{e.bucket, e.kernel, e.verified});
  return out;
}

size_t KernelCache::size() const {
  std::shared_lock lock(mu_);
  return best_.size();
}

}  // namespace kforge::server
