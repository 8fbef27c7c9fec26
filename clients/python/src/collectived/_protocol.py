"""Frames of the collectived client protocol (docs/PROTOCOL.md).

Pure encoding and decoding: no sockets here. The codec knows every frame
type up to protocol version 4 (LANE, LANE_OK, WAKE and WAKE_CLIENT are
version 2; version 3 adds ``first_call_timeout_ms`` to HELLO_OK, whose
layout therefore depends on its version; version 4 keeps version 3's
layouts and adds the CALL flag NAMED). The client asks for version 4
(:data:`PROTOCOL_VERSION`), and for an older one when the daemon refuses it.

Every decode failure raises :class:`FrameError` whose ``check`` names the
rule that failed, using the names of ``clients/testdata/README.md``
(``frame_too_long``, ``unknown_type``, ``reserved_nonzero``, ``bad_flags``,
``bad_magic``, ``payload_length``, ``inline_data_length``, ``bad_version``), plus two that
no vector pins because the daemon treats them as request errors rather than
broken frames: ``bad_dtype`` (an inline CALL with an unknown dtype and a
nonzero count) and ``bad_utf8`` (a string that is not UTF-8). Version 3
adds ``bad_ndim`` (a CALL shape of more than 8 dimensions).

Version 3's CALL extension (``CALL_EXT``: shape, per-rank counts, scale
factors, a result span) is encoded and decoded here too; which calls may
carry it, and what a daemon of an older version says, is the client's
business.

Version 4's NAMED flag (a call matched by its name, in any order) is a
bit of CALL's flags; before version 4 it is undefined (``bad_flags``).
That a named call needs a name is a request rule (the daemon's
``BAD_REQUEST``), not checked here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable, Optional, Union

PROTOCOL_VERSION = 4
#: The oldest protocol version the client still speaks.
MIN_PROTOCOL_VERSION = 1
#: The slack on the daemon's timeout bound (docs/PROTOCOL.md, Timeouts):
#: its TIMEOUT reaches a waiting trainer within the bound plus this many
#: seconds. The same number as the Go ``ipc.TimeoutMargin`` and the C client.
TIMEOUT_MARGIN = 5.0
MAGIC = b"CLVD"
HEADER_SIZE = 16
PRE_HELLO_MAX_FRAME = 4096
# A STATUS_OK payload may be this long whatever max_frame is (the status of
# the largest worlds is megabytes); no other frame may pass max_frame.
MAX_STATUS_FRAME = 8 << 20
MAX_NAME_LEN = 255
MAX_ERROR_MESSAGE = 4096

HELLO, HELLO_OK = 0x01, 0x81
ALLOC, ALLOC_OK = 0x02, 0x82
FREE, FREE_OK = 0x03, 0x83
REGISTER, REGISTER_OK = 0x04, 0x84
CALL, CALL_OK = 0x05, 0x85
STATUS, STATUS_OK = 0x06, 0x86
LANE, LANE_OK = 0x10, 0x90         # version 2
WAKE, WAKE_CLIENT = 0x11, 0x91     # version 2
# The protocol version that introduced each type; the others are version 1.
TYPE_SINCE = {LANE: 2, LANE_OK: 2, WAKE: 2, WAKE_CLIENT: 2}
ERROR = 0xFF

TYPE_NAMES = {
    HELLO: "HELLO", HELLO_OK: "HELLO_OK", ALLOC: "ALLOC", ALLOC_OK: "ALLOC_OK",
    FREE: "FREE", FREE_OK: "FREE_OK", REGISTER: "REGISTER", REGISTER_OK: "REGISTER_OK",
    CALL: "CALL", CALL_OK: "CALL_OK", STATUS: "STATUS", STATUS_OK: "STATUS_OK",
    LANE: "LANE", LANE_OK: "LANE_OK", WAKE: "WAKE", WAKE_CLIENT: "WAKE_CLIENT",
    ERROR: "ERROR",
}

FLAG_FATAL = 0x01          # header flag of ERROR
HELLO_OBSERVER = 0x0001    # HELLO payload flag
CALL_SHM = 0x01            # CALL payload flag: the buffer is in a segment
CALL_EXT = 0x02            # CALL payload flag: the extension follows the name (version 3)
CALL_NAMED = 0x04          # CALL payload flag: matched by name, in any order (version 4)
#: The protocol version that introduced each CALL payload flag (SHM: 1).
CALL_FLAG_SINCE = {CALL_EXT: 3, CALL_NAMED: 4}
# The extension's xflags (version 3).
XF_COUNTS, XF_SCALE, XF_OUT = 0x01, 0x02, 0x04
#: The most dimensions a CALL's shape may have.
MAX_DIMS = 8

# Collective codes (same numbers as the Go package `collective`).
OP_ALLREDUCE, OP_BROADCAST, OP_ALLGATHER, OP_BARRIER = 1, 2, 3, 4
OP_REDUCE_SCATTER, OP_REDUCE = 5, 6                          # version 3
DT_FLOAT32, DT_FLOAT64, DT_INT32, DT_INT64, DT_BYTES = 1, 2, 3, 4, 5
DT_FLOAT16, DT_BFLOAT16, DT_INT8, DT_UINT8 = 6, 7, 8, 9      # version 3
RED_NONE, RED_SUM, RED_PROD, RED_MAX, RED_MIN = 0, 1, 2, 3, 4
RED_AVG = 5                                                  # version 3
DTYPE_SIZES = {0: 0, DT_FLOAT32: 4, DT_FLOAT64: 8, DT_INT32: 4, DT_INT64: 8, DT_BYTES: 1,
               DT_FLOAT16: 2, DT_BFLOAT16: 2, DT_INT8: 1, DT_UINT8: 1}
OP_NAMES = {OP_ALLREDUCE: "allreduce", OP_BROADCAST: "broadcast", OP_ALLGATHER: "allgather",
            OP_BARRIER: "barrier", OP_REDUCE_SCATTER: "reduce_scatter", OP_REDUCE: "reduce"}
DTYPE_NAMES = {0: "none", DT_FLOAT32: "float32", DT_FLOAT64: "float64", DT_INT32: "int32",
               DT_INT64: "int64", DT_BYTES: "bytes", DT_FLOAT16: "float16",
               DT_BFLOAT16: "bfloat16", DT_INT8: "int8", DT_UINT8: "uint8"}
REDUCE_NAMES = {RED_NONE: "none", RED_SUM: "sum", RED_PROD: "prod", RED_MAX: "max",
                RED_MIN: "min", RED_AVG: "avg"}
FLOAT_DTYPES = frozenset((DT_FLOAT32, DT_FLOAT64, DT_FLOAT16, DT_BFLOAT16))
# The protocol version that introduced each code; the others are version 1
# (allgather's code is version 1's, but only version 3 daemons serve it).
OP_SINCE = {OP_ALLGATHER: 3, OP_REDUCE_SCATTER: 3, OP_REDUCE: 3}
DTYPE_SINCE = {DT_FLOAT16: 3, DT_BFLOAT16: 3, DT_INT8: 3, DT_UINT8: 3}
REDUCE_SINCE = {RED_AVG: 3}

_HDR = struct.Struct("<IBBHQ")
_HELLO_FIXED = struct.Struct("<4sHHiI")
_HELLO_OK = struct.Struct("<HHIIIIIIIIIIQQ")  # versions 1 and 2; 3 (and 4) add a u64
_HELLO_OK_SIZES = {1: _HELLO_OK.size, 2: _HELLO_OK.size, 3: _HELLO_OK.size + 8,
                   4: _HELLO_OK.size + 8}
_U64 = struct.Struct("<Q")
_U16 = struct.Struct("<H")
_SEG_SIZE = struct.Struct("<IIQ")
_SEG = struct.Struct("<II")
_CALL_FIXED = struct.Struct("<BBBBIQB")
_CALL_HEAD = struct.Struct("<IBBHQBBBBIQB")  # header and CALL's fixed fields: one pack
_CALL_OK = struct.Struct("<IIQ")
_EXT_HEAD = struct.Struct("<BBH")   # ndim, xflags, reserved; then ndim u64 dims
_COUNTS_HEAD = struct.Struct("<II")  # ncounts, reserved; then ncounts u64 counts
_SCALE = struct.Struct("<dd")        # prescale, postscale
_ERROR = struct.Struct("<HH")


class FrameError(ValueError):
    """A frame that breaks the protocol. ``check`` names the broken rule."""

    def __init__(self, check: str, detail: str) -> None:
        super().__init__(f"{check}: {detail}")
        self.check = check


@dataclass
class Hello:
    id: int
    local_rank: int = -1
    pid: int = 0
    job: str = ""
    label: str = ""
    flags: int = 0
    version: int = PROTOCOL_VERSION
    magic: str = "CLVD"
    frame_flags: int = 0


@dataclass
class HelloOk:
    id: int
    version: int
    world_rank: int
    world_size: int
    node_rank: int
    node_count: int
    local_rank: int
    local_size: int
    inline_limit: int
    max_frame: int
    max_in_flight: int
    generation: int
    shm_quota: int
    timeout_ms: int
    #: Version 3 and later: the daemon's timeout for the first collective of a
    #: ring generation. None in a HELLO_OK of version 1 or 2, which has no
    #: such field (and must not be given one to encode).
    first_call_timeout_ms: Optional[int] = None
    frame_flags: int = 0


@dataclass
class Alloc:
    id: int
    size: int
    frame_flags: int = 0


@dataclass
class AllocOk:
    id: int
    segment: int
    size: int
    frame_flags: int = 0


@dataclass
class Free:
    id: int
    segment: int
    frame_flags: int = 0


@dataclass
class FreeOk:
    id: int
    frame_flags: int = 0


@dataclass
class Register:
    id: int
    size: int
    frame_flags: int = 0


@dataclass
class RegisterOk:
    id: int
    segment: int
    size: int
    frame_flags: int = 0


@dataclass
class Call:
    """One collective call. With ``flags & CALL_SHM`` the buffer is
    (``segment``, ``offset``); otherwise ``data`` holds it inline.

    With ``flags & CALL_EXT`` (version 3) the extension follows the name:
    ``dims`` (the shape, ``()``: none), ``xflags``, and as ``xflags``
    says ``counts`` (COUNTS: the per-rank counts of the "v" forms),
    ``prescale`` and ``postscale`` (SCALE) and, on a shared-memory call,
    ``out_segment`` and ``out_offset`` (OUT: the result's span; an inline
    call with OUT has no such block). The fields are the shared vectors'
    (clients/testdata/README.md). Without ``CALL_EXT`` they stay empty.

    With ``flags & CALL_NAMED`` (version 4) the call is matched by its
    ``name`` (which must then not be empty) in whatever order each
    trainer makes its named calls, instead of by order."""

    id: int
    op: int
    dtype: int
    reduce: int
    count: int
    root: int = 0
    name: str = ""
    flags: int = 0
    segment: int = 0
    offset: int = 0
    data: bytes | bytearray | memoryview = b""
    frame_flags: int = 0
    xflags: int = 0
    dims: tuple[int, ...] | list[int] = ()
    counts: Optional[tuple[int, ...] | list[int]] = None
    prescale: float = 0.0
    postscale: float = 0.0
    out_segment: int = 0
    out_offset: int = 0

    @property
    def named(self) -> bool:
        """Whether the call has the NAMED flag (version 4)."""
        return bool(self.flags & CALL_NAMED)

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape (``dims``), as a tuple."""
        return tuple(self.dims)

    @property
    def scale(self) -> Optional[tuple[float, float]]:
        """(prescale, postscale) if the call has SCALE, else None."""
        return (self.prescale, self.postscale) if self.xflags & XF_SCALE else None

    @property
    def out(self) -> Optional[tuple[int, int]]:
        """The result's (segment, offset) of a shared-memory call with OUT."""
        if self.xflags & XF_OUT and self.flags & CALL_SHM:
            return (self.out_segment, self.out_offset)
        return None


