"""Turning user buffers (NumPy arrays, PyTorch CPU tensors, Python buffers)
into raw bytes with a wire dtype, without copying and without importing
NumPy or PyTorch unless the caller already uses them."""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

from . import _protocol as P

# struct/memoryview format characters -> wire dtype (itemsize checked too).
_FORMATS = {("f", 4): P.DT_FLOAT32, ("d", 8): P.DT_FLOAT64,
            ("i", 4): P.DT_INT32, ("l", 4): P.DT_INT32, ("q", 8): P.DT_INT64,
            ("l", 8): P.DT_INT64, ("B", 1): P.DT_BYTES, ("b", 1): P.DT_BYTES,
            ("c", 1): P.DT_BYTES}

DTYPE_NAMES = {P.DT_FLOAT32: "float32", P.DT_FLOAT64: "float64", P.DT_INT32: "int32",
               P.DT_INT64: "int64", P.DT_BYTES: "bytes"}


@dataclass
class Buffer:
    """A writable, contiguous view of the caller's memory."""

    view: memoryview      # format "B", the whole buffer
    dtype: int            # wire dtype code
    count: int            # elements
    owner: Any            # keeps the original object (and any torch->numpy view) alive

    @property
    def nbytes(self) -> int:
        return len(self.view)

    @functools.cached_property
    def address(self) -> int:
        """Address of the first byte (0 when empty). Worked out only when
        asked (ctypes costs microseconds): a client with no shared segments
        never asks."""
        return address_of(self.view)


def address_of(view: memoryview) -> int:
    """Address of a writable buffer's first byte (0 for an empty one)."""
    if len(view) == 0:
        return 0
    c = ctypes.c_char.from_buffer(view)
    try:
        return ctypes.addressof(c)
    finally:
        del c


def _from_torch(x: Any) -> tuple[Any, Any]:
    # is_cpu and requires_grad are plain flags; x.device makes an object
    # and detach() a tensor, microseconds each on a small call's path.
    if not x.is_cpu:
        raise TypeError(f"tensor is on {x.device}; collectived needs a CPU tensor")
    if not x.is_contiguous():
        raise ValueError("tensor is not contiguous; call .contiguous() first")
    return (x.detach() if x.requires_grad else x).numpy(), x


# (format, itemsize) -> dtype for the formats NumPy gives its common
# arrays: the first look, before the general one below.
_COMMON = {(f, n): d for (f, n), d in _FORMATS.items() for f in (f, "<" + f, "=" + f, "@" + f)}


def as_buffer(x: Any, *, what: str = "buffer") -> Buffer:
    """Describe ``x`` (NumPy array, PyTorch CPU tensor, or writable buffer)."""
    # The common cases first, in few steps: a small call's time in Python is
    # mostly steps like these. A tensor is looked at as the NumPy array
    # sharing its memory (a tensor has no buffer interface, and asking for
    # one raises, which costs more than the look at its module).
    owner = x
    mod = type(x).__module__ or ""
    if mod.startswith("torch") and hasattr(x, "is_contiguous"):
        x, owner = _from_torch(x)
    try:
        mv = memoryview(x)
    except TypeError:
        raise TypeError(f"{what} of type {type(owner).__name__} is not a NumPy array, "
                        "a PyTorch CPU tensor or a buffer") from None
    dtype = _COMMON.get((mv.format, mv.itemsize))
    if dtype is not None and not mv.readonly and mv.c_contiguous and mv.nbytes:
        return Buffer(mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B"), dtype,
                      mv.nbytes // mv.itemsize, owner)
    # The general look: an empty buffer, or one to say what is wrong with.
    if mv.readonly:
        raise ValueError(f"{what} is read-only; collectives write their result in place")
    if not mv.c_contiguous:
        raise ValueError(f"{what} is not C-contiguous")
    fmt = mv.format.lstrip("@=<")
    if mv.format.startswith((">", "!")):
        raise ValueError(f"{what} is big-endian; collectived uses native little-endian")
    dtype = _FORMATS.get((fmt, mv.itemsize))
    if dtype is None:
        kind = getattr(owner, "dtype", None) or f"element format {mv.format!r}"
        raise TypeError(f"{what} has {kind} ({mv.itemsize}-byte elements); "
                        "supported: float32, float64, int32, int64 (and bytes for broadcast)")
    count = mv.nbytes // mv.itemsize
    if mv.nbytes == 0:
        raw = memoryview(bytearray(0))  # casting a view with a zero in its shape fails
    else:
        raw = mv if (mv.ndim == 1 and mv.format == "B") else mv.cast("B")
    return Buffer(raw, dtype, count, owner)
