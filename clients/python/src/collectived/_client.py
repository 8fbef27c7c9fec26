"""The collectived client: one Unix-socket connection to the node's daemon."""

from __future__ import annotations

import _thread
import array
import collections
import concurrent.futures
import itertools
import json
import logging
import math
import mmap
import operator
import os
import socket as _socket
import struct
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, TypeVar

from . import _lane
from . import _protocol as P
from ._buffers import Buffer, _from_torch, address_of, as_buffer
from .errors import (
    CollectivedError,
    ConnectionLostError,
    DTypeError,
    FullError,
    NeedsVersionError,
    ProtocolError,
    QuotaError,
    RankTakenError,
    UsageError,
    VersionError,
    WaitTimeoutError,
    error_for,
)

DEFAULT_SOCKET = "/run/collectived/collectived.sock"
#: Job name sent when neither ``job=`` nor ``$COLLECTIVED_JOB`` is given. A
#: daemon serving another job refuses it with a :class:`JobError` that names
#: both names.
DEFAULT_JOB = "default"
#: Used when the daemon's HELLO_OK reports timeout_ms = 0 (no timeout stated).
FALLBACK_TIMEOUT = 600.0
DEFAULT_CONNECT_TIMEOUT = 10.0
#: How long a small call's caller watches the lane for its answer before it
#: sleeps until the reader thread hands it over (the C client's spin).
DEFAULT_SPIN = 200e-6
_SCRATCH_MIN = 1 << 20
_T = TypeVar("_T")
_MAX_FDS = 32

_EMPTY = Buffer(memoryview(bytearray(0)), 0, 0, None)  # a barrier's buffer
_NO_RESULT = memoryview(bytearray(0))  # where a shared-memory call's (empty) answer data goes
_NOT_SHORT = object()  # Client._short_call: not a call for the short way
_SHORT_MAX = _lane.FRAME_MAX - P.HEADER_SIZE - P.CALL_FIXED_SIZE  # the most data it can take
REDUCE_OPS = {"sum": P.RED_SUM, "prod": P.RED_PROD, "max": P.RED_MAX, "min": P.RED_MIN,
              "avg": P.RED_AVG}
_OP_NAMES = P.OP_NAMES
# The protocol version a call needs: its op's, dtype's and reduce op's,
# and 3 for anything in the CALL extension (docs/PROTOCOL.md, CALL).
_V3 = 3


@dataclass
class _Ext:
    """What a call carries in version 3's CALL extension (besides its
    result span, which the client adds for a shared-memory call)."""
    shape: tuple[int, ...] = ()
    counts: Optional[tuple[int, ...]] = None
    scale: Optional[tuple[float, float]] = None

    def size(self) -> int:
        return P.call_ext_size(len(self.shape), None if self.counts is None else len(self.counts),
                               self.scale is not None)


def _apply_ext(call: P.Call, ext: Optional[_Ext]) -> None:
    if ext is not None:
        call.flags |= P.CALL_EXT
        call.dims = ext.shape
        if ext.counts is not None:
            call.xflags |= P.XF_COUNTS
            call.counts = ext.counts
        if ext.scale is not None:
            call.xflags |= P.XF_SCALE
            call.prescale, call.postscale = ext.scale


# This process's id, kept by a fork hook rather than asked of the kernel on
# every request (os.getpid is a system call, a microsecond on some VMs).
_process_id = os.getpid()


def _after_fork_in_child() -> None:
    global _process_id
    _process_id = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _describe(op: int, name: str, buf: Buffer) -> str:
    """A call as errors and handles name it."""
    return f"{_OP_NAMES[op]}(name={name!r}, count={buf.count})"


def _describe_data(op: int, name: str, data: Any) -> str:
    """:func:`_describe` for a call whose data was not looked at yet."""
    try:
        return _describe(op, name, as_buffer(data))
    except (TypeError, ValueError):
        return f"{_OP_NAMES[op]}(name={name!r})"


def _reduce_op(op: str) -> int:
    if op not in REDUCE_OPS:
        raise UsageError(f"unknown reduce op {op!r} (want sum, prod, max, min or avg)")
    return REDUCE_OPS[op]


def _numeric(x: Any) -> Buffer:
    """``x`` as a buffer a reduction can take: numbers, not bytes (one-byte
    integers are int8 and uint8 here)."""
    return as_buffer(x, numeric=True)


def _rows_shape(shape: tuple[int, ...], n: int, counts: Sequence[int]) -> tuple[int, ...]:
    """The shape of ``n`` elements gathered (or scattered) in blocks of
    ``counts`` elements of an array of ``shape``: rows of its inner
    dimensions when every count is a whole number of them, else one
    dimension."""
    if len(shape) >= 2:
        k = math.prod(shape[1:])
        if k and all(c % k == 0 for c in counts):
            return (n // k, *shape[1:])
    return (n,)


def _new_like(buf: Buffer, n: int, shape: tuple[int, ...]) -> Any:
    """A new array of ``n`` elements of ``shape`` and ``buf``'s type: a
    tensor for a tensor, a NumPy array for an array, else a memoryview of
    ``buf``'s format over a new bytearray."""
    owner = buf.owner
    mod = type(owner).__module__ or ""
    if mod.startswith("torch"):
        return sys.modules["torch"].empty(shape, dtype=owner.dtype)
    if mod.startswith("numpy") or hasattr(owner, "__array_interface__"):
        import numpy as np

        return np.empty(shape, dtype=owner.dtype)
    fmt = memoryview(owner).format.lstrip("@=<")
    raw = bytearray(n * P.DTYPE_SIZES[buf.dtype])
    return raw if fmt == "B" else memoryview(raw).cast(fmt)  # type: ignore[call-overload]


def default_wait_timeout(timeout_ms: int, first_call_timeout_ms: Optional[int] = None) -> float:
    """The client's default wait for a call's answer, in seconds, from the
    daemon's HELLO_OK: long enough that the daemon's own TIMEOUT, which
    names who has not called, always arrives first (docs/PROTOCOL.md,
    Timeouts).

    With ``first_call_timeout_ms`` (a HELLO_OK of protocol version 3): the
    daemon's bound on any call, ``max(timeout_ms, first_call_timeout_ms)``,
    plus twice ``TIMEOUT_MARGIN`` (5 s). Without it (``None``: a daemon
    of version 1 or 2, which does not say how long a generation's first
    call may take): ``2 * timeout_ms`` plus two margins, or what this
    client waited before version 3 (``timeout_ms`` plus 10%, at least 5 s)
    if that is more. :data:`FALLBACK_TIMEOUT` when the HELLO_OK states no
    timeout at all (0)."""
    if first_call_timeout_ms is not None:
        bound = max(timeout_ms, first_call_timeout_ms) / 1000.0
        return FALLBACK_TIMEOUT if bound == 0 else bound + 2 * P.TIMEOUT_MARGIN
    if timeout_ms == 0:
        return FALLBACK_TIMEOUT
    t = timeout_ms / 1000.0
    return max(2 * t + 2 * P.TIMEOUT_MARGIN, t + max(5.0, 0.1 * t))


class Handle:
    """A request in flight. ``wait()`` returns its value (for collectives,
    the buffer passed in, now holding the result) or raises its error;
    ``add_done_callback()`` and ``as_future()`` learn of its end without
    a thread waiting."""

    def __init__(self, client: "Client", what: str, value: Any = None) -> None:
        self._client = client
        # Released once done: a bare lock costs far less to make than an
        # Event, and a small call makes one per call.
        self._signal = _thread.allocate_lock()
        self._signal.acquire()
        self._done = False
        self._error: Optional[BaseException] = None
        self._value = value
        self._keep: Any = None  # buffers stay alive while the request is in flight
        self._on_lane = False   # the call went on the lane: wait() watches it first
        self._held = False      # not sent yet: held behind the lane's call (Client._held)
        self._name: Optional[str] = None  # a named call's name, while in flight
        self.what = what
        #: ring generation and collective number of a completed collective.
        self.generation: Optional[int] = None
        self.seq: Optional[int] = None
        # Functions to call once done (add_done_callback); None when there
        # are none, the common case, which then costs nothing more.
        self._callbacks: Optional[list[Callable[["Handle"], Any]]] = None

    def done(self) -> bool:
        """True once the reply (or an error) has arrived."""
        return self._done

    def add_done_callback(self, fn: Callable[["Handle"], Any]) -> None:
        """Call ``fn(handle)`` once the request is done (with its value or
        its error; ``fn`` reads them with :meth:`wait`, which then returns
        at once, or :meth:`exception`). Called at once, in this thread, if
        it is done already; else in the thread that completes it: the
        client's reader thread, or a caller taking an answer from the lane.
        ``fn`` must therefore be short and must not wait for another
        request of the same client (hand such work to a thread of your
        own). What it raises is logged (logger ``collectived``) and
        dropped, as ``concurrent.futures`` does. Callbacks run in the order
        they were added. No thread is made per request: this is how to
        learn that a call ended without a waiter thread."""
        with _CALLBACK_LOCK:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        _run_callback(fn, self)

    def as_future(self) -> "concurrent.futures.Future[Any]":
        """A :class:`concurrent.futures.Future` that completes with this
        request: its ``result()`` is what :meth:`wait` returns, its
        ``exception()`` the request's error (the same exception object,
        of the same :class:`CollectivedError` subclass). It cannot be
        cancelled (the request is in flight). Made with
        :meth:`add_done_callback`: no thread waits for it."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        fut.set_running_or_notify_cancel()

        def settle(h: "Handle") -> None:
            if h._error is not None:
                fut.set_exception(h._error)
            else:
                fut.set_result(h._value)
        self.add_done_callback(settle)
        return fut

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """Wait as :meth:`wait` does, then return the request's error (None
        if it succeeded) instead of raising it. A wait that runs out still
        raises :class:`WaitTimeoutError`."""
        try:
            self.wait(timeout)
        except WaitTimeoutError:
            if not self._done:
                raise
        except BaseException:
            if self._error is None:
                raise
        return self._error

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Wait for the reply, at most ``timeout`` seconds (default: the
        client's timeout). Raises the daemon's error as a
        :class:`CollectivedError`, or :class:`WaitTimeoutError` if no reply
        came in time (the request then stays in flight)."""
        t = self._client.timeout if timeout is None else timeout
        if self._held and not self._done:
            self._client._drive(self, t)
        if self._on_lane and not self._done:
            self._client._watch_lane(t)
        if not self._done and not self._wait_signal(t):
            raise WaitTimeoutError(
                f"no reply from the daemon within {t:.3g} s; the request is still in flight "
                "and its buffer must not be touched", request=self.what)
        if self._error is not None:
            raise self._error
        return self._value

    def _wait_signal(self, t: float) -> bool:
        if not self._signal.acquire(True, min(max(t, 0.0), threading.TIMEOUT_MAX)):
            return False
        self._signal.release()  # for other waiters
        return True

    def _finish(self, value: Any = None, error: Optional[BaseException] = None) -> None:
        if self._done:  # pragma: no cover - settled once, under the client's lock
            return
        if error is not None:
            self._error = error
        elif value is not None:
            self._value = value
        with _CALLBACK_LOCK:
            self._done = True
            callbacks, self._callbacks = self._callbacks, None
        self._signal.release()
        if callbacks is not None:
            for fn in callbacks:
                _run_callback(fn, self)


