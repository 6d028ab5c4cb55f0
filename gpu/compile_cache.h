// Content-addressed cache of compile results, and a thread pool of compiles.
//
// The key is the sha256 of (source, exact option string, NVRTC version,
// arch): a change to any of them is a different program. Compile errors are
// cached too (they are as deterministic as cubins); transient results
// (a compile past its time limit, a compile child that died) are not, since
// another run may end differently.
//
// Thread-safe: both classes may be used from any number of threads.
#pragma once

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/compile.h"

namespace kforge::gpu {

// Hex sha256 of the fields that determine a compile's output.
std::string CompileKey(const CompileRequest& request);

class CompileCache {
 public:
  // `dir` empty: memory only. Otherwise results are also stored as
  // <dir>/<key>.cubin + <key>.json and found again by later processes.
  explicit CompileCache(std::filesystem::path dir = {});

  std::optional<CompileResult> Lookup(const std::string& key);
  void Insert(const std::string& key, const CompileResult& result);

  // Lookup, else Compile (or `compiler`) + Insert. A hit has from_cache = true.
  absl::StatusOr<CompileResult> GetOrCompile(const CompileRequest& request);
  absl::StatusOr<CompileResult> GetOrCompile(const CompileRequest& request,
                                             const Compiler& compiler);

  size_t memory_hits() const;
  size_t disk_hits() const;

 private:
  std::optional<CompileResult> ReadDisk(const std::string& key);
  void WriteDisk(const std::string& key, const CompileResult& result);

  const std::filesystem::path dir_;
  mutable std::mutex mu_;
  std::map<std::string, CompileResult> memory_;  // GUARDED_BY(mu_)
  size_t memory_hits_ = 0;                       // GUARDED_BY(mu_)
  size_t disk_hits_ = 0;                         // GUARDED_BY(mu_)
};

// N threads that compile requests (through `cache` when given). A request
// submitted while the same program (CompileKey) is queued or compiling
// shares that compile's result.
class CompilePool {
 public:
  // `cache` may be null; it must outlive the pool. `compiler` runs the
  // compiles the cache misses; empty: Compile() in this process (trusted
  // sources only: the worker compiles candidates in a child).
  CompilePool(int threads, CompileCache* cache, Compiler compiler = {});
  ~CompilePool();  // finishes queued work, then joins
  CompilePool(const CompilePool&) = delete;
  CompilePool& operator=(const CompilePool&) = delete;

  std::future<absl::StatusOr<CompileResult>> Submit(CompileRequest request);

 private:
  void Loop();

  CompileCache* const cache_;
  const Compiler compiler_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // GUARDED_BY(mu_)
  // Callers of each queued or running compile, by CompileKey: a request
  // submitted again while its compile is in flight joins it.
  std::map<std::string, std::vector<std::promise<absl::StatusOr<CompileResult>>>>
      in_flight_;                            // GUARDED_BY(mu_)
  bool stopping_ = false;                    // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;
};

}  // namespace kforge::gpu
