"""collectived: collective operations (allreduce, broadcast, barrier,
allgather, reduce_scatter, reduce) for trainer processes, through the
node's collectived daemon.

>>> import numpy as np, collectived
>>> with collectived.Client() as c:
...     g = np.ones(1000, dtype=np.float32)
...     c.allreduce(g)                      # in place: g is now the world's sum
...     big = c.zeros(1 << 24, "float32")   # lives in shared memory: zero copy
...     c.allreduce(big, op="max")

The core needs only the standard library; NumPy and PyTorch are used only
when the caller passes their arrays or tensors.
"""

from ._client import DEFAULT_JOB, DEFAULT_SOCKET, Client, Handle, default_wait_timeout
from ._protocol import FrameError, PROTOCOL_VERSION, TIMEOUT_MARGIN
from .errors import (
    AbortedError,
    AccessDeniedError,
    BadFDError,
    BadRequestError,
    BadSegmentError,
    BusyError,
    CollectivedError,
    CollectiveTimeoutError,
    ConnectionLostError,
    CorruptError,
    DTypeError,
    FullError,
    HandshakeError,
    InternalError,
    JobError,
    MismatchError,
    NeedsVersionError,
    PeerLostError,
    ProtocolError,
    QuotaError,
    RankRangeError,
    RankTakenError,
    SharedMemoryError,
    ShutdownError,
    TooLargeError,
    TooManyError,
    TrainerLostError,
    UnsupportedError,
    UsageError,
    VersionError,
    WaitTimeoutError,
)

__version__ = "0.1.0"

__all__ = [
    "Client", "Handle", "DEFAULT_SOCKET", "DEFAULT_JOB", "PROTOCOL_VERSION", "FrameError",
    "default_wait_timeout", "TIMEOUT_MARGIN", "CollectivedError", "ProtocolError", "HandshakeError",
    "VersionError", "JobError", "RankTakenError", "RankRangeError", "FullError",
    "AccessDeniedError", "SharedMemoryError", "QuotaError", "BadSegmentError", "BusyError",
    "BadFDError", "BadRequestError", "TooLargeError", "TooManyError", "MismatchError",
    "CollectiveTimeoutError", "PeerLostError", "TrainerLostError", "AbortedError",
    "ShutdownError", "UnsupportedError", "InternalError", "CorruptError", "ConnectionLostError",
    "WaitTimeoutError", "UsageError", "DTypeError", "NeedsVersionError",
]
