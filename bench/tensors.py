"""Lists of named tensors (bench/resnet50_shapes.txt): the format the
step benchmark's programs share, read the same way as `collectived bench
--tensors` reads it (cmd/collectived/benchstep.go).

One tensor a line: its name, then its shape, the dimensions joined by "x"
("64x3x7x7"; a one-dimensional tensor is its length alone), separated by
blanks. Blank lines and lines starting with "#" are skipped. Names are
unique, at most 255 bytes; every dimension is at least 1.
"""

from __future__ import annotations

import math

MAX_NAME = 255  # collective.MaxNameLen
MAX_DIMS = 8  # collective.MaxDims


def numel(shape) -> int:
    return math.prod(shape)


def shape_text(shape) -> str:
    return "x".join(str(d) for d in shape)


def parse(text: str, where: str = "tensors") -> list[tuple[str, tuple[int, ...]]]:
    """The (name, shape) of every tensor of text; a ValueError names the
    line of anything else."""
    out: list[tuple[str, tuple[int, ...]]] = []
    seen: dict[str, int] = {}
    for i, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        f = line.split()
        if len(f) != 2:
            raise ValueError(f"{where}:{i}: want \"name shape\", got {line[:100]!r}")
        name, dims = f
        if len(name.encode()) > MAX_NAME:
            raise ValueError(f"{where}:{i}: name {name[:40]!r}... is {len(name.encode())} bytes, at most {MAX_NAME}")
        if name in seen:
            raise ValueError(f"{where}:{i}: {name} again (first on line {seen[name]}): names are unique")
        seen[name] = i
        try:
            shape = tuple(int(d) for d in dims.split("x"))
        except ValueError:
            raise ValueError(f"{where}:{i}: {name}: shape {dims!r} is not dimensions joined by x") from None
        if any(d < 1 for d in shape) or len(shape) > MAX_DIMS:
            raise ValueError(f"{where}:{i}: {name}: shape {dims!r}: want 1 to {MAX_DIMS} dimensions of at least 1")
        out.append((name, shape))
    if not out:
        raise ValueError(f"{where}: no tensors")
    return out


def read(path: str) -> list[tuple[str, tuple[int, ...]]]:
    with open(path) as f:
        return parse(f.read(), path)
