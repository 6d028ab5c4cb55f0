"""Training-step benchmark: forward + backward of one attention layer with
kforge.jagged_attention against torch's varlen_attn, on the public shapes'
batches (drawn as bench/anchors.py draws them), same inputs, same process.

Two steps per shape and method, timed with triton's do_bench (median, grads
reset between runs):
  attention  q, k, v -> attention -> backward (the op alone)
  layer      x -> QKV projection -> attention -> output projection -> backward
             (d_model = heads * head_dim, bf16 weights)
kforge gets the offsets on the CPU (no synchronisation); varlen_attn on the
GPU. Before timing, kforge's outputs and gradients are compared with
varlen_attn's (relative L2) as a sanity check.

  python3 train_step.py [--shapes hstu_prod_causal,gdpa_dense] [--out DIR]
Writes DIR/train.json and DIR/train.md (the table).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch
from triton.testing import do_bench

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))
import kforge  # noqa: E402
from kforge.lengths import draw_shape_lengths  # noqa: E402
from torch.nn.attention.varlen import varlen_attn  # noqa: E402


def offsets(L):
    o = torch.zeros(len(L) + 1, dtype=torch.int32)
    o[1:] = torch.cumsum(L, 0)
    return o


def pairs(Lq, Lk, causal):
    if not causal:
        return float((Lq.double() * Lk.double()).sum())
    return sum(float(torch.clamp(torch.arange(a) + 1 + (b - a), 0, b).double().sum())
               for a, b in zip(Lq.tolist(), Lk.tolist()))


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="hstu_prod_causal,gdpa_dense")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/kforge-train"))
    ap.add_argument("--rep", type=int, default=200, help="do_bench rep (ms)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    names = args.shapes.split(",")
    shapes = [s for s in json.load(open(os.path.join(REPO, "bench", "shapes.json"))) if s["name"] in names]
    print("torch", torch.__version__, torch.cuda.get_device_name(), flush=True)
    rows = []
    for s in shapes:
        B, H, D, causal = s["B"], s["H"], s["D"], s["causal"]
        lq, lk = draw_shape_lengths(s)
        Lq = torch.tensor(lq, dtype=torch.long)
        Lk = Lq.clone() if lk is None else torch.tensor(lk, dtype=torch.long)
        cross = s["kv"] != "same"
        cu_q_cpu, cu_k_cpu = offsets(Lq), offsets(Lk)
        cu_q, cu_k = cu_q_cpu.cuda(), cu_k_cpu.cuda()
        Tq, Tk = int(cu_q_cpu[-1]), int(cu_k_cpu[-1])
        mq, mk = int(Lq.max()), int(Lk.max())
        flops = 4.0 * pairs(Lq, Lk, causal) * D * H
        torch.manual_seed(0)
        q = torch.randn(Tq, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(Tk, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(Tk, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        go = torch.randn(Tq, H, D, device="cuda", dtype=torch.bfloat16)
        kw = {"window_size": (-1, 0)} if causal else {}

        def ours(q, k, v):
            return kforge.jagged_attention(q, k, v, cu_q_cpu, cu_k_cpu if cross else cu_q_cpu, mq, mk,
                                           causal=causal)

        def theirs(q, k, v):
            return varlen_attn(q, k, v, cu_q, cu_k, mq, mk, **kw)

        # Sanity: the same answers (both are bf16 kernels; a few 1e-3 apart).
        outs = {}
        for name, fn in (("kforge", ours), ("varlen_attn", theirs)):
            q.grad = k.grad = v.grad = None
            t0 = time.time()
            o = fn(q, k, v)
            o.backward(go)
            torch.cuda.synchronize()
            outs[name] = (o.detach(), q.grad.clone(), k.grad.clone(), v.grad.clone(), time.time() - t0)
        agree = {n: rel(a, b) for n, a, b in zip(("O", "dQ", "dK", "dV"), outs["kforge"], outs["varlen_attn"])}
        print(s["name"], "kforge vs varlen_attn rel L2:", {k_: f"{v_:.2e}" for k_, v_ in agree.items()},
              f"first kforge call {outs['kforge'][4]:.2f} s (fetch/compile)", flush=True)

        # The layer: QKV and output projections around the attention.
        dm = H * D
        x = torch.randn(Tq, dm, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w_qkv = (torch.randn(dm, 3 * dm, device="cuda", dtype=torch.bfloat16) / math.sqrt(dm)).requires_grad_()
        w_o = (torch.randn(dm, dm, device="cuda", dtype=torch.bfloat16) / math.sqrt(dm)).requires_grad_()
        gx = torch.randn(Tq, dm, device="cuda", dtype=torch.bfloat16)

        def layer(attn):
            def step():
                qkv = (x @ w_qkv).view(Tq, 3, H, D)
                qq, kk, vv = qkv.unbind(1)
                if cross:  # keys from x's first Tk rows: the same work as the attention step
                    kk, vv = kk[:Tk].contiguous(), vv[:Tk].contiguous()
                o = attn(qq.contiguous(), kk.contiguous(), vv.contiguous())
                (o.reshape(Tq, dm) @ w_o).backward(gx)
            return step

        row = {"shape": s["name"], "B": B, "H": H, "D": D, "causal": causal, "Tq": Tq, "Tk": Tk,
               "gflop_fwd": flops / 1e9, "agree": agree}
        for name, fn in (("kforge", ours), ("varlen_attn", theirs)):
            fwd = lambda: fn(q, k, v)
            def fb():
                fn(q, k, v).backward(go)
            t_f = do_bench(fwd, warmup=25, rep=args.rep, return_mode="median")
            t_fb = do_bench(fb, warmup=25, rep=args.rep, return_mode="median", grad_to_none=[q, k, v])
            if cross:
                t_layer = float("nan")  # the projections' shapes differ: attention step only
            else:
                t_layer = do_bench(layer(fn), warmup=10, rep=args.rep, return_mode="median",
                                   grad_to_none=[x, w_qkv, w_o])
            row[name] = {"fwd_ms": t_f, "bwd_ms": t_fb - t_f, "step_ms": t_fb, "layer_ms": t_layer,
                         "fwd_tflops": flops / t_f / 1e9, "bwd_tflops": 2.5 * flops / (t_fb - t_f) / 1e9}
            print(s["name"], name, json.dumps(row[name]), flush=True)
        rows.append(row)
        del q, k, v, go, x, w_qkv, w_o, gx, outs
        torch.cuda.empty_cache()

    stats = kforge.stats()
    lines = ["| shape | method | fwd ms | bwd ms | attention step ms | layer step ms | step vs varlen_attn |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        base = r["varlen_attn"]["step_ms"]
        for m in ("kforge", "varlen_attn"):
            x = r[m]
            layer = "-" if math.isnan(x["layer_ms"]) else f"{x['layer_ms']:.3f}"
            lines.append(f"| {r['shape']} | {m} | {x['fwd_ms']:.3f} ({x['fwd_tflops']:.0f} TF/s) | "
                         f"{x['bwd_ms']:.3f} ({x['bwd_tflops']:.0f} TF/s) | {x['step_ms']:.3f} | {layer} | "
                         f"{base / x['step_ms']:.2f}x |")
    table = "\n".join(lines)
    print("\n" + table)
    print("kforge runtime:", stats)
    json.dump({"rows": rows, "kforge_stats": stats, "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name()}, open(os.path.join(args.out, "train.json"), "w"), indent=1)
    open(os.path.join(args.out, "train.md"), "w").write(table + "\n")


if __name__ == "__main__":
    main()
