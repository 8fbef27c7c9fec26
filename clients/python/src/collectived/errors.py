"""Exceptions raised by the collectived client.

Every error the daemon sends (an ``ERROR`` frame) becomes a
:class:`CollectivedError` subclass chosen by its code, carrying the code, the
code's name and the daemon's message verbatim. Errors found by the client
itself (a broken connection, a wait that ran out, a malformed frame) use the
same base class with ``code`` set to ``None`` (or ``BAD_FRAME`` for frames).

Every one is a :class:`RuntimeError`, as torch.distributed's own failures
are: code written for PyTorch's backends (``except RuntimeError``) catches
them, and code written for collectived can still tell them apart by class
(a :class:`TrainerLostError` stays one through ``collectived.torch``).
"""

from __future__ import annotations

from typing import Any, Optional

CODE_NAMES = {
    1: "BAD_FRAME", 2: "VERSION", 3: "JOB", 4: "RANK_TAKEN", 5: "RANK_RANGE", 6: "FULL",
    7: "PERMISSION", 8: "QUOTA", 9: "BAD_SEGMENT", 10: "BUSY", 11: "BAD_FD",
    12: "BAD_REQUEST", 13: "TOO_LARGE", 14: "TOO_MANY", 15: "MISMATCH", 16: "TIMEOUT",
    17: "PEER_LOST", 18: "TRAINER_LOST", 19: "ABORTED", 20: "SHUTDOWN", 21: "UNSUPPORTED",
    22: "INTERNAL", 23: "CORRUPT",
}


class CollectivedError(RuntimeError):
    """Base of every collectived error (a :class:`RuntimeError`, as
    torch.distributed's failures are).

    Attributes:
        code: the protocol error code (``None`` for errors found client-side).
        code_name: e.g. ``"MISMATCH"`` (``"CLIENT"`` for client-side errors).
        message: the daemon's message, verbatim (or the client's).
        fatal: the daemon closed the connection after this error.
        request: a short description of the request that failed, if any.
    """

    def __init__(self, message: str, code: Optional[int] = None, *, fatal: bool = False,
                 request: str = "") -> None:
        self.code = code
        self.code_name = CODE_NAMES.get(code, f"CODE_{code}") if code is not None else "CLIENT"
        self.message = message
        self.fatal = fatal
        self.request = request
        text = f"{self.code_name}: {message}" if code is not None else message
        if request:
            text = f"{request}: {text}"
        super().__init__(text)

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep code, fatal and request across pickling (multiprocessing).
        return (_rebuild, (type(self), self.message, self.code, self.fatal, self.request))


def _rebuild(cls: type, message: str, code: Optional[int], fatal: bool,
             request: str) -> "CollectivedError":
    return cls(message, code, fatal=fatal, request=request)  # type: ignore[no-any-return]


class ProtocolError(CollectivedError):
    """A malformed frame (``BAD_FRAME``), from either side."""


class HandshakeError(CollectivedError):
    """The daemon refused the HELLO."""


class VersionError(HandshakeError):
    """``VERSION``: the daemon speaks another protocol version."""


class JobError(HandshakeError):
    """``JOB``: the HELLO named another job than the daemon's."""


class RankTakenError(HandshakeError):
    """``RANK_TAKEN``: the requested local rank is held by another process."""


class RankRangeError(HandshakeError):
    """``RANK_RANGE``: the requested local rank is outside ``[0, local_size)``."""


class FullError(HandshakeError):
    """``FULL``: every local rank of this node is taken."""


class AccessDeniedError(CollectivedError):
    """``PERMISSION``: credentials not allowed, or a request an observer may not make."""


class SharedMemoryError(CollectivedError):
    """Base of the shared-memory errors."""


class QuotaError(SharedMemoryError):
    """``QUOTA``: the connection would hold more segment bytes than its quota."""


class BadSegmentError(SharedMemoryError):
    """``BAD_SEGMENT``: unknown segment, or a range outside it."""


