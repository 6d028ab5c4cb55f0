"""The PyTorch side: custom ops (forward, backward) with autograd and fake
implementations, the public jagged_attention, and the varlen_attn fallback.

Offsets. Kernels with a persistent tile list (most tuned forward kernels,
every backward kernel) need the batch's offsets on the host. Pass
cu_seqlens on the CPU (as a data loader has them) and nothing waits: the
runtime uploads them on the stream. Given only CUDA offsets, a kernel that
needs them copies them to the host once per forward (a synchronisation,
warned about once) and the backward reuses that copy.
"""
import functools
import inspect
import math
import warnings
from typing import Optional

import torch
from torch import Tensor

import kforge
from kforge import _lib
from kforge._lib import KforgeError

_last_kernel = {}


def _warn_once(key, message, _seen=set()):
    if key not in _seen:
        _seen.add(key)
        warnings.warn(message, stacklevel=3)


def _ptr(t):
    return t.data_ptr() if t is not None else None


def _aligned(t):
    """t starting on a 16-byte boundary, as the runtime takes tensors: a view
    at another offset (a slice of a flat buffer) is copied. Called inside the
    custom ops only: torch.compile cannot trace data_ptr(), and the ops'
    bodies are opaque to it."""
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _args(q, k, v, cu_q, cu_k, cu_q_host, cu_k_host, batch, max_q, max_k, causal, scale,
          deterministic=False):
    a = _lib.new_args()
    a.device = q.device.index if q.device.index is not None else torch.cuda.current_device()
    a.stream = torch.cuda.current_stream(q.device).cuda_stream
    a.dtype = _lib.DTYPE_BF16
    a.batch = batch
    a.heads, a.head_dim = q.shape[1], q.shape[2]
    a.kv_heads = k.shape[1]
    a.total_q, a.total_k = q.shape[0], k.shape[0]
    a.max_seqlen_q, a.max_seqlen_k = max_q, max_k
    a.softmax_scale = scale
    a.causal = int(causal)
    a.deterministic = int(deterministic)  # read by the backward only
    a.cu_seqlens_q, a.cu_seqlens_k = _ptr(cu_q), _ptr(cu_k)
    a.cu_seqlens_q_host, a.cu_seqlens_k_host = _ptr(cu_q_host), _ptr(cu_k_host)
    a.q, a.k, a.v = q.data_ptr(), k.data_ptr(), v.data_ptr()
    return a


def _to_host(cu_q, cu_k):
    _warn_once("d2h", "kforge: the offsets are on the GPU, and this kernel builds its tile list "
                      "from them on the host: copying them back (a synchronisation). Pass "
                      "cu_seqlens_q/k on the CPU to avoid it.")
    host = lambda t: t.to("cpu", torch.int32).contiguous() if t is not None else None
    return host(cu_q), host(cu_k)


def _call(call, args):
    """One runtime call; when its scratch does not fit beside PyTorch's cached
    blocks, they are released and the call tried once more."""
    try:
        call(args)
    except KforgeError as e:
        if e.code != "KF_ERR_CUDA" or "OUT_OF_MEMORY" not in e.message:
            raise
        torch.cuda.empty_cache()
        call(args)


def _run(call, args, cu_q, cu_k, host_q, host_k, cross):
    """Runs `call`, first without host offsets when it has none, then with a
    host copy if the kernel needs one. Returns the host offsets used."""
    try:
        _call(call, args)
        return host_q, host_k
    except KforgeError as e:
        if e.code != "KF_ERR_NEEDS_HOST_OFFSETS" or host_q is not None:
            raise
    host_q, host_k = _to_host(cu_q, cu_k if cross else None)
    args.cu_seqlens_q_host, args.cu_seqlens_k_host = _ptr(host_q), _ptr(host_k)
    _call(call, args)
    return host_q, host_k


@torch.library.custom_op("kforge::attention_fwd", mutates_args=())
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, cu_q: Optional[Tensor], cu_k: Optional[Tensor],
                  cu_q_host: Optional[Tensor], cu_k_host: Optional[Tensor], batch: int, max_q: int,
                  max_k: int, causal: bool, scale: float, want_host: bool, deterministic: bool
                  ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """out, lse (heads, total_q) fp32, and the host offsets used (for the backward).
    `deterministic` is for the backward (kept by autograd): the forward always is."""
    cross = cu_k is not None or cu_k_host is not None
    q, k, v = _aligned(q), _aligned(k), _aligned(v)
    out = torch.empty_like(q)
    lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
    host_q, host_k = cu_q_host, cu_k_host
    if want_host and host_q is None:  # the backward will need them: copy once, here
        host_q, host_k = _to_host(cu_q, cu_k)
    a = _args(q, k, v, cu_q, cu_k, host_q, host_k, batch, max_q, max_k, causal, scale)
    a.o, a.lse = out.data_ptr(), lse.data_ptr()
    with torch.cuda.device(q.device):
        host_q, host_k = _run(kforge.runtime().forward, a, cu_q, cu_k, host_q, host_k, cross)
    keep = lambda h: h.clone() if h is not None else torch.empty(batch + 1, dtype=torch.int32)
    return out, lse, keep(host_q), keep(host_k if cross else host_q)