@dataclass
class CallOk:
    id: int
    generation: int
    seq: int
    result: bytes | memoryview = b""
    frame_flags: int = 0


@dataclass
class Status:
    id: int
    frame_flags: int = 0


@dataclass
class StatusOk:
    id: int
    json: str
    frame_flags: int = 0


@dataclass
class Lane:
    """Version 2: asks for the connection's lane."""

    id: int
    frame_flags: int = 0


@dataclass
class LaneOk:
    """Version 2: the lane's size (its memfd travels with the frame)."""

    id: int
    size: int
    frame_flags: int = 0


@dataclass
class Wake:
    """Version 2: the client's ring of the lane; id is always 0."""

    id: int = 0
    frame_flags: int = 0


@dataclass
class WakeClient:
    """Version 2: the daemon's ring of the lane; id is always 0."""

    id: int = 0
    frame_flags: int = 0


@dataclass
class Error:
    id: int
    code: int
    message: str
    frame_flags: int = 0

    @property
    def fatal(self) -> bool:
        return bool(self.frame_flags & FLAG_FATAL)


Message = Union[Hello, HelloOk, Alloc, AllocOk, Free, FreeOk, Register, RegisterOk,
                Call, CallOk, Status, StatusOk, Lane, LaneOk, Wake, WakeClient, Error]

