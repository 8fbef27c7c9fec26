"""The connection's lane (docs/PROTOCOL.md, LANE): one page of shared
memory where a small call and its answer meet instead of crossing the
socket.

On a socket, a small call's answer reaches the caller through the
client's reader thread: the daemon's write wakes that thread, which wakes
the caller waiting on its event, two thread wake-ups a call. On the lane
the caller itself watches a counter (a load, with the GIL released) for a
short while after it puts its call there, and takes the answer at once.
If the answer is slower than that, the caller says it sleeps
(``c_parked``) and waits on its event; the daemon then rings the socket
(``WAKE_CLIENT``) and the reader thread takes the answer instead.

The shared words need sequentially consistent atomics, which Python does
not have: they come from the ``_lanewords`` C extension. Where it was not
built (no C compiler at install time), :data:`AVAILABLE` is False and the
client speaks protocol version 1, without a lane.
"""

from __future__ import annotations

import mmap
import threading
import time
from typing import Any, Optional

from . import _protocol as P
from .errors import ProtocolError

try:
    from . import _lanewords
except ImportError:  # built without a C compiler: no lane
    _lanewords = None  # type: ignore[assignment]

#: Whether this installation can use lanes (the C extension was built).
AVAILABLE = _lanewords is not None

SIZE = 12288
FRAME_MAX = 4096
C2D_SEQ, C2D_TAKEN, D2C_SEQ, D_PARKED, C_PARKED = 0, 64, 128, 192, 256
C2D, D2C = 4096, 8192
_MASK = 0xFFFFFFFF
#: Calls up to this many bytes of data go on the lane and poll for their
#: answer (the daemon's ipc.PollMaxBytes, the C client's POLL_MAX_BYTES):
#: a longer call outlasts the poll, which would only take CPU from the
#: daemons doing it.
POLL_MAX_BYTES = 256 << 10
#: The empty WAKE frame (id 0) that rings a daemon sleeping on the socket.
WAKE_FRAME = P.encode(P.Wake(0))