@attention_fwd.register_fake
def _(q, k, v, cu_q, cu_k, cu_q_host, cu_k_host, batch, max_q, max_k, causal, scale, want_host,
      deterministic):
    return (torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32),
            torch.empty(batch + 1, dtype=torch.int32, device="cpu"),
            torch.empty(batch + 1, dtype=torch.int32, device="cpu"))


@torch.library.custom_op("kforge::attention_bwd", mutates_args=())
def attention_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                  cu_q: Optional[Tensor], cu_k: Optional[Tensor], cu_q_host: Optional[Tensor],
                  cu_k_host: Optional[Tensor], batch: int, max_q: int, max_k: int, causal: bool,
                  scale: float, deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    cross = cu_k is not None or cu_k_host is not None
    dout, q, k, v = _aligned(dout), _aligned(q), _aligned(k), _aligned(v)
    out, lse = _aligned(out), _aligned(lse)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    a = _args(q, k, v, cu_q, cu_k, cu_q_host, cu_k_host, batch, max_q, max_k, causal, scale,
              deterministic)
    a.o, a.lse, a.dout = out.data_ptr(), lse.data_ptr(), dout.data_ptr()
    a.dq, a.dk, a.dv = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
    with torch.cuda.device(q.device):
        _run(kforge.runtime().backward, a, cu_q, cu_k, cu_q_host, cu_k_host, cross)
    return dq, dk, dv


@attention_bwd.register_fake
def _(dout, q, k, v, out, lse, cu_q, cu_k, cu_q_host, cu_k_host, batch, max_q, max_k, causal, scale,
      deterministic):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, cu_q_host, cu_k_host, batch, max_q, max_k, causal, scale, want_host,
     deterministic) = inputs
    out, lse, host_q, host_k = output
    ctx.cross = cu_k is not None or cu_k_host is not None
    ctx.has_host = cu_q_host is not None or want_host
    ctx.meta = (batch, max_q, max_k, causal, scale, deterministic)
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, host_q, host_k)


def _backward(ctx, dout, dlse, dhost_q, dhost_k):
    q, k, v, out, lse, cu_q, cu_k, host_q, host_k = ctx.saved_tensors
    if not ctx.has_host:
        host_q = host_k = None
    elif not ctx.cross:
        host_k = None
    dq, dk, dv = torch.ops.kforge.attention_bwd(dout.contiguous(), q, k, v, out, lse, cu_q,
                                                cu_k if ctx.cross else None, host_q, host_k,
                                                *ctx.meta)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None, None


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


@torch.compiler.assume_constant_result
def _route(device: int, dtype: str, head_dim: int, heads: int, kv_heads: int, causal: bool,
           cross: bool, backward: bool, deterministic: bool = False) -> str:
    """'' to run kforge's kernels (forward, and backward when gradients are
    needed), else why not (the varlen_attn fallback is used and, once, warned
    about); raises in strict mode, and when a deterministic backward was asked
    for (varlen_attn promises none). A constant under torch.compile: it runs
    once, at trace time, outside the graph."""
    why = _why_unsupported(device, dtype, head_dim, heads, kv_heads, causal, cross, backward,
                           deterministic)
    if why and (kforge.strict() or (backward and deterministic)):
        raise KforgeError("KF_ERR_UNSUPPORTED", why)
    if why:
        _warn_once(("fallback", why), f"kforge: {why}; using torch's varlen_attn")
    return why


@functools.lru_cache(maxsize=None)
def _why_unsupported(device, dtype, head_dim, heads, kv_heads, causal, cross, backward,
                     deterministic=False):
    if dtype != "torch.bfloat16":
        return f"dtype {dtype} (kforge kernels are bf16)"
    a = _lib.new_args()
    a.device, a.heads, a.kv_heads, a.head_dim, a.causal = device, heads, kv_heads, head_dim, int(causal)
    a.deterministic = int(deterministic)  # read for the backward only
    if cross:  # a key offsets array of its own: only its address is compared
        a.cu_seqlens_k_host = 1
    for op in [_lib.OP_FORWARD] + ([_lib.OP_BACKWARD] if backward else []):
        status = _lib.lib().kf_attention_supported(kforge.runtime().handle, a, op)
        if status != _lib.OK:
            return _lib.lib().kf_last_error().decode("utf-8", "replace")
    return ""


