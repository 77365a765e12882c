"""Messages over 2 GiB on every MPI library (counts past a C ``int``).

Needs about 7 GiB of memory per rank at 2 ranks, so it runs alone, only
when asked for (``MPIREDIST_LARGE=1``, see tests/mpi/conftest.py):

    MPIREDIST_LARGE=1 timeout 900 mpiexec -n 2 python -m pytest -q --with-mpi -m large tests/mpi/test_large.py

Open MPI 5 has no MPI-4 large-count calls: there an all-gather of
2**31 + 64 bytes per rank failed with MPI_ERR_ARG before mpiredist split
its counts (mpiredist.runtime.collectives).
"""

import warnings

import numpy as np
import pytest
from mpi4py import MPI

import mpiredist as mr
from helpers import all_ok, need_ranks

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
N = (1 << 31) + 64                      # bytes per rank: past INT_MAX


def _check_gathered(out):
    """Each rank's block is filled with its rank + 1: check the ends and a middle."""
    ok = out.shape == (SIZE * N,)
    for r in range(SIZE):
        lo, hi = r * N, (r + 1) * N
        ok = ok and out[lo] == r + 1 and out[hi - 1] == r + 1 and out[(lo + hi) // 2] == r + 1
    return bool(ok)


@pytest.mark.mpi(min_size=2)
@pytest.mark.large
@pytest.mark.parametrize("donate", [False, True], ids=["kept", "donated"])
def test_all_gather_over_2_gib_per_rank(donate):
    need_ranks(COMM, 2)
    mesh = mr.Mesh({"x": SIZE})
    local = np.full(N, RANK + 1, dtype=np.int8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mr.BudgetWarning)
        out = mr.redistribute(local, (SIZE * N,), mesh, "[{x}]", "[{}]", donate=donate)
    del local
    all_ok(COMM, _check_gathered(out), f"gathered {SIZE} x {N} bytes (donate={donate})")
