"""Turning user buffers (NumPy arrays, PyTorch CPU tensors, Python buffers)
into raw bytes with a wire dtype, without copying and without importing
NumPy or PyTorch unless the caller already uses them."""

from __future__ import annotations

import ctypes
import functools
import sys
from dataclasses import dataclass
from typing import Any

from . import _protocol as P
from .errors import DTypeError, UsageError

# struct/memoryview format characters -> wire dtype (itemsize checked too).
# One-byte integers are bytes here; in a reduction they are numbers
# (_NUMERIC_BYTES).
_FORMATS = {("f", 4): P.DT_FLOAT32, ("d", 8): P.DT_FLOAT64,
            ("i", 4): P.DT_INT32, ("l", 4): P.DT_INT32, ("q", 8): P.DT_INT64,
            ("l", 8): P.DT_INT64, ("B", 1): P.DT_BYTES, ("b", 1): P.DT_BYTES,
            ("c", 1): P.DT_BYTES, ("e", 2): P.DT_FLOAT16}
# The one-byte formats as the numbers a reduction takes them for ('c',
# a char, is not one).
_NUMERIC_BYTES = {"B": P.DT_UINT8, "b": P.DT_INT8}

DTYPE_NAMES = P.DTYPE_NAMES
#: What the client takes, as errors list it.
SUPPORTED = ("float32, float64, float16, bfloat16 (a torch.bfloat16 tensor, or NumPy's from "
             "ml_dtypes), int32, int64, int8, uint8 (bytes for broadcast and allgather)")


@dataclass
class Buffer:
    """A writable, contiguous view of the caller's memory."""

    view: memoryview      # format "B", the whole buffer
    dtype: int            # wire dtype code
    count: int            # elements
    owner: Any            # keeps the original object (and any torch->numpy view) alive
    shape: tuple[int, ...] = ()  # the array's shape (a Python buffer's: one dimension)

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
    """A CPU tensor as the NumPy array sharing its memory, and the tensor.
    A bfloat16 tensor (which NumPy has no type for, and ``.numpy()``
    refuses) comes as its bits in an int16 array: :func:`torch_wire_dtype`
    says what they are."""
    # is_cpu and requires_grad are plain flags; x.device makes an object
    # and detach() a tensor, microseconds each on a small call's path.
    if not x.is_cpu:
        raise TypeError(f"tensor is on {x.device}; collectived needs a CPU tensor")
    if not x.is_contiguous():
        raise UsageError("tensor is not contiguous; call .contiguous() first")
    t = x.detach() if x.requires_grad else x
    try:
        torch = sys.modules["torch"]
        if t.dtype is torch.bfloat16:
            return t.view(torch.int16).numpy(), x
        return t.numpy(), x
    except (TypeError, RuntimeError):  # a dtype NumPy has no counterpart for
        raise DTypeError(f"tensor has {x.dtype}; supported: {SUPPORTED}") from None


# (format, itemsize) -> dtype for the formats NumPy gives its common
# arrays: the first look, before the general one below.
_COMMON = {(f, n): d for (f, n), d in _FORMATS.items() for f in (f, "<" + f, "=" + f, "@" + f)}


def as_buffer(x: Any, *, what: str = "buffer", numeric: bool = False) -> Buffer:
    """Describe ``x`` (NumPy array, PyTorch CPU tensor, or writable buffer).

    ``numeric``: for a reduction, whose one-byte integers are int8 and
    uint8; elsewhere (broadcast, allgather) they travel as bytes."""
    # The common cases first, in few steps: a small call's time in Python is
    # mostly steps like these. A tensor is looked at as the NumPy array
    # sharing its memory (a tensor has no buffer interface, and asking for
    # one raises, which costs more than the look at its module).
    owner = x
    mod = type(x).__module__ or ""
    forced = 0  # a wire dtype the buffer's format does not say (bfloat16)
    if mod.startswith("torch") and hasattr(x, "is_contiguous"):
        x, owner = _from_torch(x)
        if x.dtype.char == "h" and owner.dtype is sys.modules["torch"].bfloat16:
            forced = P.DT_BFLOAT16  # its bits, in an int16 array
    try:
        mv = memoryview(x)
    except TypeError:
        raise DTypeError(f"{what} of type {type(owner).__name__} is not a NumPy array, "
                         "a PyTorch CPU tensor or a buffer") from None
    except ValueError:
        # NumPy refuses a buffer of a dtype it made up (ml_dtypes' bfloat16):
        # its bits, as uint16, carry it.
        if getattr(getattr(x, "dtype", None), "name", "") != "bfloat16":
            raise DTypeError(f"{what} has {getattr(x, 'dtype', type(x).__name__)}, which has no "
                             f"buffer; supported: {SUPPORTED}") from None
        mv, forced = memoryview(x.view("uint16")), P.DT_BFLOAT16
    dtype = forced or _COMMON.get((mv.format, mv.itemsize))
    if numeric and dtype == P.DT_BYTES:
        dtype = _NUMERIC_BYTES.get(mv.format.lstrip("@=<"), P.DT_BYTES)
    if dtype and not (numeric and dtype == P.DT_BYTES) and not mv.readonly and mv.c_contiguous and mv.nbytes:
        return Buffer(mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B"), dtype,
                      mv.nbytes // mv.itemsize, owner, mv.shape or ())
    # The general look: an empty buffer, bytes, or one to say what is wrong with.
    if mv.readonly:
        raise UsageError(f"{what} is read-only; collectives write their result in place")
    if not mv.c_contiguous:
        raise UsageError(f"{what} is not C-contiguous")
    fmt = mv.format.lstrip("@=<")
    if mv.format.startswith((">", "!")):
        raise DTypeError(f"{what} is big-endian; collectived uses native little-endian")
    if not dtype:
        dtype = _FORMATS.get((fmt, mv.itemsize), 0)
        if numeric and dtype == P.DT_BYTES:
            dtype = _NUMERIC_BYTES.get(fmt, P.DT_BYTES)
    if not dtype:
        kind = getattr(owner, "dtype", None) or f"element format {mv.format!r}"
        raise DTypeError(f"{what} has {kind} ({mv.itemsize}-byte elements); "
                         f"supported: {SUPPORTED}")
    if numeric and dtype == P.DT_BYTES:
        raise DTypeError(f"{what} holds untyped bytes (element format {mv.format!r}), which "
                         "cannot be reduced; use a NumPy array of int8 or uint8")
    count = mv.nbytes // mv.itemsize
    if mv.nbytes == 0:
        raw = memoryview(bytearray(0))  # casting a view with a zero in its shape fails
    else:
        raw = mv if (mv.ndim == 1 and mv.format == "B") else mv.cast("B")
    return Buffer(raw, dtype, count, owner, mv.shape or ())
