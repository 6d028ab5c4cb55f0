// The C ABI (include/kforge/runtime.h) over Runtime: argument structs are
// checked for their size, errors become a kf_status and this thread's last
// error, and no C++ exception crosses the boundary.
#include <cstring>
#include <exception>
#include <string>

#include <fmt/format.h>

#include "kforge/runtime.h"
#include "runtime/request.h"
#include "runtime/runtime.h"
#include "runtime/server_client.h"

struct kf_runtime {
  std::unique_ptr<kforge::runtime::Runtime> impl;
};

namespace {

thread_local std::string last_error;

kf_status Fail(kf_status code, std::string message) {
  last_error = std::move(message);
  return code;
}

kf_status Return(const absl::Status& s) {
  if (s.ok()) {
    last_error.clear();
    return KF_OK;
  }
  return Fail(kforge::runtime::CodeOf(s), std::string(s.message()));
}

template <typename Fn>
kf_status Guard(Fn&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return Fail(KF_ERR_INTERNAL, fmt::format("internal error: {}", e.what()));
  } catch (...) {
    return Fail(KF_ERR_INTERNAL, "internal error: unknown exception");
  }
}

}  // namespace

extern "C" {

void kf_runtime_options_init(kf_runtime_options* o) {
  if (o == nullptr) return;
  std::memset(o, 0, sizeof(*o));
  o->struct_size = sizeof(*o);
  o->policy = KF_POLICY_FALLBACK;
  o->server_timeout_ms = 10000;
  o->server_retry_s = 30;
  o->revalidate_s = 600;
}

kf_status kf_runtime_create(const kf_runtime_options* options, kf_runtime** out) {
  return Guard([&] {
    if (out == nullptr) return Fail(KF_ERR_INVALID_ARGUMENT, "out: null");
    *out = nullptr;
    kf_runtime_options defaults;
    kf_runtime_options_init(&defaults);
    if (options == nullptr) options = &defaults;
    if (options->struct_size < sizeof(kf_runtime_options))
      return Fail(KF_ERR_INVALID_ARGUMENT,
                  fmt::format("options.struct_size: {} is smaller than this library's "
                              "kf_runtime_options ({} bytes); call kf_runtime_options_init",
                              options->struct_size, sizeof(kf_runtime_options)));
    auto rt = kforge::runtime::Runtime::Create(*options, &kforge::runtime::MakeGrpcKernelServer);
    if (!rt.ok()) return Return(rt.status());
    *out = new kf_runtime{*std::move(rt)};
    return Return(absl::OkStatus());
  });
}

void kf_runtime_destroy(kf_runtime* runtime) { delete runtime; }

void kf_attention_args_init(kf_attention_args* a) {
  if (a == nullptr) return;
  std::memset(a, 0, sizeof(*a));
  a->struct_size = sizeof(*a);
  a->dtype = KF_DTYPE_BF16;
}

kf_status kf_attention_forward(kf_runtime* runtime, const kf_attention_args* args) {
  return Guard([&] {
    if (runtime == nullptr) return Fail(KF_ERR_INVALID_ARGUMENT, "runtime: null");
    return Return(runtime->impl->Forward(args));
  });
}

kf_status kf_attention_backward(kf_runtime* runtime, const kf_attention_args* args) {
  return Guard([&] {
    if (runtime == nullptr) return Fail(KF_ERR_INVALID_ARGUMENT, "runtime: null");
    return Return(runtime->impl->Backward(args));
  });
}

kf_status kf_attention_prepare(kf_runtime* runtime, const kf_attention_args* args, kf_op op,
                               kf_kernel_info* info) {
  return Guard([&] {
    if (runtime == nullptr) return Fail(KF_ERR_INVALID_ARGUMENT, "runtime: null");
    if (op != KF_OP_FORWARD && op != KF_OP_BACKWARD)
      return Fail(KF_ERR_INVALID_ARGUMENT, fmt::format("op: {} is not a kf_op", int(op)));
    return Return(runtime->impl->Prepare(
        args, op == KF_OP_FORWARD ? kforge::Op::kForward : kforge::Op::kBackward, info));
  });
}

kf_status kf_attention_supported(kf_runtime* runtime, const kf_attention_args* args, kf_op op) {
  return Guard([&] {
    if (runtime == nullptr) return Fail(KF_ERR_INVALID_ARGUMENT, "runtime: null");
    if (op != KF_OP_FORWARD && op != KF_OP_BACKWARD)
      return Fail(KF_ERR_INVALID_ARGUMENT, fmt::format("op: {} is not a kf_op", int(op)));
    return Return(runtime->impl->Supported(
        args, op == KF_OP_FORWARD ? kforge::Op::kForward : kforge::Op::kBackward));
  });
}

kf_status kf_runtime_get_stats(const kf_runtime* runtime, kf_runtime_stats* stats) {
  return Guard([&] {
    if (runtime == nullptr) return Fail(KF_ERR_INVALID_ARGUMENT, "runtime: null");
    if (stats == nullptr) return Fail(KF_ERR_INVALID_ARGUMENT, "stats: null");
    if (stats->struct_size < sizeof(kf_runtime_stats))
      return Fail(KF_ERR_INVALID_ARGUMENT,
                  fmt::format("stats.struct_size: {} is smaller than this library's "
                              "kf_runtime_stats ({} bytes)",
                              stats->struct_size, sizeof(kf_runtime_stats)));
    runtime->impl->Stats(stats);
    return Return(absl::OkStatus());
  });
}

const char* kf_last_error(void) { return last_error.c_str(); }

const char* kf_status_name(kf_status s) {
  switch (s) {
    case KF_OK: return "KF_OK";
    case KF_ERR_INVALID_ARGUMENT: return "KF_ERR_INVALID_ARGUMENT";
    case KF_ERR_UNSUPPORTED: return "KF_ERR_UNSUPPORTED";
    case KF_ERR_NEEDS_HOST_OFFSETS: return "KF_ERR_NEEDS_HOST_OFFSETS";
    case KF_ERR_NO_DEVICE: return "KF_ERR_NO_DEVICE";
    case KF_ERR_CUDA: return "KF_ERR_CUDA";
    case KF_ERR_SERVER: return "KF_ERR_SERVER";
    case KF_ERR_PACK: return "KF_ERR_PACK";
    case KF_ERR_COMPILE: return "KF_ERR_COMPILE";
    case KF_ERR_INTERNAL: return "KF_ERR_INTERNAL";
  }
  return "KF_ERR_UNKNOWN";
}

int kf_runtime_abi_version(void) { return KF_RUNTIME_ABI_VERSION; }

}  // extern "C"