class BusyError(SharedMemoryError):
    """``BUSY``: the segment is used by a call in flight."""


class BadFDError(SharedMemoryError):
    """``BAD_FD``: a registered fd was refused."""


class BadRequestError(CollectivedError):
    """``BAD_REQUEST``: an invalid field in a well-formed request."""


class TooLargeError(CollectivedError):
    """``TOO_LARGE``: inline data over the inline limit."""


class TooManyError(CollectivedError):
    """``TOO_MANY``: more requests in flight than allowed."""


class MismatchError(CollectivedError):
    """``MISMATCH``: the world's calls for one collective disagree."""


class CollectiveTimeoutError(CollectivedError, TimeoutError):
    """``TIMEOUT``: the daemon's collective timeout expired."""


class PeerLostError(CollectivedError):
    """``PEER_LOST``: a node of the ring failed."""


class TrainerLostError(CollectivedError):
    """``TRAINER_LOST``: a trainer disconnected or crashed mid-collective."""


class AbortedError(CollectivedError):
    """``ABORTED``: the collective belonged to a failed ring generation."""


class ShutdownError(CollectivedError):
    """``SHUTDOWN``: the daemon is stopping."""


class UnsupportedError(CollectivedError):
    """``UNSUPPORTED``: not implemented by this daemon."""


class InternalError(CollectivedError):
    """``INTERNAL``: the daemon failed on its own side (out of file descriptors,
    memory; the message says), or a daemon bug."""


class CorruptError(CollectivedError):
    """``CORRUPT``: a frame between two nodes arrived corrupted (a checksum did
    not match); the message names the link."""


class UsageError(CollectivedError, ValueError):
    """A call the client refuses before sending anything: an argument out
    of range or inconsistent (a root outside the world, per-rank counts
    that disagree with the buffer, avg of integers, an ``out`` buffer of
    the wrong size). The message names the argument. Nothing was sent: the
    call joined no collective, and the other trainers' calls of that
    collective wait for this trainer's next call (client-side, ``code``
    None)."""


class DTypeError(UsageError, TypeError):
    """An array or tensor whose element type collectived does not carry
    (e.g. complex64, bool, int16), or one an operation does not take
    (bytes in a reduction). The message names the type and lists the
    supported ones."""


class NeedsVersionError(UnsupportedError):
    """The call needs a newer protocol version than the daemon speaks on
    this connection (an allgather, a bfloat16 array, avg, ... need version
    3; docs/PROTOCOL.md, CALL). Found by the client before sending
    (``code`` None); a daemon's own ``UNSUPPORTED`` is its base class."""


class ConnectionLostError(CollectivedError):
    """The connection to the daemon closed or failed (client-side)."""


class WaitTimeoutError(CollectivedError, TimeoutError):
    """A client-side wait ran out before the daemon answered.

    The request is still in flight: its buffer must not be touched until
    the handle completes, and the handle may be waited on again.
    """


_BY_CODE: dict[int, type[CollectivedError]] = {
    1: ProtocolError, 2: VersionError, 3: JobError, 4: RankTakenError, 5: RankRangeError,
    6: FullError, 7: AccessDeniedError, 8: QuotaError, 9: BadSegmentError, 10: BusyError,
    11: BadFDError, 12: BadRequestError, 13: TooLargeError, 14: TooManyError,
    15: MismatchError, 16: CollectiveTimeoutError, 17: PeerLostError, 18: TrainerLostError,
    19: AbortedError, 20: ShutdownError, 21: UnsupportedError, 22: InternalError,
    23: CorruptError,
}


def error_for(code: int, message: str, *, fatal: bool = False,
              request: str = "") -> CollectivedError:
    """The exception for a daemon ``ERROR`` frame (unknown codes give the base class)."""
    return _BY_CODE.get(code, CollectivedError)(message, code, fatal=fatal, request=request)
