#!/usr/bin/env python3
"""A model of bwd_sm90's tile counter with DET=1's ordered dQ adds (notes/bwd.md v23).

CTAs take tiles in list order, each the next when it frees. A tile runs its steps
(query head x visited query block, ORDER=0: head-major, query blocks ascending), one
time unit a step, plus END units at its end (head ends, dK/dV stores). A step's add
waits until the key block before it in the add order has published its add into the
same (query block, head), PUB units after that add. Orders:
  served   the grouped list, no waits (DET=0's order, its tail deal left out)
  asc      key order (v21): "levels" dealt 3 steps of tiles apart, key block 0 first
  desc     last key block first (v23): causal groups whole, else dealt as asc
Prints each order's makespan in steps and its ratio to served. L2 is not modelled.
  det_model.py LENGTHS.json SHAPE [CTAS]   (LENGTHS: bench/attention/lengths.py's output)
"""
import heapq, json, sys

END, PUB, BM, BN = 1.3, 0.5, 64, 128


def tiles_of(lq, lk, heads, causal, bm):
    groups = []  # per (sequence, head): list of (key block, m_first, m_blocks)
    for b, (q, k) in enumerate(zip(lq, lk)):
        shift, mb = k - q, -(-q // bm)
        blocks = []
        for j in range(-(-k // BN)):
            first = max(0, j * BN - shift) if causal else 0
            mf = mb if first >= q else first // bm
            if mb - mf > 0:
                blocks.append((j, mf, mb))
        for h in range(heads):
            if blocks:
                groups.append(((b, h), blocks))
    return groups


def order_list(groups, kind, ctas, causal):
    work = lambda g: sum(mb - mf for _, mf, mb in g[1])
    gs = sorted(groups, key=work, reverse=True)
    if kind == "served":
        return [(g[0], t) for g in gs for t in g[1]]
    tiles = [t for g in gs for t in g[1]]
    mean = max(1, sum(mb - mf for _, mf, mb in tiles) // max(1, len(tiles)))
    deal = 1 if (kind == "desc" and causal) else min(64, max(1, -(-3 * ctas // mean)))
    out = []
    for i in range(0, len(gs), deal):
        chunk = gs[i:i + deal]
        for lvl in range(max(len(g[1]) for g in chunk)):
            for g in chunk:
                if lvl < len(g[1]):
                    blocks = g[1] if kind == "asc" else g[1][::-1]
                    out.append((g[0], blocks[lvl]))
    return out


def makespan(lst, kind, ctas):
    free = [0.0] * ctas
    heapq.heapify(free)
    pub = {}  # (group, key block, m) -> publish time of its add
    end_all = 0.0
    for grp, (j, mf, mb) in lst:
        t = heapq.heappop(free)
        for m in range(mf, mb):
            t += 1.0
            if kind != "served":
                pred = (grp, j - 1 if kind == "asc" else j + 1, m)
                if pred in pub:
                    t = max(t, pub[pred])
                pub[(grp, j, m)] = t + PUB
        t += END
        end_all = max(end_all, t)
        heapq.heappush(free, t)
    return end_all


def main():
    shapes = {s["name"]: s for s in json.load(open(sys.argv[1]))}
    s = shapes[sys.argv[2]]
    ctas = int(sys.argv[3]) if len(sys.argv) > 3 else 132
    bm = 128 if s["D"] == 64 else BM
    groups = tiles_of(s["lq"], s["lk"], s["H"], s["causal"], bm)
    base = None
    for kind in ("served", "asc", "desc"):
        t = makespan(order_list(groups, kind, ctas, s["causal"]), kind, ctas)
        base = base or t
        print(f"{s['name']:18s} {kind:6s} {t:10.1f} steps  {t / base:.3f}x")


if __name__ == "__main__":
    main()
