#include "kernels/check.h"

#include <algorithm>
#include <cctype>
#include <string>

#include <fmt/format.h>

namespace kforge {
namespace {

absl::Status Reject(const std::string& msg) { return absl::InvalidArgumentError(msg); }

template <typename T>
bool Contains(const std::vector<T>& v, const T& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Why the name or value of a -D option may not be used, or "".
std::string MacroProblem(std::string_view def) {
  const size_t eq = def.find('=');
  const std::string_view name = def.substr(0, eq);
  const std::string_view value = eq == std::string_view::npos ? "" : def.substr(eq + 1);
  auto ident_start = [](char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; };
  auto ident_char = [&](char c) { return ident_start(c) || std::isdigit(static_cast<unsigned char>(c)); };
  if (name.empty() || !ident_start(name[0]) || !std::all_of(name.begin(), name.end(), ident_char))
    return "the macro name must be an identifier";
  if (name.starts_with("__") || (name.size() > 1 && name[0] == '_' && std::isupper(static_cast<unsigned char>(name[1]))))
    return "reserved macro names (__x, _X) are not allowed";
  if (value.size() > 64) return "the value is longer than 64 characters";
  std::string_view v = value;
  if (!v.empty() && (v[0] == '-' || v[0] == '+')) v.remove_prefix(1);
  if (!std::all_of(v.begin(), v.end(), [&](char c) { return ident_char(c) || c == '.'; }))
    return "the value must be a number or an identifier";
  // Every identifier the option brings in passes the source check's rules.
  for (std::string_view part : {name, v}) {
    for (size_t i = 0; i < part.size();) {
      if (!ident_start(part[i]) || (i > 0 && ident_char(part[i - 1]))) {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < part.size() && ident_char(part[j])) ++j;
      const std::string_view id = part.substr(i, j - i);
      if (std::string why = ForbiddenIdentifier(id); !why.empty()) return why;
      if (id == "std") return "\"std\" is not allowed (host standard library)";
      i = j;
    }
  }
  return "";
}

// Why one option is not allowed, or "" when it is.
std::string OptionProblem(std::string_view o) {
  // One spelling for the checks below: NVRTC takes both -x and --x.
  std::string_view bare = o;
  if (bare.starts_with("--")) bare.remove_prefix(2);
  else if (bare.starts_with("-")) bare.remove_prefix(1);
  else return "not an option";
  static constexpr std::string_view kFlags[] = {"use_fast_math", "extra-device-vectorization",
                                                "lineinfo", "generate-line-info", "restrict"};
  for (std::string_view f : kFlags)
    if (bare == f) return "";
  for (std::string_view b : {"fmad=", "ftz=", "prec-div=", "prec-sqrt="}) {
    if (bare.starts_with(b)) {
      const std::string_view v = bare.substr(b.size());
      return v == "true" || v == "false" ? "" : "the value must be true or false";
    }
  }
  if (bare.starts_with("maxrregcount=")) {
    const std::string_view v = bare.substr(13);
    int n = 0;
    const bool digits = !v.empty() && v.size() <= 3 &&
                        std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits) n = std::stoi(std::string(v));
    return digits && n >= 1 && n <= 255 ? "" : "the value must be a register count in 1..255";
  }
  if (o.starts_with("-D") && !o.starts_with("--")) return MacroProblem(o.substr(2));
  if (bare.starts_with("define-macro=")) return MacroProblem(bare.substr(13));
  if (o.starts_with("-I") || bare.starts_with("include-path")) return "include paths read files";
  if (bare.starts_with("include") || bare.starts_with("pre-include"))
    return "pre-included headers read files";
  if (bare.starts_with("arch") || bare.starts_with("gpu-architecture"))
    return "the worker picks the target architecture";
  if (bare.starts_with("rdc") || bare.starts_with("relocatable-device-code") || bare == "dc")
    return "relocatable device code is not allowed (nothing is linked)";
  return "unknown option (allowed: -use_fast_math, --fmad=, --ftz=, --prec-div=, --prec-sqrt=, "
         "-maxrregcount=N, --extra-device-vectorization, -lineinfo, -restrict, -DNAME[=VALUE])";
}

}  // namespace

absl::Status CheckVariant(std::string_view source, const Manifest& m, std::string_view arch,
                          const ShapeKey& shape) {
  if (source.size() > kMaxVariantSourceBytes) {
    return Reject(fmt::format("source: {} bytes exceeds the limit of {}", source.size(),
                              kMaxVariantSourceBytes));
  }
  absl::StatusOr<std::vector<SourceToken>> tokens = LexSource(source);
  if (!tokens.ok()) return tokens.status();
  if (absl::Status s = CheckSourceTokens(*tokens); !s.ok()) return s;
  if (!DefinesEntryPoint(*tokens, m.entry_point)) {
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
  if (shape.deterministic && !m.deterministic) {
    return Reject(
        "deterministic: the shape asks for a bitwise deterministic backward and the variant's "
        "manifest does not say \"deterministic\": true");
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

namespace kforge {

absl::Status CheckCompileOptions(std::string_view options) {
  size_t i = 0;
  while (i < options.size()) {
    while (i < options.size() && IsSpace(options[i])) ++i;
    size_t j = i;
    while (j < options.size() && !IsSpace(options[j])) ++j;
    if (j > i) {
      const std::string_view o = options.substr(i, j - i);
      if (std::string why = OptionProblem(o); !why.empty()) {
        return Reject(fmt::format("compile options: {} is not allowed: {}",
                                  o.size() > 80 ? std::string(o.substr(0, 80)) + "..." : std::string(o),
                                  why));
      }
    }
    i = j;
  }
  return absl::OkStatus();
}

}  // namespace kforge
