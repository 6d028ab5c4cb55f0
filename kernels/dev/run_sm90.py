# sm90 dev harness (runs on the GPU machine): NVRTC-compiles fwd_sm90 (parts + fwd_sm90.cuh, sm90_source.py) for several knob
# sets, checks correctness on random jagged batches against torch float32 attention, and times
# the benchmark shapes. Env: SHAPES_ONLY=a,b  CONFIGS="HEAD_DIM=128,BLOCK_N=128;..."  SKIP_CHECK=1
import ctypes, json, math, os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch
from kforge.lengths import draw_shape_lengths  # the one length rule (core/lengths.h)
from nvrtc_check import compile_src
dev = "cuda"
torch.cuda.init(); torch.zeros(1, device=dev); torch.cuda.synchronize()
cu = ctypes.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0:
        s = ctypes.c_char_p(); cu.cuGetErrorString(r, ctypes.byref(s))
        raise RuntimeError(f"{what}: {r} {s.value}")

class P(ctypes.Structure):
    _fields_ = [("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("o", ctypes.c_void_p),
                ("lse", ctypes.c_void_p), ("cu_q", ctypes.c_void_p), ("cu_k", ctypes.c_void_p),
                ("batch", ctypes.c_int), ("heads", ctypes.c_int), ("kv_heads", ctypes.c_int), ("head_dim", ctypes.c_int),
                ("max_q", ctypes.c_int), ("max_k", ctypes.c_int), ("total_q", ctypes.c_int), ("total_k", ctypes.c_int),
                ("scale", ctypes.c_float), ("scale_log2", ctypes.c_float), ("causal", ctypes.c_int),
                ("tiles", ctypes.c_void_p), ("num_tiles", ctypes.c_int), ("tile_counter", ctypes.c_void_p),
                ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_longlong),
                ("dout", ctypes.c_void_p), ("dq", ctypes.c_void_p), ("dk", ctypes.c_void_p), ("dv", ctypes.c_void_p),
                ("delta", ctypes.c_void_p), ("dq_accum", ctypes.c_void_p), ("_reserved", ctypes.c_int * 8)]

NSM = torch.cuda.get_device_properties(0).multi_processor_count
HANG_S = float(os.environ.get("HANG_S", "20"))

def sync_or_die(what):
    """Waits for the stream; a kernel still running after HANG_S seconds is a
    protocol hang: exit the process at once (the driver tears the context and
    the kernel down), so a hang costs seconds of device time, not the call."""
    ev = torch.cuda.Event(); ev.record()
    t0 = time.time()
    while not ev.query():
        if time.time() - t0 > HANG_S:
            print(f"HANG in {what}: not finished after {HANG_S}s; exiting", flush=True)
            os._exit(3)
        time.sleep(0.0005)

