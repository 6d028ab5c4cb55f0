"""kforge: tuned jagged (variable-length) flash attention for PyTorch.

    out = kforge.jagged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                  max_seqlen_q, max_seqlen_k, causal=True)

runs kforge's fastest verified kernel for the shape on the current CUDA
stream, with autograd, as a torch.library custom op (torch.compile works).
Where kforge has no kernel (dtype other than bf16, a head dim no kernel
serves, another arch) it falls back to torch.nn.attention.varlen.varlen_attn;
with strict mode it raises KforgeError instead.

Kernels come from kernel packs (`kforge export`), the on-disk cache, a kforge
server, or kforge's seed kernels compiled on the spot (runtime/README.md).
Configure with configure(...) or the environment: KFORGE_SERVER,
KFORGE_TOKEN, KFORGE_PACKS (paths separated by ':'), KFORGE_CACHE_DIR
(default ~/.cache/kforge; "none" for no disk cache), KFORGE_STRICT=1,
KFORGE_RUNTIME_LIB (the library, when not bundled).
"""
import os
import threading

from kforge._lib import KforgeError, Runtime

__all__ = ["jagged_attention", "configure", "runtime", "prepare", "stats", "last_kernel",
           "KforgeError", "strict"]

_lock = threading.Lock()
_config = None
_runtime = None


def _env_config():
    cache = os.environ.get("KFORGE_CACHE_DIR")
    if cache is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        cache = os.path.join(base, "kforge")
    elif cache.lower() in ("", "none", "off"):
        cache = None
    packs = [p for p in os.environ.get("KFORGE_PACKS", "").split(os.pathsep) if p]
    return {
        "server": os.environ.get("KFORGE_SERVER") or None,
        "token": os.environ.get("KFORGE_TOKEN") or None,
        "cache_dir": cache,
        "packs": packs,
        "strict": os.environ.get("KFORGE_STRICT", "").lower() in ("1", "true", "yes", "on"),
        "arch": None,
    }


def configure(**options):
    """Sets how kernels are found; later calls use a new runtime.

    server="host:port", token=..., cache_dir=path or None, packs=[paths],
    strict=bool (raise instead of falling back; server failures are errors),
    arch="sm_90a" (resolve without a GPU), server_timeout_ms, server_retry_s,
    revalidate_s. Unset options keep their environment defaults. A pack that is
    missing or damaged raises KforgeError here.
    """
    global _config, _runtime
    with _lock:
        cfg = _env_config()
        unknown = set(options) - set(cfg) - {"server_timeout_ms", "server_retry_s", "revalidate_s"}
        if unknown:
            raise TypeError(f"configure: unknown option(s) {sorted(unknown)}")
        cfg.update(options)
        rt = Runtime(**cfg)  # raises before anything changes
        _config, _runtime = cfg, rt  # the old runtime is left alive: its launches may be in flight
    if _torch is not None:  # what is supported may have changed (packs)
        from kforge import _torch as routing
        routing._why_unsupported.cache_clear()


def runtime():
    """The process's runtime (created from the environment on first use)."""
    global _config, _runtime
    with _lock:
        if _runtime is None:
            _config = _env_config()
            _runtime = Runtime(**_config)
        return _runtime


def strict():
    runtime()
    return bool(_config and _config["strict"])


def stats():
    """What the runtime did: cache hits by source, server calls, compiles, launches."""
    return runtime().stats()


try:
    import torch as _torch  # noqa: F401
except ImportError:  # the C binding above works without it
    _torch = None

if _torch is not None:
    from kforge._torch import jagged_attention, last_kernel, prepare  # noqa: E402
else:
    def _needs_torch(*args, **kwargs):
        raise ImportError("kforge.jagged_attention needs PyTorch")

    jagged_attention = prepare = last_kernel = _needs_torch
