"""How a jagged batch's sequence lengths are drawn from a shape's length
distribution (bench/shapes.json's "q" and "kv" entries): the rule of
core/lengths.h, step for step, in pure Python (no torch, no native library).

Everything in Python that draws the public shapes' batches imports this
module (bench/anchors.py, bench/attention/lengths.py, bench/train/, the GPU
tests of this package), and `kforge tune --shapes` draws with the C++ side, so
the anchors, kforge's benchmark and a tuning job see the same batches;
tests/lengths checks that both sides draw identical lengths.

    lq, lk = draw_shape_lengths(shape)          # lk is None for "kv": "same"
    lengths = draw_lengths({"dist": "uniform", "lo": 1, "hi": 1024}, 512, SplitMix64(1))
"""

__all__ = ["DEFAULT_SEED", "SplitMix64", "draw_lengths", "draw_shape_lengths"]

DEFAULT_SEED = 1  # per shape, as core/lengths.h's kDefaultLengthSeed

_MASK = (1 << 64) - 1


class SplitMix64:
    """The generator of core/lengths.h (LengthRng): 64-bit outputs."""

    def __init__(self, seed):
        self.state = seed & _MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)


def _int(spec, name, default=None):
    if name not in spec:
        if default is None:
            raise ValueError(f'"{name}" is missing')
        return default
    v = spec[name]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f'"{name}" must be an integer')
    return v


def _check(spec):
    """(kind, lo, hi, alpha) of a distribution; ValueError as core/lengths.cc words it."""
    if not isinstance(spec, dict):
        raise ValueError("a length distribution must be an object")
    kind = spec.get("dist")
    if kind not in ("fixed", "uniform", "pareto"):
        if isinstance(kind, str):
            raise ValueError(f"unknown length distribution '{kind}'")
        raise ValueError('"dist" must be "fixed", "uniform" or "pareto"')
    hi = _int(spec, "hi")
    lo = _int(spec, "lo", 1)
    if hi < 0:
        raise ValueError('"hi" must not be negative')
    alpha = 1.0
    if kind != "fixed":
        if lo < 0:
            raise ValueError('"lo" must not be negative')
        if lo > hi:
            raise ValueError(f'"lo" {lo} is above "hi" {hi}')
    if kind == "pareto":
        if lo < 1:
            raise ValueError('a pareto "lo" must be at least 1')
        a = spec.get("alpha")
        if isinstance(a, bool) or not isinstance(a, (int, float)):
            raise ValueError('a pareto distribution needs a number "alpha"')
        alpha = float(a)
        if not (alpha > 0) or alpha == float("inf"):
            raise ValueError('"alpha" must be positive')
    return kind, lo, hi, alpha


def draw_lengths(spec, batch, rng):
    """`batch` lengths (a list of int) of distribution `spec`, drawn from `rng`."""
    kind, lo, hi, alpha = _check(spec)
    out = []
    for _ in range(batch):
        if kind == "fixed":
            out.append(hi)
        elif kind == "uniform":
            out.append(lo + rng.next() % (hi - lo + 1))
        else:
            # float(lo) * pow(u, e) in IEEE doubles, as the C++ computes it:
            # Python's ** on floats is C's pow.
            u = float((rng.next() >> 11) + 1) * 2.0 ** -53
            v = float(lo) * u ** (-1.0 / alpha)
            out.append(int(min(max(v, float(lo)), float(hi))))
    return out


def draw_shape_lengths(shape, seed=DEFAULT_SEED):
    """(query lengths, key lengths or None) of a shapes.json entry: "B" (or
    "batch") query lengths of "q", then, from the same generator, the key
    lengths of "kv" (None when "kv" is "same" or absent: self-attention)."""
    if not isinstance(shape, dict):
        raise ValueError("a shape must be an object")
    batch = _int(shape, "B" if "B" in shape else "batch")
    if batch < 0:
        raise ValueError("the batch must not be negative")
    if "q" not in shape:
        raise ValueError('"q" is missing')
    try:
        _check(shape["q"])
    except ValueError as e:
        raise ValueError(f"q: {e}") from None
    kv = shape.get("kv", "same")
    cross = kv != "same"
    if cross:
        try:
            _check(kv)
        except ValueError as e:
            raise ValueError(f"kv: {e}") from None
    rng = SplitMix64(seed)
    lq = draw_lengths(shape["q"], batch, rng)
    lk = draw_lengths(kv, batch, rng) if cross else None
    return lq, lk