# Orders add_done_callback against a handle's completion: one lock for all
# handles (a lock a handle would cost every call to make; this one is held
# for a few instructions).
_CALLBACK_LOCK = threading.Lock()
_log = logging.getLogger("collectived")


def _run_callback(fn: Callable[[Handle], Any], h: Handle) -> None:
    try:
        fn(h)
    except Exception:
        _log.exception("collectived: a done callback of %s raised", h.what)


class _Slots:
    """At most ``n`` requests in flight (HELLO_OK's max_in_flight). A
    BoundedSemaphore does the same, at several microseconds a call: this
    takes a lock when there is room and waits only when there is none."""

    def __init__(self, n: int) -> None:
        self._n = n
        self._used = 0
        self._waiting = 0
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)

    def acquire(self, timeout: float) -> bool:
        with self._lock:
            if self._used < self._n:
                self._used += 1
                return True
            deadline = time.monotonic() + timeout
            self._waiting += 1
            try:
                while self._used >= self._n:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
            finally:
                self._waiting -= 1
            self._used += 1
            return True

    def release(self) -> None:
        with self._lock:
            if self._used > 0:
                self._used -= 1
            if self._waiting:
                self._cond.notify()


@dataclass
class _Pending:
    reply_type: int
    handle: Handle
    on_ok: Callable[[Any], Any]
    cleanup: Optional[Callable[[], None]] = None


def _lane_frame_fits(name_len: int, nbytes: int) -> bool:
    """Whether a CALL with a name (and CALL extension) of ``name_len``
    bytes and ``nbytes`` of inline data fits the lane's slot."""
    return P.HEADER_SIZE + P.CALL_FIXED_SIZE + name_len + nbytes <= _lane.FRAME_MAX


@dataclass
class _Held:
    """A collective not sent yet, held behind the call on the lane."""
    rid: int
    handle: Handle
    prefix: bytes
    data: Any
    small: bool  # may take the lane


@dataclass
class _Segment:
    id: int
    size: int
    base: int
    ref: Callable[[], Optional[mmap.mmap]]  # weakref or a strong holder


@dataclass
class _Scratch:
    id: int
    size: int
    mm: mmap.mmap
    view: memoryview
    busy: bool = False


def _freeing(sc: _Scratch) -> Callable[[], None]:
    """What frees scratch segment ``sc`` for reuse once its call is settled."""
    def cleanup() -> None:
        sc.busy = False
    return cleanup


def _free_scratch(sc: Optional[_Scratch]) -> None:
    if sc is not None:
        sc.busy = False


def _from_scratch(sc: _Scratch, data: Any) -> None:
    """A call's result, in scratch segment ``sc``, copied back into its
    (C-contiguous) buffer ``data``."""
    dst = memoryview(data).cast("B")
    dst[:] = sc.view[:len(dst)]


