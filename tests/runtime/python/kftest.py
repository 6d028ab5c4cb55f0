"""Shared by the GPU tests of the Python package: the skip rule, jagged
batches (the public shapes drawn by kforge.lengths, as bench/anchors.py draws them), the float32
reference, and the tolerance policy of worker/eval/TOLERANCE.md."""
import json
import math
import os
import sys
import unittest

SKIP = 77  # exit status the gtest wrapper reports as skipped


def need_gpu():
    """Imports torch and kforge, or exits SKIP saying why."""
    try:
        import torch
    except ImportError as e:
        print(f"SKIP: no PyTorch ({e})")
        sys.exit(SKIP)
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        sys.exit(SKIP)
    import kforge  # noqa: F401
    return torch


def repo():
    return os.environ.get("KFORGE_REPO") or os.path.abspath(os.path.join(os.path.dirname(__file__), "../../.."))


def public_shapes(names=None):
    """(name, lengths_q, lengths_k or None, heads, head_dim, causal) of bench/shapes.json,
    drawn by the one length rule (kforge.lengths, as bench/anchors.py draws them)."""
    from kforge.lengths import draw_shape_lengths
    out = []
    for s in json.load(open(os.path.join(repo(), "bench", "shapes.json"))):
        if names and s["name"] not in names:
            continue
        lq, lk = draw_shape_lengths(s)
        out.append((s["name"], lq, lk, s["H"], s["D"], s["causal"]))
    return out


def offsets(lengths):
    import torch
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    return cu


def reference(q, k, v, dout, lq, lk, causal, scale):
    """Float32 attention per sequence: o, lse (heads, total_q), dq, dk, dv.
    Each sequence's backward runs at once, so memory stays one sequence's."""
    import torch
    H, G = q.shape[1], q.shape[1] // k.shape[1]
    o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.full((H, q.shape[0]), -math.inf, dtype=torch.float32, device=q.device)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=q.device)
    dv = torch.zeros(k.shape, dtype=torch.float32, device=q.device)
    q0 = k0 = 0
    for a, b in zip(lq, lk):
        if a > 0 and b > 0:
            qs = q[q0:q0 + a].float().transpose(0, 1).requires_grad_()
            ks = k[k0:k0 + b].float().transpose(0, 1).requires_grad_()
            vs = v[k0:k0 + b].float().transpose(0, 1).requires_grad_()
            kk, vv = ks.repeat_interleave(G, 0), vs.repeat_interleave(G, 0)
            s = (qs @ kk.transpose(1, 2)) * scale
            if causal:  # bottom-right: query i sees keys j <= i + (b - a)
                i = torch.arange(a, device=q.device)[:, None]
                j = torch.arange(b, device=q.device)[None, :]
                s = s.masked_fill(j > i + (b - a), -math.inf)
            m = torch.logsumexp(s.detach(), dim=-1)  # (H, a); -inf where a row sees no key
            # Rows that see no key: softmax of a finite stand-in, then zero
            # (a softmax over -inf alone has NaN gradients).
            none = torch.isinf(m)[..., None]
            p = torch.softmax(s.masked_fill(none, 0.0), dim=-1).masked_fill(none, 0.0)
            os_ = p @ vv
            os_.backward(dout[q0:q0 + a].float().transpose(0, 1))
            o[q0:q0 + a] = os_.detach().transpose(0, 1)
            lse[:, q0:q0 + a] = m.detach()
            dq[q0:q0 + a] = qs.grad.transpose(0, 1)
            dk[k0:k0 + b] = ks.grad.transpose(0, 1)
            dv[k0:k0 + b] = vs.grad.transpose(0, 1)
        q0 += a
        k0 += b
    return o, lse, dq, dk, dv


def judge_bf16(name, got, ref):
    """'' when `got` passes the bf16 rule, else why not."""
    import torch
    g = got.float()
    if not torch.isfinite(g).all():
        return f"{name}: {int((~torch.isfinite(g)).sum())} elements not finite"
    if ref.numel() == 0:
        return ""
    err = (g - ref).double()
    # A gradient that is zero in exact arithmetic (one query that sees one
    # key: P = 1, so dS = 0) has a reference of rounding noise; relative to
    # that, bf16's own rounding is huge. Below an rms of 1e-3 (under bf16's
    # resolution at the unit scale of the inputs) the norm is floored, and the
    # max_abs bound still catches a wrong value.
    floor = 1e-3 * math.sqrt(ref.numel())
    rel = (err.norm() / ref.double().norm().clamp_min(floor)).item()
    max_abs = err.abs().max().item()
    bound = 2e-2 * max(1.0, ref.abs().max().item())
    if rel > 1e-2 or max_abs > bound:
        return f"{name}: rel_l2 {rel:.3g} (<= 1e-2), max_abs {max_abs:.3g} (<= {bound:.3g})"
    return ""


def judge_lse(got, ref):
    import torch
    no_key = torch.isinf(ref)
    if not (torch.isinf(got[no_key]) & (got[no_key] < 0)).all():
        return "lse: a row that sees no key is not -inf"
    if (~no_key).any():
        d = (got[~no_key] - ref[~no_key]).abs().max().item()
        if not d <= 1e-3:
            return f"lse: max |got - ref| {d:.3g} > 1e-3"
    return ""


def main():
    unittest.main(argv=[sys.argv[0], "-v"] + sys.argv[1:])