_TYPE_OF = {Hello: HELLO, HelloOk: HELLO_OK, Alloc: ALLOC, AllocOk: ALLOC_OK, Free: FREE,
            FreeOk: FREE_OK, Register: REGISTER, RegisterOk: REGISTER_OK, Call: CALL,
            CallOk: CALL_OK, Status: STATUS, StatusOk: STATUS_OK, Lane: LANE, LaneOk: LANE_OK,
            Wake: WAKE, WakeClient: WAKE_CLIENT, Error: ERROR}


# The types whose payload is empty, and their message classes.
_EMPTY: dict[int, Callable[..., Message]] = {
    FREE_OK: FreeOk, STATUS: Status, LANE: Lane, WAKE: Wake, WAKE_CLIENT: WakeClient}


def type_code(msg: Message) -> int:
    return _TYPE_OF[type(msg)]


# ---------------------------------------------------------------- encoding


def _header(length: int, ftype: int, flags: int, fid: int) -> bytes:
    return _HDR.pack(length, ftype, flags, 0, fid)


def _short_str(s: str, what: str) -> bytes:
    b = s.encode("utf-8")
    if len(b) > 255:
        raise ValueError(f"{what} is {len(b)} bytes, limit 255")
    return bytes((len(b),)) + b


def encode_call_prefix(msg: Call) -> bytes:
    """Header and CALL payload up to (not including) the inline data; the
    caller may send the data separately to avoid a copy."""
    nb = msg.name.encode("utf-8") if msg.name else b""
    if len(nb) > 255:
        raise ValueError(f"call name is {len(nb)} bytes, limit 255")
    if msg.flags & CALL_EXT:
        if msg.xflags & XF_COUNTS and msg.counts is None:
            raise ValueError("a CALL with xflags COUNTS needs counts")
        if msg.counts is not None and not msg.xflags & XF_COUNTS:
            raise ValueError("a CALL's counts need xflags COUNTS")
        ext = encode_call_ext(msg.dims, msg.counts if msg.xflags & XF_COUNTS else None,
                              (msg.prescale, msg.postscale) if msg.xflags & XF_SCALE else None,
                              bool(msg.xflags & XF_OUT), msg.xflags)
    elif (msg.dims or msg.counts is not None or msg.xflags or msg.prescale or msg.postscale
          or msg.out_segment or msg.out_offset):
        raise ValueError("a CALL's shape, counts, scale and out travel in its extension: "
                         "set flags CALL_EXT")
    else:
        ext = b""
    tail = b""
    if msg.flags & CALL_SHM:
        tail = encode_segment_ref(msg.segment, msg.offset)
        if msg.xflags & XF_OUT:
            tail += encode_segment_ref(msg.out_segment, msg.out_offset)
    length = CALL_FIXED_SIZE + len(nb) + len(ext) + len(tail) + (
        len(msg.data) if not msg.flags & CALL_SHM else 0)
    return encode_call_head(length, msg.id, msg.op, msg.dtype, msg.reduce, msg.flags, msg.root,
                            msg.count, nb, msg.frame_flags) + ext + tail


