# Reads a bwd_sm90 trace (kforge-bench-attn --trace-dir D: D/<shape>.<n>.bin and .json) and
# says where a launch's time went: per tile class (packed runs, short and long plain tiles)
# the mean time of each phase of a tile's life as consumer 0 saw it, the producer's
# per-step times, and how the CTAs' work ends (the launch's tail).
# usage: python3 trace_bwd.py D/<shape>.<n>   [--tiles N: print the first N tiles of CTA 0]
# Event ids: kernels/templates/bwd_sm90.cuh, "KF_TRACE".
import json, struct, sys, collections, statistics

PHASES = {12: ("b. wait for a stage (per step)", "prev", "full"),
          13: ("c. stage -> dS barrier (per step)", "full", "sync"),
          14: ("d. dS barrier -> dQ issued (per step)", "sync", "prev"),
          15: ("e. head end: counts, conversions", "prev", "prev"),
          16: ("f. dK/dV epilogue", "prev", "prev")}
# cycles per ns where a CTA has too few events to measure its SM's clock
DEFAULT_RATE = 1.755
EV = {1: "P.tile", 2: "P.empty", 3: "P.kv_empty", 4: "P.full", 5: "P.next",
      10: "C.tile", 11: "C.kv", 12: "C.full", 13: "C.sync", 14: "C.add", 15: "C.head", 16: "C.end"}


def load(stem):
    meta = json.load(open(stem + ".json"))
    raw = open(stem + ".bin", "rb").read()
    words = struct.unpack("<%dQ" % (len(raw) // 8), raw)
    cap, roles = meta["cap"], meta["roles"]
    ev = {}  # (cta, role) -> [(globaltimer ns, clock, id, arg)]
    for cta in range(meta["ctas"]):
        for role in range(roles):
            base = 2 * ((cta * roles + role) * cap)
            out = []
            for n in range(cap):
                g, w = words[base + 2 * n], words[base + 2 * n + 1]
                if g == 0:
                    break
                out.append((g, w & 0xffffffff, w >> 56, (w >> 32) & 0xffffff))
            ev[(cta, role)] = out
    return meta, ev


def tile_class(meta, idx):
    t = meta["tiles"][4 * idx: 4 * idx + 4] if idx < meta["num_tiles"] else None
    if t is None:
        return "end"
    b, g, m_block, pack = t
    if pack < 0:
        return "packed"
    if m_block < 0:
        return "zero-dQ"
    return "plain"


def main():
    stem = sys.argv[1]
    show = int(sys.argv[sys.argv.index("--tiles") + 1]) if "--tiles" in sys.argv else 0
    meta, ev = load(stem)
    allg = [e[0] for v in ev.values() for e in v]
    if not allg:
        sys.exit("no events (was the candidate built with KF_TRACE?)")
    g0 = min(allg)
    span = (max(allg) - g0) / 1e3
    print(f"{meta['shape']}  {meta['variant']}")
    print(f"  CTAs {meta['ctas']}, tiles {meta['num_tiles']}, events span {span:.1f} us")

    # clock cycles per ns, per CTA (its SM's clock), from consumer 0's first and last event
    def rate(v):
        if len(v) < 2 or v[-1][0] == v[0][0]:
            return DEFAULT_RATE
        dc = (v[-1][1] - v[0][1]) & 0xffffffff
        return dc / (v[-1][0] - v[0][0])

    phases = collections.defaultdict(lambda: collections.defaultdict(list))
    counts = collections.Counter()
    ends = []
    for cta in range(meta["ctas"]):
        v = ev[(cta, 1)]
        if not v:
            continue
        r = rate(v)
        us = lambda a, b: ((b[1] - a[1]) & 0xffffffff) / r / 1e3
        ends.append(((v[-1][0] - g0) / 1e3, (v[0][0] - g0) / 1e3))
        # split consumer 0's events into tiles
        tiles, cur = [], None
        for e in v:
            if e[2] == 10:
                if cur:
                    tiles.append(cur)
                cur = [e]
            elif cur is not None:
                cur.append(e)
        if cur:
            tiles.append(cur)
        for k, t in enumerate(tiles):
            idx = t[0][3]
            cls = tile_class(meta, idx)
            if cls == "end":
                continue
            kv = next((e for e in t if e[2] == 11), None)
            steps = kv[3] if kv else 0
            if cls == "plain":
                cls = "plain<=4" if steps <= 4 else "plain>4"
            counts[cls] += 1
            nxt = tiles[k + 1][0] if k + 1 < len(tiles) else None
            P = phases[cls]
            if nxt:
                P["tile total (to the next tile)"].append(us(t[0], nxt))
            if kv:
                P["a. tile -> K/V in"].append(us(t[0], kv))
            # each consumer event closes the phase that began at one mark and
            # may start another: id -> (phase, from mark, mark it sets)
            marks = {"prev": kv}
            for e in t:
                if e[2] not in PHASES:
                    continue
                name, since, sets = PHASES[e[2]]
                if marks.get(since) is not None:
                    P[name].append(us(marks[since], e))
                marks[sets] = e
                if e[2] == 16 and nxt:
                    P["g. end -> next tile"].append(us(e, nxt))
            if show and cta == 0 and k < show:
                print("   tile", idx, cls, " ".join(f"{EV[e[2]]}:{e[3]}@{us(t[0], e):.2f}" for e in t))
    print("  tiles by class (consumer 0):", dict(counts))
    for cls in sorted(phases):
        print(f"  {cls}:")
        for name in sorted(phases[cls]):
            x = phases[cls][name]
            print(f"    {name:42s} n={len(x):6d} mean {statistics.mean(x):7.2f} us"
                  f"  median {statistics.median(x):7.2f}  sum/CTA {sum(x) / len(ends):7.1f}")
    # producer: per step, the wait for a free stage and the stage's own time
    pw, pf = [], []
    for cta in range(meta["ctas"]):
        v = ev[(cta, 0)]
        r = rate(ev[(cta, 1)]) if ev[(cta, 1)] else DEFAULT_RATE
        us = lambda a, b: ((b[1] - a[1]) & 0xffffffff) / r / 1e3
        last = None
        for e in v:
            if e[2] == 2:
                if last is not None:
                    pw.append(us(last, e))
                emp = e
            elif e[2] == 4:
                pf.append(us(emp, e))
                last = e
    if pf:
        print(f"  producer: stage free -> full {statistics.mean(pf):.2f} us mean "
              f"(median {statistics.median(pf):.2f}); full -> next stage free "
              f"{statistics.mean(pw):.2f} mean")
    ends.sort()
    first_end, last_end = ends[0][0], ends[-1][0]
    starts = sorted(s for _, s in ends)
    print(f"  CTA first event {starts[0]:.1f}..{starts[-1]:.1f} us; last event: first CTA done "
          f"{first_end:.1f}, median {ends[len(ends) // 2][0]:.1f}, last {last_end:.1f} us")
    idle = sum(last_end - e for e, _ in ends) / len(ends)
    print(f"  mean idle at the end {idle:.1f} us of {last_end:.1f} "
          f"({100 * idle / last_end:.0f}% of the SMs' time)")


if __name__ == "__main__":
    main()
