"""DDP comm hooks that send gradients through collectived while DDP keeps
another backend, and the initial broadcasts of parameters and optimizer
state (re-exported by ``collectived.torch``). Importing this imports torch."""

from __future__ import annotations

import io
import threading
import weakref
from typing import Any, Union

import torch  # type: ignore[import-not-found,unused-ignore]

from ._client import Client, Handle
from ._torch_pg import ProcessGroupCollectived, _Completer, _failing_future, default_group
from .errors import UsageError

_completers: "weakref.WeakKeyDictionary[Client, _Completer]" = weakref.WeakKeyDictionary()
_completers_lock = threading.Lock()

#: What a hook's ``state`` (and the ``group`` of the broadcasts) may be.
State = Union[None, Client, ProcessGroupCollectived]


def _resolve(state: State) -> tuple[Client, _Completer]:
    """The client (and completion threads) of a hook's state: a
    :class:`~collectived.Client`, a collectived process group, or None for
    the group ``collectived.torch.init_process_group`` made."""
    if isinstance(state, ProcessGroupCollectived):
        return state.client, state._completer
    if state is None:
        pg = default_group()
        if pg is None:
            raise UsageError("no collectived client: pass a collectived.Client (or the group "
                             "collectived.torch.init_process_group returned) as the hook's "
                             "state, or call collectived.torch.init_process_group() first")
        return pg.client, pg._completer
    if isinstance(state, Client):
        with _completers_lock:
            c = _completers.get(state)
            if c is None:
                c = _completers[state] = _Completer("collectived-hook")
        return state, c
    raise UsageError(f"a collectived hook's state is a collectived.Client, a collectived "
                     f"process group or None, not {type(state).__name__}")


def _bucket_tensor(bucket: Any) -> Any:
    # torch 1.13 and later: buffer(); before: get_tensor()
    return bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()


def _future_of(h: Handle, completer: _Completer, finish: Any) -> Any:
    """A torch future of ``finish()``'s value once ``h`` is done (failing
    as torch's C++ understands if ``h`` or ``finish`` fails), settled in
    a completion thread."""
    base = torch.futures.Future()

    def settle() -> None:
        err = h._error
        if err is None:
            try:
                value = finish()
            except BaseException as e:
                err = e
        if err is not None:
            base.set_exception(err)
        else:
            base.set_result(value)
    h.add_done_callback(lambda _h: completer.submit(settle))
    return _failing_future(base)


def allreduce_hook(state: State, bucket: Any) -> Any:
    """A DDP comm hook (``model.register_comm_hook(state, allreduce_hook)``)
    that averages each gradient bucket over the collectived world (``avg``:
    the sum divided by the world size, one rounding), for a DDP whose
    process group is another backend's. ``state``: a
    :class:`~collectived.Client` (or a collectived group; None for the one
    ``init_process_group`` made). Its world must be DDP's, rank for rank."""
    client, completer = _resolve(state)
    t = _bucket_tensor(bucket)
    h = client.allreduce_async(t, op="avg")
    return _future_of(h, completer, lambda: t)


def _compress_hook(state: State, bucket: Any, dtype: Any) -> Any:
    client, completer = _resolve(state)
    t = _bucket_tensor(bucket)
    small = t.to(dtype)
    h = client.allreduce_async(small, op="avg")

    def finish() -> Any:
        t.copy_(small)
        return t
    return _future_of(h, completer, finish)


def bf16_compress_hook(state: State, bucket: Any) -> Any:
    """As :func:`allreduce_hook`, with each bucket sent as bfloat16: half
    the bytes on the wire and through the daemon, which sums in float32
    and rounds to bfloat16 once on a node's way out and once at the end
    (torch's own hook divides by the world size first, a rounding more)."""
    return _compress_hook(state, bucket, torch.bfloat16)


def fp16_compress_hook(state: State, bucket: Any) -> Any:
    """As :func:`bf16_compress_hook`, in float16 (whose range, 65504, a
    sum of large gradients may overflow to inf)."""
    return _compress_hook(state, bucket, torch.float16)