def encode_call_ext(shape: tuple[int, ...] | list[int] = (),
                    counts: Optional[tuple[int, ...] | list[int]] = None,
                    scale: Optional[tuple[float, float]] = None, out: bool = False,
                    xflags: int = 0) -> bytes:
    """A version-3 CALL's extension, from ``ndim`` through ``postscale``
    (what follows the name when flags has ``CALL_EXT``). ``out`` sets
    the OUT xflag; the out span itself follows the segment reference
    (:func:`encode_segment_ref`). ``xflags``: bits to set besides those
    the arguments imply."""
    if len(shape) > MAX_DIMS:
        raise ValueError(f"shape has {len(shape)} dimensions, limit {MAX_DIMS}")
    xflags |= ((XF_COUNTS if counts is not None else 0) | (XF_SCALE if scale is not None else 0)
               | (XF_OUT if out else 0))
    b = _EXT_HEAD.pack(len(shape), xflags, 0)
    if shape:
        b += struct.pack(f"<{len(shape)}Q", *shape)
    if counts is not None:
        b += _COUNTS_HEAD.pack(len(counts), 0)
        if counts:
            b += struct.pack(f"<{len(counts)}Q", *counts)
    if scale is not None:
        b += _SCALE.pack(*scale)
    return b


def call_ext_size(ndim: int, ncounts: Optional[int] = None, scale: bool = False) -> int:
    """Bytes of a CALL extension with ``ndim`` dimensions, ``ncounts``
    per-rank counts (None: no COUNTS) and SCALE or not."""
    return (_EXT_HEAD.size + 8 * ndim + (0 if ncounts is None else _COUNTS_HEAD.size + 8 * ncounts)
            + (_SCALE.size if scale else 0))


