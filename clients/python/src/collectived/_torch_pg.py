"""collectived as a torch.distributed backend: a ProcessGroup written in
Python (``collectived.torch`` registers it as ``"collectived"`` and
re-exports what users need). Importing this module imports torch.

How it fits torch (1.13 to current; clients/python/README.md, "PyTorch", for users):

- torch calls the group's methods (``allreduce``, ``broadcast``, ...) from
  Python (``dist.all_reduce``) and from C++ (DDP's reducer, its parameter
  checks and broadcasts) through pybind11's trampoline, which finds the
  Python override through the Python object of each ProcessGroup and Work.
- Every method issues its collective(s) at once, as ``*_async`` calls of the
  group's :class:`~collectived.Client`, and returns a :class:`Work`. Its
  ``wait()`` waits for the handles in the calling thread (a small call's
  caller takes its answer from the lane itself); its ``get_future()`` is a
  ``torch.futures.Future`` that the handles' done callbacks settle, in a
  completion thread of the group's (never the client's reader thread: torch
  runs the callbacks chained on a future in the thread that settles it, and
  a comm hook's callback may wait for another collective).
- A Work returned to C++ keeps its Python object alive itself until it has
  been waited for or its future taken (pybind11 drops the Python half of an
  object only C++ holds, and C++ would then wait on the base class, which
  never ends).
- Errors keep their class: ``wait()`` raises the client's own exception (a
  :class:`~collectived.TrainerLostError` is also a RuntimeError), the future
  is failed with it. Where torch's C++ rethrows it (DDP's backward) it
  becomes a RuntimeError whose message starts with the class's name.
"""

from __future__ import annotations

import array
import atexit
import collections
import datetime
import inspect
import logging
import os
import threading
import warnings
from typing import Any, Callable, Optional, Sequence

import torch  # type: ignore[import-not-found,unused-ignore]
import torch.distributed as dist  # type: ignore[import-not-found,unused-ignore]

from ._client import Client, Handle
from .errors import CollectivedError, DTypeError, UnsupportedError, UsageError

#: The backend's name in torch.distributed.
BACKEND = "collectived"

_log = logging.getLogger("collectived")

# torch 2 calls it Work; 1.13 has both names.
_WorkBase: Any = getattr(dist, "Work", None) or getattr(dist, "_Work")

# What the daemon reduces; anything else travels as bytes where bytes do
# (broadcast, allgather) and is refused in a reduction.
_NUMERIC = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
            torch.int64, torch.int8, torch.uint8)
_SUPPORTED = "float32, float64, float16, bfloat16, int32, int64, int8, uint8"


def _seconds(timeout: Any) -> Optional[float]:
    """torch's timeouts (a timedelta, or milliseconds; 0 or less: none
    stated) as seconds, or None for the client's own bound."""
    if timeout is None:
        return None
    s = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout) / 1000
    return s if s > 0 else None


def _unsupported(what: str) -> UnsupportedError:
    return UnsupportedError(f"the collectived backend does not support {what} yet; it has "
                            "all_reduce (SUM, AVG, PRODUCT, MIN, MAX), broadcast, all_gather, "
                            "all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, "
                            "reduce and barrier")


def _subgroups_error() -> UnsupportedError:
    return UnsupportedError(
        "the collectived backend does not support subgroups (new_group, new_subgroups) "
        "yet: its one group is the whole world of the daemons' trainers. Run the subgroup's "
        "collectives on another backend (dist.new_group(ranks, backend='gloo') needs a "
        "default group of that backend), or make every rank call the collective")


def _value(f: Any) -> Any:
    return f.value()


def _failing_future(base: Any) -> Any:
    """A future that completes as ``base`` does, failing in a way torch's
    C++ understands. ``Future.set_exception`` stores the exception as the
    future's *value*, raised only by Python's ``wait()``: C++ (DDP's reducer)
    reads that value as its result, which fails with "Unable to cast ... to
    Tensor", or crashes torch 1.13 (SIGSEGV, seen with a killed trainer).
    A callback that raises fails the future ``then`` makes at the C++ level,
    with a RuntimeError of torch's whose message names the error's class."""
    return base.then(_value)