def _tensors(obj: Any) -> list[tuple[str, Any]]:
    """(name, tensor) pairs of a module (parameters and buffers, in
    ``state_dict`` order), a dict of tensors, or an iterable of tensors."""
    if isinstance(obj, torch.nn.Module):
        return list(obj.state_dict(keep_vars=True).items())
    if isinstance(obj, dict):
        return [(str(k), v) for k, v in obj.items() if isinstance(v, torch.Tensor)]
    return [(str(i), t) for i, t in enumerate(obj)]


def broadcast_parameters(params: Any, root: int = 0, group: State = None) -> None:
    """Overwrite every parameter and buffer of ``params`` (a module, a
    ``state_dict``, or tensors) with world rank ``root``'s, as a run's
    start needs (DDP does this itself; a hook-only setup does not).
    Tensors of one element type travel together, one broadcast per type.
    Every rank must pass the same structure (the daemon checks counts)."""
    with torch.no_grad():
        _broadcast_parameters(params, root, group)


def _broadcast_parameters(params: Any, root: int, group: State) -> None:
    client, _ = _resolve(group)
    by_type: dict[Any, list[Any]] = {}
    for _, t in _tensors(params):
        if t.device.type != "cpu":
            raise UsageError(f"broadcast_parameters: a tensor is on {t.device}; CPU tensors only")
        by_type.setdefault(t.dtype, []).append(t.data if t.requires_grad else t)
    for dtype in sorted(by_type, key=str):
        ts = by_type[dtype]
        flat = torch.cat([t.reshape(-1) for t in ts]) if len(ts) > 1 else ts[0].reshape(-1).clone()
        wire = flat if dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                 torch.int32, torch.int64, torch.int8, torch.uint8) \
            else flat.view(torch.uint8)
        client.broadcast(wire, root, name=f"broadcast_parameters:{dtype}"[:100])
        off = 0
        for t in ts:
            n = t.numel()
            t.copy_(flat[off:off + n].view(t.shape))
            off += n


def broadcast_object(obj: Any, root: int = 0, group: State = None) -> Any:
    """World rank ``root``'s ``obj`` (pickled with ``torch.save``), on
    every rank."""
    client, _ = _resolve(group)
    payload = b""
    if client.rank == root:
        buf = io.BytesIO()
        torch.save(obj, buf)
        payload = buf.getvalue()
    n = torch.tensor([len(payload)], dtype=torch.int64)
    client.broadcast(n, root, name="broadcast_object:size")
    data = bytearray(payload) if client.rank == root else bytearray(int(n[0]))
    if len(data):
        client.broadcast(data, root, name="broadcast_object")
    if client.rank == root:
        return obj
    try:  # the root's own objects (torch 2.6 and later load tensors only by default)
        return torch.load(io.BytesIO(bytes(data)), weights_only=False)
    except TypeError:  # torch before 1.13's weights_only
        return torch.load(io.BytesIO(bytes(data)))


def broadcast_optimizer_state(optimizer: Any, root: int = 0, group: State = None) -> None:
    """Load world rank ``root``'s optimizer state (``state_dict()``: its
    hyperparameters and per-parameter state, such as momentum buffers)
    into ``optimizer`` on every rank. The optimizers must be over the
    same parameters in the same order (as after
    :func:`broadcast_parameters` of the same model)."""
    sd = broadcast_object(optimizer.state_dict() if _rank(group) == root else None, root, group)
    if _rank(group) != root:
        optimizer.load_state_dict(sd)


def _rank(group: State) -> int:
    return _resolve(group)[0].rank


# DDP's register_comm_hook checks the hook's annotations against the real
# objects (bucket: dist.GradBucket, returning Future[Tensor]); this
# module's are strings (postponed annotations).
for _hook in (allreduce_hook, bf16_compress_hook, fp16_compress_hook):
    _hook.__annotations__.update(bucket=torch.distributed.GradBucket,
                                 **{"return": torch.futures.Future[torch.Tensor]})
# ... and refuses any hook *named* bf16_compress_hook without CUDA and NCCL
# (torch 1.13 to current): this one needs neither.
bf16_compress_hook.__name__ = "collectived_bf16_compress_hook"