def result_count(op: int, count: int, world_size: int, rank: int,
                 counts: Optional[tuple[int, ...] | list[int]] = None) -> int:
    """Elements of a call's result (docs/PROTOCOL.md, the op table): for
    allgather every rank's block (``world_size * count``, or the sum of
    ``counts``), for reduce_scatter the caller's block (``count //
    world_size``, or ``counts[rank]``), for the others ``count``; 0 for a
    barrier. An inline call's CALL_OK carries this many elements."""
    if op == OP_ALLGATHER:
        return sum(counts) if counts is not None else world_size * count
    if op == OP_REDUCE_SCATTER:
        return counts[rank] if counts is not None else count // max(world_size, 1)
    return 0 if op == OP_BARRIER else count


CALL_FIXED_SIZE = _CALL_FIXED.size  # CALL's payload before its name


def encode_call_head(length: int, fid: int, op: int, dtype: int, reduce: int, flags: int,
                     root: int, count: int, name: bytes, frame_flags: int = 0) -> bytes:
    """A CALL's header, fixed fields and name (at most 255 bytes, not
    checked here), for a payload of ``length`` bytes."""
    return _CALL_HEAD.pack(length, CALL, frame_flags, 0, fid, op, dtype, reduce, flags, root,
                           count, len(name)) + name


def encode_segment_ref(segment: int, offset: int) -> bytes:
    """A shared-memory CALL's (segment, reserved, offset) after its name."""
    return _SEG_SIZE.pack(segment, 0, offset)


def encode(msg: Message) -> bytes:
    """The whole frame (header and payload) for ``msg``."""
    t = type_code(msg)
    if isinstance(msg, Hello):
        magic = msg.magic.encode("ascii")
        if len(magic) != 4:
            raise ValueError("magic must be 4 bytes")
        p = (_HELLO_FIXED.pack(magic, msg.version, msg.flags, msg.local_rank, msg.pid)
             + _short_str(msg.job, "job name") + _short_str(msg.label, "label"))
    elif isinstance(msg, HelloOk):
        p = _HELLO_OK.pack(msg.version, 0, msg.world_rank, msg.world_size, msg.node_rank,
                           msg.node_count, msg.local_rank, msg.local_size, msg.inline_limit,
                           msg.max_frame, msg.max_in_flight, msg.generation, msg.shm_quota,
                           msg.timeout_ms)
        if (msg.version >= 3) != (msg.first_call_timeout_ms is not None):
            raise ValueError(f"HELLO_OK of protocol version {msg.version} "
                             + ("needs first_call_timeout_ms" if msg.version >= 3
                                else "has no first_call_timeout_ms"))
        if msg.first_call_timeout_ms is not None:
            p += _U64.pack(msg.first_call_timeout_ms)
    elif isinstance(msg, (Alloc, Register, LaneOk)):
        p = _U64.pack(msg.size)
    elif isinstance(msg, (AllocOk, RegisterOk)):
        p = _SEG_SIZE.pack(msg.segment, 0, msg.size)
    elif isinstance(msg, Free):
        p = _SEG.pack(msg.segment, 0)
    elif isinstance(msg, (FreeOk, Status, Lane, Wake, WakeClient)):
        p = b""
    elif isinstance(msg, Call):
        prefix = encode_call_prefix(msg)
        return prefix if msg.flags & CALL_SHM else prefix + bytes(msg.data)
    elif isinstance(msg, CallOk):
        p = _CALL_OK.pack(msg.generation, 0, msg.seq) + bytes(msg.result)
    elif isinstance(msg, StatusOk):
        p = msg.json.encode("utf-8")
    elif isinstance(msg, Error):
        p = _ERROR.pack(msg.code, 0) + msg.message.encode("utf-8")
    else:  # pragma: no cover - exhaustive above
        raise TypeError(f"not a protocol message: {msg!r}")
    return _header(len(p), t, msg.frame_flags, msg.id) + p


