"""Times that every rank agrees on: the median over repeats of the slowest rank."""

import time

import numpy as np

__all__ = ["slowest_median"]


def slowest_median(comm, fn, repeats, warmup=False):
    """Median over ``repeats`` runs of ``fn()`` of the largest time over ranks (collective).

    A barrier precedes each run; with ``warmup`` one untimed run comes first.
    """
    from mpi4py import MPI

    if warmup:
        fn()
    times = np.empty(repeats)
    for r in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        times[r] = time.perf_counter() - t0
    worst = np.empty_like(times)
    comm.Allreduce(times, worst, op=MPI.MAX)
    return float(np.median(worst))
