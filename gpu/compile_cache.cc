#include "gpu/compile_cache.h"

#include <openssl/evp.h>

#include <fstream>
#include <sstream>

#include "fmt/format.h"
#include "kernels/attn_params_text.h"

namespace kforge::gpu {
namespace {

std::string Sha256Hex(const std::vector<std::string_view>& fields) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  for (std::string_view f : fields) {
    // Length-prefixed so ("ab","c") and ("a","bc") differ.
    uint64_t n = f.size();
    EVP_DigestUpdate(ctx, &n, sizeof(n));
    EVP_DigestUpdate(ctx, f.data(), f.size());
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, digest, &len);
  EVP_MD_CTX_free(ctx);
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

}  // namespace

std::string CompileKey(const CompileRequest& request) {
  std::string options;
  for (const std::string& o : CompileOptions(request)) options += o + '\n';
  const std::string version = NvrtcVersion();
  return Sha256Hex({request.source, options, version, request.arch,
                    embedded::attn_params_h});
}

CompileCache::CompileCache(std::filesystem::path dir) : dir_(std::move(dir)) {
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);  // a failure shows as misses
  }
}

std::optional<CompileResult> CompileCache::Lookup(const std::string& key) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = memory_.find(key);
    if (it != memory_.end()) {
      ++memory_hits_;
      CompileResult r = it->second;
      r.from_cache = true;
      return r;
    }
  }
  std::optional<CompileResult> r = ReadDisk(key);
  if (r.has_value()) {
    std::lock_guard<std::mutex> lock(mu_);
    ++disk_hits_;
    memory_.emplace(key, *r);
    r->from_cache = true;
  }
  return r;
}

void CompileCache::Insert(const std::string& key, const CompileResult& result) {
  if (result.transient) return;
  CompileResult stored = result;
  stored.from_cache = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    memory_[key] = stored;
  }
  WriteDisk(key, stored);
}

absl::StatusOr<CompileResult> CompileCache::GetOrCompile(const CompileRequest& request) {
  return GetOrCompile(request, Compile);
}

absl::StatusOr<CompileResult> CompileCache::GetOrCompile(const CompileRequest& request,
                                                         const Compiler& compiler) {
  const std::string key = CompileKey(request);
  if (std::optional<CompileResult> hit = Lookup(key)) return *std::move(hit);
  absl::StatusOr<CompileResult> result = compiler(request);
  if (result.ok()) Insert(key, *result);
  return result;
}

size_t CompileCache::memory_hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return memory_hits_;
}

size_t CompileCache::disk_hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return disk_hits_;
}

std::optional<CompileResult> CompileCache::ReadDisk(const std::string& key) {
  if (dir_.empty()) return std::nullopt;
  std::ifstream meta(dir_ / (key + ".json"));
  if (!meta) return std::nullopt;
  std::ostringstream text;
  text << meta.rdbuf();
  absl::StatusOr<CompileResult> parsed = CompileResultFromJson(text.str());
  if (!parsed.ok()) return std::nullopt;  // a damaged entry is a miss
  CompileResult r = *std::move(parsed);
  if (r.ok) {
    std::ifstream bin(dir_ / (key + ".cubin"), std::ios::binary);
    if (!bin) return std::nullopt;
    std::ostringstream data;
    data << bin.rdbuf();
    r.cubin = data.str();
    if (r.cubin.empty()) return std::nullopt;
  }
  return r;
}

void CompileCache::WriteDisk(const std::string& key, const CompileResult& result) {
  if (dir_.empty()) return;
  // Write to temporaries and rename, so a concurrent reader never sees half
  // a file; the cubin lands before the json that announces it.
  auto write = [&](const std::string& name, const std::string& data) {
    std::filesystem::path tmp = dir_ / fmt::format("{}.tmp.{}", name,
                                                   std::hash<std::thread::id>()(
                                                       std::this_thread::get_id()));
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(data.data(), static_cast<std::streamsize>(data.size()));
      if (!out) return;
    }
    std::error_code ec;
    std::filesystem::rename(tmp, dir_ / name, ec);
  };
  if (result.ok) write(key + ".cubin", result.cubin);
  write(key + ".json", CompileResultToJson(result));
}

// ----------------------------------------------------------- CompilePool ---

CompilePool::CompilePool(int threads, CompileCache* cache, Compiler compiler)
    : cache_(cache), compiler_(compiler ? std::move(compiler) : Compiler(Compile)) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Loop(); });
}

CompilePool::~CompilePool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

std::future<absl::StatusOr<CompileResult>> CompilePool::Submit(CompileRequest request) {
  const std::string key = CompileKey(request);
  std::promise<absl::StatusOr<CompileResult>> promise;
  std::future<absl::StatusOr<CompileResult>> future = promise.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The same program already queued or compiling (a worker compiles the
    // task it leased ahead, then asks again when it runs it): wait for that
    // compile instead of running NVRTC twice.
    if (auto it = in_flight_.find(key); it != in_flight_.end()) {
      it->second.push_back(std::move(promise));
      return future;
    }
    in_flight_[key].push_back(std::move(promise));
    queue_.push_back([this, key, request = std::move(request)] {
      absl::StatusOr<CompileResult> r =
          cache_ != nullptr ? cache_->GetOrCompile(request, compiler_) : compiler_(request);
      std::vector<std::promise<absl::StatusOr<CompileResult>>> waiting;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = in_flight_.find(key);
        waiting = std::move(it->second);
        in_flight_.erase(it);
      }
      for (auto& p : waiting) p.set_value(r);
    });
  }
  cv_.notify_one();
  return future;
}

void CompilePool::Loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();
  }
}

}  // namespace kforge::gpu
