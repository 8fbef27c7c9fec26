"""Protocol version 4 in the codec (/tmp/named_spec.md, docs/PROTOCOL.md):
CALL's flag NAMED (bit 2, 0x04) byte for byte against frames written out
by hand, undefined (``bad_flags``) on a connection of version 1 to 3 and
checked before the rest of the payload; HELLO and HELLO_OK of version 4
(HELLO_OK keeps version 3's 68-byte layout). The shared vectors' named
calls are decoded and re-encoded by test_codec.py like every other
vector; here they are also checked to be named, and NAMED on a version-3
connection to be refused."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from collectived import _protocol as P


def h(s: str) -> bytes:
    return bytes.fromhex("".join(s.split()))


CASES = {
    # allreduce of two float32 (1.0, 2.0), sum, named "w", inline.
    "allreduce_named_inline": (
        P.Call(3, P.OP_ALLREDUCE, P.DT_FLOAT32, P.RED_SUM, 2, name="w", flags=P.CALL_NAMED,
               data=h("0000803f 00000040")),
        h("""1a000000 05 00 0000 0300000000000000
             01 01 01 04 00000000 0200000000000000 01 77
             0000803f 00000040""")),
    # broadcast of 16 bytes from root 1, named "layer.0", in shared memory
    # (segment 2 offset 32).
    "broadcast_named_shm": (
        P.Call(4, P.OP_BROADCAST, P.DT_BYTES, P.RED_NONE, 16, root=1, name="layer.0",
               flags=P.CALL_NAMED | P.CALL_SHM, segment=2, offset=32),
        h("""28000000 05 00 0000 0400000000000000
             02 05 00 05 01000000 1000000000000000 07 6c617965722e30
             02000000 00000000 2000000000000000""")),
    # allreduce avg of one float64 with a shape (1,), named "g": NAMED and EXT.
    "allreduce_named_ext": (
        P.Call(5, P.OP_ALLREDUCE, P.DT_FLOAT64, P.RED_AVG, 1, name="g",
               flags=P.CALL_NAMED | P.CALL_EXT, dims=(1,), data=h("000000000000f03f")),
        h("""26000000 05 00 0000 0500000000000000
             01 02 05 06 00000000 0100000000000000 01 67
             01 00 0000 0100000000000000
             000000000000f03f""")),
    # a named barrier: no data, a name.
    "barrier_named": (
        P.Call(6, P.OP_BARRIER, 0, P.RED_NONE, 0, name="sync", flags=P.CALL_NAMED),
        h("""15000000 05 00 0000 0600000000000000
             04 00 00 04 00000000 0000000000000000 04 73796e63""")),
}


def test_codes() -> None:
    assert P.PROTOCOL_VERSION == 4 and P.MIN_PROTOCOL_VERSION == 1
    assert (P.CALL_SHM, P.CALL_EXT, P.CALL_NAMED) == (1, 2, 4)
    assert P.CALL_FLAG_SINCE == {P.CALL_EXT: 3, P.CALL_NAMED: 4}


@pytest.mark.parametrize("name", list(CASES))
def test_encode_is_the_layout(name: str) -> None:
    call, frame = CASES[name]
    assert P.encode(call).hex() == frame.hex()
    assert P.encode_call_prefix(call) + (b"" if call.flags & P.CALL_SHM else bytes(call.data)) \
        == frame


@pytest.mark.parametrize("name", list(CASES))
def test_decode_on_version_4(name: str) -> None:
    call, frame = CASES[name]
    got = P.decode(frame, 1 << 16, 4)
    assert isinstance(got, P.Call) and got.named
    assert dataclasses.replace(got, data=bytes(got.data)) == dataclasses.replace(
        call, data=bytes(call.data))
    assert P.decode(frame, 1 << 16) == got  # 4 is the default


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("name", list(CASES))
def test_named_is_undefined_before_version_4(name: str, version: int) -> None:
    _, frame = CASES[name]
    with pytest.raises(P.FrameError) as ei:
        P.decode(frame, 1 << 16, version)
    assert ei.value.check == "bad_flags"
    assert str(ei.value) == (f"bad_flags: CALL flag NAMED on a connection of protocol version "
                             f"{version} (named calls are version 4's)")


def test_named_checked_before_the_rest() -> None:
    # NAMED on version 3 with a payload cut after the fixed fields (its
    # name missing): the flag is what fails, not the length.
    _, frame = CASES["allreduce_named_inline"]
    cut = frame[:P.HEADER_SIZE + P.CALL_FIXED_SIZE]
    cut = (len(cut) - P.HEADER_SIZE).to_bytes(4, "little") + cut[4:]
    with pytest.raises(P.FrameError, match="bad_flags: CALL flag NAMED"):
        P.decode(cut, 1 << 16, 3)
    with pytest.raises(P.FrameError, match="payload_length"):
        P.decode(cut, 1 << 16, 4)


def test_undefined_bits_stay_undefined() -> None:
    _, frame = CASES["allreduce_named_inline"]
    for bit in (0x08, 0x10, 0x80):
        bad = bytearray(frame)
        bad[P.HEADER_SIZE + 3] |= bit
        with pytest.raises(P.FrameError, match=f"bad_flags: CALL flags 0x{bad[19]:02x} not "
                                               "defined"):
            P.decode(bytes(bad), 1 << 16, 4)


def test_unnamed_name_is_a_request_rule() -> None:
    # NAMED with an empty name is well formed: the daemon refuses it
    # (BAD_REQUEST, "a named call needs a name"), the codec decodes it.
    c = P.Call(9, P.OP_ALLREDUCE, P.DT_INT32, P.RED_SUM, 1, flags=P.CALL_NAMED, data=bytes(4))
    got = P.decode(P.encode(c), 1 << 16, 4)
    assert isinstance(got, P.Call) and got.named and got.name == ""


def test_hello_and_hello_ok_of_version_4() -> None:
    hello = P.Hello(1, local_rank=1, pid=77, job="demo", label="t")
    assert hello.version == 4
    frame = P.encode(hello)
    assert frame[P.HEADER_SIZE + 4:P.HEADER_SIZE + 6] == b"\x04\x00"
    assert P.decode(frame) == hello
    ok = P.HelloOk(1, 4, 2, 4, 1, 2, 0, 2, 65536, 1 << 20, 64, 3, 1 << 30, 300000, 600000)
    enc = P.encode(ok)
    assert len(enc) == P.HEADER_SIZE + 68  # version 3's layout
    assert enc[P.HEADER_SIZE + 2:] == P.encode(dataclasses.replace(ok, version=3))[
        P.HEADER_SIZE + 2:]
    assert P.decode(enc) == ok
    with pytest.raises(P.FrameError, match="HELLO_OK payload is 60 bytes, must be 68 in "
                                           "protocol version 4"):
        P.decode(len(enc[P.HEADER_SIZE:-8]).to_bytes(4, "little") + enc[4:-8])
    with pytest.raises(ValueError, match="HELLO_OK of protocol version 4 needs "
                                         "first_call_timeout_ms"):
        P.encode(dataclasses.replace(ok, first_call_timeout_ms=None))


VECTORS = os.path.join(os.path.dirname(__file__), "..", "..", "testdata", "vectors.json")


def _named_vectors() -> list[dict]:
    with open(VECTORS, encoding="utf-8") as f:
        vs = json.load(f)
    return [v for v in vs if v.get("valid", True) and v["decoded"]["type"] == "CALL"
            and v["decoded"]["flags"] & P.CALL_NAMED]


def test_shared_named_vectors() -> None:
    vs = _named_vectors()
    assert len(vs) >= 10, [v["name"] for v in vs]
    with open(VECTORS, encoding="utf-8") as f:
        bad = {v["name"]: v for v in json.load(f) if not v.get("valid", True)}
    v3 = bad["call_named_on_v3_connection"]
    assert v3["error"] == "bad_flags" and v3["context"]["connection_version"] == 3
    with pytest.raises(P.FrameError, match="bad_flags: CALL flag NAMED on a connection of "
                                           "protocol version 3"):
        P.decode(bytes.fromhex(v3["hex"]), version=3)
    refused = [v for v in vs if v.get("rule") == "named_without_name"]
    assert refused and all(v["decoded"]["name"] == "" for v in refused)
    for v in vs:
        version = int(v.get("context", {}).get("connection_version", 4))
        got = P.decode(bytes.fromhex(v["hex"]), version=version)
        assert isinstance(got, P.Call) and got.named, v["name"]
        assert P.encode(got).hex() == v["hex"], v["name"]