# ---------------------------------------------------------------- decoding


def parse_header(hdr: bytes | bytearray | memoryview, max_len: int) -> tuple[int, int, int, int]:
    """Check a 16-byte header; return (length, type, flags, id).

    ``max_len`` is the current bound on ``length``: 4096 before HELLO_OK,
    then HELLO_OK's max_frame. It is checked before anything else so that
    a reader never allocates for a hostile length.
    """
    length, ftype, flags, reserved, fid = _HDR.unpack_from(hdr, 0)
    if length > max_len:
        raise FrameError("frame_too_long",
                         f"frame length {length} over the bound of {max_len} bytes")
    if ftype not in TYPE_NAMES:
        raise FrameError("unknown_type", f"unknown frame type 0x{ftype:02x}")
    if reserved:
        raise FrameError("reserved_nonzero",
                         f"{TYPE_NAMES[ftype]} header reserved field is {reserved}, must be 0")
    allowed = FLAG_FATAL if ftype == ERROR else 0
    if flags & ~allowed:
        raise FrameError("bad_flags",
                         f"{TYPE_NAMES[ftype]} header flags 0x{flags:02x} not defined")
    return length, ftype, flags, fid


def _need(p: memoryview, n: int, tname: str, what: str) -> None:
    if len(p) < n:
        raise FrameError("payload_length",
                         f"{tname} payload is {len(p)} bytes, too short for {what} ({n} bytes)")


def _exact(p: memoryview, n: int, tname: str) -> None:
    if len(p) != n:
        raise FrameError("payload_length", f"{tname} payload is {len(p)} bytes, must be {n}")


def _zero(v: int, tname: str, what: str) -> None:
    if v:
        raise FrameError("reserved_nonzero", f"{tname} {what} is {v}, must be 0")


def _utf8(b: memoryview, tname: str, what: str) -> str:
    try:
        return bytes(b).decode("utf-8")
    except UnicodeDecodeError as e:
        raise FrameError("bad_utf8", f"{tname} {what} is not UTF-8: {e}") from None


