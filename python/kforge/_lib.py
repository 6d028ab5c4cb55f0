"""ctypes binding of libkforge_runtime.so (runtime/include/kforge/runtime.h).

No torch here: the C ABI is the whole interface, so this module loads on any
Python 3 (the library is not a Python extension and has no Python ABI).

The library is looked for, in order, at $KFORGE_RUNTIME_LIB, inside this
package (kforge/lib/, where `pip install` bundles it), then on the system's
library path. Its dependencies (gRPC, protobuf, NVRTC) must be loadable; a
missing libnvrtc is looked for in CUDA_HOME and in PyTorch's nvidia wheels.
"""
import ctypes
import ctypes.util
import glob
import os
import sys
import threading

ABI_VERSION = 1

# kf_status
OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_UNSUPPORTED = 2
ERR_NEEDS_HOST_OFFSETS = 3
ERR_NO_DEVICE = 4
ERR_CUDA = 5
ERR_SERVER = 6
ERR_PACK = 7
ERR_COMPILE = 8
ERR_INTERNAL = 9

POLICY_FALLBACK = 0
POLICY_STRICT = 1
DTYPE_BF16, DTYPE_FP16, DTYPE_FP32 = 1, 2, 3
OP_FORWARD, OP_BACKWARD = 1, 2


class KforgeError(RuntimeError):
    """A failed kforge call: `code` is the kf_status name ("KF_ERR_UNSUPPORTED", ...)."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class RuntimeOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("server", ctypes.c_char_p),
        ("token", ctypes.c_char_p),
        ("cache_dir", ctypes.c_char_p),
        ("packs", ctypes.POINTER(ctypes.c_char_p)),
        ("num_packs", ctypes.c_size_t),
        ("policy", ctypes.c_int),
        ("arch", ctypes.c_char_p),
        ("server_timeout_ms", ctypes.c_int),
        ("server_retry_s", ctypes.c_int),
        ("revalidate_s", ctypes.c_int),
    ]


class AttentionArgs(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("device", ctypes.c_int),
        ("stream", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("batch", ctypes.c_int),
        ("heads", ctypes.c_int),
        ("kv_heads", ctypes.c_int),
        ("head_dim", ctypes.c_int),
        ("total_q", ctypes.c_int64),
        ("total_k", ctypes.c_int64),
        ("max_seqlen_q", ctypes.c_int),
        ("max_seqlen_k", ctypes.c_int),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int),
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("cu_seqlens_q_host", ctypes.c_void_p),
        ("cu_seqlens_k_host", ctypes.c_void_p),
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("dout", ctypes.c_void_p),
        ("dq", ctypes.c_void_p),
        ("dk", ctypes.c_void_p),
        ("dv", ctypes.c_void_p),
        ("deterministic", ctypes.c_int),  # backward only (kf_attention_args)
    ]


class KernelInfo(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("variant_id", ctypes.c_char * 64),
        ("bucket", ctypes.c_char * 192),
        ("kernel_bucket", ctypes.c_char * 192),
        ("source", ctypes.c_char * 16),
        ("arch", ctypes.c_char * 16),
        ("entry_point", ctypes.c_char * 64),
        ("tuned", ctypes.c_int),
        ("persistent", ctypes.c_int),
        ("cubin_bytes", ctypes.c_int),
    ]

    def as_dict(self):
        text = lambda b: b.decode("utf-8", "replace")
        return {
            "variant_id": text(self.variant_id), "bucket": text(self.bucket),
            "kernel_bucket": text(self.kernel_bucket), "source": text(self.source),
            "arch": text(self.arch), "entry_point": text(self.entry_point),
            "tuned": bool(self.tuned), "persistent": bool(self.persistent),
            "cubin_bytes": self.cubin_bytes,
        }


_STATS_FIELDS = ("calls", "memory_hits", "pack_hits", "disk_hits", "server_requests",
                 "server_not_modified", "server_kernels", "server_errors", "seed_compiles",
                 "seed_disk_hits", "module_loads", "plans_built", "plan_hits", "launches")


class RuntimeStats(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32)] + [(f, ctypes.c_uint64) for f in _STATS_FIELDS]


def _preload_nvrtc():
    """Makes libnvrtc.so.13 loadable when it is not on the library path."""
    try:
        ctypes.CDLL("libnvrtc.so.13", mode=ctypes.RTLD_GLOBAL)
        return
    except OSError:
        pass
    candidates = []
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    candidates += glob.glob(os.path.join(cuda, "lib64", "libnvrtc.so.13*"))
    for base in sys.path:
        candidates += glob.glob(os.path.join(base, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.13*"))
        candidates += glob.glob(os.path.join(base, "nvidia", "cu13", "lib", "libnvrtc.so.13*"))
    for c in candidates:
        try:
            ctypes.CDLL(c, mode=ctypes.RTLD_GLOBAL)
            return
        except OSError:
            continue


def library_path():
    """Where the runtime library will be loaded from (None: the system's search)."""
    env = os.environ.get("KFORGE_RUNTIME_LIB")
    if env:
        return env
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")
    for name in ("libkforge_runtime.so", "libkforge_runtime.so.1"):
        if os.path.exists(os.path.join(here, name)):
            return os.path.join(here, name)
    return None


_lib = None
_lib_lock = threading.Lock()


def lib():
    """The loaded library, with its function signatures declared."""
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        path = library_path()
        _preload_nvrtc()
        try:
            l = ctypes.CDLL(path or ctypes.util.find_library("kforge_runtime") or "libkforge_runtime.so.1")
        except OSError as e:
            raise ImportError(
                f"kforge: cannot load libkforge_runtime.so ({e}). Set KFORGE_RUNTIME_LIB to the library "
                "(build/runtime/libkforge_runtime.so, or a bundle's lib/), or reinstall with "
                "`pip install ./python` after building it; its dependencies (gRPC, protobuf, NVRTC) must "
                "be on LD_LIBRARY_PATH") from e
        l.kf_runtime_abi_version.restype = ctypes.c_int
        if l.kf_runtime_abi_version() != ABI_VERSION:
            raise ImportError(f"kforge: {path} has ABI version {l.kf_runtime_abi_version()}, "
                              f"this package needs {ABI_VERSION}")
        l.kf_last_error.restype = ctypes.c_char_p
        l.kf_status_name.restype = ctypes.c_char_p
        l.kf_status_name.argtypes = [ctypes.c_int]
        l.kf_runtime_options_init.argtypes = [ctypes.POINTER(RuntimeOptions)]
        l.kf_runtime_create.argtypes = [ctypes.POINTER(RuntimeOptions), ctypes.POINTER(ctypes.c_void_p)]
        l.kf_runtime_create.restype = ctypes.c_int
        l.kf_runtime_destroy.argtypes = [ctypes.c_void_p]
        l.kf_attention_args_init.argtypes = [ctypes.POINTER(AttentionArgs)]
        for f in (l.kf_attention_forward, l.kf_attention_backward):
            f.argtypes = [ctypes.c_void_p, ctypes.POINTER(AttentionArgs)]
            f.restype = ctypes.c_int
        l.kf_attention_prepare.argtypes = [ctypes.c_void_p, ctypes.POINTER(AttentionArgs), ctypes.c_int,
                                           ctypes.POINTER(KernelInfo)]
        l.kf_attention_prepare.restype = ctypes.c_int
        l.kf_attention_supported.argtypes = [ctypes.c_void_p, ctypes.POINTER(AttentionArgs), ctypes.c_int]
        l.kf_attention_supported.restype = ctypes.c_int
        l.kf_runtime_get_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(RuntimeStats)]
        l.kf_runtime_get_stats.restype = ctypes.c_int
        _lib = l
        return l


