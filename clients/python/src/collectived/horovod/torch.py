"""Horovod's PyTorch API (``horovod.torch``) over collectived: a script
written for Horovod runs on the collectived daemons when its import line
reads ``import collectived.horovod.torch as hvd``. Importing this module
imports torch.

The subset Horovod's PyTorch examples use: :func:`init`, :func:`shutdown`,
:func:`rank`, :func:`size`, :func:`local_rank`, :func:`local_size`
(:func:`cross_rank`, :func:`cross_size`: the node's), the collectives
(:func:`allreduce`, :func:`allgather`, :func:`broadcast`, each with an
``_async`` form and an in-place ``_`` form where Horovod has one),
:func:`synchronize` and :func:`poll` of their handles,
:func:`broadcast_parameters`, :func:`broadcast_optimizer_state`,
:func:`broadcast_object`, :class:`Compression` and
:func:`DistributedOptimizer`.

How it maps:

- Rank and sizes are the daemons' (``collectived.torch.connect``: the
  socket is ``$COLLECTIVED_SOCKET``, the job ``$COLLECTIVED_JOB``, the
  local rank ``$LOCAL_RANK``, else the lowest free one). No launcher's
  rendezvous is used: start one process per trainer, as ``torchrun``
  or a shell loop does.
- A call with a ``name`` is a named call of collectived (``ordered=False``,
  protocol version 4) named as Horovod names it on the wire,
  ``"allreduce.<name>"`` (``"broadcast.<name>"``, ``"allgather.<name>"``):
  the trainers' calls of one name meet whatever order each makes them in,
  as Horovod's do. A call without a name is an ordered call, matched by
  order (Horovod numbers unnamed calls in order, which comes to the same).
- :func:`DistributedOptimizer` is Horovod's: a gradient hook on every
  parameter starts a named allreduce of its gradient (name: the
  parameter's name from ``named_parameters``) as soon as backward has
  computed it, and ``step()`` waits for them all before it updates.
- ``op``: :data:`Average` (float types: the daemon's ``avg``, one rounding;
  integer types: the sum divided by the world size, truncated),
  :data:`Sum`, :data:`Min`, :data:`Max`, :data:`Product`; :data:`Adasum`
  is refused (``NotImplementedError``). ``prescale_factor`` and
  ``postscale_factor`` are the daemon's scale factors.
- Errors are the client's (:class:`~collectived.CollectivedError`, a
  ``RuntimeError``, as Horovod's ``HorovodInternalError`` is).
- Not here: process sets, ``hvd.join``, elastic training, GPU tensors,
  gradients through ``allreduce`` (autograd), Adasum, sparse gradients,
  alltoall and reducescatter.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import math
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch  # type: ignore[import-not-found,unused-ignore]

from .._client import Client, Handle
from .._torch_ddp import broadcast_object as _broadcast_object
from .._torch_ddp import broadcast_optimizer_state as _broadcast_optimizer_state
from .._torch_ddp import broadcast_parameters as _broadcast_parameters
from .._torch_pg import _contiguous, _cpu, _wire, connect
from ..errors import UsageError

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "allgather",
    "allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "synchronize", "poll", "barrier", "broadcast_parameters", "broadcast_optimizer_state",
    "broadcast_object", "Compression", "DistributedOptimizer",
]

#: Reduce ops, Horovod's numbers (``horovod.torch.Average`` and so on).
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_OPS = {Average: "avg", Sum: "sum", Min: "min", Max: "max", Product: "prod"}

_client: Optional[Client] = None
_lock = threading.Lock()


# ------------------------------------------------------------ the world


def init(comm: Any = None, process_sets: Any = None, *, socket: Optional[str] = None,
         job: Optional[str] = None, local_rank: Optional[int] = None,
         timeout: Optional[float] = None, rank_retry: float = 10.0) -> None:
    """Connect to this node's collectived daemon (again: nothing). Horovod's
    ``comm`` and ``process_sets`` are not supported; the keyword arguments
    are :func:`collectived.torch.connect`'s (default: ``$COLLECTIVED_SOCKET``,
    ``$COLLECTIVED_JOB``, ``$LOCAL_RANK``)."""
    global _client
    if comm is not None or process_sets is not None:
        raise NotImplementedError("collectived.horovod: init(comm=...) and process sets are "
                                  "not supported; the world is the daemons' trainers")
    with _lock:
        if _client is not None:
            return
        _client = connect(socket, job=job, local_rank=local_rank, timeout=timeout,
                          rank_retry=rank_retry, label=f"horovod pid {os.getpid()}")
    atexit.register(shutdown)


def shutdown() -> None:
    """Close the connection (idempotent); calls in flight fail."""
    global _client
    with _lock:
        c, _client = _client, None
        _handles.clear()
    if c is not None:
        c.close()


def is_initialized() -> bool:
    """Whether :func:`init` has connected (and :func:`shutdown` not closed)."""
    return _client is not None


def _c() -> Client:
    c = _client
    if c is None:
        raise UsageError("Horovod has not been initialized; use hvd.init().")
    return c


def rank() -> int:
    """The daemons' world rank (``node_rank * local_size + local_rank``)."""
    return _c().rank


