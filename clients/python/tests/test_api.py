"""The package's public surface: documented, typed, and importable from the
standard library alone (tests/test_client_scripted.py runs it without NumPy)."""

from __future__ import annotations

import inspect
import os
import sys

import pytest

import collectived

HERE = os.path.dirname(__file__)
PKG = os.path.join(HERE, "..", "src", "collectived")


def test_every_public_name_and_member_has_a_docstring() -> None:
    missing = []
    for name in collectived.__all__:
        obj = getattr(collectived, name)
        if not callable(obj) and not inspect.isclass(obj):
            continue  # constants
        if not (obj.__doc__ or "").strip():
            missing.append(name)
        if inspect.isclass(obj) and obj.__module__.startswith("collectived"):
            for k, v in vars(obj).items():
                if k.startswith("_"):
                    continue
                doc = v.fget.__doc__ if isinstance(v, property) else getattr(v, "__doc__", None)
                if (callable(v) or isinstance(v, property)) and not (doc or "").strip():
                    missing.append(f"{name}.{k}")
    assert missing == [], f"public API without a docstring: {missing}"


def test_typed_marker_is_packaged() -> None:
    assert os.path.isfile(os.path.join(PKG, "py.typed"))
    if sys.version_info < (3, 11):
        pytest.skip("tomllib needs Python 3.11")
    import tomllib

    with open(os.path.join(HERE, "..", "pyproject.toml"), "rb") as f:
        meta = tomllib.load(f)
    assert meta["project"]["name"] == "collectived"
    assert meta["project"]["dependencies"] == []  # the core is standard library only
    assert "py.typed" in meta["tool"]["setuptools"]["package-data"]["collectived"]
