"""The package as a user installs it: a regular (non-editable) install
from this source tree, loaded from where pip put it, not from ``src/``.
A module or data file that pyproject.toml fails to ship breaks here, not
on a user's machine. Offline: the build uses the venv's setuptools
(scripts/setup.sh installs the version pyproject.toml asks for)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from worlds import JOB, REPO, World

SRC = os.path.join(REPO, "clients", "python")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A site directory holding collectived installed from a copy of the
    source tree (the build writes build/ and *.egg-info beside it)."""
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} here; the build needs 77+ (scripts/setup.sh installs it)")
    tmp = tmp_path_factory.mktemp("pkg")
    tree = os.path.join(tmp, "tree")
    shutil.copytree(SRC, tree, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "tests",
                                                             "examples"))
    site = os.path.join(tmp, "site")
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                        "--target", site, tree], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"pip install of {tree} failed:\n{p.stdout}\n{p.stderr}"
    return site


def _modules(top: str) -> list[str]:
    """The modules (and py.typed) under ``top``, subpackages too, as paths."""
    return sorted(os.path.relpath(os.path.join(d, f), top) for d, _, fs in os.walk(top)
                  for f in fs if f.endswith(".py") or f == "py.typed")


def test_installed_package_ships_every_module(installed: str) -> None:
    pkg = os.path.join(installed, "collectived")
    want = _modules(os.path.join(SRC, "src", "collectived"))
    got = _modules(pkg)
    assert "horovod/torch.py" in want
    assert got == want, f"installed {pkg} has {got}, the source tree {want}"


def test_installed_package_reduces_against_a_daemon(installed: str, world_1x1: World) -> None:
    # Run from an empty directory with only the install on the path ahead
    # of the venv, so that the editable src/ cannot stand in for it.
    code = textwrap.dedent(f"""
        import array, os, sys
        import collectived
        assert collectived.__file__.startswith({installed!r}), collectived.__file__
        with collectived.Client({world_1x1.sockets[0]!r}, job={JOB!r}, local_rank=0, label="installed") as c:
            buf = array.array("f", [1.5, 2.5, -3.0])
            c.allreduce(buf)
            # The lane's extension was built and shipped, and is the installed one.
            from collectived import _lanewords
            assert _lanewords.__file__.startswith({installed!r}), _lanewords.__file__
            print(list(buf), c.rank, c.size, c.lane, c.lane_answers)
    """)
    env = dict(os.environ, PYTHONPATH=installed)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=os.path.dirname(installed), env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["[1.5,", "2.5,", "-3.0]", "0", "1", "True", "1"], p.stdout
