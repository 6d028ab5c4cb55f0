# Anchor benchmark: what a PyTorch user would pick instead for jagged attention on this GPU.
# Times forward and backward of each available method on the same jagged batches (bf16).
# kforge: FWD_ONLY=1 skips backward; ANCHORS_OUT=file appends one JSON line per shape.
import inspect, json, os, sys, time
import torch
import torch.nn.functional as F
from triton.testing import do_bench

# The one length rule (core/lengths.h), shared with kforge's benchmark and `kforge tune`.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kforge.lengths import draw_shape_lengths  # noqa: E402

dev = "cuda"
print("torch", torch.__version__, torch.cuda.get_device_name(), flush=True)

def offsets(L):
    o = torch.zeros(len(L) + 1, dtype=torch.int32); o[1:] = torch.cumsum(L, 0); return o

try:
    from torch.nn.attention.varlen import varlen_attn
    print("varlen_attn", inspect.signature(varlen_attn))
except Exception as e:
    varlen_attn = None; print("no varlen_attn:", repr(e)[:200])
from torch.nn.attention.flex_attention import flex_attention, create_block_mask
flex_c = torch.compile(flex_attention, dynamic=False)

only = os.environ.get("ONLY")
rows = []
for s in json.load(open(os.environ.get("SHAPES", "shapes.json"))):
    if only and s["name"] not in only.split(","): continue
    B, H, D, causal = s["B"], s["H"], s["D"], s["causal"]
    KVH = s.get("KVH", H)  # kforge: key/value heads (grouped-query attention)
    lq, lk = draw_shape_lengths(s)
    Lq = torch.tensor(lq, dtype=torch.long)
    Lk = Lq.clone() if lk is None else torch.tensor(lk, dtype=torch.long)
    oq, ok = offsets(Lq).to(dev), offsets(Lk).to(dev)
    Tq, Tk = int(oq[-1]), int(ok[-1])
    q = torch.randn(Tq, H, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(Tk, KVH, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(Tk, KVH, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    if causal:  # bottom-right aligned: query i of a sequence sees keys j <= i + (Lk - Lq)
        pairs = sum(float(torch.clamp(torch.arange(a) + 1 + (b - a), 0, b).double().sum())
                    for a, b in zip(Lq.tolist(), Lk.tolist()))
    else:
        pairs = float((Lq.double() * Lk.double()).sum())
    fwd_flops = 4.0 * pairs * D * H
    res = {"shape": s["name"], "KVH": KVH, "Tq": Tq, "Tk": Tk, "maxq": int(Lq.max()), "maxk": int(Lk.max()), "fwd_gflop": fwd_flops / 1e9}
    def bench(label, fwd):
        try:
            t0 = time.time(); out = fwd(); go = torch.randn_like(out)
            t_f = do_bench(fwd, warmup=25, rep=200, return_mode="median")
            if os.environ.get("FWD_ONLY"):  # kforge's run.sh times forward only
                res[label] = {"fwd_ms": t_f, "fwd_tflops": fwd_flops / t_f / 1e9}
                return
            def fb():
                fwd().backward(go)
            t_fb = do_bench(fb, warmup=25, rep=200, return_mode="median", grad_to_none=[q, k, v])
            res[label] = {"fwd_ms": t_f, "fwd_tflops": fwd_flops / t_f / 1e9,
                          "bwd_ms": t_fb - t_f, "bwd_tflops": 2.5 * fwd_flops / max(t_fb - t_f, 1e-9) / 1e9}
        except Exception as e:
            res[label] = {"error": repr(e)[:300]}
    if varlen_attn is not None:
        kw = {"window_size": (-1, 0)} if causal else {}
        bench("varlen_attn_fa2", lambda: varlen_attn(q, k, v, oq, ok, int(Lq.max()), int(Lk.max()), **kw))
    if True:
        dq = torch.repeat_interleave(torch.arange(B, device=dev), Lq.to(dev))
        dk = torch.repeat_interleave(torch.arange(B, device=dev), Lk.to(dev))
        sq = oq[:-1].long()[dq]; sk = ok[:-1].long()[dk]
        shift = (Lk - Lq).to(dev)[dq]  # bottom-right causal alignment, as in FlashAttention
        def mask_mod(b, h, qi, ki):
            m = dq[qi] == dk[ki]
            return (m & (qi - sq[qi] + shift[qi] >= ki - sk[ki])) if causal else m
        t0 = time.time()
        try:
            bm = create_block_mask(mask_mod, 1, 1, Tq, Tk, device=dev, _compile=True)
            torch.cuda.synchronize(); res["flex_mask_build_s"] = time.time() - t0
        except Exception as e:
            bm = None; res["flex_docmask"] = {"error": "block mask: " + repr(e)[:200]}
        if bm is not None: bench("flex_docmask", lambda: flex_c(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
                                             v.transpose(0, 1).unsqueeze(0), block_mask=bm,
                                             **({"enable_gqa": True} if KVH != H else {})).squeeze(0).transpose(0, 1))
    rows.append(res)
    print(json.dumps(res), flush=True)
    if os.environ.get("ANCHORS_OUT"):
        with open(os.environ["ANCHORS_OUT"], "a") as f: f.write(json.dumps(res) + "\n")
    del q, k, v; torch.cuda.empty_cache()

print("\nshape | method | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s")
for r in rows:
    for m, v in r.items():
        if isinstance(v, dict):
            if "error" in v: print(f"{r['shape']} | {m} | ERROR {v['error'][:150]}")
            elif "bwd_ms" not in v: print(f"{r['shape']} | {m} | {v['fwd_ms']:.3f} | {v['fwd_tflops']:.0f} | - | -")
            else: print(f"{r['shape']} | {m} | {v['fwd_ms']:.3f} | {v['fwd_tflops']:.0f} | {v['bwd_ms']:.3f} | {v['bwd_tflops']:.0f}")