class Kernel:
    def __init__(self, knobs):
        self.knobs = dict(knobs)
        r, log, cubin, dt = compile_src(self.knobs)
        self.log = log
        if r != 0: raise RuntimeError("compile failed:\n" + log)
        Kernel.count = getattr(Kernel, "count", 0) + 1
        open(f"/tmp/kf_{Kernel.count}.cubin", "wb").write(cubin)
        self.mod = ctypes.c_void_p(); ck(cu.cuModuleLoadData(ctypes.byref(self.mod), cubin), "load")
        self.fn = ctypes.c_void_p(); ck(cu.cuModuleGetFunction(ctypes.byref(self.fn), self.mod, b"kf_attn_fwd"), "getfn")
        D, BN, S = knobs["HEAD_DIM"], knobs["BLOCK_N"], knobs.get("STAGES", 2)
        QB = knobs.get("Q_BUFS", 2 if os.environ.get("KF_SRC") else 1)
        self.smem = QB * 2 * 64 * D * 2 + 2 * S * BN * D * 2 + 4 * S * 8 + 2 * QB * 8 + 1024
        ck(cu.cuFuncSetAttribute(self.fn, 8, self.smem), "smem attr")
        regs = ctypes.c_int(); cu.cuFuncGetAttribute(ctypes.byref(regs), 4, self.fn)
        loc = ctypes.c_int(); cu.cuFuncGetAttribute(ctypes.byref(loc), 3, self.fn)
        self.regs, self.local = regs.value, loc.value
        self.persistent = knobs.get("PERSISTENT", 1)
        spill = [l for l in log.splitlines() if "spill" in l or "C75" in l]
        print(f"  compiled {knobs} in {dt:.2f}s regs={self.regs} local={self.local} smem={self.smem} :: {' | '.join(spill)}", flush=True)

    def prepare(self, q, k, v, cu_q, cu_k, Lq, Lk, causal, heads, kv_heads, grid_cap=None):
        D = q.shape[-1]
        BM = 128
        o = torch.empty_like(q)
        lse = torch.empty(heads, q.shape[0], device=dev, dtype=torch.float32)
        B = len(Lq)
        # host tile list, LPT (work estimate = kv blocks), longest first
        tl = []
        for b in range(B):
            lq, lk = Lq[b], Lk[b]
            for mb in range((lq + BM - 1) // BM):
                n_end = lk if not causal else min(lk, min(mb * BM + BM, lq) + lk - lq)
                w = max(n_end, 0) + 1
                for h in range(heads): tl.append((w, b, h, mb))
        if os.environ.get("ORDER", "group") == "group":
            # group tiles by (b, h): groups by total work desc, m-blocks by work desc
            gw = {}
            for (w, b, h, mb) in tl: gw[(b, h)] = gw.get((b, h), 0) + w
            tl.sort(key=lambda x: (-gw[(x[1], x[2])], x[1], x[2], -x[0]))
        else:
            tl.sort(key=lambda x: -x[0])
        tiles = torch.tensor([[b, h, mb, 0] for (_, b, h, mb) in tl] or [[0, 0, 0, 0]], dtype=torch.int32, device=dev)
        counter = torch.zeros(1, dtype=torch.int32, device=dev)
        p = P()
        p.q, p.k, p.v, p.o, p.lse = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr()
        p.cu_q, p.cu_k = cu_q.data_ptr(), cu_k.data_ptr()
        p.batch, p.heads, p.kv_heads, p.head_dim = B, heads, kv_heads, D
        p.max_q, p.max_k = max(Lq) if B else 0, max(Lk) if B else 0
        p.total_q, p.total_k = q.shape[0], k.shape[0]
        p.scale = 1.0 / math.sqrt(D); p.scale_log2 = p.scale * 1.4426950408889634
        p.causal = int(causal)
        p.tiles, p.num_tiles, p.tile_counter = tiles.data_ptr(), len(tl), counter.data_ptr()
        keep = (tiles, counter, o, lse)
        if self.persistent:
            grid = (max(1, min(len(tl), NSM, grid_cap or NSM)), 1, 1)
        else:
            grid = (max(1, (p.max_q + BM - 1) // BM), heads, max(B, 1))
        arg = ctypes.c_void_p(ctypes.addressof(p))
        args = (ctypes.c_void_p * 1)(ctypes.addressof(p))
        dyn = self.persistent == 2
        def launch():
            if len(tl) == 0: return
            if dyn: counter.zero_()  # the contract: host zeroes tile_counter before every launch
            ck(cu.cuLaunchKernel(self.fn, grid[0], grid[1], grid[2], 384, 1, 1, self.smem,
                                 ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), args, None), "launch")
        return launch, o, lse, (p, args, keep)

def ref_attn(q, k, v, Lq, Lk, causal, heads, kv_heads, seqs=None):
    D = q.shape[-1]; scale = 1.0 / math.sqrt(D)
    oq = [0]; ok = [0]
    for a in Lq: oq.append(oq[-1] + a)
    for a in Lk: ok.append(ok[-1] + a)
    outs, lses = {}, {}
    for b in (seqs if seqs is not None else range(len(Lq))):
        qs = q[oq[b]:oq[b+1]].float().transpose(0, 1)  # H, Lq, D
        ks = k[ok[b]:ok[b+1]].float().transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        vs = v[ok[b]:ok[b+1]].float().transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        s = qs @ ks.transpose(1, 2) * scale
        lq, lk = Lq[b], Lk[b]
        if causal:
            i = torch.arange(lq, device=dev)[:, None]; j = torch.arange(lk, device=dev)[None, :]
            s = s.masked_fill(j > i + (lk - lq), float("-inf"))
        lse = torch.logsumexp(s, -1)  # H, Lq
        pm = torch.exp(s - lse[..., None]).nan_to_num(0.0)
        o = pm @ vs
        outs[b] = o.transpose(0, 1); lses[b] = lse
    return outs, lses, oq

def check(kern, Lq, Lk, causal, heads, kv_heads, D, seed=0, grid_cap=None):
    g = torch.Generator(device=dev).manual_seed(seed)
    Tq, Tk = sum(Lq), sum(Lk)
    q = torch.randn(max(Tq, 1), heads, D, device=dev, generator=g).bfloat16()[:Tq]
    k = torch.randn(max(Tk, 1), kv_heads, D, device=dev, generator=g).bfloat16()[:Tk]
    v = torch.randn(max(Tk, 1), kv_heads, D, device=dev, generator=g).bfloat16()[:Tk]
    cq = torch.tensor([0] + list(torch.tensor(Lq).cumsum(0).tolist()), dtype=torch.int32, device=dev)
    ckk = torch.tensor([0] + list(torch.tensor(Lk).cumsum(0).tolist()), dtype=torch.int32, device=dev)
    launch, o, lse, keep = kern.prepare(q, k, v, cq, ckk, Lq, Lk, causal, heads, kv_heads, grid_cap)
    o.fill_(float("nan")); lse.fill_(float("nan"))
    launch(); sync_or_die(f"check {Lq[:4]} causal={causal}")
    ro, rl, oq = ref_attn(q, k, v, Lq, Lk, causal, heads, kv_heads)
    worst_o, worst_l = 0.0, 0.0
    for b in range(len(Lq)):
        if Lq[b] == 0: continue
        ob = o[oq[b]:oq[b+1]].float()
        eo = (ob - ro[b]).abs().max().item() if ob.numel() else 0.0
        if math.isnan(eo) or torch.isnan(ob).any(): eo = float("inf")
        lb = lse[:, oq[b]:oq[b+1]]; rb = rl[b]
        fin = torch.isfinite(rb)
        el = (lb[fin] - rb[fin]).abs().max().item() if fin.any() else 0.0
        if (~fin).any() and not bool((lb[~fin] == float("-inf")).all()): el = float("inf")
        if torch.isnan(lb).any(): el = float("inf")
        worst_o, worst_l = max(worst_o, eo), max(worst_l, el)
    ok = worst_o < 3e-2 and worst_l < 2e-3
    return ok, worst_o, worst_l

def bench_shape(kern, s):
    B, H, D, causal = s["B"], s["H"], s["D"], s["causal"]
    Lq, lk = draw_shape_lengths(s)
    Lk = Lq if lk is None else lk
    if causal:
        pairs = sum(sum(min(max(i + 1 + (b - a), 0), b) for i in range(a)) for a, b in zip(Lq, Lk))
    else:
        pairs = sum(a * b for a, b in zip(Lq, Lk))
    flops = 4.0 * pairs * D * H
    Tq, Tk = sum(Lq), sum(Lk)
    q = torch.randn(Tq, H, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(Tk, H, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(Tk, H, D, device=dev, dtype=torch.bfloat16)
    cq = torch.tensor([0] + torch.tensor(Lq).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    ckk = torch.tensor([0] + torch.tensor(Lk).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    launch, o, lse, keep = kern.prepare(q, k, v, cq, ckk, Lq, Lk, causal, H, H)
    launch(); sync_or_die(f"bench {s['name']} first launch")
    # spot-check 3 sequences against the reference
    seqs = sorted(set([0, B // 2, B - 1]))
    ro, rl, oq = ref_attn(q, k, v, Lq, Lk, causal, H, H, seqs)
    err = 0.0
    for b in seqs:
        if Lq[b] == 0: continue
        e = (o[oq[b]:oq[b+1]].float() - ro[b]).abs().max().item()
        err = max(err, e if not math.isnan(e) else float("inf"))
    for _ in range(3): launch()
    sync_or_die(f"bench {s['name']} warmup")
    n = 20
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for rep in range(3):
        e0.record()
        for _ in range(n): launch()
        e1.record(); sync_or_die(f"bench {s['name']} timing")
        ts.append(e0.elapsed_time(e1) / n)
    t = min(ts)
    return t, flops / t / 1e9, err

def main():
    cfgs = os.environ.get("CONFIGS", "HEAD_DIM=128,BLOCK_N=128;HEAD_DIM=64,BLOCK_N=128")
    shapes = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "shapes.json")))
    only = os.environ.get("SHAPES_ONLY")
    table = []
    for cfg in cfgs.split(";"):
        knobs = {"HEAD_DIM": 128, "BLOCK_N": 128, "STAGES": 2, "PERSISTENT": 1}
        if os.environ.get("WAIT_LIMIT"): knobs["WAIT_LIMIT"] = int(os.environ["WAIT_LIMIT"])
        os.environ["ORDER"] = "group"; only_cfg = None
        for kv in cfg.split(","):
            a, b = kv.split("=")
            if a == "ORDER": os.environ["ORDER"] = b
            elif a == "ONLY": only_cfg = b.split("|")
            else: knobs[a] = int(b)
        kern = Kernel(knobs)
        D = knobs["HEAD_DIM"]
        if not os.environ.get("SKIP_CHECK"):
            cases = [
                ("self mixed", [0, 1, 63, 64, 65, 127, 128, 129, 200, 300, 517], None, 2, 2),
                ("self long", [1000, 777, 0, 2049], None, 2, 2),
                ("cross", [5, 100, 300, 129, 0, 64], [70, 3, 400, 129, 10, 0], 2, 2),
                ("gqa", [190, 256, 33], None, 4, 2),
                ("gqa1", [150, 1], [260, 300], 4, 1),
            ]
            # many tiles per CTA: a persistent grid capped at 3 CTAs walks long tile
            # sequences (ring phases across tiles, tiles with 1 or 0 key blocks)
            many = [int(x) for x in torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(7))]
            cases.append(("many/cta3", many, None, 2, 2, 3))
            cases.append(("cross/cta5", many[:20], many[20:], 4, 2, 5))
            for causal in (0, 1):
                for case in cases:
                    name, lq, lk, H, KH = case[:5]
                    cap = case[5] if len(case) > 5 else None
                    lk = lk if lk is not None else lq
                    ok, eo, el = check(kern, lq, lk, causal, H, KH, D, seed=len(lq) + causal, grid_cap=cap)
                    print(f"  check D={D} causal={causal} {name:10s} {'OK ' if ok else 'BAD'} max|dO|={eo:.3g} max|dLSE|={el:.3g}", flush=True)
                    if not ok: table.append((str(knobs), f"check {name} c{causal}", "BAD", f"{eo:.2g}"))
        for s in shapes:
            if s["D"] != D: continue
            if only and s["name"] not in only.split(","): continue
            if only_cfg and s["name"] not in only_cfg: continue
            try:
                t, tf, err = bench_shape(kern, s)
                print(f"  bench {s['name']:18s} {t*1e3:9.1f} us {tf:7.1f} TFLOP/s  spot-err {err:.3g}", flush=True)
                table.append((str(knobs) + " " + os.environ["ORDER"], s["name"], f"{tf:.1f} TF/s", f"{t*1e3:.0f}us err {err:.2g}"))
            except Exception as e:
                print("  bench", s["name"], "FAILED", repr(e)[:300], flush=True)
                table.append((str(knobs), s["name"], "FAILED", ""))
                raise
    print("\n==== summary ====")
    for r in table: print(" | ".join(r))

if __name__ == "__main__":
    main()
