"""PyTorch helpers. Importing this module imports torch.

``collectived.Client.allreduce`` already accepts contiguous CPU tensors; these
helpers add zero-copy tensors living in the daemon's shared memory.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch  # type: ignore[import-not-found,unused-ignore]

from ._client import Client

_NUMPY_NAMES = {torch.float32: "float32", torch.float64: "float64",
                torch.int32: "int32", torch.int64: "int64"}


def as_tensor(arr: Any) -> "torch.Tensor":
    """A tensor sharing ``arr``'s memory (e.g. an array from ``Client.empty``):
    collectives on the tensor then travel as (segment, offset) only."""
    return torch.from_numpy(arr)


def empty(client: Client, shape: int | Sequence[int], dtype: "torch.dtype" = torch.float32) -> "torch.Tensor":
    """An uninitialised CPU tensor in a shared segment of ``client``'s daemon."""
    if dtype not in _NUMPY_NAMES:
        raise TypeError(f"dtype {dtype} unsupported (float32, float64, int32, int64)")
    return torch.from_numpy(client.empty(shape, _NUMPY_NAMES[dtype]))


def zeros(client: Client, shape: int | Sequence[int], dtype: "torch.dtype" = torch.float32) -> "torch.Tensor":
    """A zero CPU tensor in a shared segment of ``client``'s daemon."""
    if dtype not in _NUMPY_NAMES:
        raise TypeError(f"dtype {dtype} unsupported (float32, float64, int32, int64)")
    # Client.zeros fills the memory: a segment's bytes are zero only while
    # the daemon hands out fresh memfds, which the protocol does not promise.
    return torch.from_numpy(client.zeros(shape, _NUMPY_NAMES[dtype]))
