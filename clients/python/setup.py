"""The one thing pyproject.toml cannot say without an experimental table:
the lane's atomics (src/collectived/_lanewords.c), an optional C extension.
Without a C compiler and Python's headers the build goes on without it,
and the client then speaks protocol version 1 (no lane)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("collectived._lanewords", ["src/collectived/_lanewords.c"], optional=True)])
