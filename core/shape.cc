#include "core/shape.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "core/arch.h"
#include "core/status.h"

namespace kforge {
namespace {

// Debian's abseil has its own string_view type, so absl::StrCat does not take
// std::string_view; fmt (spdlog's formatter) does.
template <typename... Args>
std::string Cat(const Args&... args) {
  std::string out;
  (fmt::format_to(std::back_inserter(out), "{}", args), ...);
  return out;
}

// Whole-string integer parse (Debian's abseil has its own string_view, so
// absl::SimpleAtoi does not take std::string_view).
template <typename T>
bool ParseInt(std::string_view s, T& out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

int Log2(int64_t pow2) { return std::bit_width(static_cast<uint64_t>(pow2)) - 1; }

absl::Status CheckLengths(std::string_view side, int64_t batch, int64_t max_len,
                          int64_t total) {
  const std::string max_name = Cat("max_len_", side);
  const std::string total_name = Cat("total_", side);
  if (max_len < 0) return Invalid(max_name, Cat(max_len, " is negative"));
  if (total < 0) return Invalid(total_name, Cat(total, " is negative"));
  if (max_len > kMaxSeqLen)
    return Invalid(max_name, Cat(max_len, " exceeds the limit ", kMaxSeqLen));
  if (total > kMaxTotalTokens)
    return Invalid(total_name, Cat(total, " exceeds the limit ", kMaxTotalTokens));
  if (total == 0) return Invalid(total_name, "must be positive (the batch has no tokens)");
  if (max_len == 0) return Invalid(max_name, "must be positive when total is positive");
  if (max_len > total)
    return Invalid(max_name, Cat(max_len, " is larger than ", total_name, " ", total));
  if (total > batch * max_len)
    return Invalid(total_name, Cat(total, " is more than batch ", batch, " x ",
                                            max_name, " ", max_len));
  return absl::OkStatus();
}

}  // namespace

std::string_view OpName(Op op) { return op == Op::kForward ? "fwd" : "bwd"; }
std::string_view DTypeName(DType) { return "bf16"; }

std::optional<Op> ParseOp(std::string_view s) {
  if (s == "fwd" || s == "forward") return Op::kForward;
  if (s == "bwd" || s == "backward") return Op::kBackward;
  return std::nullopt;
}

std::optional<DType> ParseDType(std::string_view s) {
  if (s == "bf16" || s == "bfloat16") return DType::kBF16;
  return std::nullopt;
}

int64_t CeilPow2(int64_t v) {
  if (v <= 1) return 1;
  return static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(v)));
}

absl::Status ValidateArch(std::string_view arch) { return ParseArch(arch).status(); }

absl::Status ValidateShapeKey(const ShapeKey& k) {
  if (k.head_dim <= 0) return Invalid("head_dim", Cat(k.head_dim, " must be positive"));
  if (k.head_dim % 8 != 0)
    return Invalid("head_dim", Cat(k.head_dim, " is not a multiple of 8"));
  if (k.head_dim > kMaxHeadDim)
    return Invalid("head_dim", Cat(k.head_dim, " exceeds ", kMaxHeadDim));
  if (k.heads <= 0) return Invalid("heads", Cat(k.heads, " must be positive"));
  if (k.heads > kMaxHeads) return Invalid("heads", Cat(k.heads, " exceeds ", kMaxHeads));
  if (k.kv_heads <= 0) return Invalid("kv_heads", Cat(k.kv_heads, " must be positive"));
  if (k.heads % k.kv_heads != 0)
    return Invalid("kv_heads", Cat(k.kv_heads, " does not divide heads ", k.heads));
  if (auto s = ValidateArch(k.arch); !s.ok()) return s;
  if (k.deterministic && k.op != Op::kBackward)
    return Invalid("deterministic", "applies to backward shapes only (the forward is always "
                                    "bitwise deterministic)");
  if (k.batch <= 0) return Invalid("batch", Cat(k.batch, " must be positive"));
  if (k.batch > kMaxBatch) return Invalid("batch", Cat(k.batch, " exceeds ", kMaxBatch));
  if (auto s = CheckLengths("q", k.batch, k.max_len_q, k.total_q); !s.ok()) return s;
  if (k.cross) {
    if (auto s = CheckLengths("k", k.batch, k.max_len_k, k.total_k); !s.ok()) return s;
  } else if ((k.max_len_k != 0 && k.max_len_k != k.max_len_q) ||
             (k.total_k != 0 && k.total_k != k.total_q)) {
    return Invalid("max_len_k", "self-attention keys must have the query lengths (set cross for "
                                "separate key lengths)");
  }
  return absl::OkStatus();
}

absl::Status FillLengthStats(std::span<const int32_t> cu_q, std::span<const int32_t> cu_k,
                             ShapeKey& key) {
  auto stats = [](std::string_view name, std::span<const int32_t> cu, int64_t& batch,
                  int64_t& max_len, int64_t& total) -> absl::Status {
    if (cu.size() < 2)
      return Invalid(name, Cat("needs at least 2 entries (B+1), got ", cu.size()));
    if (cu[0] != 0) return Invalid(name, Cat("must start at 0, starts at ", cu[0]));
    max_len = 0;
    for (size_t i = 1; i < cu.size(); ++i) {
      if (cu[i] < cu[i - 1])
        return Invalid(name, Cat("decreases at index ", i, " (", cu[i - 1], " -> ",
                                          cu[i], ")"));
      max_len = std::max<int64_t>(max_len, cu[i] - cu[i - 1]);
    }
    batch = static_cast<int64_t>(cu.size()) - 1;
    total = cu.back();
    return absl::OkStatus();
  };
  int64_t bq = 0, bk = 0;
  if (auto s = stats("cu_seqlens_q", cu_q, bq, key.max_len_q, key.total_q); !s.ok()) return s;
  key.batch = bq;
  key.cross = !cu_k.empty();
  if (!key.cross) {
    key.max_len_k = key.max_len_q;
    key.total_k = key.total_q;
    return absl::OkStatus();
  }
  if (auto s = stats("cu_seqlens_k", cu_k, bk, key.max_len_k, key.total_k); !s.ok()) return s;
  if (bk != bq)
    return Invalid("cu_seqlens_k", Cat("has ", bk + 1, " entries but cu_seqlens_q has ",
                                                bq + 1, "; both need B+1"));
  return absl::OkStatus();
}

