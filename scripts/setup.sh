#!/usr/bin/env bash
# Installs what building and testing collectived needs on a fresh Debian
# machine, and nothing that is already there. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
have() { command -v "$1" >/dev/null 2>&1; }
have ip            || need_pkgs+=(iproute2)
have iptables      || need_pkgs+=(iptables)
have gcc           || need_pkgs+=(gcc)
have make          || need_pkgs+=(make)
have systemd-analyze || need_pkgs+=(systemd)
# bench/test_bench.py runs the OpenMPI side of bench/compare once.
have mpicc         || need_pkgs+=(openmpi-bin libopenmpi-dev)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_pkgs+=(python3-venv)
# Python's headers: the client's lane extension (clients/python/setup.py)
# is built with them; without them the client would have no lane.
python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
	|| need_pkgs+=(python3-dev)
# The Python client's PyTorch tests and train_torch.py run on Debian's own
# Python with Debian's torch (the PyPI wheel pulls gigabytes of CUDA).
[ -x /usr/bin/python3 ] || need_pkgs+=(python3)
/usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null || need_pkgs+=(python3-venv)
/usr/bin/python3 -c 'import torch' 2>/dev/null || need_pkgs+=(python3-torch)
# examples/train_ddp.py learns scikit-learn's bundled digits (no download).
/usr/bin/python3 -c 'import sklearn' 2>/dev/null || need_pkgs+=(python3-sklearn)
if [ ${#need_pkgs[@]} -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "setup: missing Debian packages ${need_pkgs[*]}; run as root or install them" >&2
		exit 1
	fi
	echo "setup: installing Debian packages: ${need_pkgs[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}"
fi

echo "setup: Go modules"
go mod download

echo "setup: Python venv .venv"
if [ ! -x .venv/bin/python ]; then
	python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# mypy: make test type-checks the client, which ships py.typed;
# setuptools 77+: the client's build backend (SPDX license string), which
# the packaging test runs offline from this venv.
# ml_dtypes: NumPy's bfloat16, which the client takes when it is there
# (optional for users); the tests reduce bfloat16 arrays with it.
.venv/bin/python -m pip install -q numpy pytest mypy 'setuptools>=77' ml_dtypes
.venv/bin/python -m pip install -q -e ./clients/python
# The lane extension is optional for users (no compiler: no lane), not
# here: the tests expect it.
.venv/bin/python -c 'from collectived import _lanewords' || {
	echo "setup: the Python client's lane extension (clients/python/src/collectived/_lanewords.c) did not build" >&2
	exit 1
}

echo "setup: Python venv .venv-torch (Debian's python3 and torch, for the PyTorch tests)"
if [ ! -x .venv-torch/bin/python ]; then
	/usr/bin/python3 -m venv --system-site-packages .venv-torch
fi
.venv-torch/bin/python -m pip install -q pytest
.venv-torch/bin/python -c 'import torch, numpy, pytest, sklearn'
echo "setup: done"
