"""The one timing loop: the slowest rank's medians, one function or several side by side.

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_timing.py

The loop reads ``time.perf_counter`` of :mod:`mpiredist.runtime.timing`; the
tests give it a clock that each function advances by a set amount, so the
figures are exact whatever the machine's load (wall-clock thresholds in a
test fail on a busy machine, and prove less).
"""

import pytest
from mpi4py import MPI

from helpers import all_ok
from mpiredist.runtime import timing
from mpiredist.runtime.timing import slowest_median, slowest_medians


class _Clock:
    """A clock that moves only when a function under test says so."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    def takes(self, seconds):
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    found = _Clock()
    monkeypatch.setattr(timing.time, "perf_counter", found.perf_counter)
    return found


def test_slowest_medians_side_by_side(clock):
    """Every function runs once a repeat, in orders that differ between repeats
    (alike on every rank); each figure is the median over repeats of the
    slowest rank's time."""
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    calls, runs = [], {"a": 0}

    def timed(name, seconds):
        def fn():
            calls.append(name)
            if name == "a":
                runs["a"] += 1
            clock.takes(seconds())
        return fn
    # a: rank r takes (r + 1) * 10 ms, except its 2nd run, 1 s (the median ignores it)
    fns = {"a": timed("a", lambda: 1.0 if runs["a"] == 2 else 0.01 * (rank + 1)),
           "b": timed("b", lambda: 0.002), "c": timed("c", lambda: 0.0)}
    got = slowest_medians(comm, fns, 5)
    orders = [tuple(calls[i:i + 3]) for i in range(0, len(calls), 3)]
    all_ok(comm, sorted(calls) == sorted("abc" * 5) and len(set(orders)) > 1,
           f"rank {rank}: calls {calls}")
    all_ok(comm, comm.allgather(orders) == [orders] * size, "orders differ between ranks")
    all_ok(comm, got == {"a": pytest.approx(0.01 * size), "b": pytest.approx(0.002),
                         "c": 0.0}, f"medians {got}")


def test_slowest_median_of_one_function(clock):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    runs = []
    got = slowest_median(comm, lambda: (runs.append(1), clock.takes(0.003 * (rank + 1))), 3,
                         warmup=True)
    all_ok(comm, len(runs) == 4 and got == pytest.approx(0.003 * size),
           f"rank {rank}: {len(runs)} runs, median {got}")


def test_slowest_medians_in_the_dicts_order_without_a_seed():
    comm = MPI.COMM_WORLD
    calls = []
    got = slowest_medians(comm, {n: (lambda n=n: calls.append(n)) for n in "abc"}, 4,
                          seed=None)
    all_ok(comm, calls == list("abc") * 4 and sorted(got) == list("abc"), f"calls {calls}")
