#!/usr/bin/env python3
"""Generate the shared protocol test vectors (vectors.json and vectors.txt).

Standard library only. The frames are built here with ``struct`` directly,
field by field from docs/PROTOCOL.md, and on purpose share no code with any
client's codec: a vector is a second, independent reading of the document.

Run from anywhere:  python3 clients/testdata/gen_vectors.py
Output lands beside this script. README.md describes both formats.
"""

from __future__ import annotations

import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

# Frame types (PROTOCOL.md, "Frames").
T = {
    "HELLO": 0x01, "HELLO_OK": 0x81,
    "ALLOC": 0x02, "ALLOC_OK": 0x82,
    "FREE": 0x03, "FREE_OK": 0x83,
    "REGISTER": 0x04, "REGISTER_OK": 0x84,
    "CALL": 0x05, "CALL_OK": 0x85,
    "STATUS": 0x06, "STATUS_OK": 0x86,
    # Version 2 (PROTOCOL.md, "LANE (0x10) and LANE_OK (0x90)", "WAKE (0x11) and WAKE_CLIENT (0x91)").
    "LANE": 0x10, "LANE_OK": 0x90,
    "WAKE": 0x11, "WAKE_CLIENT": 0x91,
    "ERROR": 0xFF,
}
DIRECTION = {name: ("d2c" if code & 0x80 else "c2d") for name, code in T.items()}
FD_TYPES = {"ALLOC_OK", "REGISTER", "LANE_OK"}

U64_MAX = 0xFFFFFFFFFFFFFFFF
U32_MAX = 0xFFFFFFFF
PRE_HELLO_BOUND = 4096


def header(length: int, ftype: int, flags: int, fid: int, reserved: int = 0) -> bytes:
    # length u32, type u8, flags u8, reserved u16, id u64 -- little-endian.
    return struct.pack("<IBBHQ", length, ftype, flags, reserved, fid)


def frame(ftype: int, fid: int, payload: bytes, flags: int = 0) -> bytes:
    return header(len(payload), ftype, flags, fid) + payload


def p_hello(magic: bytes, version: int, flags: int, local_rank: int, pid: int,
            job: bytes, label: bytes) -> bytes:
    return (magic + struct.pack("<HHiI", version, flags, local_rank, pid)
            + struct.pack("<B", len(job)) + job
            + struct.pack("<B", len(label)) + label)


def p_hello_ok(d: dict) -> bytes:
    # Versions 1 and 2 end with timeout_ms (60 bytes); version 3 adds
    # first_call_timeout_ms (68 bytes).
    p = struct.pack(
        "<HHIIIIIIIIIIQQ",
        d["version"], 0, d["world_rank"], d["world_size"], d["node_rank"],
        d["node_count"], d["local_rank"], d["local_size"], d["inline_limit"],
        d["max_frame"], d["max_in_flight"], d["generation"], d["shm_quota"],
        d["timeout_ms"])
    if "first_call_timeout_ms" in d:
        p += struct.pack("<Q", d["first_call_timeout_ms"])
    return p


def p_call(op: int, dtype: int, reduce: int, flags: int, root: int, count: int,
           name: bytes, tail: bytes) -> bytes:
    return struct.pack("<BBBBIQB", op, dtype, reduce, flags, root, count, len(name)) + name + tail


def p_shm_tail(segment: int, offset: int, reserved: int = 0) -> bytes:
    return struct.pack("<IIQ", segment, reserved, offset)


# Version 3: the CALL extension (PROTOCOL.md, "CALL (0x05)"). Flag bits of
# the CALL payload and of the extension's xflags; version 4 adds NAMED.
CALL_SHM, CALL_EXT, CALL_NAMED = 0x01, 0x02, 0x04
X_COUNTS, X_SCALE, X_OUT = 0x01, 0x02, 0x04
# Element sizes by dtype code (PROTOCOL.md, "Element sizes").
ESIZE = {0: 0, 1: 4, 2: 8, 3: 4, 4: 8, 5: 1, 6: 2, 7: 2, 8: 1, 9: 1}
OP_ALLREDUCE, OP_BROADCAST, OP_ALLGATHER, OP_BARRIER, OP_REDUCE_SCATTER, OP_REDUCE = 1, 2, 3, 4, 5, 6
F32, F64, I32, I64, BYTES, F16, BF16, I8, U8 = 1, 2, 3, 4, 5, 6, 7, 8, 9
SUM, PROD, MAX, MIN, AVG = 1, 2, 3, 4, 5


def p_ext(dims: list[int], counts: list[int] | None = None,
          scale: tuple[float, float] | None = None, out: bool = False, *,
          xflags: int | None = None, reserved: int = 0, ndim: int | None = None,
          ncounts: int | None = None, counts_reserved: int = 0) -> bytes:
    """The extension: ndim u8, xflags u8, reserved u16, dims u64 each; then
    if COUNTS ncounts u32, reserved u32, counts u64 each; then if SCALE
    prescale f64, postscale f64. The keyword arguments break one field."""
    if xflags is None:
        xflags = ((X_COUNTS if counts is not None else 0) | (X_SCALE if scale is not None else 0)
                  | (X_OUT if out else 0))
    b = struct.pack("<BBH", len(dims) if ndim is None else ndim, xflags, reserved)
    b += b"".join(struct.pack("<Q", d) for d in dims)
    if counts is not None:
        b += struct.pack("<II", len(counts) if ncounts is None else ncounts, counts_reserved)
        b += b"".join(struct.pack("<Q", c) for c in counts)
    if scale is not None:
        b += struct.pack("<dd", *scale)
    return b


def bf16(*vals: float) -> bytes:
    """bfloat16 values that are exact in it: the upper half of their binary32."""
    out = b""
    for v in vals:
        w = struct.pack("<f", v)
        assert w[:2] == b"\0\0", f"{v} is not exact in bfloat16"
        out += w[2:]
    return out


def p_error(code: int, message: bytes, reserved: int = 0) -> bytes:
    return struct.pack("<HH", code, reserved) + message


valid: list[dict] = []
invalid: list[dict] = []


def add(name: str, decoded: dict, raw: bytes) -> None:
    tname = decoded["type"]
    valid.append({
        "name": name,
        "direction": DIRECTION[tname],
        "hex": raw.hex(),
        "decoded": decoded,
        "fd": tname in FD_TYPES,
    })


def bad(name: str, direction: str, raw: bytes, error: str, context: dict | None = None) -> None:
    invalid.append({"name": name, "direction": direction, "hex": raw.hex(),
                    "error": error, "valid": False})
    if context is not None:
        invalid[-1]["context"] = dict(context)


def hello(name: str, fid: int, flags: int, local_rank: int, pid: int, job: str, label: str,
          version: int = 1) -> None:
    payload = p_hello(b"CLVD", version, flags, local_rank, pid, job.encode(), label.encode())
    add(name, {"type": "HELLO", "id": fid, "frame_flags": 0, "magic": "CLVD", "version": version,
               "flags": flags, "local_rank": local_rank, "pid": pid, "job": job,
               "label": label}, frame(T["HELLO"], fid, payload))


def hello_ok(name: str, fid: int, **f) -> None:
    add(name, dict({"type": "HELLO_OK", "id": fid, "frame_flags": 0}, **f),
        frame(T["HELLO_OK"], fid, p_hello_ok(f)))


def call_inline(name: str, fid: int, op: int, dtype: int, reduce: int, root: int,
                count: int, cname: str, data: bytes) -> None:
    payload = p_call(op, dtype, reduce, 0, root, count, cname.encode(), data)
    add(name, {"type": "CALL", "id": fid, "frame_flags": 0, "op": op, "dtype": dtype,
               "reduce": reduce, "flags": 0, "root": root, "count": count, "name": cname,
               "data": data.hex()}, frame(T["CALL"], fid, payload))