class _Completer:
    """Settles torch futures off the client's reader thread: in a thread of
    its own, and in another whenever every one is busy (a callback chained
    on a future may wait for another collective, as PowerSGD's hook does),
    at most :attr:`MAX`; extra threads idle for 30 s end."""

    MAX = 32

    def __init__(self, name: str) -> None:
        self._name = name
        self._q: collections.deque[Callable[[], None]] = collections.deque()
        self._cv = threading.Condition(threading.Lock())
        self._idle = 0
        self._threads = 0

    def submit(self, fn: Callable[[], None]) -> None:
        with self._cv:
            self._q.append(fn)
            if self._idle >= len(self._q):
                self._cv.notify()
                return
            if self._threads >= self.MAX:
                return  # the busy ones take it in turn
            self._threads += 1
            n = self._threads
        threading.Thread(target=self._run, name=f"{self._name}-{n}", daemon=True).start()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._q:
                    self._idle += 1
                    woke = self._cv.wait(30.0)
                    self._idle -= 1
                    if not woke and not self._q and self._threads > 1:
                        self._threads -= 1
                        return
                fn = self._q.popleft()
            try:
                fn()
            except BaseException:  # pragma: no cover - _complete catches its own
                _log.exception("collectived: a completion failed")


_PENDING, _DONE = 0, 1


class Work(_WorkBase):  # type: ignore[misc]
    """A collective of the collectived backend in flight (what
    ``dist.all_reduce(..., async_op=True)`` returns, and what DDP chains
    on). ``wait()`` raises the collective's own error, ``get_future()``
    gives a ``torch.futures.Future`` of its output tensors."""

    def __init__(self, pg: "ProcessGroupCollectived", handles: Sequence[Handle],
                 result: list[Any], finish: Optional[Callable[[], None]] = None) -> None:
        super().__init__()
        self._pg = pg
        self._handles = list(handles)
        self._result = result
        self._finish = finish
        self._state = _PENDING
        self._error: Optional[BaseException] = None
        self._future = torch.futures.Future()
        # What get_future() hands out: see _failing_future.
        self._out_future = _failing_future(self._future)
        self._consumed = False
        self._lock = threading.Lock()
        self._left = len(self._handles)
        pg._pin(self)
        if not self._handles:
            self._complete()
        for h in self._handles:
            h.add_done_callback(self._handle_done)

    def _handle_done(self, _h: Handle) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._pg._completer.submit(self._complete)

    def _complete(self) -> None:
        """Once every handle is done: run the finishing step (copies into
        the caller's tensors), then settle the future. Whoever comes first
        (a waiter, the completion thread) does it; the other finds it done."""
        with self._lock:
            if self._state == _DONE:
                return
            err: Optional[BaseException] = None
            for h in self._handles:
                if h._error is not None:
                    err = h._error
                    break
            if err is None and self._finish is not None:
                try:
                    self._finish()
                except BaseException as e:  # a copy failed: the caller's to see
                    err = e
            self._error = err
            self._state = _DONE
        if err is not None:
            self._future.set_exception(err)
        else:
            self._future.set_result(self._result)
        self._pg._settled(self)

    def wait(self, timeout: Any = None) -> bool:
        """Wait for the collective (at most ``timeout``, a timedelta; by
        default the client's bound, which the daemon's own TIMEOUT always
        beats); raise its error, of its own class, or return True."""
        self._consumed = True
        t = _seconds(timeout)
        for h in self._handles:
            if not h.done():
                try:
                    h.wait(t)
                except CollectivedError:
                    if not h.done():
                        raise  # a wait that ran out: the call is still in flight
        self._complete()
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> Any:
        """A ``torch.futures.Future`` completed with the output tensors (a
        list), or failed with the collective's error: as torch carries
        errors through C++, a RuntimeError whose message begins with the
        error's class (``TrainerLostError: ...``); ``wait()`` raises the
        error itself."""
        self._consumed = True
        if self._state == _DONE:
            self._pg._settled(self)
        return self._out_future

    def is_completed(self) -> bool:
        """Whether the collective has ended (well or not)."""
        return self._state == _DONE

    def is_success(self) -> bool:
        """Whether the collective has ended without an error."""
        return self._state == _DONE and self._error is None

    def result(self) -> list[Any]:
        """The output tensors."""
        return self._result

    def synchronize(self) -> None:
        """Nothing to do: CPU tensors only."""

    def exception(self) -> Optional[BaseException]:
        """The collective's error once it has ended, else None."""
        return self._error


