"""Smoke tests: the launcher, mpi4py and the agreement helpers work."""

import pytest
from helpers import all_ok, need_ranks


@pytest.mark.mpi
def test_allreduce_of_ranks(comm):
    from mpi4py import MPI

    n = comm.size
    total = comm.allreduce(comm.rank, op=MPI.SUM)
    all_ok(comm, total == n * (n - 1) // 2,
           f"allreduce of ranks over {n} ranks gave {total}")


@pytest.mark.mpi
def test_all_ok_fails_on_every_rank(comm):
    # Only rank 0 is "wrong", yet every rank must raise: nobody hangs.
    with pytest.raises(AssertionError, match=r"rank\(s\) \[0\]"):
        all_ok(comm, comm.rank != 0, "deliberate")


@pytest.mark.mpi
def test_need_ranks_skips_together(comm):
    need_ranks(comm, 2)
    all_ok(comm, comm.size >= 2, "need_ranks let a too-small run through")
