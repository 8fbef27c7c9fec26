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


def bad(name: str, direction: str, raw: bytes, error: str) -> None:
    invalid.append({"name": name, "direction": direction, "hex": raw.hex(),
                    "error": error, "valid": False})


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


def call_ok(name: str, fid: int, generation: int, seq: int, result: bytes) -> None:
    payload = struct.pack("<IIQ", generation, 0, seq) + result
    add(name, {"type": "CALL_OK", "id": fid, "frame_flags": 0, "generation": generation,
               "seq": seq, "result": result.hex()}, frame(T["CALL_OK"], fid, payload))


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
    # Version 0 was never spoken: its layout is unknown, so it cannot decode.
    bad("hello_ok_version_0", "d2c",
        frame(T["HELLO_OK"], 1, p_hello_ok(dict(ok_v3, version=0))[:60]), "bad_version")
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
    bad("call_undefined_flag", "c2d",
        frame(T["CALL"], 3, p_call(1, 1, 1, 4, 0, 0, b"", b"")), "bad_flags")
    bad("error_undefined_header_flag", "d2c", frame(T["ERROR"], 0, p_error(1, b"x"), flags=2),
        "bad_flags")


def txt_value(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    return "x" + v.encode().hex()


def txt_lines() -> list[str]:
    out = [
        "# collectived protocol test vectors; generated by gen_vectors.py, do not edit.",
        "# valid<TAB>name<TAB>direction<TAB>fd<TAB>hex<TAB>key=value;...",
        "# invalid<TAB>name<TAB>direction<TAB>-<TAB>hex<TAB>error=<check>",
        "# type is a bare name; other integers are decimal; strings and byte fields are 'x' + hex.",
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
        out.append("\t".join(["valid", v["name"], v["direction"], "1" if v["fd"] else "0",
                              v["hex"], ";".join(fields)]))
    for v in invalid:
        out.append("\t".join(["invalid", v["name"], v["direction"], "-", v["hex"],
                              "error=" + v["error"]]))
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