class ProcessGroupCollectived(dist.ProcessGroup):  # type: ignore[misc]
    """torch.distributed's process group over the node's collectived daemon.

    Made by ``collectived.torch.init_process_group()`` (or by
    ``dist.init_process_group("collectived")``); its rank and size are the
    daemon's world rank and world size. :attr:`client` is its
    :class:`~collectived.Client` (made with ``shapes=True``: calls of the
    same count in other shapes fail with MismatchError on every rank).
    """

    def __init__(self, client: Client, timeout: Optional[float] = None) -> None:
        super().__init__(client.rank, client.size)
        #: The group's connection to the daemon.
        self.client = client
        self._timeout = timeout
        self._completer = _Completer("collectived-torch")
        # Collectives leave in the order they were made, several-call
        # ones (coalesced) together.
        self._issue = threading.Lock()
        self._pins: dict[int, Work] = {}
        self._pins_lock = threading.Lock()

    # ------------------------------------------------------------ bookkeeping

    def _pin(self, w: Work) -> None:
        with self._pins_lock:
            self._pins[id(w)] = w
            if len(self._pins) > 4096:
                # Works ended and never waited for nor asked for their
                # future: whoever made them dropped them.
                for k in [k for k, v in self._pins.items()
                          if v._state == _DONE and not v._consumed][:1024]:
                    del self._pins[k]

    def _settled(self, w: Work) -> None:
        if w._consumed:
            with self._pins_lock:
                self._pins.pop(id(w), None)

    def _work(self, handles: Sequence[Handle], result: list[Any],
              finish: Optional[Callable[[], None]] = None) -> Work:
        return Work(self, handles, result, finish)

    # ------------------------------------------------------------ names

    def getBackendName(self) -> str:
        """``"collectived"``."""
        return BACKEND

    def name(self) -> str:
        """``"collectived"``."""
        return BACKEND

    def shutdown(self) -> None:
        """Close the group's client (``collectived.torch.destroy_process_group`` does)."""
        self.client.close()

    # ------------------------------------------------------------ collectives

    def allreduce(self, tensors: Any, opts: Any = None) -> Work:
        """``dist.all_reduce``: SUM, AVG (float types), PRODUCT, MIN, MAX."""
        t = _single(tensors, "all_reduce")
        op = _red(opts)
        buf, back = _contiguous(t)
        with self._issue:
            h = self.client.allreduce_async(buf, op=op)
        return self._work([h], [t], back)

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> Work:
        """``dist.all_reduce_coalesced``: one allreduce per tensor, one Work."""
        op = _red(opts)
        ts = [_cpu(t, "all_reduce_coalesced") for t in tensors]
        bufs = [_contiguous(t) for t in ts]
        with self._issue:
            hs = [self.client.allreduce_async(b, op=op) for b, _ in bufs]
        backs = [bk for _, bk in bufs if bk is not None]

        def finish() -> None:
            for bk in backs:
                bk()
        return self._work(hs, ts, finish if backs else None)

    def broadcast(self, tensors: Any, opts: Any = None) -> Work:
        """``dist.broadcast``; any element type (as bytes where not a number type)."""
        t = _single(tensors, "broadcast")
        root = _root(opts, self.size(), "broadcast")
        buf, back = _contiguous(t)
        with self._issue:
            h = self.client.broadcast_async(_wire(buf), root)
        return self._work([h], [t], back)

    def reduce(self, tensors: Any, opts: Any = None) -> Work:
        """``dist.reduce``: the reduction lands in rank ``dst``'s tensor only."""
        t = _single(tensors, "reduce")
        root = _root(opts, self.size(), "reduce")
        op = _red(opts)
        buf, back = _contiguous(t)
        with self._issue:
            h = self.client.reduce_async(buf, root, op=op)
        return self._work([h], [t], back)

    def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Work:
        """``dist.all_gather``: rank i's tensor into ``output_tensors[i]``."""
        t = _single(input_tensors, "all_gather")
        if len(output_tensors) != 1:
            raise UsageError(f"all_gather: one output list per process, got {len(output_tensors)}")
        outs = list(output_tensors[0])
        n = t.numel()
        if len(outs) != self.size():
            raise UsageError(f"all_gather: the output list has {len(outs)} tensors; the world "
                             f"has {self.size()} ranks")
        for i, o in enumerate(outs):
            _cpu(o, "all_gather")
            if o.dtype != t.dtype or o.numel() != n:
                raise UsageError(f"all_gather: output {i} is {o.dtype} of {o.numel()} elements; "
                                 f"the input is {t.dtype} of {n}")
        buf, _ = _contiguous(t)
        flat = torch.empty(self.size() * n, dtype=t.dtype)

        def finish() -> None:
            for i, o in enumerate(outs):
                o.copy_(flat[i * n:(i + 1) * n].view(o.shape))
        with self._issue:
            h = self.client.allgather_async(_wire(buf), out=_wire(flat))
        return self._work([h], [outs], finish)

    def _allgather_base(self, output: Any, input: Any, opts: Any = None) -> Work:
        """``dist.all_gather_into_tensor``: every rank's ``input``, rank 0's
        first, into ``output`` (``size`` times as many elements)."""
        _cpu(input, "all_gather_into_tensor")
        _cpu(output, "all_gather_into_tensor")
        if output.dtype != input.dtype or output.numel() != self.size() * input.numel():
            raise UsageError(f"all_gather_into_tensor: output is {output.dtype} of "
                             f"{output.numel()} elements; want {input.dtype} of world size "
                             f"{self.size()} x {input.numel()}")
        buf, _ = _contiguous(input)
        out, back = _contiguous(output)
        with self._issue:
            h = self.client.allgather_async(_wire(buf), out=_wire(out))
        return self._work([h], [output], back)

    def reduce_scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Work:
        """``dist.reduce_scatter``: the reduction of every rank's
        ``input_list[i]`` into rank i's ``output`` (blocks may differ in size)."""
        out = _single(output_tensors, "reduce_scatter")
        if len(input_tensors) != 1:
            raise UsageError(f"reduce_scatter: one input list per process, got {len(input_tensors)}")
        ins = list(input_tensors[0])
        if len(ins) != self.size():
            raise UsageError(f"reduce_scatter: the input list has {len(ins)} tensors; the world "
                             f"has {self.size()} ranks")
        for i, x in enumerate(ins):
            _cpu(x, "reduce_scatter")
            if x.dtype != out.dtype:
                raise UsageError(f"reduce_scatter: input {i} is {x.dtype}, the output {out.dtype}")
        counts = [x.numel() for x in ins]
        if out.numel() != counts[self.rank()]:
            raise UsageError(f"reduce_scatter: the output holds {out.numel()} elements; this "
                             f"rank's input block has {counts[self.rank()]}")
        op = _red(opts)
        flat = torch.cat([x.reshape(-1) for x in ins]) if ins else torch.empty(0, dtype=out.dtype)
        o, back = _contiguous(out)
        with self._issue:
            if len(set(counts)) <= 1:
                h = self.client.reduce_scatter_async(flat, out=o.reshape(-1), op=op)
            else:
                h = self.client.reduce_scatterv_async(flat, counts, out=o.reshape(-1), op=op)
        return self._work([h], [out], back)

    def _reduce_scatter_base(self, output: Any, input: Any, opts: Any = None) -> Work:
        """``dist.reduce_scatter_tensor``: the reduction of ``input``
        (``size`` blocks), this rank's block into ``output``."""
        _cpu(input, "reduce_scatter_tensor")
        _cpu(output, "reduce_scatter_tensor")
        if output.dtype != input.dtype or input.numel() != self.size() * output.numel():
            raise UsageError(f"reduce_scatter_tensor: input is {input.dtype} of {input.numel()} "
                             f"elements; want {output.dtype} of world size {self.size()} x "
                             f"{output.numel()}")
        op = _red(opts)
        buf, _ = _contiguous(input)
        o, back = _contiguous(output)
        with self._issue:
            h = self.client.reduce_scatter_async(buf.reshape(-1), out=o.reshape(-1), op=op)
        return self._work([h], [output], back)

    def barrier(self, opts: Any = None) -> Work:
        """``dist.barrier``."""
        with self._issue:
            h = self.client.barrier_async()
        return self._work([h], [])

    # ------------------------------------------------------------ not (yet)

    def alltoall(self, *args: Any, **kw: Any) -> Work:
        """Not supported yet (raises :class:`~collectived.UnsupportedError`)."""
        raise _unsupported("all_to_all")

    def alltoall_base(self, *args: Any, **kw: Any) -> Work:
        """Not supported yet."""
        raise _unsupported("all_to_all_single")

    def gather(self, *args: Any, **kw: Any) -> Work:
        """Not supported yet (all_gather does it, on every rank)."""
        raise _unsupported("gather")

    def scatter(self, *args: Any, **kw: Any) -> Work:
        """Not supported yet (broadcast does it, with every rank's part)."""
        raise _unsupported("scatter")

    def send(self, *args: Any, **kw: Any) -> Work:
        """Not supported: collectived has collectives only."""
        raise _unsupported("send (point-to-point)")

    def recv(self, *args: Any, **kw: Any) -> Work:
        """Not supported: collectived has collectives only."""
        raise _unsupported("recv (point-to-point)")

    def recv_anysource(self, *args: Any, **kw: Any) -> Work:
        """Not supported: collectived has collectives only."""
        raise _unsupported("recv (point-to-point)")

    def monitored_barrier(self, *args: Any, **kw: Any) -> Work:
        """Not supported (``barrier`` is bounded anyway, and the daemon's
        TIMEOUT names the ranks that did not come)."""
        raise _unsupported("monitored_barrier (barrier is bounded and names latecomers)")


