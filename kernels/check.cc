#include "kernels/check.h"

#include <algorithm>
#include <regex>
#include <string>

#include <fmt/format.h>

namespace kforge {
namespace {

absl::Status Reject(const std::string& msg) { return absl::InvalidArgumentError(msg); }

template <typename T>
bool Contains(const std::vector<T>& v, const T& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Strips // and /* */ comments so markers in comments do not count.
std::string StripComments(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '/' && i + 1 < s.size() && s[i + 1] == '/') {
      while (i < s.size() && s[i] != '\n') ++i;
      out.push_back('\n');
    } else if (s[i] == '/' && i + 1 < s.size() && s[i + 1] == '*') {
      i += 2;
      while (i + 1 < s.size() && !(s[i] == '*' && s[i + 1] == '/')) ++i;
      ++i;
      out.push_back(' ');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

}  // namespace

absl::Status CheckVariant(std::string_view source, const Manifest& m, std::string_view arch,
                          const ShapeKey& shape) {
  if (source.size() > kMaxVariantSourceBytes) {
    return Reject(fmt::format("source: {} bytes exceeds the limit of {}", source.size(),
                              kMaxVariantSourceBytes));
  }
  const std::string code = StripComments(source);
  static const std::regex kInclude(R"(#\s*include\s*[<"]([^>"]+)[>"])");
  for (auto it = std::sregex_iterator(code.begin(), code.end(), kInclude);
       it != std::sregex_iterator(); ++it) {
    if ((*it)[1].str() != "kforge/attn_params.h") {
      return Reject(fmt::format("source: #include <{}> is not allowed (only \"kforge/attn_params.h\")",
                                (*it)[1].str()));
    }
  }
  static const std::regex kHostMarkers(
      R"(\bint\s+main\s*\(|\bcuda(Malloc|Free|Memcpy|LaunchKernel|DeviceSynchronize|StreamCreate)\w*\s*\(|\bcu(MemAlloc|LaunchKernel|CtxCreate)\w*\s*\(|\bprintf\s*\(|\b__host__\b|\bmalloc\s*\(|\bfree\s*\(|\bexit\s*\(|\bnew\s+|\bdelete\b|\btrap;|__trap\s*\()");
  std::smatch hit;
  if (std::regex_search(code, hit, kHostMarkers)) {
    return Reject(fmt::format("source: forbidden construct \"{}\" (host code, printf, allocation "
                              "or trap)", hit.str()));
  }
  // The host standard library (std::, but not libcu++'s cuda::std::) and
  // calls that reach the operating system have no place in device code.
  static const std::regex kHostStd(R"((^|[^\w])std::)");
  static const std::regex kLibcuxx(R"(\bcuda::std::)");
  static const std::regex kHostCalls(
      R"(\b(system|popen|fopen|fork|execl|execv|execve|execvp|dlopen|getenv|socket)\s*\()");
  if (std::regex_search(code, hit, kHostCalls)) {
    return Reject(fmt::format("source: calls {}() (host code is not allowed)", hit[1].str()));
  }
  if (std::regex_search(std::regex_replace(code, kLibcuxx, "cuda::"), kHostStd)) {
    return Reject("source: uses the host standard library (std::); device code only");
  }
  const std::regex kEntry("extern\\s+\"C\"\\s+__global__[^;{]*\\b" + m.entry_point + "\\s*\\(");
  if (!std::regex_search(code, kEntry)) {
    return Reject(fmt::format("source: no `extern \"C\" __global__ void {}(` definition",
                              m.entry_point));
  }
  if (m.threads < 32 || m.threads > 1024 || m.threads % 32 != 0) {
    return Reject(fmt::format("threads: {} must be a multiple of 32 in [32, 1024]", m.threads));
  }
  const int smem_limit = MaxSmemPerBlock(arch);
  if (smem_limit == 0) return Reject(fmt::format("arch: unknown architecture \"{}\"", arch));
  if (m.dynamic_smem_bytes > smem_limit) {
    return Reject(fmt::format("dynamic_smem_bytes: {} exceeds {}'s limit of {}",
                              m.dynamic_smem_bytes, arch, smem_limit));
  }
  if (!Contains(m.archs, std::string(arch))) {
    return Reject(fmt::format("archs: {} is not among the manifest's archs [{}]", arch,
                              fmt::join(m.archs, ", ")));
  }
  for (const auto& f : m.features) {
    if (!ArchHasFeature(arch, f)) {
      return Reject(fmt::format("features: \"{}\" is not available on {}", f, arch));
    }
  }
  if (shape.arch != arch && !shape.arch.empty()) {
    return Reject(fmt::format("arch: the shape asks for {}, the check was for {}", shape.arch, arch));
  }
  const std::string op(OpName(shape.op));
  if (!Contains(m.ops, op)) {
    return Reject(fmt::format("ops: the variant does not implement {}", op));
  }
  if (!Contains(m.head_dims, shape.head_dim)) {
    return Reject(fmt::format("head_dims: {} is not supported (variant has [{}])", shape.head_dim,
                              fmt::join(m.head_dims, ", ")));
  }
  if (shape.causal && !m.causal) return Reject("causal: the variant does not support causal masks");
  if (!shape.causal && !m.noncausal) return Reject("causal: the variant only supports causal masks");
  if (shape.kv_heads != shape.heads && !m.gqa) {
    return Reject(fmt::format("gqa: kv_heads {} != heads {} and the variant does not support GQA",
                              shape.kv_heads, shape.heads));
  }
  if (m.grid == GridPolicy::kPerTile && (shape.batch > 65535 || shape.heads > 65535)) {
    return Reject(fmt::format("grid: batch {} exceeds the per_tile grid's limit of 65535",
                              shape.batch));
  }
  return absl::OkStatus();
}

}  // namespace kforge