class Client:
    """A connection to the collectived daemon of this node.

    Args:
        socket: the daemon's socket path; default ``$COLLECTIVED_SOCKET``,
            then ``/run/collectived/collectived.sock``.
        local_rank: the local rank wanted, or -1 for the lowest free one.
        job: the job name; default ``$COLLECTIVED_JOB``, then ``"default"``.
        label: free text shown in the daemon's status (at most 255 bytes).
        timeout: default seconds every wait may take; default
            (:func:`default_wait_timeout` of HELLO_OK): the larger of the
            daemon's two timeouts (collective, first call of a generation)
            plus 10 s, so the daemon's own TIMEOUT, which names who has
            not called, always comes first; against a daemon of protocol
            version 1 or 2, twice its collective timeout plus 10 s.
        connect_timeout: seconds for connect and the HELLO exchange.
        observer: attach without a rank (only :meth:`status` is allowed).
        rank_retry: seconds to keep retrying while the daemon answers
            RANK_TAKEN or FULL (default 0: fail at once). A trainer restarted
            right after its predecessor exited may need this: the daemon frees
            a rank only once it notices the old connection closed.
        no_lane: keep small calls on the socket instead of the connection's
            lane of shared memory (protocol version 2 and later), which needs the
            ``_lanewords`` extension (built with the package when a C
            compiler is there; :attr:`lane` says whether this connection has
            one).
        spin: seconds a small call's caller watches the lane for its answer
            before it sleeps until the reader thread hands it over (default
            200 µs; 0 never watches).
        shapes: on a connection of protocol version 3, send every array's
            shape with its call (default False), for the daemon to match:
            trainers whose arrays hold as many elements in other shapes
            then get MISMATCH naming both shapes. A 0-d array, and any call
            on a daemon of version 1 or 2, sends none. Without it no call
            carries a shape and calls match by count, as before version 3
            and as the Go client's do. Every trainer of a job must choose
            alike: a call with a shape matches only calls with the same
            shape, never one without.

    Calls are matched across the world by order, so issue collectives on one
    client from one thread (or serialize them); waiting on handles from
    other threads is safe. Named calls (``ordered=False``, protocol version
    4) are matched by name instead: the k-th call of name X on every
    trainer meet, in whatever order each trainer makes them. A name may be
    in flight once per client (a second call of it is refused here until
    the first is done), and an ordered call fences them: the named calls
    made before it must meet those the others made before theirs.
    Named calls travel on the socket (or in shared memory), never on the
    lane. After ``fork()`` the child must make its own
    client: using the parent's raises :class:`CollectivedError`.
    """

    def __init__(self, socket: Optional[str] = None, *, local_rank: int = -1,
                 job: Optional[str] = None, label: str = "", timeout: Optional[float] = None,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT, observer: bool = False,
                 rank_retry: float = 0.0, no_lane: bool = False,
                 spin: float = DEFAULT_SPIN, shapes: bool = False) -> None:
        if spin < 0:
            raise ValueError(f"spin is {spin} s; want 0 (never watch the lane) or more")
        self.path = socket or os.environ.get("COLLECTIVED_SOCKET") or DEFAULT_SOCKET
        self.job = job if job is not None else os.environ.get("COLLECTIVED_JOB", DEFAULT_JOB)
        self._lock = threading.Lock()        # pending, segments, scratch, state
        self._send_lock = threading.Lock()   # one frame at a time on the socket
        # Collectives leave in the order they were made: whoever sends one
        # (a caller, or whoever sends what was held) holds this.
        self._order_lock = threading.Lock()
        # The call on the lane whose answer is due (0: none), and the
        # collectives made meanwhile, held until it is answered (_send_held).
        self._lane_rid = 0
        self._held: collections.deque[_Held] = collections.deque()
        self._pending: dict[int, _Pending] = {}
        # The named calls in flight, by name (one each: Client._claim_name).
        self._names: dict[str, Handle] = {}
        self._segments: dict[int, _Segment] = {}
        self._scratch: list[_Scratch] = []
        self._frees: collections.deque[int] = collections.deque()
        self._ids = itertools.count(2)
        self._broken: Optional[CollectivedError] = None
        self._closed = False
        self._reader: Optional[threading.Thread] = None
        self._lane: Optional[_lane.Lane] = None
        self._spin = spin
        self._pid = os.getpid()
        #: bytes written to the socket so far (frames and inline data).
        self.bytes_sent = 0
        # The newest version; a daemon that does not speak it answers
        # VERSION, and the client asks again one version lower: what an
        # older one lacks (the first-call timeout in 2, the lane too in 1)
        # it does without. A connection that never asks for a lane is
        # version 1 whatever its number.
        want_lane = _lane.AVAILABLE and not no_lane and not observer
        hello = P.Hello(1, version=P.PROTOCOL_VERSION,
                        local_rank=-1 if observer else local_rank, pid=os.getpid(),
                        job=self.job, label=label, flags=P.HELLO_OBSERVER if observer else 0)
        retry_until = time.monotonic() + rank_retry
        while True:
            try:
                ok = self._handshake(hello, connect_timeout)
                break
            except (RankTakenError, FullError):
                if time.monotonic() >= retry_until:
                    raise
                time.sleep(0.1)
            except VersionError:
                if hello.version <= P.MIN_PROTOCOL_VERSION:
                    raise
                hello.version -= 1
        self.info = ok
        self._generation = ok.generation
        # Whether calls carry their array's shape (the CALL extension).
        self._shapes = shapes and ok.version >= _V3
        self._observer = observer
        self.timeout: float = (timeout if timeout is not None else
                               default_wait_timeout(ok.timeout_ms, ok.first_call_timeout_ms))
        self._inflight = _Slots(ok.max_in_flight) if ok.max_in_flight else None
        # From now on sends give up after `timeout` (SO_SNDTIMEO); the reader
        # blocks until data arrives or close() shuts the socket down.
        self._sock.settimeout(None)
        sec = int(self.timeout)
        self._sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDTIMEO,
                              struct.pack("ll", sec, int((self.timeout - sec) * 1e6)))
        self._reader = threading.Thread(target=self._read_loop, name="collectived-reader",
                                        daemon=True)
        self._reader.start()
        if ok.version >= 2 and want_lane:
            try:
                self._open_lane(connect_timeout)
            except BaseException:
                self.close()
                raise

    def _open_lane(self, timeout: float) -> None:
        """Ask for the connection's lane (LANE) and map it."""
        h = self._request(P.Lane(0), P.LANE_OK, lambda m: None, "LANE")
        _, mm = h.wait(timeout)
        self._lane = _lane.Lane(mm)

    def _handshake(self, hello: P.Hello, connect_timeout: float) -> P.HelloOk:
        self._sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            self._sock.settimeout(connect_timeout)
            try:
                self._sock.connect(self.path)
            except OSError as e:
                raise ConnectionLostError(f"cannot connect to collectived at {self.path}: {e}") from e
            try:
                self._send(P.encode(hello))
            except OSError as e:
                # A daemon refusing our credentials answers before reading
                # anything and closes: its ERROR may be waiting to be read.
                try:
                    self._read_hello_reply(hello.version, min(connect_timeout, 1.0))
                except CollectivedError as daemon_err:
                    if daemon_err.code is not None:
                        raise daemon_err from e
                raise ConnectionLostError(f"sending HELLO to {self.path}: {e}") from e
            return self._read_hello_reply(hello.version, connect_timeout)
        except BaseException:
            self._sock.close()
            raise

    # ------------------------------------------------------------ properties

    @property
    def rank(self) -> int:
        """World rank (node_rank * local_size + local_rank); -1 for an observer."""
        return -1 if self._observer else self.info.world_rank

    @property
    def size(self) -> int:
        """World size (node_count * local_size)."""
        return self.info.world_size

    @property
    def local_rank(self) -> int:
        """Rank among this node's trainers, in ``[0, local_size)``; -1 for an observer."""
        return -1 if self._observer else self.info.local_rank

    @property
    def local_size(self) -> int:
        """Trainers per node (the daemon's ``job.local_size``)."""
        return self.info.local_size

    @property
    def node_rank(self) -> int:
        """This node's rank in the ring of daemons (its index in ``peers``)."""
        return self.info.node_rank

    @property
    def node_count(self) -> int:
        """Nodes (daemons) in the world."""
        return self.info.node_count

    @property
    def generation(self) -> int:
        """The ring generation of the last completed collective (at first,
        the one reported by HELLO_OK)."""
        return self._generation

    @property
    def inline_limit(self) -> int:
        """Largest buffer, in bytes, sent inside the CALL frame."""
        return self.info.inline_limit

    @property
    def lane(self) -> bool:
        """Whether small calls go through the connection's lane of shared
        memory (protocol version 2) rather than the socket."""
        return self._lane is not None

    @property
    def lane_answers(self) -> int:
        """Answers taken from the lane so far."""
        lane = self._lane
        return lane.answers if lane is not None else 0

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<collectived.Client rank={self.rank}/{self.size} node={self.node_rank}/"
                f"{self.node_count} local={self.local_rank}/{self.local_size} path={self.path!r}>")

    # ------------------------------------------------------------ collectives

    def allreduce(self, x: Any, op: str = "sum", *, name: str = "", prescale: float = 1.0,
                  postscale: float = 1.0, timeout: Optional[float] = None,
                  ordered: bool = True) -> Any:
        """Reduce ``x`` across the world in place and return it.

        ``x`` is a contiguous NumPy array or PyTorch CPU tensor of float32,
        float64, float16, bfloat16, int32, int64, int8 or uint8 (or a
        writable Python buffer of those). ``op`` is ``"sum"``, ``"prod"``,
        ``"max"``, ``"min"`` or ``"avg"`` (the sum divided by the world
        size; float dtypes only). ``prescale`` and ``postscale`` (float
        dtypes, sum or avg) multiply every input element before the
        reduction and every result element after it. float16, bfloat16,
        int8, uint8, avg and the scale factors need a daemon of protocol
        version 3 (:class:`NeedsVersionError` otherwise).

        ``ordered=False`` makes it a named call (protocol version 4; every
        collective takes it): matched across the world by ``name``, which
        it needs, in whatever order each trainer makes its named calls,
        rather than by order (see the class's docstring).
        """
        named = self._named(P.OP_ALLREDUCE, name, ordered)
        red = REDUCE_OPS.get(op)
        if (red is not None and red != P.RED_AVG and prescale == 1.0 and postscale == 1.0
                and self._lane is not None and not named):
            got = self._short_call(P.OP_ALLREDUCE, red, 0, name, x, True, timeout)
            if got is not _NOT_SHORT:
                return got
        buf = _numeric(x)
        red, ext = self._reduction(P.OP_ALLREDUCE, op, name, buf, prescale, postscale)
        return self._call_now(P.OP_ALLREDUCE, red, 0, name, buf, x, timeout, ext, named)

    def allreduce_async(self, x: Any, op: str = "sum", *, name: str = "", prescale: float = 1.0,
                        postscale: float = 1.0, ordered: bool = True) -> Handle:
        """Start an allreduce; ``x`` must not be touched until the handle is done."""
        named = self._named(P.OP_ALLREDUCE, name, ordered)
        buf = _numeric(x)
        red, ext = self._reduction(P.OP_ALLREDUCE, op, name, buf, prescale, postscale)
        return self._collective(P.OP_ALLREDUCE, red, 0, name, buf, x, ext, named)

    def reduce(self, x: Any, root: int, op: str = "sum", *, name: str = "",
               prescale: float = 1.0, postscale: float = 1.0,
               timeout: Optional[float] = None, ordered: bool = True) -> Any:
        """Reduce ``x`` across the world into world rank ``root``'s ``x``,
        in place; return ``x``. Elsewhere ``x`` is left as it was. Element
        types, ``op`` and the scale factors as for :meth:`allreduce`.
        Protocol version 3."""
        named = self._named(P.OP_REDUCE, name, ordered)
        buf = self._reduce_args(x, root)
        red, ext = self._reduction(P.OP_REDUCE, op, name, buf, prescale, postscale)
        return self._call_now(P.OP_REDUCE, red, root, name, buf, x, timeout, ext, named)

    def reduce_async(self, x: Any, root: int, op: str = "sum", *, name: str = "",
                     prescale: float = 1.0, postscale: float = 1.0,
                     ordered: bool = True) -> Handle:
        """Start a reduce to world rank ``root``; ``x`` must not be touched
        until the handle is done. ``wait()`` returns ``x``."""
        named = self._named(P.OP_REDUCE, name, ordered)
        buf = self._reduce_args(x, root)
        red, ext = self._reduction(P.OP_REDUCE, op, name, buf, prescale, postscale)
        return self._collective(P.OP_REDUCE, red, root, name, buf, x, ext, named)

    def _reduce_args(self, x: Any, root: int) -> Buffer:
        self._need_v3(P.OP_REDUCE, "reduce")
        self._check_root(root, "reduce")
        return _numeric(x)

    def broadcast(self, x: Any, root: int, *, name: str = "",
                  timeout: Optional[float] = None, ordered: bool = True) -> Any:
        """Overwrite ``x`` with world rank ``root``'s ``x``, in place; return it."""
        named = self._named(P.OP_BROADCAST, name, ordered)
        self._check_root(root)
        if self._lane is not None and not named:
            got = self._short_call(P.OP_BROADCAST, P.RED_NONE, root, name, x, False, timeout)
            if got is not _NOT_SHORT:
                return got
        buf = self._moved(x, P.OP_BROADCAST, name)
        return self._call_now(P.OP_BROADCAST, P.RED_NONE, root, name, buf, x, timeout,
                              self._ext(buf), named)

    def broadcast_async(self, x: Any, root: int, *, name: str = "",
                        ordered: bool = True) -> Handle:
        """Start a broadcast from world rank ``root``; ``x`` must not be
        touched until the handle is done. ``wait()`` returns ``x``."""
        named = self._named(P.OP_BROADCAST, name, ordered)
        self._check_root(root)
        buf = self._moved(x, P.OP_BROADCAST, name)
        return self._collective(P.OP_BROADCAST, P.RED_NONE, root, name, buf, x, self._ext(buf),
                                named)

    def _check_root(self, root: int, what: str = "broadcast") -> None:
        if not 0 <= root < self.size:
            raise UsageError(f"{what} root {root} outside world of {self.size} "
                             f"(world ranks 0 to {self.size - 1})")

    def allgather(self, x: Any, out: Any = None, *, name: str = "",
                  timeout: Optional[float] = None, ordered: bool = True) -> Any:
        """Gather every rank's ``x`` (all of one shape) into ``out``, rank
        0's first, and return ``out``: ``size * len(x)`` elements of
        ``x``'s type. Without ``out`` a new array (or tensor) is made, of
        shape ``(size * x.shape[0], *x.shape[1:])``. Any element type
        (one-byte ones travel as bytes). With ``x`` and ``out`` both in
        the client's shared memory (:meth:`empty`) nothing is copied; ``x``
        may then be the caller's own block of ``out`` (in place).
        Protocol version 3."""
        return self.allgather_async(x, out, name=name, ordered=ordered).wait(timeout)

    def allgather_async(self, x: Any, out: Any = None, *, name: str = "",
                        ordered: bool = True) -> Handle:
        """Start an allgather; neither ``x`` nor ``out`` may be touched
        until the handle is done. ``wait()`` returns ``out``."""
        named = self._named(P.OP_ALLGATHER, name, ordered)
        self._need_v3(P.OP_ALLGATHER, "allgather")
        buf = self._moved(x, P.OP_ALLGATHER, name)
        n = self.size * buf.count
        shape = (self.size * buf.shape[0], *buf.shape[1:]) if buf.shape else (n,)
        ob, oval = self._out_for(P.OP_ALLGATHER, name, buf, out, n, shape, False)
        return self._collective_out(P.OP_ALLGATHER, P.RED_NONE, name, buf, ob, oval,
                                    self._ext(buf), self.rank * buf.nbytes, named)

    def allgatherv(self, x: Any, counts: Sequence[int], out: Any = None, *, name: str = "",
                   timeout: Optional[float] = None, ordered: bool = True) -> Any:
        """Allgather with a count per rank: rank i gives ``counts[i]``
        elements (``len(x)`` must be ``counts[rank]``; zero allowed), and
        ``out`` gets ``sum(counts)`` elements, rank i's at offset
        ``sum(counts[:i])``. Every rank passes the same ``counts``. Without
        ``out`` a new array is made: ``(sum(counts) // k, *x.shape[1:])``
        when every count is a multiple of ``k``, the product of
        ``x.shape[1:]``, else one-dimensional. Protocol version 3."""
        return self.allgatherv_async(x, counts, out, name=name, ordered=ordered).wait(timeout)

    def allgatherv_async(self, x: Any, counts: Sequence[int], out: Any = None, *,
                         name: str = "", ordered: bool = True) -> Handle:
        """Start an allgatherv; ``x`` and ``out`` must not be touched until
        the handle is done. ``wait()`` returns ``out``."""
        named = self._named(P.OP_ALLGATHER, name, ordered)
        self._need_v3(P.OP_ALLGATHER, "allgatherv")
        buf = self._moved(x, P.OP_ALLGATHER, name)
        cs = self._counts("allgatherv", counts)
        if cs[self.rank] != buf.count:
            raise UsageError(f"allgatherv: counts[{self.rank}] (this rank's) is "
                             f"{cs[self.rank]}, but x holds {buf.count} elements")
        n = sum(cs)
        shape = _rows_shape(buf.shape, n, cs)
        ob, oval = self._out_for(P.OP_ALLGATHER, name, buf, out, n, shape, False)
        esize = P.DTYPE_SIZES[buf.dtype]
        return self._collective_out(P.OP_ALLGATHER, P.RED_NONE, name, buf, ob, oval,
                                    self._ext(buf, counts=cs), sum(cs[:self.rank]) * esize, named)

    def reduce_scatter(self, x: Any, out: Any = None, op: str = "sum", *, name: str = "",
                       prescale: float = 1.0, postscale: float = 1.0,
                       timeout: Optional[float] = None, ordered: bool = True) -> Any:
        """Reduce ``x`` (the whole vector, as many elements on every rank,
        a multiple of the world size) across the world and put block
        ``rank`` of the result, ``len(x) // size`` elements, in ``out``;
        return ``out``. Without ``out`` a new array is made (of shape
        ``(x.shape[0] // size, *x.shape[1:])`` when the first dimension
        divides, else one-dimensional). Element types, ``op`` and the
        scale factors as for :meth:`allreduce`. Protocol version 3."""
        return self.reduce_scatter_async(x, out, op, name=name, prescale=prescale,
                                         postscale=postscale, ordered=ordered).wait(timeout)

    def reduce_scatter_async(self, x: Any, out: Any = None, op: str = "sum", *, name: str = "",
                             prescale: float = 1.0, postscale: float = 1.0,
                             ordered: bool = True) -> Handle:
        """Start a reduce_scatter; ``x`` and ``out`` must not be touched
        until the handle is done. ``wait()`` returns ``out``."""
        named = self._named(P.OP_REDUCE_SCATTER, name, ordered)
        self._need_v3(P.OP_REDUCE_SCATTER, "reduce_scatter")
        buf = _numeric(x)
        red, ext = self._reduction(P.OP_REDUCE_SCATTER, op, name, buf, prescale, postscale)
        if buf.count % self.size:
            raise UsageError(f"reduce_scatter: x holds {buf.count} elements, not a multiple of "
                             f"the world size {self.size} (reduce_scatterv takes per-rank counts)")
        n = buf.count // self.size
        shape = ((buf.shape[0] // self.size, *buf.shape[1:])
                 if buf.shape and buf.shape[0] % self.size == 0 else (n,))
        ob, oval = self._out_for(P.OP_REDUCE_SCATTER, name, buf, out, n, shape, True)
        return self._collective_out(P.OP_REDUCE_SCATTER, red, name, buf, ob, oval, ext,
                                    self.rank * ob.nbytes, named)

    def reduce_scatterv(self, x: Any, counts: Sequence[int], out: Any = None, op: str = "sum", *,
                        name: str = "", prescale: float = 1.0, postscale: float = 1.0,
                        timeout: Optional[float] = None, ordered: bool = True) -> Any:
        """reduce_scatter with a block per rank of its own length: rank i
        gets ``counts[i]`` elements (zero allowed) of the reduction, from
        offset ``sum(counts[:i])``; ``sum(counts)`` must be ``len(x)``.
        Every rank passes the same ``counts``. Protocol version 3."""
        return self.reduce_scatterv_async(x, counts, out, op, name=name, prescale=prescale,
                                          postscale=postscale, ordered=ordered).wait(timeout)

    def reduce_scatterv_async(self, x: Any, counts: Sequence[int], out: Any = None,
                              op: str = "sum", *, name: str = "", prescale: float = 1.0,
                              postscale: float = 1.0, ordered: bool = True) -> Handle:
        """Start a reduce_scatterv; ``x`` and ``out`` must not be touched
        until the handle is done. ``wait()`` returns ``out``."""
        named = self._named(P.OP_REDUCE_SCATTER, name, ordered)
        self._need_v3(P.OP_REDUCE_SCATTER, "reduce_scatterv")
        buf = _numeric(x)
        red, ext = self._reduction(P.OP_REDUCE_SCATTER, op, name, buf, prescale, postscale)
        cs = self._counts("reduce_scatterv", counts)
        if sum(cs) != buf.count:
            raise UsageError(f"reduce_scatterv: counts sum to {sum(cs)}, but x holds "
                             f"{buf.count} elements")
        n = cs[self.rank]
        ob, oval = self._out_for(P.OP_REDUCE_SCATTER, name, buf, out, n,
                                 _rows_shape(buf.shape, n, (n,)), True)
        ext = ext or _Ext()
        ext.counts = cs
        return self._collective_out(P.OP_REDUCE_SCATTER, red, name, buf, ob, oval, ext,
                                    sum(cs[:self.rank]) * P.DTYPE_SIZES[buf.dtype], named)

    def barrier(self, *, name: str = "", timeout: Optional[float] = None,
                ordered: bool = True) -> None:
        """Return once every trainer of the world has entered the barrier."""
        named = self._named(P.OP_BARRIER, name, ordered)
        self._call_now(P.OP_BARRIER, P.RED_NONE, 0, name, _EMPTY, None, timeout, None, named)

    def barrier_async(self, *, name: str = "", ordered: bool = True) -> Handle:
        """Enter a barrier; the handle is done once every trainer has entered."""
        named = self._named(P.OP_BARRIER, name, ordered)
        return self._collective(P.OP_BARRIER, P.RED_NONE, 0, name, _EMPTY, None, None, named)

    # ------------------------------------------------------------ call checks

    def _named(self, op: int, name: str, ordered: bool) -> bool:
        """Whether a call is named (``ordered=False``), checked: a named
        call needs a name and a connection of protocol version 4. Refused
        here, before anything is sent."""
        if ordered:
            return False
        what = f"{_OP_NAMES[op]}(name={name!r})"
        if not name:
            raise UsageError(f"{_OP_NAMES[op]}: ordered=False makes a named call, matched "
                             "across the world by its name: give it a name= (the same on "
                             "every rank)", request=what)
        if self.info.version < P.CALL_FLAG_SINCE[P.CALL_NAMED]:
            raise NeedsVersionError(
                f"named calls (ordered=False) need protocol version 4; the daemon at "
                f"{self.path} speaks version {self.info.version} on this connection",
                request=what)
        return True

    def _claim_name(self, name: str, h: Handle) -> None:
        """Enter a named call's name among those in flight on this client,
        or refuse the call: one name may be in flight once (the daemon
        would refuse the second with BAD_REQUEST)."""
        with self._lock:
            other = self._names.get(name)
            if other is None:
                self._names[name] = h
                h._name = name
                return
        raise UsageError(f"a named call of name {name!r} is already in flight on this client "
                         f"({other.what}): wait for it before calling {name!r} again (a "
                         "name may be in flight once)", request=h.what)

    def _release_name(self, h: Handle) -> None:
        """A named call has ended (or was never sent): its name is free."""
        name, h._name = h._name, None
        if name is not None:
            with self._lock:
                if self._names.get(name) is h:
                    del self._names[name]

    def _need_v3(self, op: int, what: str) -> None:
        """A version-3 op on a connection of an older version: said here,
        before anything is sent."""
        if self.info.version < P.OP_SINCE.get(op, 1):
            raise NeedsVersionError(
                f"{what} needs protocol version 3; the daemon at {self.path} speaks version "
                f"{self.info.version} on this connection", request=what)

    def _check_dtype(self, op: int, name: str, buf: Buffer) -> None:
        since = P.DTYPE_SINCE.get(buf.dtype, 1)
        if since > self.info.version:
            raise NeedsVersionError(
                f"dtype {P.DTYPE_NAMES[buf.dtype]} needs protocol version {since}; the daemon "
                f"at {self.path} speaks version {self.info.version} on this connection",
                request=_describe(op, name, buf))

    def _moved(self, x: Any, op: int, name: str) -> Buffer:
        """``x`` as the buffer of a broadcast or allgather (any type)."""
        buf = as_buffer(x)
        self._check_dtype(op, name, buf)
        return buf

    def _reduction(self, op: int, red_name: str, name: str, buf: Buffer, prescale: float,
                   postscale: float) -> tuple[int, Optional[_Ext]]:
        """The reduce op code and CALL extension of a reduction of
        ``buf``, checked: avg and the scale factors only on floats, and
        what needs version 3 only on a version-3 connection."""
        red = _reduce_op(red_name)
        what = _describe(op, name, buf)
        self._check_dtype(op, name, buf)
        float_dt = buf.dtype in P.FLOAT_DTYPES
        if red == P.RED_AVG:
            if self.info.version < _V3:
                raise NeedsVersionError(
                    f"reduce op avg needs protocol version 3; the daemon at {self.path} speaks "
                    f"version {self.info.version} on this connection", request=what)
            if not float_dt:
                raise UsageError(f"reduce op avg needs a float dtype (float32, float64, "
                                 f"float16, bfloat16), got {P.DTYPE_NAMES[buf.dtype]}: sum the "
                                 f"integers and divide them yourself", request=what)
        scale: Optional[tuple[float, float]] = None
        if prescale != 1.0 or postscale != 1.0:
            if self.info.version < _V3:
                raise NeedsVersionError(
                    f"prescale and postscale need protocol version 3; the daemon at {self.path} "
                    f"speaks version {self.info.version} on this connection", request=what)
            if not float_dt or red not in (P.RED_SUM, P.RED_AVG):
                raise UsageError(f"prescale and postscale apply to a sum or avg of a float "
                                 f"dtype, not {P.REDUCE_NAMES[red]} of "
                                 f"{P.DTYPE_NAMES[buf.dtype]}", request=what)
            for k, v in (("prescale", prescale), ("postscale", postscale)):
                if not (math.isfinite(v) and v != 0):
                    raise UsageError(f"{k} is {v}; it must be finite and nonzero", request=what)
            scale = (float(prescale), float(postscale))
        return red, self._ext(buf, scale=scale)

    def _ext(self, buf: Buffer, counts: Optional[tuple[int, ...]] = None,
             scale: Optional[tuple[float, float]] = None) -> Optional[_Ext]:
        """What a call of ``buf`` carries in the CALL extension: its shape
        (on a version-3 connection made with ``shapes=True``; a 0-d array
        has none), and ``counts`` and ``scale`` if given. None when there
        is nothing to carry: the call then has no extension at all."""
        shape = buf.shape if self._shapes else ()
        if len(shape) > P.MAX_DIMS:
            raise UsageError(f"an array of shape {shape} has {len(shape)} dimensions; the "
                             f"protocol carries at most {P.MAX_DIMS}: reshape it, or make the "
                             "Client without shapes=True")
        if not shape and counts is None and scale is None:
            return None
        return _Ext(tuple(shape), counts, scale)

    def _counts(self, what: str, counts: Sequence[int]) -> tuple[int, ...]:
        try:
            cs = tuple(operator.index(c) for c in counts)
        except TypeError:
            raise UsageError(f"{what}: counts must be a sequence of integers, one per world "
                             f"rank, got {counts!r}") from None
        if len(cs) != self.size:
            raise UsageError(f"{what}: counts has {len(cs)} entries; the world has {self.size} "
                             "ranks, one count each")
        bad = [i for i, c in enumerate(cs) if c < 0]
        if bad:
            raise UsageError(f"{what}: counts[{bad[0]}] is {cs[bad[0]]}; counts are elements, "
                             "0 or more")
        return cs

    def _out_for(self, op: int, name: str, buf: Buffer, out: Any, n: int,
                 shape: tuple[int, ...], numeric: bool) -> tuple[Buffer, Any]:
        """The result buffer of an allgather or reduce_scatter: ``out``,
        checked (``buf``'s element type, ``n`` elements), or a new array
        like ``buf``'s of ``shape``. Returns it as a Buffer and as what
        the call returns."""
        what = _describe(op, name, buf)
        if out is None:
            out = _new_like(buf, n, shape)
        ob = as_buffer(out, what="out", numeric=numeric)
        if ob.dtype != buf.dtype:
            raise DTypeError(f"out has {P.DTYPE_NAMES[ob.dtype]} elements, x has "
                             f"{P.DTYPE_NAMES[buf.dtype]}", request=what)
        if ob.count != n:
            raise UsageError(f"out holds {ob.count} elements; the result has {n}", request=what)
        return ob, out

    def status(self, timeout: Optional[float] = None) -> dict[str, Any]:
        """The daemon's status document (STATUS), as a dict."""
        h = self._request(P.Status(0), P.STATUS_OK, lambda m: json.loads(m.json), "STATUS")
        return h.wait(timeout)  # type: ignore[no-any-return]

    # ------------------------------------------------------------ shared memory

    def empty(self, shape: int | Sequence[int], dtype: Any = "float32", *,
              register: bool = False) -> Any:
        """A NumPy array living in a shared segment of the daemon's.

        Collectives on it (or on any contiguous slice of it) send only the
        segment id and offset: no data goes through the socket. The segment
        is freed (FREE) once the array and every view of it are gone, or
        when the client closes. With ``register=True`` the client makes the
        memfd itself and passes it with REGISTER instead of asking ALLOC.
        Each array is a segment of its own, and a client may hold at most
        the daemon's ``limits.max_segments`` (default 1024) at once: for
        many small tensors, make one large array and use slices of it.
        """
        import numpy as np

        shp = (shape,) if isinstance(shape, int) else tuple(shape)
        dt = np.dtype(dtype)
        n = math.prod(shp)
        mm = self._new_segment(max(n * dt.itemsize, 1), register)
        return np.frombuffer(mm, dtype=dt, count=n).reshape(shp)

    def zeros(self, shape: int | Sequence[int], dtype: Any = "float32", *,
              register: bool = False) -> Any:
        """Like :meth:`empty`, filled with zeros."""
        a = self.empty(shape, dtype, register=register)
        a.fill(0)
        return a

    def buffer(self, nbytes: int, *, register: bool = False) -> memoryview:
        """A writable memoryview of ``nbytes`` in a shared segment (no NumPy
        needed); cast it, e.g. ``client.buffer(4 * n).cast("f")``."""
        return memoryview(self._new_segment(max(nbytes, 1), register))[:nbytes]

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Close the connection (idempotent). Requests in flight fail with
        :class:`ConnectionLostError`. The daemon frees this connection's
        segments; arrays from :meth:`empty` stay valid memory (no longer
        shared) until they are dropped."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # A graceful end: half-close and let the reader thread run until the
        # daemon closes its side, which it does once it has released this
        # trainer's local rank (at most 2 s). A clean exit is then never
        # mistaken for a crash mid-collective, and a trainer restarted at
        # once finds its rank free.
        own_thread = self._reader is threading.current_thread()
        try:
            self._sock.shutdown(_socket.SHUT_WR)
        except OSError:
            pass
        if self._reader is not None and not own_thread:
            self._reader.join(timeout=2.0)
        try:
            self._sock.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass
        if self._reader is not None and not own_thread:
            self._reader.join(timeout=5.0)
        self._fail_all(ConnectionLostError("client closed"))
        self._sock.close()
        lane, self._lane = self._lane, None
        if lane is not None:
            lane.close()
        with self._lock:
            scratch, self._scratch = self._scratch, []
            self._segments.clear()
        for s in scratch:
            s.view.release()
            try:
                s.mm.close()
            except BufferError:  # pragma: no cover - a view escaped; GC unmaps it
                pass

    # ------------------------------------------------------------ internals

    def _collective(self, op: int, red: int, root: int, name: str, buf: Buffer,
                    value: Any, ext: Optional[_Ext] = None, named: bool = False) -> Handle:
        """A collective in place (allreduce, broadcast, reduce, barrier).
        ``named``: with the NAMED flag (checked by :meth:`_named`); such a
        call never takes the lane, which carries ordered calls only."""
        nb = len(name.encode("utf-8"))
        if nb > P.MAX_NAME_LEN:
            raise UsageError(f"call name is {nb} bytes, limit {P.MAX_NAME_LEN}")
        what = _describe(op, name, buf)
        call = P.Call(0, op, buf.dtype if op != P.OP_BARRIER else 0, red, buf.count, root, name,
                      flags=P.CALL_NAMED if named else 0)
        _apply_ext(call, ext)
        xl = ext.size() if ext is not None else 0
        small = buf.nbytes <= _lane.POLL_MAX_BYTES and not named  # may take the lane
        h = Handle(self, what, value)
        if named:
            self._claim_name(name, h)  # before a scratch segment is taken: nothing to undo
        seg = self._find_segment(buf) if buf.nbytes else None
        cleanup: Optional[Callable[[], None]] = None
        copy_back: Optional[memoryview] = None
        if seg is not None:
            call.flags, call.segment, call.offset = call.flags | P.CALL_SHM, seg[0], seg[1]
        elif buf.nbytes <= self.info.inline_limit and (
                self._lane is None or not small or _lane_frame_fits(nb + xl, buf.nbytes)):
            call.data = buf.view
            copy_back = buf.view
        else:
            # Over the inline limit, or a small call whose frame would not
            # fit the lane's slot: its data goes through a scratch segment,
            # and the call on the lane (docs/TUNING.md, sections 18, 29).
            try:
                sc, cleanup = self._copy_to_scratch(buf)
            except BaseException:
                self._release_name(h)
                raise
            call.flags, call.segment, call.offset = call.flags | P.CALL_SHM, sc.id, 0
        scratch_back = (buf.view, sc, 0) if call.flags & P.CALL_SHM and seg is None else None
        self._send_collective(call, h, self._on_call_ok(h, copy_back, scratch_back), cleanup,
                              (buf.owner, value), small)
        return h

    def _send_collective(self, call: P.Call, h: Handle, on_ok: Callable[[Any], Any],
                         cleanup: Optional[Callable[[], None]], keep: Any, small: bool) -> None:
        """Send a collective (:meth:`_request`); a named one's name is
        freed if it could not be sent."""
        try:
            self._request(call, P.CALL_OK, on_ok, h.what, handle=h, cleanup=cleanup, keep=keep,
                          lane=small)
        except BaseException:
            if h._name is not None and not h._done:
                with self._lock:
                    sent = any(p.handle is h for p in self._pending.values())
                if not sent:
                    self._release_name(h)
            raise

    def _on_call_ok(self, h: Handle, copy_back: Optional[memoryview],
                    scratch_back: Optional[tuple[memoryview, _Scratch, int]],
                    in_place: bool = True) -> Callable[[Any], Any]:
        """What CALL_OK does for a call: check its result and put it in
        place (``copy_back``: the inline buffer, or the result's for an
        allgather or reduce_scatter, not ``in_place``; ``scratch_back``:
        the caller's buffer, the scratch segment the result is in and its
        offset there)."""
        def on_ok(m: P.CallOk) -> Any:
            self._generation = m.generation
            h.generation, h.seq = m.generation, m.seq
            if copy_back is not None:
                if len(m.result) != len(copy_back):
                    raise ProtocolError(f"CALL_OK result is {len(m.result)} bytes, " + (
                        f"the call sent {len(copy_back)}" if in_place else
                        f"the call's result has {len(copy_back)}"), request=h.what)
                copy_back[:] = m.result
            elif len(m.result):
                raise ProtocolError(f"CALL_OK for a shared-memory call carries "
                                    f"{len(m.result)} result bytes", request=h.what)
            elif scratch_back is not None:
                dst, sc, off = scratch_back
                dst[:] = sc.view[off:off + len(dst)]
            return h._value
        return on_ok

    def _collective_out(self, op: int, red: int, name: str, buf: Buffer, out: Buffer,
                        value: Any, ext: Optional[_Ext], own_at: int,
                        named: bool = False) -> Handle:
        """An allgather or reduce_scatter: ``buf`` in, the result into
        ``out``. ``own_at`` is the byte offset of the caller's own block
        in ``out`` (allgather) or in ``buf`` (reduce_scatter), where an
        empty span of the other side goes (the one overlap the protocol
        allows). Zero copy when both sides lie in the client's segments;
        else inline if both fit, else through a scratch segment for
        whichever side does not. ``named``: as for :meth:`_collective`."""
        nb = len(name.encode("utf-8"))
        if nb > P.MAX_NAME_LEN:
            raise UsageError(f"call name is {nb} bytes, limit {P.MAX_NAME_LEN}")
        what = _describe(op, name, buf)
        call = P.Call(0, op, buf.dtype, red, buf.count, 0, name,
                      flags=P.CALL_NAMED if named else 0)
        _apply_ext(call, ext or _Ext())
        xl = (ext or _Ext()).size()
        in_seg = self._find_segment(buf) if buf.nbytes else None
        out_seg = self._find_segment(out) if out.nbytes else None
        cleanup: Optional[Callable[[], None]] = None
        copy_back: Optional[memoryview] = None
        scratch_back: Optional[tuple[memoryview, _Scratch, int]] = None
        limit = self.info.inline_limit
        h = Handle(self, what, value)
        claimed = False
        inline = not buf.nbytes and not out.nbytes  # nothing to carry: inline, empty
        if not inline and ((in_seg is None and buf.nbytes) or (out_seg is None and out.nbytes)):
            inline = (buf.nbytes <= limit and out.nbytes <= limit
                      and P.CALL_FIXED_SIZE + nb + xl + buf.nbytes <= self.info.max_frame)
            if inline:
                call.data, copy_back = buf.view, out.view
            else:
                in_room = 0 if in_seg is not None else -(-buf.nbytes // 8) * 8
                if named:  # claimed before the scratch segment: a refusal leaves nothing to undo
                    self._claim_name(name, h)
                    claimed = True
                try:
                    sc = self._take_scratch(max(1, in_room + (0 if out_seg is not None
                                                              else out.nbytes)))
                except BaseException:
                    self._release_name(h)
                    raise
                cleanup = _freeing(sc)
                if in_seg is None and buf.nbytes:
                    sc.view[:buf.nbytes] = buf.view
                    in_seg = (sc.id, 0)
                if out_seg is None and out.nbytes:
                    out_seg = (sc.id, in_room)
                    scratch_back = (out.view, sc, in_room)
        if named and not claimed:
            self._claim_name(name, h)
        if not inline:
            # Shared memory. An empty side lies at the caller's own block of
            # the other, so that the spans overlap only as allowed.
            if in_seg is None and out_seg is not None:
                in_seg = (out_seg[0], out_seg[1] + own_at)
            if out_seg is None and in_seg is not None:
                out_seg = (in_seg[0], in_seg[1] + own_at)
            assert in_seg is not None and out_seg is not None
            call.flags |= P.CALL_SHM
            call.segment, call.offset = in_seg
            call.xflags |= P.XF_OUT
            call.out_segment, call.out_offset = out_seg
        self._send_collective(call, h, self._on_call_ok(h, copy_back, scratch_back, False),
                              cleanup, (buf.owner, out.owner, value),
                              max(buf.nbytes, out.nbytes) <= _lane.POLL_MAX_BYTES and not named)
        return h

    def _short_call(self, op: int, red: int, root: int, name: str, x: Any, numeric: bool,
                    timeout: Optional[float]) -> Any:
        """The shortest way for the commonest call, an allreduce or
        broadcast of at most 256 KiB waited for at once with nothing else in
        flight: its frame is built and put on the lane in C
        (``Lane.put_call``; its data inline if it fits the slot, else copied
        into the scratch segment, unless the client has segments of its
        own), and its answer taken in C (``Lane.take_call_ok``). It makes
        no handle and enters no request in flight unless the answer is not
        the plain one taken within the spin (then ``_enter_short`` does,
        before the reader thread can take it). Each of the general path's
        steps costs a microsecond or more in Python (docs/TUNING.md,
        section 31).
        Returns ``x``, or ``_NOT_SHORT`` with nothing sent if the call is
        not one for this way (the general path takes it, and says what is
        wrong with it, if anything)."""
        lane = self._lane
        if lane is None or self._spin <= 0 or self._frees or _process_id != self._pid:
            return _NOT_SHORT
        data = x
        if type(x).__module__.startswith("torch") and hasattr(x, "is_contiguous"):
            data = _from_torch(x)[0]  # a tensor has no buffer interface; its NumPy view has
        n = getattr(data, "nbytes", 0)  # NumPy's arrays say; put_call looks at every buffer
        sc: Optional[_Scratch] = None
        if n > _SHORT_MAX:
            # Too long for the slot: through a scratch segment, as the
            # general path copies it, unless the client has segments of its
            # own, which the general path refers to in place (zero copy).
            if n > _lane.POLL_MAX_BYTES or self._segments or self._pending or self._lane_rid:
                return _NOT_SHORT
            sc = self._take_scratch(n)
        nb = name.encode("utf-8") if name else b""
        spin = self._spin if timeout is None else min(self._spin, timeout)
        slots = self._inflight
        if slots is not None and not slots.acquire(0.0):
            _free_scratch(sc)
            return _NOT_SHORT
        # Every step from here is inside the try, so that a KeyboardInterrupt
        # between any two of them leaves the client in order (_short_interrupted);
        # slot says whether the in-flight slot (and the scratch segment, if
        # any, while busy) are still this call's to give back.
        rid, slot = 0, True
        with lane.take_lock:
            own, seen = lane.words.own, lane.words.seen
            try:
                with self._lock:
                    if not (self._pending or self._held or self._lane_rid or self._closed
                            or self._broken is not None):
                        rid = self._lane_rid = next(self._ids)
                if not rid:
                    slot = False
                    self._release_slot()
                    _free_scratch(sc)
                    return _NOT_SHORT
                with self._send_lock:
                    self._wait_lane_free(lane)
                    if sc is None:
                        put = lane.put_call(rid, op, red, root, nb, data, numeric,
                                            self.info.inline_limit, None, 0, self._shapes)
                    else:
                        put = lane.put_call(rid, op, red, root, nb, data, numeric,
                                            _lane.POLL_MAX_BYTES, sc.view, sc.id, self._shapes)
                    if put > 0:
                        self._sock.sendall(_lane.WAKE_FRAME)
                        self.bytes_sent += len(_lane.WAKE_FRAME)
                if put < 0:
                    self._end_lane_call(rid)
                    slot = False
                    self._release_slot()
                    _free_scratch(sc)
                    return _NOT_SHORT
                code, gen, _ = lane.take_call_ok_held(rid, data if sc is None else _NO_RESULT, spin)
                if code == 1:
                    self._end_lane_call(rid)
                    if sc is not None:
                        _from_scratch(sc, data)
                        sc.busy = False
                    slot = False
                    self._release_slot()
                    self._generation = gen
                    return x
                slot = False  # the call's now, once entered: settling it gives the slot back
                h = self._enter_short(rid, op, name, data, x, sc)
            except CollectivedError:  # the wait for the lane broke the connection, and says why
                if slot:
                    self._release_slot()
                    _free_scratch(sc)
                raise
            except (OSError, ValueError) as e:  # ValueError: the lane was closed under us
                if slot:
                    self._release_slot()
                    _free_scratch(sc)
                what = _describe_data(op, name, data)
                lost = ConnectionLostError(f"sending {what} to {self.path}: {e}", request=what)
                self._fail_all(lost)
                raise lost from e
            except BaseException:  # KeyboardInterrupt, from a signal handled between two steps
                self._short_interrupted(lane, own, seen, rid, slot, op, name, data, x, sc)
                raise
        if code == 2:
            try:
                self._take_lane()
            except CollectivedError as e:
                self._break(e)
        return h.wait(timeout)

    def _short_interrupted(self, lane: _lane.Lane, own: int, seen: int, rid: int, slot: bool,
                           op: int, name: str, data: Any, x: Any,
                           sc: Optional[_Scratch]) -> None:
        """An exception from outside (KeyboardInterrupt) stopped a call on
        the short way, under the lane's take lock: leave the client as if
        the call had not begun, or had ended, or had gone the general way,
        so that the next call finds it in order (the lane's counts, which
        the C extension moves with the frames, say which). A call put and
        not answered is entered, and the client says it sleeps, so that
        the reader thread takes its answer when the daemon rings; an answer
        already there is taken now. ``slot``: the in-flight slot is still
        the call's to give back."""
        if lane.words.own == own or lane.words.seen != seen:  # not put, or its answer taken
            if rid:
                self._end_lane_call(rid)
            if sc is not None and sc.busy:
                if lane.words.own != own:
                    _from_scratch(sc, data)  # the answer was taken: its result is there
                sc.busy = False
            if slot:
                self._release_slot()
            return
        with self._lock:
            entered = rid in self._pending
        if not entered:
            self._enter_short(rid, op, name, data, x, sc)
        try:
            if not lane.free():  # the WAKE it needs may not have gone: one more does no harm
                with self._send_lock:
                    self._sock.sendall(_lane.WAKE_FRAME)
                    self.bytes_sent += len(_lane.WAKE_FRAME)
            if lane.sleep_reader():
                msg = lane.take_held(self.info.max_frame)
                if msg is not None:
                    self._dispatch(msg, None)
        except CollectivedError as e:
            self._break(e)
        except OSError:
            pass  # the connection is gone: the reader thread finds out, and fails the call

    def _enter_short(self, rid: int, op: int, name: str, data: Any, x: Any,
                     sc: Optional[_Scratch]) -> Handle:
        """A call on the short way whose plain answer was not taken:
        entered now among the requests in flight, as the general path's
        are, for the reader thread or the general checks to settle (the
        scratch segment ``sc`` it went through, if any, is copied back and
        freed then). Called under the lane's take lock."""
        buf = as_buffer(data)
        h = Handle(self, _describe(op, name, buf), x)
        h._keep = (data, x)
        if sc is None:
            on_ok, cleanup = self._on_call_ok(h, buf.view, None), None
        else:
            on_ok, cleanup = self._on_call_ok(h, None, (buf.view, sc, 0)), _freeing(sc)
        with self._lock:
            err = self._broken or (ConnectionLostError("client closed") if self._closed else None)
            if err is None:
                self._pending[rid] = _Pending(P.CALL_OK, h, on_ok, cleanup)
        if err is not None:
            self._release_slot()
            _free_scratch(sc)
            h._finish(error=ConnectionLostError(f"connection unusable: {err}", request=h.what))
        return h

    def _end_lane_call(self, rid: int) -> None:
        """The lane's call ``rid`` is answered (or was never put): the lane
        is free for the next, and what was held behind it goes."""
        with self._lock:
            if self._lane_rid == rid:
                self._lane_rid = 0
        if self._held:
            self._send_held()

    def _call_now(self, op: int, red: int, root: int, name: str, buf: Buffer, value: Any,
                  timeout: Optional[float], ext: Optional[_Ext] = None,
                  named: bool = False) -> Any:
        """A collective waited for at once (allreduce, broadcast, barrier).
        A small one goes on the lane by a short way of its own when it can
        (nothing else in flight, its data inline or in a segment): in
        Python every step of the general path costs microseconds, and a
        small call is little else. A named call never does: the lane
        carries ordered calls only."""
        lane = self._lane
        n = buf.nbytes
        if (lane is not None and not named and n <= _lane.POLL_MAX_BYTES and not self._pending
                and not self._frees and _process_id == self._pid):
            seg = self._find_segment(buf) if n else None
            if seg is not None or n <= self.info.inline_limit:
                got = self._lane_call(lane, op, red, root, name, buf, seg, value, ext)
                if got is not None:
                    h, rid, result, scratch = got
                    self._take_own_answer(lane, h, rid, result, buf.view, scratch,
                                          self.timeout if timeout is None else timeout)
                    return h.wait(timeout)
        return self._collective(op, red, root, name, buf, value, ext, named).wait(timeout)

    def _take_own_answer(self, lane: _lane.Lane, h: Handle, rid: int, result: memoryview,
                         dst: memoryview, scratch: Optional[_Scratch], timeout: float) -> None:
        """The caller's wait for its call on the lane: watch for the answer
        and, if it is the plain CALL_OK expected, take it in one step in C
        (``result``: where its data goes; a call through ``scratch`` is
        copied back to ``dst``) and settle the call here. Any other answer
        is taken by the general way, whose checks name what is wrong; none
        within the spin is left to the reader thread."""
        h._on_lane = False  # one watch a call
        try:
            code, gen, seq = lane.take_call_ok(rid, result, min(self._spin, timeout))
            if code == 2:
                self._take_lane()
        except CollectivedError as e:
            self._break(e)
            return
        except ValueError:
            return  # closed under us: close() failed the request
        if code != 1:
            return
        with self._lock:
            p = self._pending.pop(rid, None)
            if self._lane_rid == rid:
                self._lane_rid = 0
        if p is None:
            return  # failed meanwhile (close, a broken connection): h says so
        self._generation = h.generation = gen
        h.seq = seq
        if scratch is not None:
            dst[:] = scratch.view[:len(dst)]
        self._settle(p, value=h._value)
        if self._held:
            self._send_held()

    def _lane_call(self, lane: _lane.Lane, op: int, red: int, root: int, name: str, buf: Buffer,
                   seg: Optional[tuple[int, int]], value: Any,
                   ext: Optional[_Ext] = None
                   ) -> Optional[tuple[Handle, int, memoryview, Optional[_Scratch]]]:
        """Put a call on the lane and return its handle, request id, where
        its answer's data goes and the scratch segment it went through; or
        None if it cannot go there after all (the general path then takes
        it, and says what is wrong with it, if anything). Data that does not fit
        the lane's slot inline goes through a scratch segment, as the Go
        client's above 2 KiB (docs/TUNING.md, section 18): a copy each way
        instead of the socket both ways."""
        nb = name.encode("utf-8") if name else b""
        if len(nb) > P.MAX_NAME_LEN:
            return None
        xb = P.encode_call_ext(ext.shape, ext.counts, ext.scale) if ext is not None else b""
        head = P.HEADER_SIZE + P.CALL_FIXED_SIZE + len(nb) + len(xb)
        data: Any = b""
        sc: Optional[_Scratch] = None
        cleanup: Optional[Callable[[], None]] = None
        if seg is None and not _lane_frame_fits(len(nb) + len(xb), buf.nbytes):
            sc, cleanup = self._copy_to_scratch(buf)
            seg = (sc.id, 0)
        if seg is None:
            data, tail = buf.view, b""
        else:
            tail = P.encode_segment_ref(seg[0], seg[1])
        length = head - P.HEADER_SIZE + len(tail) + len(data)  # fits: checked above
        h = Handle(self, _describe(op, name, buf), value)
        h._keep = (buf.owner, value)
        h._on_lane = True
        if sc is not None:
            on_ok = self._on_call_ok(h, None, (buf.view, sc, 0))
        else:
            on_ok = self._on_call_ok(h, buf.view if seg is None else None, None)
        free = self._inflight is None or self._inflight.acquire(0.0)
        if free:
            with self._lock:
                free = not self._pending and self._broken is None and not self._closed
                if free:
                    rid = self._lane_rid = next(self._ids)
                    self._pending[rid] = _Pending(P.CALL_OK, h, on_ok, cleanup)
            if not free:
                self._release_slot()
        if not free:
            if cleanup is not None:
                cleanup()
            return None
        flags = (P.CALL_SHM if tail else 0) | (P.CALL_EXT if xb else 0)
        frame = P.encode_call_head(length, rid, op, buf.dtype if op != P.OP_BARRIER else 0, red,
                                   flags, root, buf.count, nb) + xb + tail
        self._sending(h.what, self._put_lane, lane, frame, data)  # fits: checked above
        return h, rid, buf.view if seg is None else _NO_RESULT, sc

    def _copy_to_scratch(self, buf: Buffer) -> tuple[_Scratch, Callable[[], None]]:
        """``buf``'s data copied into a scratch segment, and what frees the
        segment for reuse once its call is settled."""
        sc = self._take_scratch(buf.nbytes)
        sc.view[:buf.nbytes] = buf.view
        return sc, _freeing(sc)

    def _find_segment(self, buf: Buffer) -> Optional[tuple[int, int]]:
        if not self._segments:
            return None
        with self._lock:
            segs = list(self._segments.values())
        for s in segs:
            if s.ref() is None:
                continue  # dropped, FREE queued; its address range may be reused
            if s.base <= buf.address and buf.address + buf.nbytes <= s.base + s.size:
                off = buf.address - s.base
                if off % max(1, P.DTYPE_SIZES[buf.dtype]):
                    return None  # misaligned for the protocol: take the copy path
                return s.id, off
        return None

    def _take_scratch(self, nbytes: int) -> _Scratch:
        with self._lock:
            idle = [s for s in self._scratch if not s.busy and s.size >= nbytes]
            if idle:
                sc = min(idle, key=lambda s: s.size)
                sc.busy = True
                return sc
        size = max(_SCRATCH_MIN, 1 << (nbytes - 1).bit_length())
        try:
            sid, mm, real = self._alloc(size)
        except QuotaError:
            self._drop_idle_scratch()
            sid, mm, real = self._alloc(nbytes)
        sc = _Scratch(sid, real, mm, memoryview(mm), busy=True)
        with self._lock:
            self._scratch.append(sc)
        return sc

    def _drop_idle_scratch(self) -> None:
        with self._lock:
            idle = [s for s in self._scratch if not s.busy]
            self._scratch = [s for s in self._scratch if s.busy]
        for s in idle:
            self._request(P.Free(0, s.id), P.FREE_OK, lambda m: None, "FREE").wait()
            s.view.release()
            s.mm.close()

    def _alloc(self, size: int) -> tuple[int, mmap.mmap, int]:
        h = self._request(P.Alloc(0, size), P.ALLOC_OK, lambda m: m, f"ALLOC({size})")
        sid, mm = h.wait()
        return sid, mm, len(mm)

    def _register(self, size: int) -> tuple[int, mmap.mmap, int]:
        import fcntl

        fd = os.memfd_create("collectived", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
            mm = mmap.mmap(fd, size)
            h = self._request(P.Register(0, size), P.REGISTER_OK, lambda m: m.segment,
                              f"REGISTER({size})", fd=fd)
            try:
                sid = h.wait()
            except BaseException:
                mm.close()
                raise
        finally:
            os.close(fd)
        return sid, mm, size

    def _new_segment(self, size: int, register: bool) -> mmap.mmap:
        sid, mm, real = self._register(size) if register else self._alloc(size)
        view = memoryview(mm)
        base = address_of(view)
        view.release()
        me = weakref.ref(self)

        def freed(_ref: Any, sid: int = sid) -> None:
            # Runs when the last array over the mapping dies, possibly inside
            # GC on any thread: only queue the FREE; the next request sends it.
            c = me()
            if c is not None:
                c._frees.append(sid)

        with self._lock:
            self._segments[sid] = _Segment(sid, real, base, weakref.ref(mm, freed))
        return mm

    def _flush_frees(self) -> None:
        while self._frees and self._broken is None and not self._closed:
            try:
                sid = self._frees.popleft()
            except IndexError:
                return
            with self._lock:
                self._segments.pop(sid, None)
            self._request(P.Free(0, sid), P.FREE_OK, lambda m: None, f"FREE({sid})",
                          flush=False)

    def _request(self, msg: Any, reply_type: int, on_ok: Callable[[Any], Any], what: str, *,
                 handle: Optional[Handle] = None, cleanup: Optional[Callable[[], None]] = None,
                 fd: Optional[int] = None, keep: Any = None, flush: bool = True,
                 lane: bool = False) -> Handle:
        """Send a request. ``lane``: a small CALL, which may go on the lane
        if it fits and nothing else is in flight (docs/PROTOCOL.md, LANE)."""
        if _process_id != self._pid:
            # A forked child shares the parent's socket but not its reader
            # thread: any use would interleave frames with the parent's.
            raise CollectivedError(f"this Client was made in process {self._pid}; make a new "
                                   f"one in process {os.getpid()} after fork()", request=what)
        if flush and self._frees:
            self._flush_frees()
        rid = msg.id = next(self._ids)
        is_call = isinstance(msg, P.Call)
        prefix = P.encode_call_prefix(msg) if is_call else P.encode(msg)
        data = b"" if not is_call or msg.flags & P.CALL_SHM else msg.data  # a call's inline data
        h = handle or Handle(self, what)
        h._keep = keep
        if self._inflight is not None and not self._inflight.acquire(timeout=self.timeout):
            if cleanup:
                cleanup()
            raise WaitTimeoutError(f"{self.info.max_in_flight} requests already in flight "
                                   f"for {self.timeout:.3g} s", request=what)
        with self._order_lock:
            on_lane = hold = False
            with self._lock:
                err = self._broken or (ConnectionLostError("client closed") if self._closed else None)
                if err is None:
                    self._pending[rid] = _Pending(reply_type, h, on_ok, cleanup)
                    if is_call:
                        # Behind the lane's call a small call waits its turn
                        # for the lane, and any collective behind a held one.
                        # Held here, under the lock the lane's answer is
                        # taken under: whoever takes it then sees it held.
                        # (Calls are matched by order, so one held back
                        # holds up nothing another rank needs first. Were
                        # they matched by name in any order, as Horovod's
                        # are, it would have to go at once.)
                        hold = bool(self._held) or (lane and self._lane_rid != 0)
                        if hold:
                            h._held = True
                            self._held.append(_Held(rid, h, prefix, data, lane))
                        elif lane and self._lane is not None and len(self._pending) == 1:
                            on_lane = True
                            self._lane_rid = rid
            if err is not None:
                self._release_slot()
                if cleanup:
                    cleanup()
                raise ConnectionLostError(f"connection unusable: {err}", request=what) from err
            if not is_call:
                self._sending(what, self._send, prefix, None, fd)
            elif not hold:
                self._send_call(h, rid, prefix, data, on_lane)
        return h

    def _send_call(self, h: Handle, rid: int, prefix: bytes, data: Any, on_lane: bool) -> None:
        """Send a collective on the lane (``on_lane``: it was given the
        lane) if it fits there, else on the socket. The order lock is held."""
        the_lane = self._lane
        if on_lane and the_lane is not None and self._sending(h.what, self._put_lane, the_lane, prefix, data):
            h._on_lane = True
            return
        if on_lane:
            with self._lock:
                if self._lane_rid == rid:
                    self._lane_rid = 0
        self._sending(h.what, self._send, prefix, data)

    def _sending(self, what: str, send: Callable[..., _T], *args: Any) -> _T:
        """``send(*args)``; a failure to write is the connection's: every
        request fails with a ConnectionLostError naming ``what``."""
        try:
            return send(*args)
        except CollectivedError:  # the lane's wait (a TimeoutError too) broke the connection, and says why
            raise
        except (OSError, ValueError) as e:  # ValueError: the lane was closed under us
            lost = ConnectionLostError(f"sending {what} to {self.path}: {e}", request=what)
            self._fail_all(lost)
            raise lost from e

    def _send_held(self) -> None:
        """The lane's call has been answered: send the collectives held
        behind it, in their order. The first takes the lane if nothing
        else is in flight, and what follows it waits for its answer in
        turn; the others go on the socket. Called by whoever took the
        answer (a caller, or the reader thread); a failure to send is the
        connection's, and fails every request."""
        with self._order_lock:
            while True:
                with self._lock:
                    if self._lane_rid or not self._held or self._closed or self._broken is not None:
                        return
                    item = self._held.popleft()
                    if item.rid not in self._pending:
                        continue  # failed meanwhile
                    on_lane = (item.small and self._lane is not None
                               and len(self._pending) - len(self._held) == 1)
                    if on_lane:
                        self._lane_rid = item.rid
                try:
                    self._send_call(item.handle, item.rid, item.prefix, item.data, on_lane)
                except CollectivedError:
                    return  # the connection broke: every request has failed
                finally:
                    item.handle._held = False
                if on_lane and item.handle._on_lane:
                    return

    def _drive(self, h: Handle, timeout: float) -> None:
        """A held call's wait: watch for the answer to the lane's call
        ahead of it and take it, which sends what was held behind it, until
        this call has left (then its own wait follows) or a watch runs out
        (the reader thread then takes the answers, and sends)."""
        deadline = time.monotonic() + timeout
        while h._held and not h._done:
            left = deadline - time.monotonic()
            if left <= 0 or not self._watch_lane(left):
                return

    def _put_lane(self, lane: _lane.Lane, prefix: bytes, data: Any) -> bool:
        """Put a call on the lane, ringing the daemon if it sleeps on the
        socket. False if it does not fit (it then goes on the socket)."""
        if not lane.fits(len(prefix) + len(data)):
            return False
        with self._send_lock:
            self._wait_lane_free(lane)
            if lane.put(prefix, data):
                self._sock.sendall(_lane.WAKE_FRAME)
                self.bytes_sent += len(_lane.WAKE_FRAME)
        return True

    def _wait_lane_free(self, lane: _lane.Lane) -> None:
        # Calls are matched in the order the daemon reads them: nothing may
        # follow a call on the lane before the daemon has taken it.
        if not lane.free() and not lane.wait_free(self.timeout):
            err = WaitTimeoutError(f"the daemon did not take the call on the lane within "
                                   f"{self.timeout:.3g} s: the connection is broken")
            self._break(err)
            raise err

    def _watch_lane(self, timeout: float) -> bool:
        """The caller's side of a call on the lane: watch for the answer
        (the spin), then take it, or leave it to the reader thread, which
        the daemon rings once the caller said it sleeps. Whether an answer
        came within the watch."""
        lane = self._lane
        if lane is None:
            return False
        try:
            if lane.poll(min(self._spin, timeout)):
                self._take_lane()
                return True
        except CollectivedError as e:
            self._break(e)
        except ValueError:
            pass  # closed under us: close() failed the request
        return False

    def _take_lane(self) -> None:
        """Take the answer on the lane, if one waits, and hand it over."""
        lane = self._lane
        if lane is None:
            raise ProtocolError("WAKE_CLIENT on a connection without a lane")
        msg = lane.take(self.info.max_frame)
        if msg is not None:
            self._dispatch(msg, None)
            if self._held:
                self._send_held()

    def _break(self, err: CollectivedError) -> None:
        """A broken connection found outside the reader thread: fail every
        request and end the reader."""
        self._fail_all(err)
        try:
            self._sock.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass

    def _send(self, frame: bytes, data: Any = None, fd: Optional[int] = None) -> None:
        with self._send_lock:
            if self._lane is not None:
                self._wait_lane_free(self._lane)
            if fd is not None:
                n = _socket.send_fds(self._sock, [frame], [fd])
                if n < len(frame):
                    self._sock.sendall(frame[n:])
            else:
                self._sock.sendall(frame)
            if data is not None and len(data):
                self._sock.sendall(data)
            self.bytes_sent += len(frame) + (len(data) if data is not None else 0)

    def _release_slot(self) -> None:
        if self._inflight is not None:
            self._inflight.release()

    def _read_hello_reply(self, version: int, timeout: float) -> P.HelloOk:
        deadline = time.monotonic() + timeout
        buf = bytearray()
        need = P.HEADER_SIZE
        hdr: Optional[tuple[int, int, int, int]] = None
        while True:
            while len(buf) < need:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WaitTimeoutError(f"no HELLO reply from {self.path} within {timeout} s")
                self._sock.settimeout(left)
                try:
                    chunk = self._sock.recv(need - len(buf))
                except _socket.timeout:
                    continue
                if not chunk:
                    raise ConnectionLostError(f"{self.path} closed the connection during HELLO")
                buf += chunk
            if hdr is None:
                try:
                    hdr = P.parse_header(buf, P.PRE_HELLO_MAX_FRAME)
                except P.FrameError as e:
                    raise ProtocolError(f"reply to HELLO: {e}") from e
                need += hdr[0]
                continue
            break
        try:
            msg = P.decode_payload(hdr[1], hdr[2], hdr[3], bytes(buf[P.HEADER_SIZE:]))
        except P.FrameError as e:
            raise ProtocolError(f"reply to HELLO: {e}") from e
        if isinstance(msg, P.Error):
            raise error_for(msg.code, msg.message, fatal=msg.fatal, request="HELLO")
        if not isinstance(msg, P.HelloOk):
            raise ProtocolError(f"daemon answered HELLO with {P.TYPE_NAMES[hdr[1]]}")
        # A later version would speak frames we did not ask for; an
        # earlier one is the daemon's to choose, and the connection
        # speaks it.
        if msg.version > version:
            raise ProtocolError(f"daemon answered HELLO of protocol version {version} in "
                                f"version {msg.version}")
        if msg.id != 1:
            raise ProtocolError(f"HELLO_OK carries id {msg.id}, HELLO had 1")
        return msg

    # ------------------------------------------------------------ reader thread

    def _read_loop(self) -> None:
        max_frame, version = self.info.max_frame, self.info.version
        rbase = max(2 * (P.HEADER_SIZE + max_frame), 1 << 16)
        status_bound = max(max_frame, P.MAX_STATUS_FRAME)
        rbuf = bytearray(rbase)
        mv = memoryview(rbuf)
        start = end = 0
        fds: collections.deque[int] = collections.deque()
        anc_size = _socket.CMSG_SPACE(_MAX_FDS * 4)
        cloexec = getattr(_socket, "MSG_CMSG_CLOEXEC", 0)  # no fd leaks into exec'd children
        err: CollectivedError
        try:
            while True:
                if end == len(rbuf):  # keep the partial frame, move it to the front
                    mv[0:end - start] = bytes(mv[start:end])
                    start, end = 0, end - start
                n, anc, flags, _ = self._sock.recvmsg_into([mv[end:]], anc_size, cloexec)
                got = 0
                for level, kind, data in anc:
                    if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                        a = array.array("i")
                        a.frombytes(data[:len(data) - len(data) % a.itemsize])
                        fds.extend(a)
                        got += len(a)
                if flags & _socket.MSG_CTRUNC and got < _MAX_FDS:
                    # Room was left: the kernel could not install an fd here.
                    raise ProtocolError("an fd the daemon sent could not be received: this "
                                        "process is out of file descriptors (MSG_CTRUNC)")
                if flags & _socket.MSG_CTRUNC:
                    raise ProtocolError("received control message truncated (MSG_CTRUNC): "
                                        "more fds than expected")
                if n == 0:
                    raise ConnectionLostError(f"daemon at {self.path} closed the connection")
                end += n
                while end - start >= P.HEADER_SIZE:
                    # STATUS_OK alone may pass max_frame, up to MAX_STATUS_FRAME.
                    bound = status_bound if mv[start + 4] == P.STATUS_OK else max_frame
                    length, ftype, fflags, fid = P.parse_header(
                        mv[start:start + P.HEADER_SIZE], bound)
                    if P.TYPE_SINCE.get(ftype, 1) > version:
                        raise ProtocolError(
                            f"{P.TYPE_NAMES[ftype]} (type 0x{ftype:02x}, id {fid}) is a protocol "
                            f"version {P.TYPE_SINCE[ftype]} frame; this connection speaks version "
                            f"{version}")
                    if end - start < P.HEADER_SIZE + length:
                        if P.HEADER_SIZE + length > len(rbuf):  # a large STATUS_OK: make room
                            grown = bytearray(P.HEADER_SIZE + length)
                            grown[0:end - start] = mv[start:end]
                            rbuf, mv = grown, memoryview(grown)
                            start, end = 0, end - start
                        break
                    payload = mv[start + P.HEADER_SIZE:start + P.HEADER_SIZE + length]
                    msg = P.decode_payload(ftype, fflags, fid, payload)
                    with_fd = ftype in (P.ALLOC_OK, P.LANE_OK)
                    fd = fds.popleft() if with_fd and fds else None
                    if with_fd and fd is None:
                        raise ProtocolError(f"{P.TYPE_NAMES[ftype]} (id {fid}) arrived without an fd")
                    if ftype == P.WAKE_CLIENT:  # decode_payload checked it is empty
                        if fid != 0:
                            raise ProtocolError(f"WAKE_CLIENT carries id {fid}, want 0")
                        self._take_lane()
                    else:
                        self._dispatch(msg, fd)
                        if self._held:
                            self._send_held()
                    payload.release()
                    start += P.HEADER_SIZE + length
                if start == end:
                    start = end = 0
                    if len(rbuf) > rbase:  # the large STATUS_OK has gone: shrink back
                        rbuf = bytearray(rbase)
                        mv = memoryview(rbuf)
        except P.FrameError as e:
            err = ProtocolError(f"from daemon at {self.path}: {e}")
        except CollectivedError as e:
            err = e
        except OSError as e:
            err = ConnectionLostError(f"reading from daemon at {self.path}: {e}")
        except BaseException as e:  # pragma: no cover - a bug; never leave waiters hanging
            err = ConnectionLostError(f"reader failed: {e!r}")
        for fd in fds:
            os.close(fd)
        if self._closed:
            err = ConnectionLostError("client closed")
        self._fail_all(err)

    def _dispatch(self, msg: Any, fd: Optional[int]) -> None:
        lane = self._lane
        if lane is not None and msg.id and msg.id == self._lane_rid and msg.id not in self._pending:
            # An answer on the socket to a call on the short way, whose
            # caller enters it among the requests in flight only once its
            # watch of the lane is over (_short_call): wait for that.
            with lane.take_lock:
                pass
        if isinstance(msg, P.Error) and (msg.id == 0 or msg.fatal):
            with self._lock:
                p = self._pending.pop(msg.id, None) if msg.id else None
            e = error_for(msg.code, msg.message, fatal=msg.fatal,
                          request=p.handle.what if p else "connection")
            if p is not None:
                self._settle(p, error=e)
            raise e
        with self._lock:
            p = self._pending.pop(msg.id, None)
            if msg.id == self._lane_rid:
                self._lane_rid = 0
        if p is None:
            if fd is not None:
                os.close(fd)
            raise ProtocolError(f"{P.TYPE_NAMES[P.type_code(msg)]} carries id {msg.id}, "
                                "which matches no request in flight")
        if isinstance(msg, P.Error):
            self._settle(p, error=error_for(msg.code, msg.message, request=p.handle.what))
            return
        if P.type_code(msg) != p.reply_type:
            err = ProtocolError(f"{P.TYPE_NAMES[P.type_code(msg)]} answers a request that "
                                f"expects {P.TYPE_NAMES[p.reply_type]}", request=p.handle.what)
            self._settle(p, error=err)
            raise err
        if fd is not None:
            if isinstance(msg, P.LaneOk) and msg.size != _lane.SIZE:
                os.close(fd)
                err = ProtocolError(f"LANE_OK gives a lane of {msg.size} bytes, want {_lane.SIZE}",
                                    request=p.handle.what)
                self._settle(p, error=err)
                raise err
            try:
                mm = mmap.mmap(fd, msg.size)
            except (OSError, ValueError) as e:
                self._settle(p, error=ConnectionLostError(
                    f"mapping segment {msg.segment} ({msg.size} bytes): {e}",
                    request=p.handle.what))
                return
            finally:
                os.close(fd)
            self._settle(p, value=(getattr(msg, "segment", 0), mm))
            return
        try:
            value = p.on_ok(msg)
        except CollectivedError as e:
            self._settle(p, error=e)
            raise
        self._settle(p, value=value)

    def _settle(self, p: _Pending, value: Any = None, error: Optional[BaseException] = None) -> None:
        if p.cleanup is not None:
            p.cleanup()
        self._release_slot()
        if p.handle._name is not None:  # before _finish: its waiter may call the name again
            self._release_name(p.handle)
        p.handle._keep = None
        p.handle._finish(value, error)

    def _fail_all(self, err: CollectivedError) -> None:
        with self._lock:
            if self._broken is None:
                self._broken = err
            pending, self._pending = self._pending, {}
            self._held.clear()
            self._lane_rid = 0
        for p in pending.values():
            self._settle(p, error=err)
