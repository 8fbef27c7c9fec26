"""The ring settings of the tree being measured, read from its source.

The daemon's defaults change as collectived is tuned; bench/compare reads
them from the tree it builds so that the report states them. Each is
declared once, by the package that uses it (rendezvous/config.go for the
streams, ring/config.go for the segment; config/config.go refers to them,
and older trees declared them there). A value the patterns no longer find
is None, and the report says so rather than guessing.
"""

import os
import re

_UNIT = {"": 1, "KiB": 1 << 10, "MiB": 1 << 20}


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _size(m):
    """'512 * KiB', '1 << 20', '65536' as matched below, in bytes."""
    if m is None:
        return None
    num, op, rhs = m.group(1), m.group(2), m.group(3)
    if op == "<<":
        return int(num) << int(rhs)
    if op == "*":
        return int(num) * _UNIT.get(rhs, 0) or None
    return int(num)


_EXPR = r"(\d+)\s*(?:(<<|\*)\s*(\d+|KiB|MiB))?"


def read(src: str) -> dict:
    cfg = _read(os.path.join(src, "config", "config.go"))
    streams_src = _read(os.path.join(src, "rendezvous", "config.go")) + cfg
    seg_src = _read(os.path.join(src, "ring", "config.go")) + cfg
    d_streams = re.search(r"DefaultStreams\s*=\s*(\d+)", streams_src)
    d_seg = re.search(r"DefaultSegmentBytes\s*=\s*" + _EXPR, seg_src)
    return {
        "daemon_streams": int(d_streams.group(1)) if d_streams else None,
        "daemon_segment_bytes": _size(d_seg),
    }


def describe(streams, segment) -> str:
    s = "? streams" if streams is None else f"{streams} TCP stream{'s' if streams != 1 else ''} per link"
    if segment is None:
        return s + ", ? segments"
    for unit, m in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if segment % m == 0:
            return f"{s}, {segment // m} {unit} segments"
    return f"{s}, {segment} B segments"