def call_shm(name: str, fid: int, op: int, dtype: int, reduce: int, root: int,
             count: int, cname: str, segment: int, offset: int) -> None:
    payload = p_call(op, dtype, reduce, 1, root, count, cname.encode(), p_shm_tail(segment, offset))
    add(name, {"type": "CALL", "id": fid, "frame_flags": 0, "op": op, "dtype": dtype,
               "reduce": reduce, "flags": 1, "root": root, "count": count, "name": cname,
               "segment": segment, "offset": offset}, frame(T["CALL"], fid, payload))


def call3(name: str, fid: int, op: int, dtype: int, reduce: int, root: int, count: int,
          cname: str, *, dims: list[int] | None = None, counts: list[int] | None = None,
          scale: tuple[float, float] | None = None, shm: tuple[int, int] | None = None,
          out: tuple[int, int] | None = None, data: bytes | None = None,
          context: dict | None = None, refused: tuple[str, str] | None = None,
          named: bool = False) -> None:
    """A CALL of version 3: with the extension (EXT) when any of dims,
    counts, scale or out is given (dims=[] alone: an empty extension).
    shm=(segment, offset) makes it a shared-memory call, else data is
    inline. refused=(code, rule): a well-formed frame the daemon answers
    with that error, in the world of `context`. named: the NAMED flag
    (version 4), the call matched by its name in any order."""
    ext = dims is not None or counts is not None or scale is not None or out is not None
    flags = (CALL_SHM if shm else 0) | (CALL_EXT if ext else 0) | (CALL_NAMED if named else 0)
    d = {"type": "CALL", "id": fid, "frame_flags": 0, "op": op, "dtype": dtype, "reduce": reduce,
         "flags": flags, "root": root, "count": count, "name": cname}
    tail = b""
    if ext:
        dims = dims or []
        tail += p_ext(dims, counts, scale, out is not None)
        d["xflags"] = ((X_COUNTS if counts is not None else 0) | (X_SCALE if scale is not None else 0)
                       | (X_OUT if out is not None else 0))
        d["dims"] = list(dims)
        if counts is not None:
            d["counts"] = list(counts)
        if scale is not None:
            d["prescale"], d["postscale"] = float(scale[0]), float(scale[1])
    if shm:
        tail += p_shm_tail(*shm)
        d["segment"], d["offset"] = shm
        if out is not None:
            tail += p_shm_tail(*out)
            d["out_segment"], d["out_offset"] = out
    else:
        assert data is not None and (out is None or refused), name
        tail += data
        d["data"] = data.hex()
    if refused is None:
        # A request the daemon takes: its inline data has the length its
        # count implies, and a shape's product is its count.
        assert shm or len(data) == count * ESIZE[dtype], name
        assert not named or cname, name  # a named call needs a name
        if dims:
            prod = 1
            for x in dims:
                prod *= x
            assert prod == count, name
    add(name, d, frame(T["CALL"], fid, p_call(op, dtype, reduce, flags, root, count,
                                                cname.encode(), tail)))
    if context is not None:
        valid[-1]["context"] = dict(context)
    if refused is not None:
        valid[-1]["refused"], valid[-1]["rule"] = refused


