"""Bench timing: the slowest rank's medians, one function or several side by side.

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_timing.py
"""

import time

from mpi4py import MPI

from helpers import all_ok
from mpiredist.bench.timing import slowest_median, slowest_medians


def test_slowest_medians_side_by_side():
    """Every function runs once a repeat, in orders that differ between repeats
    (alike on every rank); each figure is the median of the slowest rank's."""
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    calls = []

    def sleeper(name, seconds):
        def fn():
            calls.append(name)
            time.sleep(seconds)
        return fn
    fns = {"a": sleeper("a", 0.01 * (rank + 1)), "b": sleeper("b", 0.002),
           "c": sleeper("c", 0.0)}
    got = slowest_medians(comm, fns, 6)
    orders = [tuple(calls[i:i + 3]) for i in range(0, len(calls), 3)]
    all_ok(comm, sorted(calls) == sorted("abc" * 6) and len(set(orders)) > 1,
           f"rank {rank}: calls {calls}")
    all_ok(comm, comm.allgather(orders) == [orders] * size, "orders differ between ranks")
    all_ok(comm, 0.01 * size <= got["a"] < 0.01 * size + 0.1
           and got["c"] < 0.002 <= got["b"] < got["a"], f"medians {got}")


def test_slowest_median_of_one_function():
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    runs = []
    got = slowest_median(comm, lambda: (runs.append(1), time.sleep(0.003 * (rank + 1))), 3,
                         warmup=True)
    all_ok(comm, len(runs) == 4 and 0.003 * size <= got < 0.003 * size + 0.05,
           f"rank {rank}: {len(runs)} runs, median {got}")


def test_slowest_medians_in_the_dicts_order_without_a_seed():
    comm = MPI.COMM_WORLD
    calls = []
    got = slowest_medians(comm, {n: (lambda n=n: calls.append(n)) for n in "abc"}, 4,
                          seed=None)
    all_ok(comm, calls == list("abc") * 4 and sorted(got) == list("abc"), f"calls {calls}")