# ------------------------------------------------------------ tensor helpers


def _cpu(t: Any, what: str) -> Any:
    if not isinstance(t, torch.Tensor):
        raise UsageError(f"{what}: expected a tensor, got {type(t).__name__}")
    if not t.is_cpu:
        raise UsageError(f"{what}: the tensor is on {t.device}; the collectived backend takes "
                         "CPU tensors (copy it with .cpu(), or use NCCL for GPU tensors)")
    return t


def _single(tensors: Any, what: str) -> Any:
    if isinstance(tensors, torch.Tensor):
        return _cpu(tensors, what)
    if len(tensors) != 1:
        raise UsageError(f"{what}: the collectived backend takes one tensor per process, "
                         f"got {len(tensors)}")
    return _cpu(tensors[0], what)


def _contiguous(t: Any) -> tuple[Any, Optional[Callable[[], None]]]:
    """``t`` itself if contiguous, else a contiguous copy and what copies
    the result back."""
    if t.is_contiguous():
        return t, None
    c = t.contiguous()
    return c, lambda: t.copy_(c)


def _wire(t: Any) -> Any:
    """A tensor for data movement (broadcast, allgather): itself if the
    daemon carries its type, else its bytes (bool, int16, complex, ...)."""
    if t.dtype in _NUMERIC:
        return t
    return t.reshape(-1).view(torch.uint8)


