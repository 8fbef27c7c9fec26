"""Bidirectional TCP loopback throughput, N streams each way, for
bench/compare: the practical limit of a 2-node ring on this machine.

Two processes (like two daemons), N TCP connections between them (as a
ring link with N streams); on each connection each process sends 64 MiB
buffers with sendall in one thread while another receives into a 64 MiB
buffer, both directions at once. Unlike iperf3 3.x, whose one thread per
process both sends and receives, sending and receiving here run on
threads of their own, as in the daemon (socket calls release the GIL, so
this is not Python-bound at these sizes).

  tcp_bidir.py --listen PORT --seconds S [--streams N]    # start first
  tcp_bidir.py --connect PORT --seconds S [--streams N]
Each prints one JSON line: bytes sent and received and the seconds each took.
"""

import argparse
import json
import socket
import sys
import threading
import time

CHUNK = 64 << 20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--listen", type=int, metavar="PORT")
    g.add_argument("--connect", type=int, metavar="PORT")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--streams", type=int, default=1, help="TCP connections, each carrying both directions")
    ap.add_argument("--timeout", type=float, default=30.0, help="give up waiting for the peer after this long")
    a = ap.parse_args()
    if a.seconds <= 0:
        ap.error(f"--seconds {a.seconds}: want more than 0")
    if not 1 <= a.streams <= 16:
        ap.error(f"--streams {a.streams}: want 1 to 16")

    try:
        conns = accept(a) if a.listen is not None else connect(a)
    except OSError as e:
        print(f"tcp_bidir: {'accept on' if a.listen is not None else 'connect to'} 127.0.0.1:"
              f"{a.listen if a.listen is not None else a.connect}: {e}", file=sys.stderr)
        return 1
    for c in conns:
        c.settimeout(a.timeout + a.seconds)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # A one-byte handshake each way so both sides start timing together.
        c.sendall(b"s")
        if c.recv(1) != b"s":
            print("tcp_bidir: peer closed before starting", file=sys.stderr)
            return 1

    out = memoryview(bytearray(CHUNK))  # read-only use: one buffer for every sender
    sent = [{"bytes": 0, "s": 0.0, "err": None} for _ in conns]
    got = [{"bytes": 0, "s": 0.0, "err": None} for _ in conns]
    t0 = time.monotonic()

    def send(c, st):
        try:
            while time.monotonic() - t0 < a.seconds:
                c.sendall(out)
                st["bytes"] += CHUNK
            c.shutdown(socket.SHUT_WR)
        except OSError as e:
            st["err"] = e
        st["s"] = time.monotonic() - t0

    def recv(c, st):
        buf = memoryview(bytearray(CHUNK))
        try:
            while True:
                n = c.recv_into(buf)
                if n == 0:
                    break
                st["bytes"] += n
        except OSError as e:
            st["err"] = e
        st["s"] = time.monotonic() - t0

    threads = [threading.Thread(target=send, args=(c, st)) for c, st in zip(conns, sent)]
    threads += [threading.Thread(target=recv, args=(c, st)) for c, st in zip(conns, got)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in conns:
        c.close()
    for what, sts in (("send", sent), ("receive", got)):
        for i, st in enumerate(sts):
            if st["err"]:
                print(f"tcp_bidir: {what} on stream {i}: {st['err']}", file=sys.stderr)
                return 1
    print(json.dumps({"streams": len(conns), "sent_bytes": sum(s["bytes"] for s in sent),
                      "send_s": max(s["s"] for s in sent), "recv_bytes": sum(g["bytes"] for g in got),
                      "recv_s": max(g["s"] for g in got)}))
    return 0


def accept(a):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", a.listen))
    ls.listen(a.streams)
    ls.settimeout(a.timeout)
    try:
        return [ls.accept()[0] for _ in range(a.streams)]
    finally:
        ls.close()


def connect(a):
    deadline = time.monotonic() + a.timeout
    conns = []
    while len(conns) < a.streams:
        try:
            conns.append(socket.create_connection(("127.0.0.1", a.connect), timeout=a.timeout))
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise OSError(f"nothing listens after {a.timeout}s")
            time.sleep(0.05)
    return conns


if __name__ == "__main__":
    sys.exit(main())
