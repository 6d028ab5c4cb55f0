// KernelCache: what GetKernel serves, kept in memory so that the hot path
// never touches the store.
//
// Holds, per (bucket, arch), the best verified variant as a ready-built
// v1::Kernel (source, manifest, cubin, timing, provenance), loaded from the
// store at start and refreshed whenever ReportResult replaces a best. The
// cubin is the promoting evaluation's and is checked against its hash when
// loaded; bytes that do not match are not served (logged, the bucket falls
// back as if untuned).
//
// A best is served only for requests inside the sizes it was verified at
// (BestRecord::verified, ExtentCovers); a best stored before extents were
// covers the shape of the task that promoted it, which the evaluator of
// its time verified and timed it on. A request outside its own bucket's
// extent, or for a bucket without a winner, gets the nearest tuned bucket
// of the same class (BucketDistance) whose extent covers it, else a seed
// default built by a SeedProvider and compiled once per bucket.
//
// Thread-safe. Lookups take a shared lock and return immutable
// shared_ptr<const v1::Kernel>, so serving is a copy of a cached message.
#pragma once

#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/shape.h"
#include "kforge/v1/kforge.pb.h"
#include "storage/store.h"

namespace kforge::server {

// A correct, untuned kernel for a shape: the kernels component's default
// variant compiled by NVRTC for the shape's arch (main() wires it; tests use
// a fake). NOT_FOUND when no template serves the shape.
struct SeedKernel {
  std::string source;
  std::string manifest_json;
  std::string template_name;
  std::string knobs_json;
  std::string cubin;  // may be empty when compiling is not possible here
  std::string compile_options;
  std::string nvrtc_version;
};
using SeedProvider = std::function<absl::StatusOr<SeedKernel>(const ShapeKey&)>;

struct Served {
  std::shared_ptr<const v1::Kernel> kernel;  // requested_bucket/tuned still to set
  bool tuned = false;
  // Exact hits only: the whole GetKernelResponse, serialized once when the
  // best was loaded, so the hot path sends shared bytes without copying.
  std::shared_ptr<const std::string> response_bytes;
};

// Turns a response into the not-modified answer for a caller that already
// holds its variant: no source, no cubin.
void MarkNotModified(v1::GetKernelResponse& resp);

class KernelCache {
 public:
  // `store` must outlive the cache. `seeds` may be empty (no seed defaults:
  // untuned buckets without a nearby winner get NOT_FOUND).
  KernelCache(Store* store, SeedProvider seeds);

  // Loads every stored best. Bests whose variant or cubin cannot be read
  // are skipped with a warning (served as untuned until re-tuned).
  absl::Status LoadAll();
  // Re-reads the best of one bucket (after ReportResult replaced it).
  absl::Status Refresh(const std::string& bucket_id, const std::string& arch);

  // The kernel for a validated shape: exact winner, nearest winner, or seed.
  absl::StatusOr<Served> Lookup(const ShapeKey& key, const Bucket& bucket);
  // The serialized response of a tuned bucket whose best covers `key`, or
  // nullptr; never blocks. When `if_none_match` names the bucket's best,
  // the not-modified response.
  std::shared_ptr<const std::string> Cached(const ShapeKey& key, const Bucket& bucket,
                                            const std::string& if_none_match) const;

  size_t size() const;

  struct BestEntry {
    Bucket bucket;
    std::shared_ptr<const v1::Kernel> kernel;
    SizeExtent verified;  // the sizes it may be served for
  };
  // Every loaded best, in bucket-id order: a snapshot (ExportKernels).
  std::vector<BestEntry> Bests() const;

 private:
  // Also sets `verified` to the sizes the kernel may be served for.
  absl::StatusOr<std::shared_ptr<const v1::Kernel>> Build(const BestRecord& best,
                                                          SizeExtent* verified);
  SizeExtent ExtentOfBest(const BestRecord& best, const EvaluationRecord& winner);
  absl::StatusOr<std::shared_ptr<const v1::Kernel>> Seed(const ShapeKey& key,
                                                         const std::string& bucket_id);

  Store* store_;  // must outlive the cache
  SeedProvider seeds_;

  struct Entry {
    Bucket bucket;
    SizeExtent verified;
    std::shared_ptr<const v1::Kernel> kernel;
    std::shared_ptr<const std::string> response_bytes;
    std::shared_ptr<const std::string> not_modified_bytes;
  };
  mutable std::shared_mutex mu_;
  std::map<std::string, Entry> best_;  // by bucket id (includes the arch); guarded by mu_

  std::mutex seed_mu_;
  // One compile per bucket even when many requests arrive at once.
  std::map<std::string,
           std::shared_future<absl::StatusOr<std::shared_ptr<const v1::Kernel>>>>
      seeds_cache_;  // guarded by seed_mu_
};

}  // namespace kforge::server
