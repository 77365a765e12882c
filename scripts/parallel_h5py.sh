#!/usr/bin/env bash
# Build an MPI-enabled h5py (MPI-IO driver "mpio") in a separate virtualenv,
# against Debian's parallel HDF5 and MPICH, for mpiredist.arrays.hdf5's MPI-IO path.
#
# h5py wheels from PyPI are serial (h5py.get_config().mpi is False); mpiredist
# then falls back to token-passing writes.  This script makes the parallel one.
#
# Usage:   bash scripts/parallel_h5py.sh [VENV]        (default VENV=/tmp/ph5)
# Then:    timeout 120 /usr/bin/mpiexec.mpich -n 4 VENV/bin/python -m pytest \
#              --with-mpi tests/mpi/test_hdf5.py
# Needs root for apt-get (Debian 12 "bookworm": HDF5 1.10.8, MPICH 4.0.2) and
# the PyPI registry.  Everything must use the SAME MPI: Debian's MPICH, i.e.
# /usr/bin/mpicc.mpich to build and /usr/bin/mpiexec.mpich to run (a pip
# "mpich" wheel or pyenv shims earlier on PATH must not be picked up).
set -euo pipefail

VENV=${1:-/tmp/ph5}
PYTHON=${PYTHON:-python3}
HDF5_DIR=/usr/lib/x86_64-linux-gnu/hdf5/mpich

if [ ! -e "$HDF5_DIR/include/hdf5.h" ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y libhdf5-mpich-dev mpich pkg-config
fi

"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --upgrade pip setuptools wheel
# mpi4py compiled against Debian's MPICH (not the pip "mpich" wheel).
if ! "$VENV/bin/python" -c "from mpi4py import MPI" 2>/dev/null; then
    PATH=/usr/bin:$PATH MPICC=/usr/bin/mpicc.mpich CC=/usr/bin/mpicc.mpich \
        "$VENV/bin/pip" install --no-cache-dir --no-binary=mpi4py mpi4py
fi
"$VENV/bin/pip" install numpy pytest pytest-mpi
# h5py from source with HDF5_MPI=ON against the MPICH flavour of HDF5.
# Without build isolation: an isolated build would compile its own mpi4py
# (pinned 4.0.0) with whatever "mpicc" comes first on PATH, which fails
# against newer MPICH headers (MPI_ERR_REVOKED undeclared) and would not be
# the mpi4py installed above anyway.
"$VENV/bin/pip" install "setuptools>=77" "Cython>=3,<4" pkgconfig
PATH=/usr/bin:$PATH CC=/usr/bin/mpicc.mpich MPICC=/usr/bin/mpicc.mpich \
    HDF5_MPI=ON HDF5_DIR="$HDF5_DIR" \
    "$VENV/bin/pip" install --no-cache-dir --no-build-isolation \
    --no-binary=h5py h5py
# The project itself, editable, once it has packaging metadata; otherwise run
# from the repository root ("python -m pytest" puts it on sys.path).
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ -e "$ROOT/pyproject.toml" ]; then
    "$VENV/bin/pip" install --no-deps -e "$ROOT"
fi

"$VENV/bin/python" - <<'PY'
import h5py
from mpi4py import MPI
assert h5py.get_config().mpi, "h5py was built without MPI"
print("h5py", h5py.version.version, "HDF5", h5py.version.hdf5_version,
      "MPI:", MPI.Get_library_version().splitlines()[0])
PY
