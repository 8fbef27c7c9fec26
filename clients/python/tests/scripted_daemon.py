"""A small scripted peer for client tests that need behaviour a real daemon
cannot be made to show on demand (replies out of order, a reply that never
comes, a fatal error, a malformed frame).

It speaks the protocol over a real Unix socket with real memfds and acts
like a world of ``world`` identical trainers: allreduce(sum) multiplies by
``world``, max/min leave values as they are, prod raises to the power;
reduce does as allreduce, allgather repeats the call's data ``world``
times (with per-rank counts: the caller's block is its data, every other
block zero bytes), reduce_scatter gives the caller's block of what
allreduce would give. Shared-memory calls of version 3 write the result
to their OUT span.
Call names steer it:

- ``"hold"``: reply only after the next call arrives (so replies come out of order);
- ``"silent"``: never reply;
- ``"mismatch"``: ERROR MISMATCH;
- ``"fatal"``: connection-level ERROR BAD_FRAME FATAL (id 0), then close;
- ``"garbage"``: send a frame with an unknown type;
- ``"wake"``: send a WAKE_CLIENT, a frame of protocol version 2 only;
- ``"wake-id"``: send a WAKE_CLIENT with id 5 (it must carry 0).

With ``version=2`` or 3 it also serves the lane (LANE, WAKE; it always sleeps on
the socket, so clients ring it) and answers calls that came on the lane
there, steered by more names:

- ``"lane-socket"``: answer on the socket instead (allowed);
- ``"lane-slow"``: answer after 50 ms, when the caller has stopped watching;
- ``"lane-skip"``: move d2c_seq by two;
- ``"lane-type"``: put a STATUS_OK on the lane;
- ``"lane-long"``: put a header claiming more than the slot holds;
- ``"lane-short"``: put a result 4 bytes shorter than the call's data;
- ``"lane-id"``: put the answer with another request's id;
- ``"lane-ring"``: ring the socket after every answer, whether the client
  sleeps or not (a ring that finds nothing is allowed).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import socket
import struct
import threading
import time
from typing import Optional

from collectived import _lane as L
from collectived import _protocol as P

_FMT = {P.DT_FLOAT32: "f", P.DT_FLOAT64: "d", P.DT_INT32: "i", P.DT_INT64: "q",
        P.DT_FLOAT16: "e"}


class ScriptedDaemon:
    def __init__(self, path: str, *, world: int = 2, inline_limit: int = 64,
                 max_in_flight: int = 8, timeout_ms: int = 1000, job: str = "demo",
                 version: int = 1, first_call_timeout_ms: int = 1000) -> None:
        self.path = path
        self.version = version  # the newest protocol version it speaks
        self.versions_asked: list[int] = []  # the version of every HELLO, in order
        # Answer HELLO in this version instead of the one asked (None: as asked).
        self.answer_version: Optional[int] = None
        self.lane_calls = 0  # calls taken from a lane
        self.ignore_wakes = False  # never take a call from the lane
        self.lane_size = L.SIZE  # the size LANE_OK states
        self.lane_fd = True  # LANE_OK carries the lane's fd
        self.world = world
        self.inline_limit = inline_limit
        self.max_in_flight = max_in_flight
        self.timeout_ms = timeout_ms
        self.first_call_timeout_ms = first_call_timeout_ms  # sent in version 3 on
        self.job = job
        self.calls: list[P.Call] = []
        self.frees: list[int] = []
        self.registered: list[int] = []
        self.bytes_received = 0
        self.rank_taken_times = 0  # answer this many HELLOs with RANK_TAKEN
        self.refuse = False  # answer PERMISSION before reading anything, as for bad credentials
        self.status_pad = 0  # bytes of padding in STATUS_OK's document (past max_frame if large)
        self._segs: dict[int, mmap.mmap] = {}
        # Which connection made each segment: a session's end frees its
        # own only (a client's refused first HELLO ends a session that may
        # finish after the next connection has made segments).
        self._seg_conn: dict[int, int] = {}
        self._lanes: dict[int, _DaemonLane] = {}
        self._ranks: dict[int, int] = {}  # each connection's rank (its local rank)
        self._next_seg = 1
        self._srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._srv.bind(path)
        self._srv.listen(4)
        self._srv.settimeout(10)
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self) -> None:
        for c in list(self._conns):
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            self._srv.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self._srv.close()
        self._thread.join(5)

    # ------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._srv.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _recv_frame(self, conn: socket.socket, max_len: int) -> tuple[Optional[P.Message], list[int]]:
        hdr, fds, _, _ = socket.recv_fds(conn, P.HEADER_SIZE, 4, socket.MSG_WAITALL)
        if len(hdr) < P.HEADER_SIZE:
            return None, fds
        length, ftype, flags, fid = P.parse_header(hdr, max_len)
        body = b""
        while len(body) < length:
            chunk = conn.recv(length - len(body))
            if not chunk:
                return None, fds
            body += chunk
        self.bytes_received += P.HEADER_SIZE + length
        return P.decode_payload(ftype, flags, fid, body), fds

    def _session(self, conn: socket.socket) -> None:
        held: list[bytes] = []
        try:
            if self.refuse:
                conn.sendall(P.encode(P.Error(0, 7, "uid 1000 is not allowed", P.FLAG_FATAL)))
                return
            msg, _ = self._recv_frame(conn, P.PRE_HELLO_MAX_FRAME)
            if not isinstance(msg, P.Hello):
                return
            self.versions_asked.append(msg.version)
            if msg.version > self.version:
                conn.sendall(P.encode(P.Error(msg.id, 2, f"HELLO speaks protocol version "
                                              f"{msg.version}, daemon speaks {self.version}",
                                              P.FLAG_FATAL)))
                return
            if msg.job != self.job:
                conn.sendall(P.encode(P.Error(msg.id, 3, f'HELLO names job "{msg.job}", '
                                              f'daemon serves job "{self.job}"', P.FLAG_FATAL)))
                return
            if self.rank_taken_times > 0:
                self.rank_taken_times -= 1
                conn.sendall(P.encode(P.Error(msg.id, 4, "local rank 0 of node 0 is held by pid 1",
                                              P.FLAG_FATAL)))
                return
            lr = 0 if msg.local_rank < 0 else msg.local_rank
            self._ranks[id(conn)] = lr
            v = msg.version if self.answer_version is None else self.answer_version
            conn.sendall(P.encode(P.HelloOk(
                msg.id, v, lr, self.world, 0, 1, lr, self.world, self.inline_limit,
                max(4096, self.inline_limit + 512), self.max_in_flight, 7, 1 << 30,
                self.timeout_ms, self.first_call_timeout_ms if v >= 3 else None)))
            while True:
                msg, fds = self._recv_frame(conn, max(4096, self.inline_limit + 512))
                if msg is None:
                    return
                out = self._handle(conn, msg, fds)
                if out == "close":
                    return
                if out is not None:
                    if isinstance(msg, P.Call) and msg.name == "hold":
                        held.append(out)
                        continue
                    conn.sendall(out)
                    for h in held:
                        conn.sendall(h)
                    held.clear()
        except OSError:
            return
        finally:
            conn.close()
            # list() copies in one step: another session may add meanwhile
            for sid in [sid for sid, c in list(self._seg_conn.items()) if c == id(conn)]:
                self._seg_conn.pop(sid, None)
                mm = self._segs.pop(sid, None)
                if mm is not None:
                    mm.close()
            lane = self._lanes.pop(id(conn), None)
            if lane is not None:
                lane.close()

    def _handle(self, conn: socket.socket, msg: P.Message, fds: list[int]) -> Optional[bytes | str]:
        if isinstance(msg, P.Lane):
            fd = os.memfd_create("scripted-lane", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, L.SIZE)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self._lanes[id(conn)] = _DaemonLane(mmap.mmap(fd, L.SIZE))
            ok = P.encode(P.LaneOk(msg.id, self.lane_size))
            if self.lane_fd:
                socket.send_fds(conn, [ok], [fd])
            else:
                conn.sendall(ok)
            os.close(fd)
            return None
        if isinstance(msg, P.Wake):
            if self.ignore_wakes:
                return None
            lane = self._lanes[id(conn)]
            call = lane.take()
            if call is None:
                return None  # the ring crossed a look: nothing there
            self.lane_calls += 1
            out = self._handle(conn, call, [])
            if not isinstance(out, bytes) or call.name in ("lane-socket", "wake", "wake-id", "garbage"):
                return out  # on the socket
            if call.name == "lane-slow":
                time.sleep(0.05)
            if lane.put(out, call.name) or call.name == "lane-ring":
                conn.sendall(P.encode(P.WakeClient(0)))
            return None
        if isinstance(msg, P.Alloc):
            size = (msg.size + 4095) // 4096 * 4096
            fd = os.memfd_create("scripted", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            sid = self._next_seg
            self._next_seg += 1
            self._segs[sid] = mmap.mmap(fd, size)
            self._seg_conn[sid] = id(conn)
            socket.send_fds(conn, [P.encode(P.AllocOk(msg.id, sid, size))], [fd])
            os.close(fd)
            return None
        if isinstance(msg, P.Register):
            fd = fds[0]
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            assert seals & fcntl.F_SEAL_SHRINK, "registered memfd lacks F_SEAL_SHRINK"
            assert os.fstat(fd).st_size == msg.size
            sid = self._next_seg
            self._next_seg += 1
            self._segs[sid] = mmap.mmap(fd, msg.size)
            self._seg_conn[sid] = id(conn)
            os.close(fd)
            self.registered.append(sid)
            return P.encode(P.RegisterOk(msg.id, sid, msg.size))
        if isinstance(msg, P.Free):
            self.frees.append(msg.segment)
            self._segs.pop(msg.segment, None)
            self._seg_conn.pop(msg.segment, None)
            return P.encode(P.FreeOk(msg.id))
        if isinstance(msg, P.Status):
            pad = ', "pad": "%s"' % ("x" * self.status_pad) if self.status_pad else ""
            return P.encode(P.StatusOk(msg.id, '{"job": "%s", "calls": %d%s}' % (
                self.job, len(self.calls), pad)))
        if isinstance(msg, P.Call):
            self.calls.append(msg)
            if msg.name == "silent":
                return None
            if msg.name == "mismatch":
                return P.encode(P.Error(msg.id, 15, "world rank 1 called allreduce(float32, "
                                        "sum, count=4), world rank 0 called count=3"))
            if msg.name == "fatal":
                conn.sendall(P.encode(P.Error(0, 1, "scripted fatal error", P.FLAG_FATAL)))
                return "close"
            if msg.name == "garbage":
                return struct.pack("<IBBHQ", 0, 0x42, 0, 0, msg.id)
            if msg.name == "wake":
                return struct.pack("<IBBHQ", 0, P.WAKE_CLIENT, 0, 0, 0)
            if msg.name == "wake-id":  # a WAKE_CLIENT that carries an id
                return struct.pack("<IBBHQ", 0, P.WAKE_CLIENT, 0, 0, 5)
            seq = len(self.calls) - 1
            rank = self._ranks.get(id(conn), 0)
            if msg.flags & P.CALL_SHM:
                mm = self._segs[msg.segment]
                n = msg.count * P.DTYPE_SIZES[msg.dtype]
                res = self._result(msg, bytes(mm[msg.offset:msg.offset + n]), rank)
                if msg.out is not None:
                    om = self._segs[msg.out[0]]
                    om[msg.out[1]:msg.out[1] + len(res)] = res
                else:
                    mm[msg.offset:msg.offset + n] = res
                return P.encode(P.CallOk(msg.id, 7, seq))
            return P.encode(P.CallOk(msg.id, 7, seq, self._result(msg, bytes(msg.data), rank)))
        raise AssertionError(f"unexpected {msg!r}")

    def _result(self, c: P.Call, data: bytes, rank: int) -> bytes:
        """What the call gives this rank, by the rules in the docstring."""
        size = P.DTYPE_SIZES.get(c.dtype, 0)
        if c.op == P.OP_ALLGATHER:
            if c.counts is None:
                return data * self.world
            return b"".join(data if i == rank else bytes(n * size) for i, n in enumerate(c.counts))
        if c.op == P.OP_REDUCE_SCATTER:
            red = self._reduce(c, data)
            counts = c.counts or (c.count // self.world,) * self.world
            at = sum(counts[:rank]) * size
            return red[at:at + counts[rank] * size]
        return self._reduce(c, data)

    def _reduce(self, c: P.Call, data: bytes) -> bytes:
        if c.op not in (P.OP_ALLREDUCE, P.OP_REDUCE, P.OP_REDUCE_SCATTER) or not data:
            return data
        f = _FMT.get(c.dtype)
        if f is None:  # the types struct has no format for: as max and min
            return data
        vals = struct.unpack(f"<{c.count}{f}", data)
        if c.reduce == P.RED_SUM:
            vals = tuple(v * self.world for v in vals)
        elif c.reduce == P.RED_PROD:
            vals = tuple(v ** self.world for v in vals)
        if c.scale is not None:
            vals = tuple(v * c.scale[0] * c.scale[1] for v in vals)
        return struct.pack(f"<{c.count}{f}", *vals)


class _DaemonLane:
    """The daemon's side of a lane, in Python through the client's own
    atomics (collectived._lanewords)."""

    def __init__(self, mm: mmap.mmap) -> None:
        from collectived import _lanewords

        self.mm = mm
        self.words = _lanewords.Words(mm)
        self.taken = 0
        self.put_seq = 0
        self.words.store(L.D_PARKED, 1)  # always asleep on the socket: clients ring

    def take(self) -> Optional[P.Call]:
        n = self.words.load(L.C2D_SEQ)
        if n == self.taken:
            return None
        hdr = bytes(self.mm[L.C2D:L.C2D + P.HEADER_SIZE])
        length, ftype, flags, fid = P.parse_header(hdr, L.FRAME_MAX)
        msg = P.decode_payload(ftype, flags, fid, bytes(self.mm[L.C2D + P.HEADER_SIZE:
                                                                 L.C2D + P.HEADER_SIZE + length]))
        assert isinstance(msg, P.Call), msg
        self.taken = n
        self.words.store(L.C2D_TAKEN, n)
        return msg

    def put(self, frame: bytes, script: str) -> bool:
        """Put an answer (as the script says); returns whether the client
        sleeps on the socket."""
        if script == "lane-type":
            frame = P.encode(P.StatusOk(0, "{}"))
        elif script == "lane-short":  # a result 4 bytes short of the call's data
            frame = struct.pack("<I", len(frame) - P.HEADER_SIZE - 4) + frame[4:-4]
        elif script == "lane-id":  # the answer of another request
            frame = frame[:8] + struct.pack("<Q", 99) + frame[16:]
        elif script == "lane-long":
            # Within max_frame (4096 here) but, with its header, over the slot.
            frame = struct.pack("<IBBHQ", 4090, P.CALL_OK, 0, 0, 2) + frame[P.HEADER_SIZE:]
        self.mm[L.D2C:L.D2C + len(frame)] = frame
        self.put_seq += 2 if script == "lane-skip" else 1
        self.words.store(L.D2C_SEQ, self.put_seq)
        return self.words.load(L.C_PARKED) != 0

    def close(self) -> None:
        self.words.close()
        self.mm.close()
