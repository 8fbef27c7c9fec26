"""Ports for daemons and servers that Python harnesses start on this
machine: the Python client's test worlds and bench/compare. The rule is
internal/localworld.FreePorts' (the Go harnesses'): ports from 20000 up,
outside the kernel's ephemeral range, where dialers take their source
ports; a port from that range may be handed to a retrying dial before its
server binds it. Drawn at random and checked to bind, so that runs side by
side seldom draw the same. Standard library only."""

from __future__ import annotations

import random
import socket

PORT_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
MIN_PORT = 20000  # below: services a developer's machine may run
TRIES = 200


class PortError(RuntimeError):
    """No port could be had: the machine's doing, as the message says."""


def free_ports(n: int) -> list[int]:
    """n distinct ports free on 127.0.0.1 just now, outside the ephemeral
    range. They are held together while drawn, then released."""
    try:
        with open(PORT_RANGE_FILE) as f:
            lo, hi = (int(x) for x in f.read().split())
    except (OSError, ValueError) as e:
        raise PortError(f"cannot read the ephemeral port range from {PORT_RANGE_FILE}: {e} "
                        "(the machine's setting, not the caller's)") from e
    spans = [(a, b) for a, b in ((MIN_PORT, lo - 1), (max(hi + 1, MIN_PORT), 65535)) if a <= b]
    if not spans:
        raise PortError(f"no port from {MIN_PORT} up lies outside the ephemeral range {lo}-{hi} "
                        f"(the machine's setting: narrow {PORT_RANGE_FILE})")
    held: list[socket.socket] = []
    try:
        for _ in range(n):
            for _ in range(TRIES):
                a, b = random.choice(spans)
                s = socket.socket()
                try:
                    s.bind(("127.0.0.1", random.randint(a, b)))
                except OSError:
                    s.close()
                    continue
                held.append(s)
                break
            else:
                raise PortError(f"no free port outside the ephemeral range {lo}-{hi} in {TRIES} tries "
                                "(the machine's ports are taken, not the caller's fault)")
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()