Bucket BucketOf(const ShapeKey& k) {
  Bucket b;
  b.op = k.op;
  b.dtype = k.dtype;
  b.head_dim = k.head_dim;
  b.heads = k.heads;
  b.kv_heads = k.kv_heads;
  b.causal = k.causal;
  b.cross = k.cross;
  b.arch = k.arch;
  b.deterministic = k.deterministic;
  b.batch = CeilPow2(k.batch);
  b.max_q = CeilPow2(k.max_len_q);
  b.mean_q = CeilPow2((k.total_q + k.batch - 1) / std::max<int64_t>(k.batch, 1));
  const int64_t max_k = k.cross ? k.max_len_k : k.max_len_q;
  const int64_t total_k = k.cross ? k.total_k : k.total_q;
  b.max_k = CeilPow2(max_k);
  b.mean_k = CeilPow2((total_k + k.batch - 1) / std::max<int64_t>(k.batch, 1));
  return b;
}

std::string Bucket::Id() const {
  return Cat(OpName(op), ".", DTypeName(dtype), ".d", head_dim, ".h", heads, ".kv",
                      kv_heads, ".", causal ? "causal" : "full", ".", cross ? "cross" : "self",
                      ".", arch, ".b", batch, ".mq", max_q, ".aq", mean_q, ".mk", max_k, ".ak",
                      mean_k, deterministic ? ".det" : "");
}

absl::StatusOr<Bucket> ParseBucketId(std::string_view id) {
  std::vector<std::string_view> p;
  for (size_t start = 0;;) {
    size_t dot = id.find('.', start);
    p.push_back(id.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(Cat("bucket id '", id, "': ", why));
  };
  // A 14th field is the deterministic suffix (Bucket::Id).
  if (p.size() != 13 && !(p.size() == 14 && p[13] == "det"))
    return bad("expected 13 dot-separated fields (14 with a final \"det\")");
  Bucket b;
  b.deterministic = p.size() == 14;
  auto op = ParseOp(p[0]);
  auto dt = ParseDType(p[1]);
  if (!op) return bad("unknown op");
  if (!dt) return bad("unknown dtype");
  b.op = *op;
  b.dtype = *dt;
  auto num = [&](std::string_view field, std::string_view prefix, auto& out) -> bool {
    if (field.substr(0, prefix.size()) != prefix) return false;
    return ParseInt(field.substr(prefix.size()), out) && out > 0;
  };
  if (!num(p[2], "d", b.head_dim) || !num(p[3], "h", b.heads) || !num(p[4], "kv", b.kv_heads))
    return bad("malformed head fields");
  if (p[5] != "causal" && p[5] != "full") return bad("mask must be causal or full");
  if (p[6] != "self" && p[6] != "cross") return bad("must be self or cross");
  b.causal = p[5] == "causal";
  b.cross = p[6] == "cross";
  if (!ValidateArch(p[7]).ok()) return bad("unknown arch");
  b.arch = std::string(p[7]);
  if (!num(p[8], "b", b.batch) || !num(p[9], "mq", b.max_q) || !num(p[10], "aq", b.mean_q) ||
      !num(p[11], "mk", b.max_k) || !num(p[12], "ak", b.mean_k))
    return bad("malformed length fields");
  if (b.deterministic && b.op != Op::kBackward) return bad("det applies to backward buckets only");
  return b;
}

std::optional<int> BucketDistance(const Bucket& a, const Bucket& b) {
  if (a.op != b.op || a.dtype != b.dtype || a.head_dim != b.head_dim || a.heads != b.heads ||
      a.kv_heads != b.kv_heads || a.causal != b.causal || a.cross != b.cross || a.arch != b.arch ||
      a.deterministic != b.deterministic)
    return std::nullopt;
  auto d = [](int64_t x, int64_t y) { return std::abs(Log2(x) - Log2(y)); };
  return d(a.batch, b.batch) + d(a.max_q, b.max_q) + d(a.mean_q, b.mean_q) + d(a.max_k, b.max_k) +
         d(a.mean_k, b.mean_k);
}

bool ExtentCovers(const SizeExtent& v, const ShapeKey& k) {
  const int64_t max_k = k.cross ? k.max_len_k : k.max_len_q;
  const int64_t total_k = k.cross ? k.total_k : k.total_q;
  return k.batch <= v.batch && k.max_len_q <= v.max_len_q && k.total_q <= v.total_q &&
         max_k <= v.max_len_k && total_k <= v.total_k;
}

SizeExtent BucketExtent(const Bucket& b) {
  SizeExtent e;
  e.batch = b.batch;
  e.max_len_q = b.max_q;
  e.max_len_k = b.max_k;
  e.total_q = b.batch * std::min(b.mean_q, b.max_q);
  e.total_k = b.batch * std::min(b.mean_k, b.max_k);
  return e;
}

}  // namespace kforge