def decode_payload(ftype: int, flags: int, fid: int,
                   payload: bytes | bytearray | memoryview,
                   version: int = PROTOCOL_VERSION) -> Message:
    """Decode the payload of a frame whose header passed :func:`parse_header`,
    as on a connection of protocol ``version`` (a CALL's EXT flag is
    undefined before 3, its NAMED flag before 4).

    Byte buffers (CALL data, CALL_OK result) are returned as memoryview
    slices of ``payload``, not copies.
    """
    p = memoryview(payload).cast("B") if not isinstance(payload, memoryview) else payload
    if ftype == CALL_OK:  # the hot one first
        _need(p, _CALL_OK.size, "CALL_OK", "generation, reserved and seq")
        gen, res, seq = _CALL_OK.unpack_from(p, 0)
        _zero(res, "CALL_OK", "reserved field")
        return CallOk(fid, gen, seq, p[_CALL_OK.size:], frame_flags=flags)
    tname = TYPE_NAMES[ftype]
    if ftype == HELLO:
        _need(p, _HELLO_FIXED.size + 1, tname, "the fixed fields and job length")
        magic, version, hflags, local_rank, pid = _HELLO_FIXED.unpack_from(p, 0)
        if magic != MAGIC:
            raise FrameError("bad_magic", f"HELLO magic is {magic!r}, must be b'CLVD'")
        if hflags & ~HELLO_OBSERVER:
            raise FrameError("bad_flags", f"HELLO flags 0x{hflags:04x} not defined")
        off = _HELLO_FIXED.size
        jlen = p[off]
        _need(p, off + 1 + jlen + 1, tname, f"a {jlen}-byte job name and the label length")
        job = _utf8(p[off + 1:off + 1 + jlen], tname, "job")
        off += 1 + jlen
        llen = p[off]
        _exact(p, off + 1 + llen, tname)
        label = _utf8(p[off + 1:off + 1 + llen], tname, "label")
        return Hello(id=fid, magic="CLVD", version=version, flags=hflags, local_rank=local_rank,
                     pid=pid, job=job, label=label, frame_flags=flags)
    if ftype == HELLO_OK:
        # The version decides the layout, so it is read first.
        _need(p, 2, tname, "the version")
        (version,) = _U16.unpack_from(p, 0)
        size = _HELLO_OK_SIZES.get(version)
        if size is None:
            raise FrameError("bad_version", f"{tname} is in protocol version {version}, whose "
                             f"layout this client does not know (it speaks "
                             f"{MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION})")
        if len(p) != size:
            raise FrameError("payload_length", f"{tname} payload is {len(p)} bytes, must be "
                             f"{size} in protocol version {version}")
        f = _HELLO_OK.unpack_from(p, 0)
        _zero(f[1], tname, "reserved field")
        first = _U64.unpack_from(p, _HELLO_OK.size)[0] if version >= 3 else None
        return HelloOk(fid, f[0], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11],
                       f[12], f[13], first, frame_flags=flags)
    if ftype in (ALLOC, REGISTER):
        _exact(p, 8, tname)
        (size,) = _U64.unpack_from(p, 0)
        return (Alloc if ftype == ALLOC else Register)(fid, size, frame_flags=flags)
    if ftype in (ALLOC_OK, REGISTER_OK):
        _exact(p, _SEG_SIZE.size, tname)
        seg, res, size = _SEG_SIZE.unpack_from(p, 0)
        _zero(res, tname, "reserved field")
        return (AllocOk if ftype == ALLOC_OK else RegisterOk)(fid, seg, size, frame_flags=flags)
    if ftype == FREE:
        _exact(p, _SEG.size, tname)
        seg, res = _SEG.unpack_from(p, 0)
        _zero(res, tname, "reserved field")
        return Free(fid, seg, frame_flags=flags)
    if ftype in _EMPTY:
        _exact(p, 0, tname)
        return _EMPTY[ftype](fid, frame_flags=flags)
    if ftype == LANE_OK:
        _exact(p, 8, tname)
        (size,) = _U64.unpack_from(p, 0)
        return LaneOk(fid, size, frame_flags=flags)
    if ftype == CALL:
        return _decode_call(p, flags, fid, version)
    if ftype == STATUS_OK:
        return StatusOk(fid, _utf8(p, tname, "JSON document"), frame_flags=flags)
    # ERROR
    _need(p, _ERROR.size, tname, "code and reserved")
    code, res = _ERROR.unpack_from(p, 0)
    _zero(res, tname, "reserved field")
    msg = bytes(p[_ERROR.size:]).decode("utf-8", errors="replace")
    return Error(fid, code, msg, frame_flags=flags)


