"""Bidirectional TCP loopback throughput with one stream each way, for
bench/compare: the practical limit of a 2-node ring on this machine.

Two processes (like two daemons), one TCP connection between them; each
sends 64 MiB buffers with sendall in one thread while its main thread
receives into a 64 MiB buffer, both directions at once. Unlike iperf3
3.x, whose one thread per process both sends and receives, sending and
receiving here run on threads of their own, as in the daemon (socket
calls release the GIL, so this is not Python-bound at these sizes).

  tcp_bidir.py --listen PORT --seconds S     # start first
  tcp_bidir.py --connect PORT --seconds S
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
    ap.add_argument("--timeout", type=float, default=30.0, help="give up waiting for the peer after this long")
    a = ap.parse_args()
    if a.seconds <= 0:
        ap.error(f"--seconds {a.seconds}: want more than 0")

    if a.listen is not None:
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", a.listen))
        ls.listen(1)
        ls.settimeout(a.timeout)
        conn, _ = ls.accept()
        ls.close()
    else:
        deadline = time.monotonic() + a.timeout
        while True:
            try:
                conn = socket.create_connection(("127.0.0.1", a.connect), timeout=a.timeout)
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    print(f"tcp_bidir: nothing listens on 127.0.0.1:{a.connect} after {a.timeout}s", file=sys.stderr)
                    return 1
                time.sleep(0.05)
    conn.settimeout(a.timeout + a.seconds)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    # A one-byte handshake each way so both sides start timing together.
    conn.sendall(b"s")
    if conn.recv(1) != b"s":
        print("tcp_bidir: peer closed before starting", file=sys.stderr)
        return 1

    out = memoryview(bytearray(CHUNK))
    sent = {"bytes": 0, "s": 0.0, "err": None}

    def send():
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < a.seconds:
                conn.sendall(out)
                sent["bytes"] += CHUNK
            conn.shutdown(socket.SHUT_WR)
        except OSError as e:
            sent["err"] = e
        sent["s"] = time.monotonic() - t0

    th = threading.Thread(target=send)
    t0 = time.monotonic()
    th.start()
    buf = memoryview(bytearray(CHUNK))
    got = 0
    while True:
        n = conn.recv_into(buf)
        if n == 0:
            break
        got += n
    recv_s = time.monotonic() - t0
    th.join()
    conn.close()
    if sent["err"]:
        print(f"tcp_bidir: send: {sent['err']}", file=sys.stderr)
        return 1
    print(json.dumps({"sent_bytes": sent["bytes"], "send_s": sent["s"], "recv_bytes": got, "recv_s": recv_s}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