def size() -> int:
    """The world size (``node_count * local_size``)."""
    return _c().size


def local_rank() -> int:
    """This trainer's rank among its node's."""
    return _c().local_rank


def local_size() -> int:
    """Trainers per node (the daemon's ``job.local_size``)."""
    return _c().local_size


def cross_rank() -> int:
    """This node's rank among the nodes."""
    return _c().node_rank


def cross_size() -> int:
    """The number of nodes."""
    return _c().node_count


# ------------------------------------------------------------ handles


@dataclass
class _Op:
    handle: Handle
    output: Any
    finish: Optional[Callable[[], None]] = None


_handles: dict[int, _Op] = {}
_ids = itertools.count(1)


def _register(h: Handle, output: Any, finish: Optional[Callable[[], None]] = None) -> int:
    hid = next(_ids)
    with _lock:
        _handles[hid] = _Op(h, output, finish)
    return hid


def _op_of(handle: int) -> _Op:
    op = _handles.get(handle)
    if op is None:
        raise UsageError(f"handle {handle!r} is not a call in flight (unknown, or already "
                         "synchronized)")
    return op


def poll(handle: int) -> bool:
    """Whether the call of ``handle`` has finished (:func:`synchronize`
    then returns at once)."""
    return _op_of(handle).handle.done()


def synchronize(handle: int) -> Any:
    """Wait for the call of ``handle`` and return its output tensor (the
    call's own error if it failed). A handle is synchronized once."""
    op = _op_of(handle)
    try:
        op.handle.wait()
        if op.finish is not None:
            op.finish()
    finally:
        with _lock:
            _handles.pop(handle, None)
    return op.output


def _names(prefix: str, name: Optional[str]) -> tuple[str, bool]:
    """A call's name on the wire, Horovod's ``"<op>.<name>"``, and whether
    it is named; a call without a name is an ordered call."""
    if not name:
        return "", False
    return f"{prefix}.{name}", True


def _reduce_op(op: Optional[int], average: Optional[bool]) -> int:
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if op is None:
        op = Average if average is None or average else Sum
    if op == Adasum:
        raise NotImplementedError("op=Adasum: collectived does not implement Horovod's Adasum "
                                  "(adaptive summation); use op=hvd.Average or op=hvd.Sum")
    if op not in _OPS:
        raise ValueError(f"op={op!r} is not a reduce op of Horovod's (Average, Sum, Min, Max, "
                         "Product)")
    return op


# ------------------------------------------------------------ collectives


def allreduce_async_(tensor: Any, average: Optional[bool] = None, name: Optional[str] = None,
                     op: Optional[int] = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0) -> int:
    """Start an allreduce of ``tensor`` in place; :func:`synchronize` of
    the handle returns ``tensor``, reduced."""
    c = _c()
    code = _reduce_op(op, average)
    _cpu(tensor, "allreduce")
    wire, back = _contiguous(tensor.detach())
    red = _OPS[code]
    int_average = code == Average and not wire.dtype.is_floating_point
    if int_average:
        red = "sum"  # the daemon averages floats only: the sum, divided below
    wname, named = _names("allreduce", name)
    h = c.allreduce_async(wire, red, name=wname, prescale=prescale_factor,
                          postscale=postscale_factor, ordered=not named)

    def finish() -> None:
        if int_average:
            wire.copy_(torch.div(wire, c.size, rounding_mode="trunc"))
        if back is not None:
            back()
    return _register(h, tensor, finish if int_average or back is not None else None)


def allreduce_async(tensor: Any, average: Optional[bool] = None, name: Optional[str] = None,
                    op: Optional[int] = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0) -> int:
    """Start an allreduce of a copy of ``tensor``; :func:`synchronize`
    returns the copy, reduced (``tensor`` is left as it is)."""
    out = tensor.detach().clone(memory_format=torch.contiguous_format)
    return allreduce_async_(out, average, name, op, prescale_factor, postscale_factor)


def allreduce(tensor: Any, average: Optional[bool] = None, name: Optional[str] = None,
              compression: Any = None, op: Optional[int] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0) -> Any:
    """The reduction of ``tensor`` over every rank (default: the average),
    as a new tensor."""
    comp = compression or Compression.none
    t, ctx = comp.compress(tensor)
    out = synchronize(allreduce_async(t, average, name, op, prescale_factor, postscale_factor))
    return comp.decompress(out, ctx)


