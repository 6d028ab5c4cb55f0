#include "runtime/request.h"

#include <cmath>

#include <fmt/format.h>

#include "absl/strings/cord.h"

namespace kforge::runtime {
namespace {

constexpr char kCodeUrl[] = "type.kforge.dev/runtime.kf_status";

absl::Status Invalid(std::string_view field, std::string_view why) {
  return ToStatus(KF_ERR_INVALID_ARGUMENT, fmt::format("args.{}: {}", field, why));
}

// The checks FillLengthStats does not make: the offsets must agree with the
// sizes the caller gave, which is what the kernel is told.
absl::Status CheckHostOffsets(std::string_view field, std::string_view side,
                              std::span<const int32_t> cu, int64_t total, int max_seqlen,
                              int64_t& exact_max) {
  if (cu.back() != total)
    return Invalid(field, fmt::format("ends at {} but total_{} is {}", cu.back(), side, total));
  exact_max = 0;
  for (size_t i = 1; i < cu.size(); ++i) exact_max = std::max<int64_t>(exact_max, cu[i] - cu[i - 1]);
  if (max_seqlen != 0 && max_seqlen < exact_max)
    return Invalid(field, fmt::format("has a sequence of {} rows, longer than max_seqlen {}",
                                      exact_max, max_seqlen));
  return absl::OkStatus();
}

}  // namespace

absl::Status ToStatus(kf_status code, std::string message) {
  absl::StatusCode c = absl::StatusCode::kInternal;
  switch (code) {
    case KF_OK: return absl::OkStatus();
    case KF_ERR_INVALID_ARGUMENT: c = absl::StatusCode::kInvalidArgument; break;
    case KF_ERR_UNSUPPORTED: c = absl::StatusCode::kUnimplemented; break;
    case KF_ERR_NEEDS_HOST_OFFSETS: c = absl::StatusCode::kFailedPrecondition; break;
    case KF_ERR_NO_DEVICE: c = absl::StatusCode::kUnavailable; break;
    case KF_ERR_SERVER: c = absl::StatusCode::kUnavailable; break;
    case KF_ERR_PACK: c = absl::StatusCode::kDataLoss; break;
    default: break;
  }
  absl::Status s(c, message);
  s.SetPayload(kCodeUrl, absl::Cord(std::to_string(int(code))));
  return s;
}

kf_status CodeOf(const absl::Status& s) {
  if (s.ok()) return KF_OK;
  if (auto p = s.GetPayload(kCodeUrl)) return static_cast<kf_status>(std::stoi(std::string(*p)));
  return KF_ERR_INTERNAL;
}

int ArgsDeterministic(const kf_attention_args& a) {
  constexpr size_t kEnd = offsetof(kf_attention_args, deterministic) + sizeof(a.deterministic);
  return a.struct_size >= kEnd ? a.deterministic : 0;
}

absl::StatusOr<Request> MakeRequest(const kf_attention_args* a, Op op, std::string_view arch,
                                    bool sizes_only) {
  if (a == nullptr) return ToStatus(KF_ERR_INVALID_ARGUMENT, "args: null");
  if (a->struct_size < kArgsMinSize)
    return Invalid("struct_size",
                   fmt::format("{} is smaller than any kf_attention_args ({} bytes or more); "
                               "call kf_attention_args_init",
                               a->struct_size, kArgsMinSize));
  if (a->dtype != KF_DTYPE_BF16) {
    if (a->dtype == KF_DTYPE_FP16 || a->dtype == KF_DTYPE_FP32)
      return ToStatus(KF_ERR_UNSUPPORTED,
                      fmt::format("args.dtype: {} has no kforge kernels (bf16 only)",
                                  a->dtype == KF_DTYPE_FP16 ? "fp16" : "fp32"));
    return Invalid("dtype", fmt::format("{} is not a kf_dtype", int(a->dtype)));
  }
  if (a->device < 0) return Invalid("device", fmt::format("{} is negative", a->device));
  if (a->batch <= 0) return Invalid("batch", fmt::format("{} must be positive", a->batch));
  if (a->heads <= 0) return Invalid("heads", fmt::format("{} must be positive", a->heads));
  const int kv_heads = a->kv_heads == 0 ? a->heads : a->kv_heads;
  if (kv_heads < 0 || a->heads % kv_heads != 0)
    return Invalid("kv_heads", fmt::format("{} does not divide heads {}", a->kv_heads, a->heads));
  if (a->head_dim <= 0)
    return Invalid("head_dim", fmt::format("{} must be positive", a->head_dim));
  if (a->total_q < 0) return Invalid("total_q", fmt::format("{} is negative", a->total_q));
  if (a->total_k < 0) return Invalid("total_k", fmt::format("{} is negative", a->total_k));
  if (a->max_seqlen_q < 0)
    return Invalid("max_seqlen_q", fmt::format("{} is negative", a->max_seqlen_q));
  if (a->max_seqlen_k < 0)
    return Invalid("max_seqlen_k", fmt::format("{} is negative", a->max_seqlen_k));
  if (a->causal != 0 && a->causal != 1)
    return Invalid("causal", fmt::format("{} is not 0 or 1", a->causal));
  const int deterministic = ArgsDeterministic(*a);
  if (deterministic != 0 && deterministic != 1)
    return Invalid("deterministic", fmt::format("{} is not 0 or 1", deterministic));
  if (!std::isfinite(a->softmax_scale))
    return Invalid("softmax_scale", "is not finite");

  Request r;
  r.op = op;
  r.args = a;
  r.scale = a->softmax_scale != 0 ? a->softmax_scale : 1.0f / std::sqrt(float(a->head_dim));

  // Self-attention: no separate key offsets (or the same array again).
  const bool k_dev = a->cu_seqlens_k != nullptr && a->cu_seqlens_k != a->cu_seqlens_q;
  const bool k_host = a->cu_seqlens_k_host != nullptr && a->cu_seqlens_k_host != a->cu_seqlens_q_host;
  const bool cross = k_dev || k_host;
  if (a->cu_seqlens_q == nullptr && a->cu_seqlens_q_host == nullptr)
    return Invalid("cu_seqlens_q", "null (give the device offsets, the host offsets or both)");
  if (cross && a->cu_seqlens_q_host != nullptr && a->cu_seqlens_k_host == nullptr)
    return Invalid("cu_seqlens_k_host",
                   "null while cu_seqlens_q_host is given for cross attention (give both or "
                   "neither)");
  if (cross && a->cu_seqlens_q == nullptr && a->cu_seqlens_k != nullptr)
    return Invalid("cu_seqlens_q", "null while the device cu_seqlens_k is given");

  ShapeKey& k = r.key;
  k.op = op;
  k.dtype = DType::kBF16;
  k.head_dim = a->head_dim;
  k.heads = a->heads;
  k.kv_heads = kv_heads;
  k.causal = a->causal != 0;
  k.cross = cross;
  // The forward is always deterministic: the flag selects backward kernels.
  k.deterministic = op == Op::kBackward && deterministic == 1;
  k.arch = std::string(arch);
  k.batch = a->batch;
  k.total_q = a->total_q;
  k.max_len_q = a->max_seqlen_q;
  if (cross) {
    k.total_k = a->total_k;
    k.max_len_k = a->max_seqlen_k;
  } else {
    if (a->total_k != 0 && a->total_k != a->total_q)
      return Invalid("total_k", fmt::format("{} differs from total_q {} in self-attention (pass "
                                            "separate cu_seqlens_k for cross attention)",
                                            a->total_k, a->total_q));
    if (a->max_seqlen_k != 0 && a->max_seqlen_k != a->max_seqlen_q)
      return Invalid("max_seqlen_k", fmt::format("{} differs from max_seqlen_q {} in "
                                                 "self-attention",
                                                 a->max_seqlen_k, a->max_seqlen_q));
    k.total_k = k.total_q;
    k.max_len_k = k.max_len_q;
  }

  if (a->cu_seqlens_q_host != nullptr) {
    r.has_host_offsets = true;
    r.cu_q_host = std::span<const int32_t>(a->cu_seqlens_q_host, size_t(a->batch) + 1);
    if (cross) r.cu_k_host = std::span<const int32_t>(a->cu_seqlens_k_host, size_t(a->batch) + 1);
    ShapeKey stats = k;
    if (absl::Status s = FillLengthStats(r.cu_q_host, r.cu_k_host, stats); !s.ok()) {
      // "cu_seqlens_q: must start at 0 ..." names the host array here.
      std::string m(s.message());
      const size_t colon = m.find(':');
      if (colon != std::string::npos) m.insert(colon, "_host");
      return ToStatus(KF_ERR_INVALID_ARGUMENT, "args." + m);
    }
    int64_t exact = 0;
    if (absl::Status s = CheckHostOffsets("cu_seqlens_q_host", "q", r.cu_q_host, a->total_q,
                                          a->max_seqlen_q, exact);
        !s.ok())
      return s;
    k.max_len_q = exact;
    if (cross) {
      if (absl::Status s = CheckHostOffsets("cu_seqlens_k_host", "k", r.cu_k_host, a->total_k,
                                            a->max_seqlen_k, exact);
          !s.ok())
        return s;
      k.max_len_k = exact;
    } else {
      k.max_len_k = k.max_len_q;
    }
  }

  if (k.total_q == 0) {
    r.degenerate = Degenerate::kNoQueries;
  } else if (k.total_k == 0) {
    r.degenerate = Degenerate::kNoKeys;
  } else {
    if (k.max_len_q == 0)
      return Invalid("max_seqlen_q", "0, but the batch has query rows");
    if (cross && k.max_len_k == 0)
      return Invalid("max_seqlen_k", "0, but the batch has key rows");
    if (absl::Status s = ValidateShapeKey(k); !s.ok()) {
      // head_dim 100 is not a bad argument of the caller's, just not a
      // kernel anyone has: say so with the code callers fall back on.
      const std::string m(s.message());
      const kf_status code =
          m.rfind("head_dim", 0) == 0 ? KF_ERR_UNSUPPORTED : KF_ERR_INVALID_ARGUMENT;
      return ToStatus(code, "args." + m);
    }
  }
  if (sizes_only) return r;

  auto need = [&](const void* p, const char* field) -> absl::Status {
    return p != nullptr ? absl::OkStatus() : Invalid(field, "null");
  };
  const bool rows_q = k.total_q > 0, rows_k = k.total_k > 0;
  struct Ptr {
    const void* p;
    const char* name;
    bool needed;
  };
  const bool fwd = op == Op::kForward;
  for (const Ptr& p : {Ptr{a->q, "q", rows_q && rows_k}, Ptr{a->k, "k", rows_q && rows_k},
                       Ptr{a->v, "v", rows_q && rows_k},
                       Ptr{a->o, "o", fwd ? rows_q : rows_q && rows_k},
                       Ptr{a->lse, "lse", !fwd && rows_q && rows_k},
                       Ptr{a->dout, "dout", !fwd && rows_q && rows_k},
                       Ptr{a->dq, "dq", !fwd && rows_q}, Ptr{a->dk, "dk", !fwd && rows_k},
                       Ptr{a->dv, "dv", !fwd && rows_k}}) {
    if (p.needed) {
      if (absl::Status s = need(p.p, p.name); !s.ok()) return s;
    }
    // Kernels load and store 16 bytes at a time (and TMA needs 16-byte
    // aligned tensors): a tensor starting elsewhere, as a view at an odd
    // offset can, would fault on the device and leave the caller's CUDA
    // context unusable. Refused here, by name, instead.
    if (p.p != nullptr && reinterpret_cast<uintptr_t>(p.p) % kTensorAlignment != 0)
      return Invalid(p.name, fmt::format("{} is not {}-byte aligned (pass a tensor that starts on a "
                                         "{}-byte boundary, as cudaMalloc and PyTorch's allocator "
                                         "give)",
                                         p.p, kTensorAlignment, kTensorAlignment));
  }
  for (const Ptr& p : {Ptr{a->cu_seqlens_q, "cu_seqlens_q", false},
                       Ptr{a->cu_seqlens_k, "cu_seqlens_k", false}}) {
    if (p.p != nullptr && reinterpret_cast<uintptr_t>(p.p) % alignof(int32_t) != 0)
      return Invalid(p.name, fmt::format("{} is not {}-byte aligned (int32 offsets)", p.p,
                                         alignof(int32_t)));
  }
  return r;
}

}  // namespace kforge::runtime