def _red(opts: Any) -> str:
    """torch's reduce op (in ``opts``, or a ReduceOp) as the client's name."""
    R = dist.ReduceOp
    op = R.SUM if opts is None else getattr(opts, "reduceOp", opts)
    for name, k in (("sum", "SUM"), ("avg", "AVG"), ("prod", "PRODUCT"), ("min", "MIN"),
                    ("max", "MAX")):
        if hasattr(R, k) and op == getattr(R, k):
            return name
    label = next((k for k in dir(R) if k.isupper() and _eq(op, getattr(R, k))), str(op))
    raise _unsupported(f"reduce op {label} (it has SUM, AVG, PRODUCT, MIN and MAX)")


def _eq(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return False


def _root(opts: Any, size: int, what: str) -> int:
    root = int(getattr(opts, "rootRank", 0)) if opts is not None else 0
    if getattr(opts, "rootTensor", 0):
        raise UsageError(f"{what}: one tensor per process; rootTensor must be 0")
    if not 0 <= root < size:
        raise UsageError(f"{what}: root rank {root} outside the world of {size}")
    return root


# ------------------------------------------------------------ the store


class WorldStore(dist.Store):  # type: ignore[misc]
    """The store ``collectived.torch.init_process_group`` hands torch (no
    server, no port): its keys are this process's own, except that ``add``
    of a nonzero amount sums the amount over the world (an allreduce
    through the daemon; every rank must make the same adds), which is all
    torch's initialization barrier asks of a store. After initialization a
    nonzero ``add`` means torch is making a subgroup: it raises the
    "subgroups not supported" error at once, on the ranks left out of the
    subgroup too (torch 1.13 has them wait in such a barrier). A key never
    set here raises rather than waits: no one else can set it."""

    def __init__(self, client: Client) -> None:
        super().__init__()
        self._client = client
        self._keys: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self.sealed = False

    def set(self, key: str, value: Any) -> None:
        """Set ``key`` in this process."""
        with self._lock:
            self._keys[key] = value.encode() if isinstance(value, str) else bytes(value)

    def get(self, key: str) -> bytes:
        """``key``'s value (set in this process)."""
        with self._lock:
            if key in self._keys:
                return self._keys[key]
        raise _missing(key)

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` summed over the world (0: this process's value)."""
        if amount:
            if self.sealed:
                raise _subgroups_error()
            a = array.array("q", [int(amount)])
            self._client.allreduce(a, name=f"store:{key}"[:200])
            amount = a[0]
        with self._lock:
            v = int(self._keys.get(key, b"0")) + int(amount)
            self._keys[key] = str(v).encode()
        return v

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        """Compare and set, in this process."""
        exp = expected.encode() if isinstance(expected, str) else bytes(expected)
        des = desired.encode() if isinstance(desired, str) else bytes(desired)
        with self._lock:
            cur = self._keys.get(key)
            if (cur is None and not exp) or cur == exp:
                self._keys[key] = des
                return des
            return cur if cur is not None else exp

    def wait(self, keys: Any, timeout: Any = None) -> None:
        """Return if every key is set here; else raise (no one else can set them)."""
        with self._lock:
            missing = [k for k in keys if k not in self._keys]
        if missing:
            raise _missing(missing[0])

    def check(self, keys: Any) -> bool:
        """Whether every key is set here."""
        with self._lock:
            return all(k in self._keys for k in keys)

    def delete_key(self, key: str) -> bool:
        """Delete ``key`` here."""
        with self._lock:
            return self._keys.pop(key, None) is not None

    def num_keys(self) -> int:
        """Keys set here."""
        with self._lock:
            return len(self._keys)

    def set_timeout(self, timeout: Any) -> None:
        """Nothing waits here: ignored."""


def _missing(key: str) -> CollectivedError:
    return UnsupportedError(
        f"the collectived backend's store has no key {key!r}: its keys are each process's "
        "own (there is no store server), so what another rank sets cannot be read here. "
        "Subgroups and store-based rendezvous of other libraries need a store of their own")


# ------------------------------------------------------------ registration and init

_state_lock = threading.Lock()
_pending: Optional[Client] = None     # handed by init_process_group to _create
_default: Optional[ProcessGroupCollectived] = None


def _create(store: Any, rank: int, size: int, timeout: Any) -> ProcessGroupCollectived:
    """The creator torch calls for ``init_process_group("collectived")``."""
    global _pending, _default
    if dist.is_initialized():
        raise _subgroups_error()
    with _state_lock:
        client, _pending = _pending, None
    if client is None:
        # dist.init_process_group("collectived", ...) called directly (say,
        # with torchrun's env://): connect as collectived.torch's own
        # init_process_group would, then check torch's rank is the daemon's.
        client = connect()
        if (client.rank, client.size) != (rank, size):
            msg = (f"torch.distributed was given rank {rank} of {size}, but this trainer is "
                   f"world rank {client.rank} of {client.size} of the collectived daemons "
                   f"(node {client.node_rank} of {client.node_count}, local rank "
                   f"{client.local_rank} of {client.local_size}); ranks come from the daemon: "
                   "call collectived.torch.init_process_group() instead")
            client.close()
            raise UsageError(msg)
    pg = ProcessGroupCollectived(client, _seconds(timeout) if timeout is not None else None)
    _default = pg
    return pg


def register() -> None:
    """Register the ``"collectived"`` backend with torch.distributed
    (idempotent; importing ``collectived.torch`` does it)."""
    with _state_lock:
        if hasattr(dist.Backend, BACKEND.upper()):
            return
        kw: dict[str, Any] = {}
        try:
            if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
                kw["devices"] = ["cpu"]
        except (TypeError, ValueError):  # pragma: no cover - no signature
            pass
        dist.Backend.register_backend(BACKEND, _create, **kw)


def connect(socket: Optional[str] = None, *, job: Optional[str] = None,
            local_rank: Optional[int] = None, timeout: Optional[float] = None,
            rank_retry: float = 10.0, label: str = "") -> Client:
    """The Client a process group uses: ``shapes=True``; the local rank
    is ``local_rank``, else ``$LOCAL_RANK`` (torchrun's), else the lowest free
    one; torchrun's ``$LOCAL_WORLD_SIZE``, when set, must be the daemon's
    trainers per node, and ``$WORLD_SIZE`` that or the daemons' world size."""
    env = os.environ
    if local_rank is None:
        local_rank = int(env["LOCAL_RANK"]) if env.get("LOCAL_RANK", "") != "" else -1
    c = Client(socket, job=job, local_rank=local_rank, timeout=timeout, rank_retry=rank_retry,
               shapes=True, label=label or f"torch pid {os.getpid()}")
    try:
        _check_launcher(c, env)
    except BaseException:
        c.close()
        raise
    return c


def _check_launcher(c: Client, env: Any) -> None:
    """torchrun's variables, where set, against the daemons' world: one
    torchrun per node (``--nnodes 1``: its world is the node's trainers) or
    one over all nodes (its world is the daemons')."""
    lws = env.get("LOCAL_WORLD_SIZE", "")
    if lws != "" and int(lws) != c.local_size:
        raise UsageError(
            f"$LOCAL_WORLD_SIZE is {lws} (torchrun's --nproc-per-node), but the collectived "
            f"daemon serves {c.local_size} trainers per node (its job.local_size): start "
            f"torchrun with --nproc-per-node {c.local_size}")
    ws = env.get("WORLD_SIZE", "")
    if ws != "" and int(ws) not in (c.size, c.local_size):
        raise UsageError(
            f"$WORLD_SIZE is {ws}, but the collectived daemons' world is {c.node_count} nodes x "
            f"{c.local_size} trainers = {c.size}: run one torchrun per node with "
            f"--nproc-per-node {c.local_size} (its world is then the node's), or one over all "
            f"{c.node_count} nodes")
    r = env.get("RANK", "")
    if ws != "" and int(ws) == c.size and r != "" and int(r) != c.rank:
        warnings.warn(
            f"torchrun's $RANK is {r}, but torch.distributed's rank is the daemons' world rank "
            f"{c.rank} (node {c.node_rank} x {c.local_size} + local rank {c.local_rank}): "
            "torchrun numbered the nodes in another order than the daemons' peers list. "
            "Use dist.get_rank(), not $RANK", stacklevel=3)


def init_process_group(socket: Optional[str] = None, *, job: Optional[str] = None,
                       local_rank: Optional[int] = None,
                       timeout: Optional[datetime.timedelta] = None,
                       rank_retry: float = 10.0, label: str = "") -> ProcessGroupCollectived:
    """Connect to this node's collectived daemon and make torch.distributed's
    default process group of backend ``"collectived"``; replaces
    ``dist.init_process_group(...)``. Rank and world size come from the
    daemon (:func:`connect` says how the local rank is chosen; under
    torchrun, ``$LOCAL_RANK``). ``timeout``: the bound of every wait
    (default: the client's, from the daemon's timeouts). Returns the group."""
    global _pending
    register()
    t = timeout.total_seconds() if timeout is not None else None
    client = connect(socket, job=job, local_rank=local_rank, timeout=t, rank_retry=rank_retry,
                     label=label)
    store = WorldStore(client)
    with _state_lock:
        _pending = client
    try:
        dist.init_process_group(BACKEND, store=store, rank=client.rank, world_size=client.size,
                                timeout=timeout or datetime.timedelta(seconds=client.timeout))
    except BaseException:
        with _state_lock:
            _pending = None
        client.close()
        raise
    store.sealed = True
    # dist.destroy_process_group() tells the group nothing: close the
    # connection at exit at the latest, cleanly (the daemon then never
    # takes the end for a crash).
    atexit.register(client.close)
    assert _default is not None and _default.client is client
    return _default


def destroy_process_group() -> None:
    """``dist.destroy_process_group()`` and close the group's client."""
    global _default
    pg, _default = _default, None
    if dist.is_initialized():
        dist.destroy_process_group()
    if pg is not None:
        pg.client.close()


def default_group() -> Optional[ProcessGroupCollectived]:
    """The collectived group made by :func:`init_process_group`, if any."""
    return _default