def allreduce_(tensor: Any, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[int] = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0) -> Any:
    """:func:`allreduce` in place; returns ``tensor``."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor))


def allgather_async(tensor: Any, name: Optional[str] = None) -> int:
    """Start an allgather: every rank's ``tensor`` concatenated along the
    first dimension, rank 0's first; ranks may differ in the first
    dimension only (the daemon checks the others). The first dimensions
    are gathered first, waited for here."""
    c = _c()
    _cpu(tensor, "allgather")
    x, _ = _contiguous(tensor.detach())
    if x.dim() == 0:
        x = x.reshape(1)
    wname, named = _names("allgather", name)
    rows = torch.tensor([x.shape[0]], dtype=torch.int64)
    all_rows = [int(r) for r in c.allgather(rows, name=wname + ".rows" if named else "",
                                            ordered=not named)]
    inner = tuple(x.shape[1:])
    k = math.prod(inner)
    out = torch.empty((sum(all_rows), *inner), dtype=x.dtype)
    wx, wout = _wire(x), _wire(out)  # a type the daemon does not reduce: its bytes
    per = k if wx.dtype == x.dtype else k * x.element_size()  # wire elements a row
    h = c.allgatherv_async(wx, [r * per for r in all_rows], wout, name=wname,
                           ordered=not named)
    return _register(h, out)


def allgather(tensor: Any, name: Optional[str] = None) -> Any:
    """Every rank's ``tensor``, concatenated along the first dimension."""
    return synchronize(allgather_async(tensor, name))


def broadcast_async_(tensor: Any, root_rank: int, name: Optional[str] = None) -> int:
    """Start overwriting ``tensor`` with world rank ``root_rank``'s."""
    c = _c()
    _cpu(tensor, "broadcast")
    wire, back = _contiguous(tensor.detach())
    wname, named = _names("broadcast", name)
    h = c.broadcast_async(_wire(wire), root_rank, name=wname, ordered=not named)
    return _register(h, tensor, back)


def broadcast_async(tensor: Any, root_rank: int, name: Optional[str] = None) -> int:
    """Start a broadcast into a copy of ``tensor``; :func:`synchronize`
    returns the copy, holding ``root_rank``'s tensor."""
    out = tensor.detach().clone(memory_format=torch.contiguous_format)
    return broadcast_async_(out, root_rank, name)


def broadcast(tensor: Any, root_rank: int, name: Optional[str] = None) -> Any:
    """World rank ``root_rank``'s ``tensor``, as a new tensor."""
    return synchronize(broadcast_async(tensor, root_rank, name))


def broadcast_(tensor: Any, root_rank: int, name: Optional[str] = None) -> Any:
    """:func:`broadcast` in place; returns ``tensor``."""
    return synchronize(broadcast_async_(tensor, root_rank, name))


def barrier() -> None:
    """Return once every trainer has entered the barrier."""
    _c().barrier()


def broadcast_parameters(params: Any, root_rank: int) -> None:
    """Overwrite ``params`` (a ``state_dict()``, ``named_parameters()``,
    or a list of tensors) with world rank ``root_rank``'s, in place
    (``collectived.torch.broadcast_parameters``)."""
    if not isinstance(params, dict):
        items = list(params)
        params = {(p[0] if isinstance(p, tuple) else str(i)): (p[1] if isinstance(p, tuple) else p)
                  for i, p in enumerate(items)}
    _broadcast_parameters(params, root_rank, _c())


def broadcast_optimizer_state(optimizer: Any, root_rank: int) -> None:
    """Load world rank ``root_rank``'s optimizer state (its
    ``state_dict()``) into ``optimizer`` on every rank."""
    _broadcast_optimizer_state(optimizer, root_rank, _c())


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None) -> Any:
    """World rank ``root_rank``'s ``obj`` (pickled by ``torch.save``)."""
    return _broadcast_object(obj, root_rank, _c())


# ------------------------------------------------------------ the optimizer


class Compressor:
    """Horovod's gradient compression interface."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        """The tensor to send, and what :meth:`decompress` needs."""
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        """The received tensor as the caller's type."""
        return tensor


class NoneCompressor(Compressor):
    """No compression."""


class FP16Compressor(Compressor):
    """Float tensors travel as float16 (the daemon sums them in float32)."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        """A float tensor as float16, and its type."""
        if tensor.dtype.is_floating_point:
            return tensor.type(torch.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        """Back to the type it had."""
        return tensor.type(ctx) if ctx is not None and ctx.is_floating_point else tensor


class Compression:
    """``hvd.Compression.none`` and ``hvd.Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor


class _DistributedOptimizer(torch.optim.Optimizer):  # type: ignore[misc]
    """Horovod's DistributedOptimizer: its methods are copied into a
    subclass of the wrapped optimizer's class (:func:`DistributedOptimizer`),
    so ``super(self.__class__, self)`` is that class."""

    def __init__(self, params: Any, named_parameters: Any, compression: Any,
                 backward_passes_per_step: int, op: int,
                 gradient_predivide_factor: float) -> None:
        super(self.__class__, self).__init__(params)
        self._compression = compression
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [(f"noname.{i}.{j}", v) for i, group in enumerate(self.param_groups)
                                for j, v in enumerate(group["params"])]
        if any(not isinstance(p, tuple) for p in named_parameters):
            raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                             "usually produced by model.named_parameters().")
        names = [k for k, _ in named_parameters]
        dups = sorted({k for k in names if names.count(k) > 1})
        if dups:
            raise ValueError("Parameter names in named_parameters must be unique. Found "
                             f"duplicates: {', '.join(dups)}")
        all_ids = {id(v) for group in self.param_groups for v in group["params"]}
        unnamed = all_ids - {id(v) for _, v in named_parameters}
        if unnamed:
            raise ValueError("named_parameters was specified, but one or more model parameters "
                             f"were not named. Python object ids: "
                             f"{', '.join(str(i) for i in sorted(unnamed))}")
        self._parameter_names = {v: k for k, v in sorted(named_parameters, key=lambda kv: kv[0])}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for _, v in sorted(
            named_parameters, key=lambda kv: kv[0])}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self._handles: dict[Any, tuple[Optional[int], Any]] = {}
        self._grad_accs: list[Any] = []
        self._requires_update: set[Any] = set()
        self._synchronized = False
        self._should_synchronize = True
        if size() > 1:
            self._register_hooks()

    def _register_hooks(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    p_tmp = p.expand_as(p)
                    grad_acc = p_tmp.grad_fn.next_functions[0][0]  # p's AccumulateGrad
                    grad_acc.register_hook(self._make_hook(p))
                    self._grad_accs.append(grad_acc)

    def _allreduce_grad_async(self, p: Any) -> tuple[int, Any]:
        if p.grad is None:  # a parameter backward did not reach: its gradient is zero
            p.grad = torch.zeros_like(p)
        tensor_compressed, ctx = self._compression.compress(p.grad)
        pre = post = 1.0
        if self.op == Average:
            pre, post = 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        handle = allreduce_async_(tensor_compressed, name=self._parameter_names.get(p),
                                  op=self.op, prescale_factor=pre, postscale_factor=post)
        return handle, ctx

    def _make_hook(self, p: Any) -> Callable[..., None]:
        def hook(*ignore: Any) -> None:
            if p in self._handles and self._handles[p][0] is not None:
                if self._allreduce_delay[p] <= 0:
                    raise AssertionError(
                        "Gradients were computed more than backward_passes_per_step times "
                        "before call to step(). Increase backward_passes_per_step to "
                        "accumulate gradients locally.")
            assert not p.grad.requires_grad
            assert self._allreduce_delay[p] > 0
            handle: Optional[int] = None
            ctx = None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def synchronize(self) -> None:
        """Wait for every gradient's allreduce (starting those backward
        did not start), and put the results in the gradients."""
        missing = sorted(self._requires_update - set(self._handles),
                         key=lambda p: self._parameter_names.get(p, ""))
        for p in missing:
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in self._handles.items():
            assert handle is not None
            output = synchronize(handle)
            self._allreduce_delay[p] = self.backward_passes_per_step
            p.grad.set_(self._compression.decompress(output, ctx))
        self._handles.clear()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """For ``optimizer.synchronize()`` then ``step()`` (say, with
        gradient clipping between): the step does not synchronize again."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        """:meth:`synchronize` (unless in :meth:`skip_synchronize`), then
        the wrapped optimizer's step."""
        if self._should_synchronize:
            if self._synchronized:
                import warnings

                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args: Any, **kw: Any) -> Any:
        """The wrapped optimizer's, refused while gradients are in flight."""
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kw)


def DistributedOptimizer(optimizer: Any, named_parameters: Any = None,
                         compression: Any = Compression.none, backward_passes_per_step: int = 1,
                         op: int = Average, gradient_predivide_factor: float = 1.0) -> Any:
    """Wrap ``optimizer`` (Horovod's): each parameter's gradient is
    averaged (``op``) over the world by a named allreduce started from a
    hook as soon as backward has computed it (name: the parameter's name in
    ``named_parameters``, as from ``model.named_parameters()``), and
    ``step()`` waits for them before updating. With
    ``backward_passes_per_step=n`` the allreduce starts at every n-th
    backward (the gradients of the passes between accumulate locally).
    The result is an instance of a subclass of ``optimizer``'s class over
    its parameter groups (so its hyperparameters), as Horovod makes it."""
    _reduce_op(op, None)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step is {backward_passes_per_step}; want 1 or more")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor)