def result_length(call: dict, world_size: int, world_rank: int) -> int:
    """Bytes of an inline call's result in CALL_OK (PROTOCOL.md, the op
    table and CALL_OK): allgather and reduce_scatter as the table gives,
    every other op the request's data length."""
    esize, count, counts = ESIZE[call["dtype"]], call["count"], call.get("counts")
    if call["op"] == OP_ALLGATHER:
        return esize * (sum(counts) if counts is not None else world_size * count)
    if call["op"] == OP_REDUCE_SCATTER:
        if counts is not None:
            return esize * counts[world_rank]
        assert count % world_size == 0
        return esize * (count // world_size)
    return len(call["data"]) // 2


def call_ok(name: str, fid: int, generation: int, seq: int, result: bytes,
            answers: tuple[str, int, int] | None = None) -> None:
    """answers=(vector, world_size, world_rank): the CALL_OK of that inline
    CALL vector for that caller (same id), its result as long as the op
    table says."""
    payload = struct.pack("<IIQ", generation, 0, seq) + result
    add(name, {"type": "CALL_OK", "id": fid, "frame_flags": 0, "generation": generation,
               "seq": seq, "result": result.hex()}, frame(T["CALL_OK"], fid, payload))
    if answers is not None:
        call = next(v["decoded"] for v in valid if v["name"] == answers[0])
        assert call["id"] == fid and "data" in call, name
        assert len(result) == result_length(call, answers[1], answers[2]), name
        valid[-1]["context"] = {"answers": answers[0], "world_size": answers[1],
                                "world_rank": answers[2]}


def error(name: str, fid: int, code: int, message: str, fatal: bool) -> None:
    add(name, {"type": "ERROR", "id": fid, "frame_flags": 1 if fatal else 0, "code": code,
               "message": message},
        frame(T["ERROR"], fid, p_error(code, message.encode()), flags=1 if fatal else 0))


def build() -> None:
    # HELLO: any rank, fixed rank, observer, max id, 255-byte label.
    hello("hello_any_rank", 1, 0, -1, 4242, "demo", "w0")
    hello("hello_fixed_rank", 1, 0, 3, 77, "resnet-50", "train.py worker")
    hello("hello_observer", 1, 1, -1, 1, "demo", "")
    hello("hello_id0_empty_label", 0, 0, 0, 0xFFFFFFFF, "j", "")
    hello("hello_label_255", 1, 0, 1, 99, "demo", "L" * 255)
    hello("hello_utf8", 1, 0, -1, 5, "jöb", "wörker ✓")
    hello("hello_v2", 1, 0, -1, 4242, "demo", "w0", version=2)
    hello("hello_v3", 1, 0, -1, 4242, "demo", "w0", version=3)
    hello("hello_v4", 1, 0, -1, 4242, "demo", "w0", version=4)

    base_ok = dict(version=1, world_rank=5, world_size=8, node_rank=2, node_count=4,
                   local_rank=1, local_size=2, inline_limit=65536, max_frame=65536 + 1024,
                   max_in_flight=64, generation=3, shm_quota=1 << 30, timeout_ms=60000)
    hello_ok("hello_ok", 1, **base_ok)
    hello_ok("hello_ok_observer", 1, **dict(base_ok, world_rank=U32_MAX, local_rank=U32_MAX))
    hello_ok("hello_ok_max_values", U64_MAX, **dict(
        base_ok, world_rank=0, world_size=1, node_rank=0, node_count=1, local_rank=0,
        local_size=1, inline_limit=U32_MAX - 512, max_frame=U32_MAX, max_in_flight=U32_MAX,
        generation=U32_MAX, shm_quota=U64_MAX, timeout_ms=U64_MAX))
    hello_ok("hello_ok_v2", 1, **dict(base_ok, version=2))
    # Version 3: first_call_timeout_ms after timeout_ms.
    hello_ok("hello_ok_v3", 1, **dict(base_ok, version=3, first_call_timeout_ms=600000))
    # Version 4: the layout of version 3.
    hello_ok("hello_ok_v4", 1, **dict(base_ok, version=4, first_call_timeout_ms=600000))
    hello_ok("hello_ok_v3_max_values", U64_MAX, **dict(
        base_ok, version=3, world_rank=0, world_size=1, node_rank=0, node_count=1, local_rank=0,
        local_size=1, inline_limit=U32_MAX - 512, max_frame=U32_MAX, max_in_flight=U32_MAX,
        generation=U32_MAX, shm_quota=U64_MAX, timeout_ms=U64_MAX,
        first_call_timeout_ms=U64_MAX))

    # ALLOC / ALLOC_OK (fd attached to ALLOC_OK).
    add("alloc", {"type": "ALLOC", "id": 2, "frame_flags": 0, "size": 1 << 20},
        frame(T["ALLOC"], 2, struct.pack("<Q", 1 << 20)))
    add("alloc_max", {"type": "ALLOC", "id": U64_MAX, "frame_flags": 0, "size": U64_MAX},
        frame(T["ALLOC"], U64_MAX, struct.pack("<Q", U64_MAX)))
    add("alloc_ok", {"type": "ALLOC_OK", "id": 2, "frame_flags": 0, "segment": 1, "size": 1 << 20},
        frame(T["ALLOC_OK"], 2, struct.pack("<IIQ", 1, 0, 1 << 20)))
    add("alloc_ok_rounded", {"type": "ALLOC_OK", "id": 9, "frame_flags": 0, "segment": U32_MAX,
                             "size": 8192},
        frame(T["ALLOC_OK"], 9, struct.pack("<IIQ", U32_MAX, 0, 8192)))

    # FREE / FREE_OK.
    add("free", {"type": "FREE", "id": 5, "frame_flags": 0, "segment": 1},
        frame(T["FREE"], 5, struct.pack("<II", 1, 0)))
    add("free_ok", {"type": "FREE_OK", "id": 5, "frame_flags": 0}, frame(T["FREE_OK"], 5, b""))

    # REGISTER (fd attached) / REGISTER_OK.
    add("register", {"type": "REGISTER", "id": 6, "frame_flags": 0, "size": 4096},
        frame(T["REGISTER"], 6, struct.pack("<Q", 4096)))
    add("register_ok", {"type": "REGISTER_OK", "id": 6, "frame_flags": 0, "segment": 2,
                        "size": 4096},
        frame(T["REGISTER_OK"], 6, struct.pack("<IIQ", 2, 0, 4096)))

    # CALL inline.
    f32 = struct.pack("<3f", 1.0, 2.5, -3.0)
    call_inline("call_allreduce_f32_sum", 3, 1, 1, 1, 0, 3, "", f32)
    call_inline("call_allreduce_f32_sum_named", 4, 1, 1, 1, 0, 3, "grad/layer1", f32)
    call_inline("call_allreduce_i64_max", 7, 1, 4, 3, 0, 2, "",
                struct.pack("<2q", -(1 << 63), (1 << 63) - 1))
    call_inline("call_allreduce_f64_prod", 8, 1, 2, 2, 0, 2, "p", struct.pack("<2d", 0.5, -2.0))
    call_inline("call_allreduce_i32_min", 10, 1, 3, 4, 0, 4, "", struct.pack("<4i", 1, -1, 7, 0))
    call_inline("call_broadcast_root", 11, 2, 1, 0, 3, 2, "weights", struct.pack("<2f", 0.25, 8.0))
    call_inline("call_broadcast_bytes", 12, 2, 5, 0, 1, 5, "", b"hello")
    call_inline("call_barrier", 13, 4, 0, 0, 0, 0, "", b"")
    call_inline("call_barrier_named", 14, 4, 0, 0, 0, 0, "epoch-end", b"")
    call_inline("call_allreduce_zero_count", 15, 1, 1, 1, 0, 0, "", b"")
    call_inline("call_name_255", 16, 1, 3, 1, 0, 1, "n" * 255, struct.pack("<i", 42))
    call_inline("call_max_id", U64_MAX, 1, 2, 1, 0, 1, "", struct.pack("<d", 1.5))
    # CALL shm.
    call_shm("call_shm_allreduce", 17, 1, 1, 1, 0, 1 << 20, "grad", 1, 0)
    call_shm("call_shm_broadcast_offset", 18, 2, 4, 0, 7, 3, "", 2, 4096 + 8)
    call_shm("call_shm_max_values", U64_MAX, 1, 4, 4, 0, 1 << 40, "", U32_MAX, U64_MAX - 7)
    call_shm("call_shm_zero_count", 19, 1, 3, 1, 0, 0, "", 1, 0)

    # CALL_OK.
    call_ok("call_ok_result", 3, 3, 41, struct.pack("<3f", 4.0, 10.0, -12.0))
    call_ok("call_ok_empty", 17, 0, 0, b"")
    call_ok("call_ok_max_values", U64_MAX, U32_MAX, U64_MAX, b"")

    # STATUS / STATUS_OK.
    add("status", {"type": "STATUS", "id": 1, "frame_flags": 0}, frame(T["STATUS"], 1, b""))
    doc = '{"job":"demo","node_rank":0,"node_count":2,"generation":1,"trainers":[]}'
    add("status_ok", {"type": "STATUS_OK", "id": 1, "frame_flags": 0, "json": doc},
        frame(T["STATUS_OK"], 1, doc.encode()))

    # LANE / LANE_OK (fd attached to LANE_OK), WAKE / WAKE_CLIENT: version 2.
    add("lane", {"type": "LANE", "id": 2, "frame_flags": 0}, frame(T["LANE"], 2, b""))
    add("lane_ok", {"type": "LANE_OK", "id": 2, "frame_flags": 0, "size": 12288},
        frame(T["LANE_OK"], 2, struct.pack("<Q", 12288)))
    add("wake", {"type": "WAKE", "id": 0, "frame_flags": 0}, frame(T["WAKE"], 0, b""))
    add("wake_client", {"type": "WAKE_CLIENT", "id": 0, "frame_flags": 0},
        frame(T["WAKE_CLIENT"], 0, b""))

    # ERROR.
    error("error_mismatch", 4, 15,
          'collective 7: world rank 1 called allreduce(float32, sum, count=3) but world rank 0 '
          'called allreduce(float32, sum, count=4)', False)
    error("error_timeout", 5, 16, "collective 2 timed out after 60s waiting for world ranks [3]",
          False)
    error("error_quota_empty_message", 2, 8, "", False)
    error("error_job_fatal", 1, 3, 'HELLO names job "a", daemon serves job "b"', True)
    error("error_bad_frame_conn_fatal", 0, 1, "frame type 0x07 unknown", True)
    error("error_peer_lost_max_id", U64_MAX, 17, "node 1 (127.0.0.1:7001) lost: EOF", False)
    error("error_internal_unknown_code", 9, 999, "codes beyond 22 still decode", False)
    # Fatal errors caused by one request carry its id (PROTOCOL.md, "ERROR"); the
    # frame itself fails, nothing of it done. ipc/conformance_test.go provokes each
    # of these from the daemon and compares type, id, flags and code.
    error("error_bad_fd_fatal", 5, 11,
          "STATUS (id 5) arrived with 1 fd(s) and carries none: only REGISTER carry one, "
          "attached to the sendmsg that begins with the frame's first byte", True)
    error("error_bad_fd_two_fds_fatal", 6, 11,
          "REGISTER (id 6) arrived with 2 fds; it carries exactly one", True)
    error("error_bad_frame_request_fatal", 7, 1,
          "CALL: inline data is 8 bytes, count 3 of int32 implies 12", True)
    error("error_hello_job_not_utf8", 1, 12, 'HELLO: job name "\\xff" is not UTF-8', True)

    # ---- protocol version 3 (PROTOCOL.md, "CALL (0x05)") ----------------------
    # The new ops, dtypes and reduce op need no extension. float16 data is
    # packed by struct's "e" (IEEE binary16), bfloat16 as the upper half of
    # a binary32 (values exact in it), int8 "b", uint8 "B".
    call3("call_allgather_f32", 20, OP_ALLGATHER, F32, 0, 0, 2, "",
          data=struct.pack("<2f", 1.5, -2.0))
    call3("call_allgather_bytes", 21, OP_ALLGATHER, BYTES, 0, 0, 3, "blk", data=b"abc")
    call3("call_allgather_zero_count", 32, OP_ALLGATHER, I64, 0, 0, 0, "", data=b"")
    call3("call_reduce_scatter_i32_sum", 22, OP_REDUCE_SCATTER, I32, SUM, 0, 4, "",
          data=struct.pack("<4i", 1, -2, 3, (1 << 31) - 1))
    call3("call_reduce_scatter_zero_count", 31, OP_REDUCE_SCATTER, F64, SUM, 0, 0, "", data=b"")
    call3("call_reduce_f64_sum_root", 23, OP_REDUCE, F64, SUM, 3, 2, "loss",
          data=struct.pack("<2d", 0.25, -8.0))
    call3("call_allreduce_f16_sum", 24, OP_ALLREDUCE, F16, SUM, 0, 4, "",
          data=struct.pack("<4e", 1.0, -0.5, 65504.0, 2.0 ** -24))
    call3("call_allreduce_bf16_max", 25, OP_ALLREDUCE, BF16, MAX, 0, 3, "",
          data=bf16(1.0078125, -2.5, 2.0 ** 127))
    call3("call_allreduce_i8_min", 26, OP_ALLREDUCE, I8, MIN, 0, 4, "",
          data=struct.pack("<4b", -128, 127, 0, -1))
    call3("call_allreduce_u8_prod", 27, OP_ALLREDUCE, U8, PROD, 0, 3, "",
          data=struct.pack("<3B", 0, 255, 7))
    call3("call_allreduce_f32_avg", 28, OP_ALLREDUCE, F32, AVG, 0, 2, "",
          data=struct.pack("<2f", 3.0, -1.0))
    call3("call_broadcast_u8", 29, OP_BROADCAST, U8, 0, 2, 3, "", data=bytes([1, 2, 250]))
    call3("call_shm_reduce_bf16_avg", 30, OP_REDUCE, BF16, AVG, 1, 1024, "", shm=(3, 2048))
    call3("call_shm_allreduce_i8", 33, OP_ALLREDUCE, I8, SUM, 0, 3, "", shm=(1, 5))

    # The extension (EXT): shape, COUNTS, SCALE, OUT, alone and together.
    call3("call_ext_empty", 40, OP_ALLREDUCE, F32, SUM, 0, 1, "", dims=[],
          data=struct.pack("<f", 1.0))
    call3("call_ext_shape_1d", 41, OP_ALLREDUCE, F32, SUM, 0, 3, "", dims=[3], data=f32)
    call3("call_ext_shape_2d_f16", 42, OP_ALLREDUCE, F16, SUM, 0, 6, "w", dims=[2, 3],
          data=struct.pack("<6e", 1, 2, 3, -4, 0.5, -0.0))
    call3("call_ext_shape_8d", 43, OP_BROADCAST, I8, 0, 1, 4, "", dims=[1, 2, 1, 1, 1, 1, 1, 2],
          data=struct.pack("<4b", 1, -2, 3, -4))
    call3("call_ext_shape_zero_dim", 44, OP_ALLREDUCE, I64, SUM, 0, 0, "", dims=[4, 0, 2], data=b"")
    call3("call_ext_shape_large_shm", 45, OP_ALLREDUCE, BF16, SUM, 0, 1 << 40, "",
          dims=[1 << 20, 1 << 20], shm=(1, 0))
    call3("call_ext_shape_name_255", 46, OP_REDUCE, U8, MAX, 0, 2, "s" * 255, dims=[2],
          data=bytes([9, 200]))
    call3("call_ext_allgatherv_inline", 50, OP_ALLGATHER, I64, 0, 0, 2, "", counts=[1, 0, 2, 3],
          data=struct.pack("<2q", -7, 1 << 40), context={"world_size": 4, "world_rank": 2})
    call3("call_ext_allgatherv_shm_out", 51, OP_ALLGATHER, F32, 0, 0, 3, "", counts=[3, 1],
          shm=(1, 0), out=(2, 64), context={"world_size": 2, "world_rank": 0})
    call3("call_ext_reduce_scatterv_inline", 52, OP_REDUCE_SCATTER, F32, SUM, 0, 3, "",
          counts=[1, 2, 0], data=f32, context={"world_size": 3, "world_rank": 1})
    call3("call_ext_reduce_scatterv_empty_block", 55, OP_REDUCE_SCATTER, F32, SUM, 0, 3, "",
          counts=[1, 2, 0], data=f32, context={"world_size": 3, "world_rank": 2})
    call3("call_ext_counts_all_zero", 53, OP_ALLGATHER, U8, 0, 0, 0, "", counts=[0, 0], data=b"",
          context={"world_size": 2, "world_rank": 1})
    call3("call_ext_counts_world_of_one", 54, OP_REDUCE_SCATTER, I32, MAX, 0, 2, "", counts=[2],
          data=struct.pack("<2i", 5, -5), context={"world_size": 1, "world_rank": 0})
    call3("call_ext_scale_allreduce_avg", 60, OP_ALLREDUCE, F32, AVG, 0, 2, "", scale=(0.5, 3.0),
          data=struct.pack("<2f", 3.0, -1.0))
    call3("call_ext_scale_reduce_f64", 61, OP_REDUCE, F64, SUM, 1, 1, "", scale=(1 / 3, -2.5),
          data=struct.pack("<d", 6.0), context={"world_size": 2, "world_rank": 0})
    call3("call_ext_scale_extremes_shm", 62, OP_ALLREDUCE, BF16, SUM, 0, 8, "",
          scale=(5e-324, 1.7976931348623157e308), shm=(7, 16))
    call3("call_ext_scale_reduce_scatter_f16", 63, OP_REDUCE_SCATTER, F16, AVG, 0, 4, "",
          dims=[2, 2], scale=(0.25, 1.0), data=struct.pack("<4e", 1, 2, 3, 4),
          context={"world_size": 2, "world_rank": 1})
    call3("call_ext_shape_scale_bf16", 64, OP_ALLREDUCE, BF16, SUM, 0, 2, "", dims=[2],
          scale=(2.0, 0.5), data=bf16(1.0, -3.0))
    call3("call_ext_out_allgather", 70, OP_ALLGATHER, F64, 0, 0, 4, "", shm=(1, 0), out=(1, 4096),
          context={"world_size": 2, "world_rank": 0})
    # In place: the input is the caller's own block of the output (allgather),
    # the output the caller's own block of the input (reduce_scatter).
    call3("call_ext_out_allgather_in_place", 71, OP_ALLGATHER, F32, 0, 0, 2, "", shm=(5, 8),
          out=(5, 0), context={"world_size": 4, "world_rank": 1})
    call3("call_ext_out_reduce_scatter_in_place", 72, OP_REDUCE_SCATTER, I64, SUM, 0, 6, "",
          shm=(2, 0), out=(2, 16), context={"world_size": 3, "world_rank": 1})
    call3("call_ext_out_max_values", U64_MAX, OP_REDUCE_SCATTER, U8, SUM, 0, 1 << 40, "n" * 255,
          shm=(U32_MAX, U64_MAX), out=(U32_MAX, U64_MAX))
    call3("call_ext_all_fields", 80, OP_REDUCE_SCATTER, F16, AVG, 0, 8, "grad/all", dims=[4, 2],
          counts=[2, 6], scale=(0.125, 2.0), shm=(4, 256), out=(9, 0),
          context={"world_size": 2, "world_rank": 0})
    call3("call_ext_shape_counts_inline", 81, OP_ALLGATHER, BF16, 0, 0, 3, "x", dims=[3, 1],
          counts=[2, 3], data=bf16(1.0, 2.0, -0.5), context={"world_size": 2, "world_rank": 1})

    # CALL_OK of inline version-3 calls: the result as long as the op table
    # says (allgather: world_size * count or sum(counts) elements;
    # reduce_scatter: count / world_size or counts[rank]; reduce: the
    # request's data, also where it is left unchanged).
    call_ok("call_ok_allgather_result", 20, 3, 42,
            struct.pack("<8f", 0.0, 1.0, 1.5, -2.0, 4.0, 5.0, 6.0, 7.0),
            answers=("call_allgather_f32", 4, 1))
    call_ok("call_ok_allgatherv_result", 50, 3, 43,
            struct.pack("<6q", 11, -7, 1 << 40, 1, 2, 3), answers=("call_ext_allgatherv_inline", 4, 2))
    call_ok("call_ok_reduce_scatter_result", 22, 3, 44, struct.pack("<2i", 6, 8),
            answers=("call_reduce_scatter_i32_sum", 2, 1))
    call_ok("call_ok_reduce_scatterv_result", 52, 3, 45, struct.pack("<2f", 5.0, -9.0),
            answers=("call_ext_reduce_scatterv_inline", 3, 1))
    call_ok("call_ok_reduce_scatterv_empty_block", 55, 3, 46, b"",
            answers=("call_ext_reduce_scatterv_empty_block", 3, 2))
    call_ok("call_ok_reduce_nonroot", 23, 3, 47, struct.pack("<2d", 0.25, -8.0),
            answers=("call_reduce_f64_sum_root", 4, 0))
    call_ok("call_ok_allreduce_f16", 24, 3, 48, struct.pack("<4e", 4.0, -2.0, float("inf"), 2.0 ** -22),
            answers=("call_allreduce_f16_sum", 4, 0))

    # Well-formed frames the daemon refuses (context: the world and the
    # connection's version they are judged in); PROTOCOL.md, "CALL".
    br = "BAD_REQUEST"
    w2 = {"world_size": 2, "world_rank": 0}
    one = struct.pack("<f", 1.0)
    call3("refused_out_on_inline", 100, OP_ALLGATHER, F32, 0, 0, 1, "", out=(0, 0), data=one,
          context=w2, refused=(br, "out_on_inline"))
    call3("refused_out_on_allreduce", 101, OP_ALLREDUCE, F32, SUM, 0, 4, "", shm=(1, 0),
          out=(1, 64), context=w2, refused=(br, "out_on_other_op"))
    call3("refused_shm_allgather_without_out", 102, OP_ALLGATHER, F32, 0, 0, 4, "", shm=(1, 0),
          context=w2, refused=(br, "shm_without_out"))
    call3("refused_shm_reduce_scatter_without_out", 103, OP_REDUCE_SCATTER, F32, SUM, 0, 4, "",
          dims=[4], shm=(1, 0), context=w2, refused=(br, "shm_without_out"))
    call3("refused_counts_on_allreduce", 104, OP_ALLREDUCE, I32, SUM, 0, 2, "", counts=[1, 1],
          data=struct.pack("<2i", 1, 2), context=w2, refused=(br, "counts_on_other_op"))
    call3("refused_ncounts_not_world_size", 105, OP_ALLGATHER, I32, 0, 0, 1, "", counts=[1, 1, 1],
          data=struct.pack("<i", 1), context={"world_size": 4, "world_rank": 0},
          refused=(br, "ncounts_not_world_size"))
    call3("refused_allgatherv_count_not_own", 106, OP_ALLGATHER, I32, 0, 0, 2, "", counts=[1, 3],
          data=struct.pack("<2i", 1, 2), context=w2, refused=(br, "count_not_own_count"))
    call3("refused_reduce_scatterv_sum_not_count", 107, OP_REDUCE_SCATTER, F32, SUM, 0, 4, "",
          counts=[1, 2], data=struct.pack("<4f", 1, 2, 3, 4), context=w2,
          refused=(br, "counts_sum_not_count"))
    call3("refused_reduce_scatter_count_not_multiple", 108, OP_REDUCE_SCATTER, F32, SUM, 0, 5, "",
          data=struct.pack("<5f", 1, 2, 3, 4, 5), context=w2, refused=(br, "count_not_multiple"))
    call3("refused_scale_on_int", 109, OP_ALLREDUCE, I32, SUM, 0, 1, "", scale=(2.0, 1.0),
          data=struct.pack("<i", 1), context=w2, refused=(br, "scale_not_allowed"))
    call3("refused_scale_on_max", 110, OP_ALLREDUCE, F32, MAX, 0, 1, "", scale=(2.0, 1.0),
          data=one, context=w2, refused=(br, "scale_not_allowed"))
    call3("refused_scale_on_broadcast", 111, OP_BROADCAST, F32, 0, 0, 1, "", scale=(2.0, 1.0),
          data=one, context=w2, refused=(br, "scale_not_allowed"))
    call3("refused_scale_on_allgather", 112, OP_ALLGATHER, F32, 0, 0, 1, "", scale=(2.0, 1.0),
          data=one, context=w2, refused=(br, "scale_not_allowed"))
    call3("refused_scale_zero", 113, OP_ALLREDUCE, F32, SUM, 0, 1, "", scale=(0.0, 1.0), data=one,
          context=w2, refused=(br, "scale_not_finite_nonzero"))
    call3("refused_scale_negative_zero", 114, OP_ALLREDUCE, F32, SUM, 0, 1, "", scale=(1.0, -0.0),
          data=one, context=w2, refused=(br, "scale_not_finite_nonzero"))
    call3("refused_avg_on_int32", 115, OP_ALLREDUCE, I32, AVG, 0, 1, "", data=struct.pack("<i", 1),
          context=w2, refused=(br, "avg_on_integer"))
    call3("refused_avg_on_uint8", 116, OP_REDUCE_SCATTER, U8, AVG, 0, 2, "", data=bytes([1, 2]),
          context=w2, refused=(br, "avg_on_integer"))
    call3("refused_shape_product_not_count", 117, OP_ALLREDUCE, F32, SUM, 0, 3, "", dims=[2, 2],
          data=f32, context=w2, refused=(br, "shape_not_count"))
    call3("refused_shape_max_dims", U64_MAX, OP_ALLREDUCE, F32, SUM, 0, 1, "", dims=[U64_MAX] * 8,
          data=one, context=w2, refused=(br, "shape_not_count"))
    call3("refused_reduce_root_outside_world", 118, OP_REDUCE, F32, SUM, 4, 1, "", data=one,
          context={"world_size": 4, "world_rank": 0}, refused=(br, "root_outside_world"))
    call3("refused_reduce_scatter_of_bytes", 119, OP_REDUCE_SCATTER, BYTES, SUM, 0, 2, "",
          data=b"ab", context=w2, refused=(br, "reduction_of_bytes"))
    call3("refused_out_offset_misaligned", 120, OP_ALLGATHER, F32, 0, 0, 1, "", shm=(1, 0),
          out=(1, 66), context=w2, refused=(br, "offset_misaligned"))
    # Input [0, 16), output [8, 40): rank 0's block of the output is [8, 24).
    call3("refused_out_overlaps_input", 121, OP_ALLGATHER, F32, 0, 0, 4, "", shm=(1, 0),
          out=(1, 8), context=w2, refused=(br, "spans_overlap"))
    # Input [0, 16), output [0, 8): rank 1's block of the input is [8, 16).
    call3("refused_reduce_scatter_out_not_own_block", 122, OP_REDUCE_SCATTER, F32, SUM, 0, 4, "",
          shm=(1, 0), out=(1, 0), context={"world_size": 2, "world_rank": 1},
          refused=(br, "spans_overlap"))
    # Version-3 codes on a connection of an older version: BAD_REQUEST naming
    # the version needed; allgather, as before version 3, UNSUPPORTED.
    v2 = {"world_size": 2, "world_rank": 0, "connection_version": 2}
    call3("refused_bf16_on_v2", 123, OP_ALLREDUCE, BF16, SUM, 0, 1, "", data=bf16(1.0), context=v2,
          refused=(br, "needs_version_3"))
    call3("refused_uint8_on_v2", 124, OP_BROADCAST, U8, 0, 0, 1, "", data=b"\x01", context=v2,
          refused=(br, "needs_version_3"))
    call3("refused_avg_on_v2", 125, OP_ALLREDUCE, F32, AVG, 0, 1, "", data=one, context=v2,
          refused=(br, "needs_version_3"))
    call3("refused_reduce_scatter_on_v2", 126, OP_REDUCE_SCATTER, F32, SUM, 0, 2, "",
          data=struct.pack("<2f", 1, 2), context=v2, refused=(br, "needs_version_3"))
    call3("refused_reduce_on_v1", 127, OP_REDUCE, F32, SUM, 0, 1, "", data=one,
          context=dict(v2, connection_version=1), refused=(br, "needs_version_3"))
    call3("refused_allgather_on_v2", 128, OP_ALLGATHER, F32, 0, 0, 1, "", data=one, context=v2,
          refused=("UNSUPPORTED", "needs_version_3"))

    # ---- protocol version 4: named calls (PROTOCOL.md, "Named calls") ---------
    # NAMED (flag bit 2) on every op, inline and in shared memory, with and
    # without the extension; decoded as on a version-4 connection (the
    # default without a context).
    call3("call_v4_named_allreduce_f32", 130, OP_ALLREDUCE, F32, SUM, 0, 3, "layer3.w", data=f32,
          named=True)
    call3("call_v4_named_allreduce_shm_bf16", 131, OP_ALLREDUCE, BF16, AVG, 0, 1024, "layer3.b",
          shm=(1, 4096), named=True)
    call3("call_v4_named_broadcast", 132, OP_BROADCAST, I64, 0, 1, 2, "embed",
          data=struct.pack("<2q", 7, -7), named=True)
    call3("call_v4_named_allgather_shm_out", 133, OP_ALLGATHER, F16, 0, 0, 4, "acts", shm=(2, 0),
          out=(2, 64), context=w2, named=True)
    call3("call_v4_named_allgatherv_inline", 134, OP_ALLGATHER, I32, 0, 0, 1, "tok", counts=[1, 2],
          data=struct.pack("<i", 5), context=w2, named=True)
    call3("call_v4_named_reduce_scatter_scaled", 135, OP_REDUCE_SCATTER, F32, SUM, 0, 4, "shard/0",
          dims=[2, 2], scale=(0.5, 1.0), data=struct.pack("<4f", 1, 2, 3, 4),
          context={"world_size": 2, "world_rank": 1}, named=True)
    call3("call_v4_named_reduce", 136, OP_REDUCE, F64, MAX, 1, 1, "loss", data=struct.pack("<d", 2.5),
          context=w2, named=True)
    call3("call_v4_named_barrier", 137, OP_BARRIER, 0, 0, 0, 0, "epoch-7", data=b"", named=True)
    call3("call_v4_named_name_255", U64_MAX, OP_ALLREDUCE, U8, MAX, 0, 1, "N" * 255, data=b"\x09",
          named=True)
    call_ok("call_ok_v4_named_allreduce", 130, 2, 5, struct.pack("<3f", 2.0, 5.0, -6.0),
            answers=("call_v4_named_allreduce_f32", 2, 0))
    # A named call needs a name: without one it is well formed, and refused.
    call3("refused_named_without_name", 138, OP_ALLREDUCE, F32, SUM, 0, 1, "", data=one, context=w2,
          refused=(br, "named_without_name"), named=True)
    call3("refused_named_barrier_without_name", 139, OP_BARRIER, 0, 0, 0, 0, "", data=b"",
          context=w2, refused=(br, "named_without_name"), named=True)

    # ---- invalid frames -------------------------------------------------------
    good_hello = p_hello(b"CLVD", 1, 0, -1, 4242, b"demo", b"w0")
    bad("bad_magic", "c2d",
        frame(T["HELLO"], 1, p_hello(b"CLVX", 1, 0, -1, 4242, b"demo", b"w0")), "bad_magic")
    # Only the header: a decoder must reject before reading (or allocating) the payload.
    bad("length_over_pre_hello_bound", "c2d",
        header(PRE_HELLO_BOUND + 1, T["HELLO"], 0, 1), "frame_too_long")
    bad("length_max_u32", "d2c", header(U32_MAX, T["CALL_OK"], 0, 3), "frame_too_long")
    bad("header_reserved_nonzero", "c2d",
        header(len(good_hello), T["HELLO"], 0, 1, reserved=1) + good_hello, "reserved_nonzero")
    bad("free_reserved_nonzero", "c2d", frame(T["FREE"], 5, struct.pack("<II", 1, 1)),
        "reserved_nonzero")
    bad("alloc_ok_reserved_nonzero", "d2c", frame(T["ALLOC_OK"], 2, struct.pack("<IIQ", 1, 2, 4096)),
        "reserved_nonzero")
    bad("hello_ok_reserved_nonzero", "d2c",
        frame(T["HELLO_OK"], 1, b"\x01\x00\x01\x00" + p_hello_ok(dict(
            version=1, world_rank=0, world_size=1, node_rank=0, node_count=1, local_rank=0,
            local_size=1, inline_limit=1024, max_frame=2048, max_in_flight=4, generation=1,
            shm_quota=0, timeout_ms=1000))[4:]), "reserved_nonzero")
    bad("call_shm_reserved_nonzero", "c2d",
        frame(T["CALL"], 3, p_call(1, 1, 1, 1, 0, 4, b"", p_shm_tail(1, 0, reserved=9))),
        "reserved_nonzero")
    bad("call_ok_reserved_nonzero", "d2c", frame(T["CALL_OK"], 3, struct.pack("<IIQ", 1, 1, 0)),
        "reserved_nonzero")
    bad("error_reserved_nonzero", "d2c", frame(T["ERROR"], 3, p_error(15, b"x", reserved=1)),
        "reserved_nonzero")
    bad("hello_job_overruns_payload", "c2d",
        frame(T["HELLO"], 1, good_hello[:16] + b"\x0a" + b"demo"), "payload_length")
    bad("hello_trailing_byte", "c2d", frame(T["HELLO"], 1, good_hello + b"\x00"), "payload_length")
    bad("hello_truncated_fixed_part", "c2d", frame(T["HELLO"], 1, good_hello[:10]),
        "payload_length")
    bad("hello_ok_short", "d2c", frame(T["HELLO_OK"], 1, b"\x01\x00" + b"\x00" * 56),
        "payload_length")
    # The version decides the length: 60 bytes in versions 1 and 2, 68 in 3.
    ok_v3 = dict(version=3, world_rank=0, world_size=1, node_rank=0, node_count=1,
                 local_rank=0, local_size=1, inline_limit=1024, max_frame=4096,
                 max_in_flight=4, generation=1, shm_quota=0, timeout_ms=1000,
                 first_call_timeout_ms=5000)
    bad("hello_ok_v3_without_first_call", "d2c",
        frame(T["HELLO_OK"], 1, p_hello_ok(ok_v3)[:60]), "payload_length")
    bad("hello_ok_v2_with_first_call", "d2c",
        frame(T["HELLO_OK"], 1, p_hello_ok(dict(ok_v3, version=2))), "payload_length")
    bad("hello_ok_v1_with_first_call", "d2c",
        frame(T["HELLO_OK"], 1, p_hello_ok(dict(ok_v3, version=1))), "payload_length")
    bad("hello_ok_v3_trailing_byte", "d2c",
        frame(T["HELLO_OK"], 1, p_hello_ok(ok_v3) + b"\x00"), "payload_length")
    bad("hello_ok_v4_without_first_call", "d2c",
        frame(T["HELLO_OK"], 1, p_hello_ok(dict(ok_v3, version=4))[:60]), "payload_length")
    # Version 0 was never spoken, version 5 not yet: their layouts are
    # unknown, so they cannot decode.
    bad("hello_ok_version_0", "d2c",
        frame(T["HELLO_OK"], 1, p_hello_ok(dict(ok_v3, version=0))[:60]), "bad_version")
    bad("hello_ok_version_5", "d2c",
        frame(T["HELLO_OK"], 1, p_hello_ok(dict(ok_v3, version=5))), "bad_version")
    bad("free_long", "c2d", frame(T["FREE"], 5, struct.pack("<IIQ", 1, 0, 0)), "payload_length")
    bad("free_ok_nonempty", "d2c", frame(T["FREE_OK"], 5, b"\x00"), "payload_length")
    bad("status_nonempty", "c2d", frame(T["STATUS"], 1, b"{}"), "payload_length")
    bad("alloc_short", "c2d", frame(T["ALLOC"], 2, b"\x00\x10\x00\x00"), "payload_length")
    bad("call_shm_short_tail", "c2d",
        frame(T["CALL"], 3, p_call(1, 1, 1, 1, 0, 4, b"g", struct.pack("<II", 1, 0))),
        "payload_length")
    bad("call_name_overruns_payload", "c2d",
        frame(T["CALL"], 3, p_call(1, 1, 1, 0, 0, 0, b"", b"")[:16] + b"\x09abc"), "payload_length")
    bad("call_truncated_description", "c2d", frame(T["CALL"], 3, b"\x01\x01\x01\x00"),
        "payload_length")
    bad("call_ok_short", "d2c", frame(T["CALL_OK"], 3, struct.pack("<II", 1, 0)),
        "payload_length")
    bad("error_short", "d2c", frame(T["ERROR"], 3, b"\x0f\x00"), "payload_length")
    bad("lane_nonempty", "c2d", frame(T["LANE"], 2, b"\x00"), "payload_length")
    bad("lane_ok_short", "d2c", frame(T["LANE_OK"], 2, struct.pack("<I", 12288)), "payload_length")
    bad("wake_nonempty", "c2d", frame(T["WAKE"], 0, b"\x00"), "payload_length")
    bad("unknown_type_request", "c2d", frame(0x07, 1, b""), "unknown_type")
    bad("unknown_type_reply", "d2c", frame(0x87, 1, b""), "unknown_type")
    bad("unknown_type_zero", "c2d", frame(0x00, 1, b""), "unknown_type")
    bad("call_inline_data_short", "c2d",
        frame(T["CALL"], 3, p_call(1, 1, 1, 0, 0, 3, b"", struct.pack("<2f", 1, 2))),
        "inline_data_length")
    bad("call_inline_data_long", "c2d",
        frame(T["CALL"], 3, p_call(1, 4, 1, 0, 0, 1, b"x", struct.pack("<2q", 1, 2))),
        "inline_data_length")
    bad("call_inline_count_overflow", "c2d",
        frame(T["CALL"], 3, p_call(1, 1, 1, 0, 0, 1 << 62, b"", struct.pack("<f", 1))),
        "inline_data_length")
    bad("call_barrier_with_data", "c2d",
        frame(T["CALL"], 3, p_call(4, 0, 0, 0, 0, 0, b"", b"\x00")), "inline_data_length")
    bad("hello_undefined_flag", "c2d",
        frame(T["HELLO"], 1, p_hello(b"CLVD", 1, 2, -1, 1, b"demo", b"")), "bad_flags")
    bad("header_flags_on_request", "c2d", frame(T["STATUS"], 1, b"", flags=1), "bad_flags")
    # Bit 3 is undefined in every version (bit 1, EXT, is version 3's:
    # call_ext_on_v2_connection; bit 2, NAMED, version 4's:
    # call_named_on_v3_connection).
    bad("call_undefined_flag", "c2d",
        frame(T["CALL"], 3, p_call(1, 1, 1, 0x08, 0, 0, b"", b"")), "bad_flags")
    bad("error_undefined_header_flag", "d2c", frame(T["ERROR"], 0, p_error(1, b"x"), flags=2),
        "bad_flags")

    # Version 3: the CALL extension. EXT on a connection of version 1 or 2 is
    # an undefined flag there (context: the connection's version; without
    # one a vector is decoded as on a version-3 connection).
    ext_f32 = p_call(1, 1, 1, CALL_EXT, 0, 2, b"", p_ext([2]) + struct.pack("<2f", 1, 2))
    bad("call_ext_on_v2_connection", "c2d", frame(T["CALL"], 3, ext_f32), "bad_flags",
        context={"connection_version": 2})
    bad("call_ext_on_v1_connection", "c2d",
        frame(T["CALL"], 3, p_call(3, 1, 0, CALL_SHM | CALL_EXT, 0, 4, b"", p_ext([], out=True)
                                   + p_shm_tail(1, 0) + p_shm_tail(1, 64))), "bad_flags",
        context={"connection_version": 1})
    # Version 4: NAMED on a connection of version 1 to 3 is an undefined
    # flag there, whatever else the call is.
    bad("call_named_on_v3_connection", "c2d",
        frame(T["CALL"], 3, p_call(1, 1, 1, CALL_NAMED, 0, 1, b"layer3.w", struct.pack("<f", 1.0))),
        "bad_flags", context={"connection_version": 3})
    bad("call_named_shm_on_v1_connection", "c2d",
        frame(T["CALL"], 3, p_call(2, 4, 0, CALL_SHM | CALL_NAMED, 0, 2, b"w", p_shm_tail(1, 0))),
        "bad_flags", context={"connection_version": 1})
    bad("call_undefined_flag_high", "c2d",
        frame(T["CALL"], 3, p_call(1, 1, 1, 0x80, 0, 0, b"", b"")), "bad_flags")
    bad("call_xflags_undefined_bit", "c2d",
        frame(T["CALL"], 3, p_call(1, 1, 1, CALL_EXT, 0, 0, b"", p_ext([], xflags=0x08))),
        "bad_flags")
    bad("call_xflags_high_bit", "c2d",
        frame(T["CALL"], 3, p_call(1, 1, 1, CALL_EXT, 0, 0, b"", p_ext([], xflags=0x80))),
        "bad_flags")
    bad("call_ext_reserved_nonzero", "c2d",
        frame(T["CALL"], 3, p_call(1, 1, 1, CALL_EXT, 0, 2, b"",
                                   p_ext([2], reserved=1) + struct.pack("<2f", 1, 2))),
        "reserved_nonzero")
    bad("call_counts_reserved_nonzero", "c2d",
        frame(T["CALL"], 3, p_call(3, 3, 0, CALL_EXT, 0, 1, b"",
                                   p_ext([], [1, 1], counts_reserved=7) + struct.pack("<i", 1))),
        "reserved_nonzero")
    bad("call_out_reserved_nonzero", "c2d",
        frame(T["CALL"], 3, p_call(3, 1, 0, CALL_SHM | CALL_EXT, 0, 4, b"", p_ext([], out=True)
                                   + p_shm_tail(1, 0) + p_shm_tail(1, 64, reserved=1))),
        "reserved_nonzero")
    # Truncated or overlong extensions: the payload's length disagrees with
    # what its fields imply (never an allocation for ndim or ncounts).
    bad("call_ext_missing", "c2d",
        frame(T["CALL"], 3, p_call(1, 1, 1, CALL_EXT, 0, 0, b"g", b"")), "payload_length")
    bad("call_ext_truncated_fixed_part", "c2d",
        frame(T["CALL"], 3, p_call(1, 1, 1, CALL_EXT, 0, 0, b"", p_ext([])[:3])), "payload_length")
    bad("call_ext_dims_overrun", "c2d",
        frame(T["CALL"], 3, p_call(1, 1, 1, CALL_EXT, 0, 0, b"", p_ext([2, 3], ndim=3))),
        "payload_length")
    # A shape has at most 8 dimensions: a ninth (its bytes all there, their
    # product the count) cannot be held, and fails the frame.
    bad("call_ext_ndim_9", "c2d",
        frame(T["CALL"], 3, p_call(1, 1, 1, CALL_EXT, 0, 1, b"", p_ext([1] * 9)
                                   + struct.pack("<f", 1.0))), "bad_ndim")
    bad("call_counts_overrun", "c2d",
        frame(T["CALL"], 3, p_call(3, 1, 0, CALL_EXT, 0, 0, b"", p_ext([], [0, 0], ncounts=U32_MAX))),
        "payload_length")
    bad("call_counts_header_truncated", "c2d",
        frame(T["CALL"], 3, p_call(3, 1, 0, CALL_EXT, 0, 0, b"",
                                   p_ext([], xflags=X_COUNTS) + struct.pack("<I", 0))),
        "payload_length")
    bad("call_counts_ncounts_short_shm", "c2d",
        frame(T["CALL"], 3, p_call(3, 1, 0, CALL_SHM | CALL_EXT, 0, 1, b"",
                                   p_ext([], [1, 1], out=True, ncounts=1)
                                   + p_shm_tail(1, 0) + p_shm_tail(1, 64))), "payload_length")
    # Inline, the bytes after the counts are data: one count too few leaves
    # 8 bytes of data that the count does not imply.
    bad("call_counts_ncounts_short_inline", "c2d",
        frame(T["CALL"], 3, p_call(3, 1, 0, CALL_EXT, 0, 0, b"", p_ext([], [0, 0], ncounts=1))),
        "inline_data_length")
    bad("call_scale_truncated", "c2d",
        frame(T["CALL"], 3, p_call(1, 1, 1, CALL_EXT, 0, 0, b"",
                                   p_ext([], xflags=X_SCALE) + struct.pack("<d", 2.0))),
        "payload_length")
    bad("call_out_missing", "c2d",
        frame(T["CALL"], 3, p_call(3, 1, 0, CALL_SHM | CALL_EXT, 0, 4, b"", p_ext([], out=True)
                                   + p_shm_tail(1, 0))), "payload_length")
    bad("call_out_trailing_byte", "c2d",
        frame(T["CALL"], 3, p_call(3, 1, 0, CALL_SHM | CALL_EXT, 0, 4, b"", p_ext([], out=True)
                                   + p_shm_tail(1, 0) + p_shm_tail(1, 64) + b"\x00")),
        "payload_length")
    bad("call_shm_out_block_without_out", "c2d",
        frame(T["CALL"], 3, p_call(3, 1, 0, CALL_SHM | CALL_EXT, 0, 4, b"", p_ext([])
                                   + p_shm_tail(1, 0) + p_shm_tail(1, 64))), "payload_length")
    bad("call_ext_inline_data_short", "c2d",
        frame(T["CALL"], 3, p_call(1, 1, 1, CALL_EXT, 0, 3, b"", p_ext([3])
                                   + struct.pack("<2f", 1, 2))), "inline_data_length")
    bad("call_inline_f16_odd_bytes", "c2d",
        frame(T["CALL"], 3, p_call(1, 6, 1, 0, 0, 2, b"", b"\x00\x3c\x00")), "inline_data_length")
    bad("call_inline_bf16_long", "c2d",
        frame(T["CALL"], 3, p_call(1, 7, 3, 0, 0, 1, b"", struct.pack("<f", 1.0))),
        "inline_data_length")
    bad("call_inline_u8_short", "c2d",
        frame(T["CALL"], 3, p_call(2, 9, 0, 0, 0, 3, b"", b"\x01\x02")), "inline_data_length")
    # An inline call's OUT has no block in the frame (it is refused as a
    # request, refused_out_on_inline); one sent anyway is data the count
    # does not imply.
    bad("call_out_block_on_inline", "c2d",
        frame(T["CALL"], 3, p_call(3, 1, 0, CALL_EXT, 0, 1, b"", p_ext([], out=True)
                                   + p_shm_tail(1, 64) + struct.pack("<f", 1.0))),
        "inline_data_length")


def txt_value(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "f" + repr(v)  # the shortest decimal that reads back as the same binary64
    if isinstance(v, list):
        return "l" + ",".join(str(x) for x in v)
    return "x" + v.encode().hex()


def txt_context(v: dict) -> str:
    """The seventh column: refused and rule, then the context, as key=value;
    names (refused, rule, answers) bare, numbers decimal."""
    fields = []
    if "refused" in v:
        fields += [f"refused={v['refused']}", f"rule={v['rule']}"]
    for k, val in v.get("context", {}).items():
        fields.append(f"{k}={val}")
    return ";".join(fields)


def txt_lines() -> list[str]:
    out = [
        "# collectived protocol test vectors; generated by gen_vectors.py, do not edit.",
        "# valid<TAB>name<TAB>direction<TAB>fd<TAB>hex<TAB>key=value;...",
        "# invalid<TAB>name<TAB>direction<TAB>-<TAB>hex<TAB>error=<check>",
        "# type is a bare name; other integers are decimal; strings and byte fields are 'x' + hex;",
        "# lists (dims, counts) 'l' + comma-separated decimals; floats (prescale, postscale) 'f' + decimal.",
        "# An optional seventh column: refused=CODE;rule=NAME (a well-formed frame the daemon",
        "# refuses) and the context (world_size, world_rank, connection_version, answers).",
    ]
    for v in valid:
        fields = []
        for k, val in v["decoded"].items():
            if k == "type":
                fields.append(f"type={val}")  # a bare frame type name
            elif k in ("data", "result"):
                fields.append(f"{k}=x{val}")  # already hex of the bytes
            else:
                fields.append(f"{k}={txt_value(val)}")
        cols = ["valid", v["name"], v["direction"], "1" if v["fd"] else "0", v["hex"],
                ";".join(fields)]
        if txt_context(v):
            cols.append(txt_context(v))
        out.append("\t".join(cols))
    for v in invalid:
        cols = ["invalid", v["name"], v["direction"], "-", v["hex"], "error=" + v["error"]]
        if txt_context(v):
            cols.append(txt_context(v))
        out.append("\t".join(cols))
    return out


def main() -> None:
    build()
    names = [v["name"] for v in valid + invalid]
    assert len(names) == len(set(names)), "duplicate vector names"
    with open(os.path.join(HERE, "vectors.json"), "w", encoding="utf-8") as f:
        json.dump(valid + invalid, f, indent=1, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(HERE, "vectors.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(txt_lines()) + "\n")
    print(f"{len(valid)} valid, {len(invalid)} invalid vectors written to {HERE}")


if __name__ == "__main__":
    main()