class Lane:
    """The client's side of one connection's lane. :meth:`put` is called
    with the client's send lock held; :meth:`take` may be called from any
    thread (it serializes itself)."""

    def __init__(self, mm: mmap.mmap) -> None:
        if _lanewords is None:  # pragma: no cover - the client checks AVAILABLE first
            raise RuntimeError("collectived._lanewords is not built")
        if len(mm) != SIZE:
            raise ProtocolError(f"lane mapping is {len(mm)} bytes, want {SIZE}")
        self._mm = mm
        #: The C extension's view of the lane's words. Its counts ``own``
        #: (calls put in the c2d slot) and ``seen`` (answers taken from the
        #: d2c slot) move in the same step as what they count (put_call,
        #: take_call_ok), so that a signal handled between two Python
        #: statements cannot part them; the client reads them directly.
        self.words = _lanewords.Words(mm)
        self._take_lock = threading.Lock()
        #: answers taken from the lane so far.
        self.answers = 0
        # The reader thread sleeps on the socket whenever no caller polls:
        # the daemon is to ring it. A polling caller clears the word while
        # it polls.
        self.words.store(C_PARKED, 1)

    def fits(self, frame_len: int) -> bool:
        return frame_len <= FRAME_MAX

    def free(self) -> bool:
        """Whether the daemon has taken every call put on the lane (only
        then may anything but WAKE go on the socket)."""
        return self.words.load(C2D_TAKEN) == self.words.own

    def wait_free(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for :meth:`free`."""
        deadline = time.monotonic() + timeout
        taken = self.words.load(C2D_TAKEN)
        while taken != self.words.own:
            if time.monotonic() >= deadline:
                return False
            taken = self.words.poll(C2D_TAKEN, taken, 1_000_000)
        return True

    def put(self, prefix: bytes, data: Any) -> bool:
        """Put a CALL frame (``prefix`` and its inline ``data``) in the c2d
        slot and publish it. Returns whether the daemon sleeps on the
        socket, in which case the caller must send :data:`WAKE_FRAME`."""
        n, m = len(prefix), len(data)
        self._mm[C2D:C2D + n] = prefix
        if m:
            self._mm[C2D + n:C2D + n + m] = data
        own = (self.words.own + 1) & _MASK
        self.words.own = own
        self.words.store(C2D_SEQ, own)
        return self.words.load(D_PARKED) != 0

    def put_call(self, rid: int, op: int, red: int, root: int, name: bytes, data: Any,
                 numeric: bool, max_data: int, scratch: Any = None, segment: int = 0,
                 shape: bool = False) -> int:
        """Put a CALL of ``data`` inline, its frame built in C
        (``Words.put_call``), and publish it, saying the client watches for
        the answer (``c_parked`` 0: the caller is to call
        :meth:`take_call_ok_held` next, so the daemon need not ring). The
        caller holds the client's send lock, as for :meth:`put`, and
        :attr:`take_lock`. Returns 1 if the daemon sleeps on the
        socket (send :data:`WAKE_FRAME`), 0 if not, and -1 with nothing put
        if ``data`` is not a buffer this short way takes (not a writable
        C-contiguous buffer of a wire dtype, bytes where ``numeric``, empty,
        over ``max_data`` bytes, or too long for the slot). With ``scratch``
        (a writable mapping of the client's segment number ``segment``) the
        data is copied there and the call refers to it. With ``shape`` (a
        connection of protocol version 3) the call carries ``data``'s
        shape in the CALL extension when it has one dimension or more."""
        return int(self.words.put_call(rid, op, red, root, name, data, numeric, max_data, scratch,
                                       segment, shape))

    def poll(self, seconds: float) -> bool:
        """Watch for an answer for up to ``seconds``, then say the client
        sleeps on the socket again and look once more (so that the daemon
        either sees the sleeper and rings, or is seen; ``Words.watch_answer``).
        Returns whether an answer waits."""
        seen = self.words.seen
        return self.words.watch_answer(seen, int(seconds * 1e9)) != seen

    @property
    def take_lock(self) -> threading.Lock:
        """Held by whoever takes an answer from the d2c slot. A caller on
        the client's short way holds it from before it puts its call until
        it has taken the answer or entered the call among the requests in
        flight: the reader thread, rung by the daemon (now, or by a ring
        left over from an earlier answer), then waits for it instead of
        taking an answer that matches no request yet."""
        return self._take_lock

    def take_call_ok(self, rid: int, result: Any, seconds: float) -> tuple[int, int, int]:
        """A small call's whole wait, in C (``Words.take_call_ok``): watch
        for up to ``seconds`` as :meth:`poll` does, and if the answer is
        the plain CALL_OK of request ``rid`` with a result as long as the
        writable buffer ``result``, copy the result there and take it.
        Returns (1, generation, seq) if taken, (2, 0, 0) if something else
        waits (for :meth:`take`, whose checks name what is wrong), (0, 0,
        0) if nothing came."""
        with self._take_lock:
            return self.take_call_ok_held(rid, result, seconds)

    def take_call_ok_held(self, rid: int, result: Any, seconds: float) -> tuple[int, int, int]:
        """:meth:`take_call_ok` for a caller that holds :attr:`take_lock`."""
        got: tuple[int, int, int] = self.words.take_call_ok(rid, result, int(seconds * 1e9))
        if got[0] == 1:
            self.answers += 1
        return got

    def sleep_reader(self) -> bool:
        """Say the client sleeps on the socket again (``c_parked`` 1), as
        a watch does when it ends, then look once more: whether an answer
        is already there (the daemon, having seen the client watching, will
        not ring for it: take it), else the daemon rings when it answers."""
        self.words.store(C_PARKED, 1)
        return bool(self.words.load(D2C_SEQ) != self.words.seen)

    def take(self, max_frame: int) -> Optional[P.Message]:
        """Copy the answer out of the d2c slot and decode it, or None if
        there is none (another thread took it, or a WAKE_CLIENT crossed
        the answer). The copy is checked, never the slot: the daemon could
        change the slot under it."""
        with self._take_lock:
            return self.take_held(max_frame)

    def take_held(self, max_frame: int) -> Optional[P.Message]:
        """:meth:`take` for a caller that holds :attr:`take_lock`."""
        n, seen = self.words.load(D2C_SEQ), self.words.seen
        if n == seen:
            return None
        if n != (seen + 1) & _MASK:
            raise ProtocolError(f"lane: {(n - seen) & _MASK} answers put since the last "
                                "taken, want 1")
        self.words.seen = n
        hdr = bytes(self._mm[D2C:D2C + P.HEADER_SIZE])
        try:
            length, ftype, flags, fid = P.parse_header(hdr, max_frame)
        except P.FrameError as e:
            raise ProtocolError(f"lane: {e}") from e
        if P.HEADER_SIZE + length > FRAME_MAX:
            raise ProtocolError(f"lane: {P.TYPE_NAMES[ftype]} of {P.HEADER_SIZE + length} bytes "
                                f"does not fit the lane's {FRAME_MAX}")
        if ftype not in (P.CALL_OK, P.ERROR):
            raise ProtocolError(f"lane: {P.TYPE_NAMES[ftype]} (id {fid}): only CALL_OK and "
                                "ERROR may travel the lane")
        payload = bytes(self._mm[D2C + P.HEADER_SIZE:D2C + P.HEADER_SIZE + length])
        try:
            msg = P.decode_payload(ftype, flags, fid, payload)
        except P.FrameError as e:
            raise ProtocolError(f"lane: {P.TYPE_NAMES[ftype]} (id {fid}): {e}") from e
        self.answers += 1
        return msg

    def close(self) -> None:
        """Release the words and unmap (idempotent). A poll still under way
        in another thread keeps the mapping until it ends."""
        self.words.close()
        try:
            self._mm.close()
        except BufferError:  # a poll holds it: the garbage collector unmaps it later
            pass