def check(status):
    """Raises KforgeError for a failed call, with this thread's last error."""
    if status != OK:
        l = lib()
        raise KforgeError(l.kf_status_name(status).decode(), l.kf_last_error().decode("utf-8", "replace"))


class Runtime:
    """One kf_runtime: thread-safe, shared by every call of the process."""

    def __init__(self, server=None, token=None, cache_dir=None, packs=(), strict=False, arch=None,
                 server_timeout_ms=10000, server_retry_s=30, revalidate_s=600):
        l = lib()
        o = RuntimeOptions()
        l.kf_runtime_options_init(ctypes.byref(o))
        enc = lambda s: s.encode() if s else None
        self._keep = [enc(server), enc(token), enc(cache_dir), enc(arch)]
        o.server, o.token, o.cache_dir, o.arch = self._keep
        packs = [p.encode() for p in packs]
        self._packs = (ctypes.c_char_p * max(1, len(packs)))(*packs)
        o.packs = self._packs
        o.num_packs = len(packs)
        o.policy = POLICY_STRICT if strict else POLICY_FALLBACK
        o.server_timeout_ms, o.server_retry_s, o.revalidate_s = server_timeout_ms, server_retry_s, revalidate_s
        handle = ctypes.c_void_p()
        check(l.kf_runtime_create(ctypes.byref(o), ctypes.byref(handle)))
        self.handle = handle
        self.strict = strict

    def forward(self, args):
        check(lib().kf_attention_forward(self.handle, ctypes.byref(args)))

    def backward(self, args):
        check(lib().kf_attention_backward(self.handle, ctypes.byref(args)))

    def prepare(self, args, op=OP_FORWARD):
        info = KernelInfo()
        info.struct_size = ctypes.sizeof(KernelInfo)
        check(lib().kf_attention_prepare(self.handle, ctypes.byref(args), op, ctypes.byref(info)))
        return info.as_dict()

    def stats(self):
        s = RuntimeStats()
        s.struct_size = ctypes.sizeof(RuntimeStats)
        check(lib().kf_runtime_get_stats(self.handle, ctypes.byref(s)))
        return {f: getattr(s, f) for f in _STATS_FIELDS}

    # Deliberately no __del__: launches may still be in flight on a stream,
    # and at interpreter exit the CUDA driver may already be gone.


def new_args():
    a = AttentionArgs()
    lib().kf_attention_args_init(ctypes.byref(a))
    return a
