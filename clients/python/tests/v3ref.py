"""A NumPy reference for version 3's collectives that computes what the
daemon must give, bit for bit: the order of every operation and every
rounding of the 16-bit floats, as docs/PROTOCOL.md ("Reductions") and
ring/doc.go ("Reduction order") fix them.

- Each node folds its local trainers' inputs in local-rank order, each
  multiplied by the prescale first, in the computing type (float32 for
  float16 and bfloat16, else the dtype itself; integers wrap).
- A ring of one node: that fold, finished (divided by the world size for
  avg, then multiplied by the postscale), rounded once.
- Small path (the buffer at most ring.small_bytes, or fewer elements than
  nodes): every node's fold is rounded to the dtype as it goes on the
  ring; every rank folds them in node order 0..N-1, finishes, rounds.
- Large path: the count is cut into N chunks (the first count % N one
  element longer); chunk c starts as node c's fold, rounded, and each
  next node computes round(received op its own fold), the received value
  on the left; node c-1 finishes the last instead of rounding it.
- reduce runs allreduce's path; reduce_scatter's block of node c (its
  trainers' blocks) starts at node c+1 and ends, finished, at node c, as
  the large path's hops do.

Storage arrays: float16 as np.float16, bfloat16 as its bits (np.uint16),
the others as their NumPy dtype.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

#: The daemon's ring.small_bytes default (config.yaml, config.go), which
#: the test worlds keep.
SMALL_BYTES = 64 << 10

FLOATS = ("float32", "float64", "float16", "bfloat16")
INTS = ("int32", "int64", "int8", "uint8")
DTYPES = FLOATS + INTS
SIZES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8,
         "int8": 1, "uint8": 1}


def bf16_from_f32(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, to nearest even; a NaN stays a NaN."""
    b = np.ascontiguousarray(x, np.float32).view(np.uint32)
    r = ((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    nan = (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    r = np.where(nan, (b >> np.uint32(16)) | np.uint32(0x40), r)
    return r.astype(np.uint16)


def f32_from_bf16(h: np.ndarray) -> np.ndarray:
    return (np.asarray(h, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


class Arith:
    """One dtype's arithmetic: widen to the computing type, narrow back."""

    def __init__(self, dtype: str, op: str, world: int, pre: float = 1.0,
                 post: float = 1.0) -> None:
        self.dtype, self.op, self.world = dtype, op, world
        self.half = dtype in ("float16", "bfloat16")
        self.ct = np.float32 if self.half or dtype == "float32" else np.dtype(dtype).type
        self.pre = None if pre == 1.0 else self.ct(pre)
        self.post = None if post == 1.0 else self.ct(post)

    def storage(self) -> type:
        return np.uint16 if self.dtype == "bfloat16" else np.dtype(self.dtype).type

    def widen(self, a: np.ndarray) -> np.ndarray:
        if self.dtype == "bfloat16":
            return f32_from_bf16(a)
        return np.asarray(a).astype(self.ct)

    def narrow(self, a: np.ndarray) -> np.ndarray:
        if self.dtype == "bfloat16":
            return bf16_from_f32(a)
        with np.errstate(over="ignore"):
            return a.astype(self.storage())

    def comb(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            if self.op in ("sum", "avg"):
                return (a + b).astype(self.ct)
            if self.op == "prod":
                return (a * b).astype(self.ct)
            f = np.maximum if self.op == "max" else np.minimum  # both propagate NaN
            return f(a, b).astype(self.ct)

    def fold(self, xs: Sequence[np.ndarray]) -> np.ndarray:
        """A node's fold of its local inputs, prescaled, unrounded."""
        with np.errstate(over="ignore", invalid="ignore"):
            acc = self.widen(xs[0])
            if self.pre is not None:
                acc = (acc * self.pre).astype(self.ct)
            for x in xs[1:]:
                v = self.widen(x)
                if self.pre is not None:
                    v = (v * self.pre).astype(self.ct)
                acc = self.comb(acc, v)
        return acc

    def finish(self, acc: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            if self.op == "avg" and self.world > 1:
                acc = (acc / self.ct(self.world)).astype(self.ct)
            if self.post is not None:
                acc = (acc * self.post).astype(self.ct)
        return acc

    def sent(self, acc: np.ndarray) -> np.ndarray:
        """A partial as the next node reads it: rounded to the dtype."""
        return self.widen(self.narrow(acc))


def _folds(ar: Arith, xs: Sequence[np.ndarray], nodes: int, local: int) -> list[np.ndarray]:
    return [ar.fold(xs[n * local:(n + 1) * local]) for n in range(nodes)]


def allreduce(xs: Sequence[np.ndarray], dtype: str, op: str, nodes: int, local: int,
              pre: float = 1.0, post: float = 1.0,
              small_bytes: int = SMALL_BYTES) -> np.ndarray:
    """The allreduce (and reduce) of world ranks' inputs ``xs``."""
    ar = Arith(dtype, op, nodes * local, pre, post)
    parts = _folds(ar, xs, nodes, local)
    count = len(xs[0])
    if nodes == 1:
        return ar.narrow(ar.finish(parts[0]))
    if count * SIZES[dtype] <= small_bytes or count < nodes:
        acc = ar.sent(parts[0])
        for p in parts[1:]:
            acc = ar.comb(acc, ar.sent(p))
        return ar.narrow(ar.finish(acc))
    out = np.empty(count, ar.storage())
    base, rem = divmod(count, nodes)
    for c in range(nodes):
        lo = c * base + min(c, rem)
        hi = lo + base + (1 if c < rem else 0)
        acc = parts[c][lo:hi]
        for k in range(1, nodes):
            acc = ar.comb(ar.sent(acc), parts[(c + k) % nodes][lo:hi])
        out[lo:hi] = ar.narrow(ar.finish(acc))
    return out


def reduce_scatter(xs: Sequence[np.ndarray], dtype: str, op: str, nodes: int, local: int,
                   counts: Optional[Sequence[int]] = None, pre: float = 1.0,
                   post: float = 1.0) -> list[np.ndarray]:
    """Every world rank's block of a reduce_scatter (``counts``: the "v"
    form's per-rank counts; else equal blocks)."""
    world = nodes * local
    count = len(xs[0])
    cs = list(counts) if counts is not None else [count // world] * world
    ar = Arith(dtype, op, world, pre, post)
    parts = _folds(ar, xs, nodes, local)
    whole = np.empty(count, ar.storage())
    for c in range(nodes):
        lo = sum(cs[:c * local])
        hi = lo + sum(cs[c * local:(c + 1) * local])
        if nodes == 1:
            whole[lo:hi] = ar.narrow(ar.finish(parts[0][lo:hi]))
            continue
        acc = parts[(c + 1) % nodes][lo:hi]
        for k in range(2, nodes + 1):
            acc = ar.comb(ar.sent(acc), parts[(c + k) % nodes][lo:hi])
        whole[lo:hi] = ar.narrow(ar.finish(acc))
    at = np.cumsum([0] + cs)
    return [whole[at[w]:at[w + 1]] for w in range(world)]


def make_input(key: str, rank: int, dtype: str, op: str, n: int) -> np.ndarray:
    """Rank ``rank``'s input of case ``key``, in storage form: random,
    deterministic, every value exact in the dtype. Floats: normal values
    for sum, avg, max and min, values near 1 for prod (no overflow);
    integers over their whole range (sums and products wrap)."""
    import zlib

    rng = np.random.default_rng([zlib.crc32(key.encode()), rank])
    if dtype in FLOATS:
        v = rng.uniform(0.5, 1.5, n) if op == "prod" else rng.standard_normal(n) * 3
        if dtype == "bfloat16":
            return bf16_from_f32(v.astype(np.float32))
        return v.astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=n, endpoint=True, dtype=dtype)


def bits(a: np.ndarray) -> np.ndarray:
    """An array's bits as unsigned integers, for exact comparisons."""
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])