def _varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale):
    """torch.nn.attention.varlen.varlen_attn with kforge's arguments, across its versions."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as e:
        raise KforgeError("KF_ERR_UNSUPPORTED", f"no kforge kernel and no varlen_attn fallback ({e})")
    params = inspect.signature(varlen_attn).parameters
    cu_q = cu_q.to(q.device, torch.int32, non_blocking=True)
    cu_k = cu_k.to(q.device, torch.int32, non_blocking=True)
    kw = {}
    if causal:  # bottom-right aligned in both
        if "window_size" in params:
            kw["window_size"] = (-1, 0)
        else:
            kw["is_causal"] = True
    if scale != 1.0 / math.sqrt(q.shape[-1]):
        if "scale" in params:
            kw["scale"] = scale
        else:
            q = q * (scale * math.sqrt(q.shape[-1]))
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in params:
            kw["enable_gqa"] = True
        else:
            g = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **kw)


def _split(cu):
    """(device offsets, host offsets) of a cu_seqlens tensor, int32."""
    if cu.is_cuda:
        return (cu if cu.dtype == torch.int32 else cu.to(torch.int32)), None
    return None, cu.to(torch.int32).contiguous()


def jagged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     causal=False, softmax_scale=None, deterministic=False):
    """Attention over a packed jagged batch, with autograd, on the current stream.

    q: (total_q, heads, head_dim); k, v: (total_k, kv_heads, head_dim), bf16, CUDA.
    cu_seqlens_q/k: (batch + 1,) int32 prefix sums; pass the same tensor twice for
    self-attention, and keep them on the CPU to avoid any synchronisation.
    max_seqlen_q/k: the longest sequences (ints). causal masks are bottom-right
    aligned; softmax_scale defaults to 1/sqrt(head_dim). deterministic=True asks
    for a bitwise reproducible backward (the same gradients in every run on the
    same inputs; today at head dims 64 and 128, and raises where there is none
    rather than fall back); the forward always is. Returns (total_q, heads, head_dim).
    """
    heads, head_dim, kv_heads = q.shape[1], q.shape[2], k.shape[1]
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    cross = not (cu_seqlens_k is None or cu_seqlens_k is cu_seqlens_q)
    if cu_seqlens_k is None:
        cu_seqlens_k = cu_seqlens_q
    if not q.is_cuda:
        raise KforgeError("KF_ERR_INVALID_ARGUMENT", f"q is on {q.device}; kforge runs on CUDA devices")
    need_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    device = q.device.index if q.device.index is not None else torch.cuda.current_device()
    if _route(device, str(q.dtype), int(head_dim), int(heads), int(kv_heads), bool(causal), cross,
              need_grad, bool(deterministic)):
        return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale)
    dev_q, host_q = _split(cu_seqlens_q)
    dev_k, host_k = _split(cu_seqlens_k) if cross else (None, None)
    out, _, _, _ = torch.ops.kforge.attention_fwd(
        q.contiguous(), k.contiguous(), v.contiguous(), dev_q, dev_k, host_q, host_k,
        cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k, bool(causal), scale, need_grad,
        bool(deterministic))
    return out


def prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
            backward=False, deterministic=False):
    """Fetches (or compiles) and loads the kernel a call with these arguments
    would run, without running it; returns its description. Warms the caches
    before a training loop."""
    cross = not (cu_seqlens_k is None or cu_seqlens_k is cu_seqlens_q)
    cu_k = cu_seqlens_k if cross else cu_seqlens_q
    dev_q, host_q = _split(cu_seqlens_q)
    dev_k, host_k = _split(cu_k) if cross else (None, None)
    if host_q is None:
        host_q, host_k = _to_host(dev_q, dev_k)
    a = _args(q, k, v, dev_q, dev_k, host_q, host_k, int(cu_seqlens_q.shape[0]) - 1,
              int(max_seqlen_q), int(max_seqlen_k), causal, 1.0 / math.sqrt(q.shape[2]),
              deterministic)
    with torch.cuda.device(q.device):
        info = kforge.runtime().prepare(a, _lib.OP_BACKWARD if backward else _lib.OP_FORWARD)
    _last_kernel["backward" if backward else "forward"] = info
    return info


def last_kernel():
    """The kernels the last prepare() calls described ({"forward": {...}})."""
    return dict(_last_kernel)
