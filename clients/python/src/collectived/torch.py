"""PyTorch: the ``"collectived"`` torch.distributed backend, DDP comm hooks,
and tensors in the daemon's shared memory. Importing this module imports
torch and registers the backend.

>>> import collectived.torch as ct, torch.distributed as dist
>>> ct.init_process_group()           # instead of dist.init_process_group(...)
>>> dist.get_rank(), dist.get_world_size()   # the daemons' world rank and size
>>> model = torch.nn.parallel.DistributedDataParallel(model)

``collectived.Client.allreduce`` and friends already accept contiguous CPU
tensors; :func:`empty` and :func:`zeros` make zero-copy tensors living in the
daemon's shared memory.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch  # type: ignore[import-not-found,unused-ignore]

from ._client import Client
from ._torch_pg import (
    BACKEND,
    ProcessGroupCollectived,
    Work,
    WorldStore,
    connect,
    default_group,
    destroy_process_group,
    init_process_group,
    register,
)
from ._torch_ddp import (
    allreduce_hook,
    bf16_compress_hook,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
    fp16_compress_hook,
)
from .errors import DTypeError

__all__ = [
    "BACKEND", "ProcessGroupCollectived", "Work", "WorldStore", "connect", "default_group",
    "destroy_process_group", "init_process_group", "register", "allreduce_hook",
    "bf16_compress_hook", "fp16_compress_hook", "broadcast_parameters",
    "broadcast_optimizer_state", "broadcast_object", "as_tensor", "empty", "zeros",
]

register()

_NUMPY_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
                torch.int32: "int32", torch.int64: "int64", torch.int8: "int8",
                torch.uint8: "uint8"}
_SUPPORTED = "float32, float64, float16, bfloat16, int32, int64, int8, uint8"


def as_tensor(arr: Any) -> "torch.Tensor":
    """A tensor sharing ``arr``'s memory (e.g. an array from ``Client.empty``):
    collectives on the tensor then travel as (segment, offset) only."""
    return torch.from_numpy(arr)


def _shared(client: Client, shape: int | Sequence[int], dtype: "torch.dtype",
            zero: bool) -> "torch.Tensor":
    make = client.zeros if zero else client.empty
    if dtype == torch.bfloat16:  # NumPy has none: its bits, as int16, viewed back
        return torch.from_numpy(make(shape, "int16")).view(torch.bfloat16)
    if dtype not in _NUMPY_NAMES:
        raise DTypeError(f"dtype {dtype} unsupported ({_SUPPORTED})")
    return torch.from_numpy(make(shape, _NUMPY_NAMES[dtype]))


def empty(client: Client, shape: int | Sequence[int], dtype: "torch.dtype" = torch.float32) -> "torch.Tensor":
    """An uninitialised CPU tensor in a shared segment of ``client``'s daemon."""
    return _shared(client, shape, dtype, False)


def zeros(client: Client, shape: int | Sequence[int], dtype: "torch.dtype" = torch.float32) -> "torch.Tensor":
    """A zero CPU tensor in a shared segment of ``client``'s daemon."""
    # Client.zeros fills the memory: a segment's bytes are zero only while
    # the daemon hands out fresh memfds, which the protocol does not promise.
    return _shared(client, shape, dtype, True)