def _decode_call(p: memoryview, flags: int, fid: int, version: int = PROTOCOL_VERSION) -> Call:
    _need(p, _CALL_FIXED.size, "CALL", "the description")
    op, dtype, red, cflags, root, count, nlen = _CALL_FIXED.unpack_from(p, 0)
    if cflags & ~(CALL_SHM | CALL_EXT | CALL_NAMED):
        raise FrameError("bad_flags", f"CALL flags 0x{cflags:02x} not defined")
    if cflags & CALL_NAMED and version < CALL_FLAG_SINCE[CALL_NAMED]:
        raise FrameError("bad_flags", f"CALL flag NAMED on a connection of protocol version "
                         f"{version} (named calls are version 4's)")
    off = _CALL_FIXED.size
    _need(p, off + nlen, "CALL", f"a {nlen}-byte name")
    name = _utf8(p[off:off + nlen], "CALL", "name")
    off += nlen
    shape: tuple[int, ...] = ()
    counts: Optional[tuple[int, ...]] = None
    scale = (0.0, 0.0)
    xflags = 0
    if cflags & CALL_EXT:
        if version < 3:
            raise FrameError("bad_flags", f"CALL flag EXT on a connection of protocol version "
                             f"{version} (the extension is version 3's)")
        _need(p, off + _EXT_HEAD.size, "CALL", "the extension's ndim, xflags and reserved")
        ndim, xflags, res = _EXT_HEAD.unpack_from(p, off)
        if xflags & ~(XF_COUNTS | XF_SCALE | XF_OUT):
            raise FrameError("bad_flags", f"CALL extension xflags 0x{xflags:02x} not defined")
        _zero(res, "CALL", "extension reserved field")
        if ndim > MAX_DIMS:  # its dimensions are not read
            raise FrameError("bad_ndim", f"CALL shape has {ndim} dimensions, limit {MAX_DIMS}")
        off += _EXT_HEAD.size
        _need(p, off + 8 * ndim, "CALL", f"a shape of {ndim} dimensions")
        shape = struct.unpack_from(f"<{ndim}Q", p, off)
        off += 8 * ndim
        if xflags & XF_COUNTS:
            _need(p, off + _COUNTS_HEAD.size, "CALL", "ncounts and reserved")
            n, res = _COUNTS_HEAD.unpack_from(p, off)
            _zero(res, "CALL", "counts reserved field")
            off += _COUNTS_HEAD.size
            _need(p, off + 8 * n, "CALL", f"{n} per-rank counts")
            counts = struct.unpack_from(f"<{n}Q", p, off)
            off += 8 * n
        if xflags & XF_SCALE:
            _need(p, off + _SCALE.size, "CALL", "prescale and postscale")
            scale = _SCALE.unpack_from(p, off)
            off += _SCALE.size
        # OUT on an inline call: no span follows (the bytes are data); the
        # daemon refuses the call as a request (BAD_REQUEST).
    if cflags & CALL_SHM:
        tail = _SEG_SIZE.size * (2 if xflags & XF_OUT else 1)
        _exact(p, off + tail, "CALL")
        seg, res, offset = _SEG_SIZE.unpack_from(p, off)
        _zero(res, "CALL", "segment reserved field")
        oseg = ooff = 0
        if xflags & XF_OUT:
            oseg, res, ooff = _SEG_SIZE.unpack_from(p, off + _SEG_SIZE.size)
            _zero(res, "CALL", "out segment reserved field")
        return Call(fid, op, dtype, red, count, root, name, cflags, seg, offset, b"",
                    frame_flags=flags, xflags=xflags, dims=shape, counts=counts,
                    prescale=scale[0], postscale=scale[1], out_segment=oseg, out_offset=ooff)
    size = DTYPE_SIZES.get(dtype)
    if size is None:
        if count != 0:  # well formed, but the data length cannot be checked
            raise FrameError("bad_dtype", f"CALL dtype code {dtype} unknown")
        size = 0
    data = p[off:]
    if len(data) != count * size:
        raise FrameError("inline_data_length",
                         f"CALL inline data is {len(data)} bytes, count {count} x element size "
                         f"{size} needs {count * size}")
    return Call(fid, op, dtype, red, count, root, name, cflags, 0, 0, data, frame_flags=flags,
                xflags=xflags, dims=shape, counts=counts, prescale=scale[0], postscale=scale[1])


def decode(frame: bytes | bytearray | memoryview, max_len: int = PRE_HELLO_MAX_FRAME,
           version: int = PROTOCOL_VERSION) -> Message:
    """Decode exactly one whole frame (header and payload), as on a
    connection of protocol ``version``."""
    mv = memoryview(frame).cast("B")
    if len(mv) < HEADER_SIZE:
        raise FrameError("payload_length", f"frame is {len(mv)} bytes, shorter than a header")
    length, ftype, flags, fid = parse_header(mv[:HEADER_SIZE], max_len)
    if len(mv) != HEADER_SIZE + length:
        raise FrameError("payload_length",
                         f"header says {length} payload bytes, frame has {len(mv) - HEADER_SIZE}")
    return decode_payload(ftype, flags, fid, mv[HEADER_SIZE:], version)
