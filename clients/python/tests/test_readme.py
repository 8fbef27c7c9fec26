"""The client snippets of README.md, clients/python/README.md,
clients/c/README.md and the collectived package's docstring run as printed
against a real daemon (a 1x1 world of job "demo", the job the snippets
name, also set as $COLLECTIVED_JOB): a snippet that no longer runs is a
documentation bug a reader meets first.

The C and Go snippets are statement lists; each is wrapped in ``main``
(C: with the names it leaves to the reader, ``n`` and ``buf``, built with the
library's one source; Go: in a scratch module that replaces the project's
module with this checkout, built offline from the module cache).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import Iterator

import pytest

from worlds import REPO, World

README = os.path.join(REPO, "README.md")
PY_README = os.path.join(REPO, "clients", "python", "README.md")
C_README = os.path.join(REPO, "clients", "c", "README.md")
C_DIR = os.path.join(REPO, "clients", "c")


def blocks(path: str, lang: str) -> list[str]:
    """The fenced code blocks of ``path`` in language ``lang``."""
    with open(path, encoding="utf-8") as f:
        return re.findall(r"^```" + lang + r"\n(.*?)^```", f.read(), re.S | re.M)


@pytest.fixture(scope="module")
def demo_world(collectived_bin: str) -> Iterator[World]:
    w = World(collectived_bin, 1, 1, job="demo")
    try:
        w.start()
        yield w
    finally:
        w.stop()


def _env(world: World) -> dict[str, str]:
    src = os.path.join(REPO, "clients", "python", "src")
    return dict(os.environ, COLLECTIVED_SOCKET=world.sockets[0], COLLECTIVED_JOB="demo",
                PYTHONPATH=os.pathsep.join([src] + [p for p in os.environ.get(
                    "PYTHONPATH", "").split(os.pathsep) if p]))


def docstring_example() -> str:
    """The ``>>>`` example of the package's docstring, as a script."""
    with open(os.path.join(REPO, "clients", "python", "src", "collectived", "__init__.py"),
              encoding="utf-8") as f:
        lines = re.findall(r"^(?:>>>|\.\.\.) ?(.*)$", f.read(), re.M)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("path", [README, PY_README, "docstring"],
                         ids=["README.md", "clients/python", "collectived.__doc__"])
def test_python_snippet_runs(demo_world: World, path: str) -> None:
    (code,) = [docstring_example()] if path == "docstring" else blocks(path, "python")
    assert "collectived.Client(" in code and "allreduce(" in code
    r = subprocess.run([sys.executable, "-c", code], env=_env(demo_world),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{path} snippet failed:\n{r.stdout}\n{r.stderr}"


@pytest.mark.parametrize("path", [README, C_README], ids=["README.md", "clients/c"])
def test_c_snippet_runs(demo_world: World, path: str, tmp_path) -> None:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    (code,) = blocks(path, "c")
    assert "cvd_connect(" in code and "cvd_allreduce" in code
    body = "\n".join(ln for ln in code.splitlines() if not ln.startswith("#include"))
    prog = tmp_path / "snippet.c"
    prog.write_text(
        "#include <stdint.h>\n#include <stdio.h>\n#include \"collectived.h\"\n"
        "int main(void)\n{\n"
        "\tsize_t n = 1024;\n\tstatic int64_t buf[1024];\n"
        f"{body}\n"
        "\t(void)buf;\n"
        "\treturn err.code != 0; /* the last call's outcome */\n}\n")
    exe = tmp_path / "snippet"
    r = subprocess.run([cc, "-std=c99", "-Wall", "-I", C_DIR, "-o", str(exe), str(prog),
                        os.path.join(C_DIR, "collectived.c")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{path} snippet does not compile:\n{r.stderr}"
    r = subprocess.run([str(exe)], env=_env(demo_world), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, f"{path} snippet failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"


def test_go_snippet_runs(demo_world: World, tmp_path) -> None:
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not os.path.exists(go):
        pytest.skip("no Go toolchain")
    (code,) = blocks(README, "go")
    assert "collectived.Dial(" in code and "collectived.AllReduce(" in code
    with open(os.path.join(REPO, "go.mod"), encoding="utf-8") as f:
        mod = f.read()
    module = re.search(r"^module (\S+)", mod, re.M).group(1)  # type: ignore[union-attr]
    version = re.search(r"^go (\S+)", mod, re.M).group(1)  # type: ignore[union-attr]
    (tmp_path / "go.mod").write_text(
        f"module snippet\n\ngo {version}\n\nrequire {module} v0.0.0\n\n"
        f"replace {module} => {REPO}\n")
    shutil.copy(os.path.join(REPO, "go.sum"), tmp_path / "go.sum")
    # The snippet drops its errors and leaves buf and seg unused: the wrapper
    # uses them, and fails on the last error.
    (tmp_path / "main.go").write_text(
        "package main\n\nimport (\n\t\"log\"\n\n"
        f"\tcollectived \"{module}/clients/go\"\n)\n\nfunc main() {{\n{code}"
        "\tif err != nil || len(buf) != 1<<24 || seg == nil || len(grad) != 1024 {\n"
        "\t\tlog.Fatalf(\"snippet: err %v, %d elements\", err, len(buf))\n\t}\n"
        "\tc.Close()\n}\n")
    env = dict(os.environ, GOFLAGS="-mod=mod", GOPROXY="off", GOWORK="off")
    r = subprocess.run([go, "build", "-o", "snippet", "."], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"README.md Go snippet does not build:\n{r.stderr}"
    r = subprocess.run([str(tmp_path / "snippet")], env=_env(demo_world), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, f"README.md Go snippet failed:\n{r.stdout}\n{r.stderr}"
