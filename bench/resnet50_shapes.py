#!/usr/bin/env python3
"""The parameter tensors of torchvision's ResNet-50, for the step benchmark
of issue 27: writes bench/resnet50_shapes.txt.

    python3 bench/resnet50_shapes.py            # rewrite bench/resnet50_shapes.txt
    python3 bench/resnet50_shapes.py --check    # the file is what this writes (and, where
                                                # torchvision imports, what resnet50() has)

The list is built from the architecture itself (He et al. 2015, as
torchvision.models.resnet50 builds it: a 7x7 stem, bottleneck blocks of
[3, 4, 6, 3] at widths 64, 128, 256, 512 with expansion 4, a projection
"downsample" in each stage's first block, a 1000-way fc), in the order of
named_parameters(): 161 tensors, 25,557,032 parameters (102,228,128 bytes
in float32). No weights are read; only names and shapes matter. With
--check it is compared name by name with torchvision.models.resnet50()
where torchvision can be imported (Debian's python3-torchvision).

The file holds one tensor a line, "name shape", the shape's dimensions
joined by "x" (a one-dimensional tensor is its length alone); lines
starting with "#" are comments. `collectived bench --tensors` and
bench/gloo_allreduce.py --tensors read it (bench/tensors.py).
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FILE = os.path.join(HERE, "resnet50_shapes.txt")
TENSORS = 161
PARAMS = 25_557_032

sys.path.insert(0, HERE)
import tensors  # noqa: E402


def build() -> list[tuple[str, tuple[int, ...]]]:
    """ResNet-50's parameters, (name, shape), in named_parameters() order."""
    out: list[tuple[str, tuple[int, ...]]] = []

    def conv(name: str, cout: int, cin: int, k: int) -> None:
        out.append((f"{name}.weight", (cout, cin, k, k)))

    def bn(name: str, c: int) -> None:
        out.extend([(f"{name}.weight", (c,)), (f"{name}.bias", (c,))])

    conv("conv1", 64, 3, 7)
    bn("bn1", 64)
    inplanes = 64
    for stage, (planes, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3)), start=1):
        for b in range(blocks):
            p = f"layer{stage}.{b}"
            conv(f"{p}.conv1", planes, inplanes, 1)
            bn(f"{p}.bn1", planes)
            conv(f"{p}.conv2", planes, planes, 3)
            bn(f"{p}.bn2", planes)
            conv(f"{p}.conv3", planes * 4, planes, 1)
            bn(f"{p}.bn3", planes * 4)
            if b == 0:  # the projection shortcut: channels (and, past stage 1, stride) change
                conv(f"{p}.downsample.0", planes * 4, inplanes, 1)
                bn(f"{p}.downsample.1", planes * 4)
            inplanes = planes * 4
    out += [("fc.weight", (1000, 2048)), ("fc.bias", (1000,))]
    return out


def text(ts: list[tuple[str, tuple[int, ...]]]) -> str:
    n = sum(tensors.numel(s) for _, s in ts)
    lines = ["# torchvision.models.resnet50(): its parameter tensors in named_parameters() order,",
             f"# {len(ts)} tensors, {n:,} parameters ({4 * n:,} bytes in float32).",
             "# Written by bench/resnet50_shapes.py; one tensor a line: name shape (dimensions joined by x)."]
    lines += [f"{name} {tensors.shape_text(shape)}" for name, shape in ts]
    return "\n".join(lines) + "\n"


def torchvision_shapes() -> list[tuple[str, tuple[int, ...]]] | None:
    """named_parameters() of torchvision's resnet50(), None where it is not
    installed."""
    try:
        import torchvision
    except ImportError:
        return None
    m = torchvision.models.resnet50()
    return [(n, tuple(p.shape)) for n, p in m.named_parameters()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help=f"check {os.path.relpath(FILE)} instead of writing it")
    ap.add_argument("--out", default=FILE)
    a = ap.parse_args()
    ts = build()
    n = sum(tensors.numel(s) for _, s in ts)
    if (len(ts), n) != (TENSORS, PARAMS):
        print(f"resnet50_shapes: built {len(ts)} tensors of {n:,} parameters, want {TENSORS} of {PARAMS:,}",
              file=sys.stderr)
        return 1
    if not a.check:
        with open(a.out, "w") as f:
            f.write(text(ts))
        print(f"wrote {a.out}: {len(ts)} tensors, {n:,} parameters")
        return 0
    with open(a.out) as f:
        if f.read() != text(ts):
            print(f"resnet50_shapes: {a.out} is not what this script writes; run it again", file=sys.stderr)
            return 1
    tv = torchvision_shapes()
    if tv is None:
        print(f"{a.out}: {len(ts)} tensors, {n:,} parameters (torchvision not installed: not compared with it)")
        return 0
    if tv != ts:
        diff = [(x, y) for x, y in zip(tv, ts) if x != y][:5]
        print(f"resnet50_shapes: torchvision's resnet50() has {len(tv)} tensors, this {len(ts)}; "
              f"first differences (torchvision, this): {diff}", file=sys.stderr)
        return 1
    print(f"{a.out}: {len(ts)} tensors, {n:,} parameters, the same as torchvision's resnet50()")
    return 0


if __name__ == "__main__":
    sys.exit(main())
