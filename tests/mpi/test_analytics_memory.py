"""Memory of the one-exchange routes of reshape, slicing and concatenate.

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_analytics_memory.py

E (tracemalloc peak over the call) must stay within max(S, T) + W, with S
the operands' blocks, T the result's block and W the exchange's default
workspace (a quarter of the largest block of any rank plus 1 MiB), plus a
small allowance for Python bookkeeping.  Before these routes, reshape
without shared leading dims and slicing every dim replicated the array:
E was about the whole array per rank.
"""

import tracemalloc

import numpy as np
import pytest
from analytics_data import close, data
from helpers import all_ok

from mpiredist import Mesh
from mpiredist.arrays.distarray import DistArray, concatenate

pytestmark = pytest.mark.mpi
BOOKKEEPING = 64 << 10
MIB = 1 << 20


def _measured(comm, call):
    tracemalloc.start()
    try:
        comm.Barrier()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = call()
        used = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return out, used


def _bound(comm, s, t, largest):
    w = comm.allreduce(largest, op=__import__("mpi4py").MPI.MAX) // 4 + MIB
    return max(s, t) + w + BOOKKEEPING


CASES = [
    ("reshape (n, m) -> (m, n)", (2003, 301), "[{x}, {}]", lambda a: a.reshape(301, 2003)),
    ("slice every dim", (1501, 403), "[{x}, {}]", lambda a: a[3:-5, 7:390]),
    ("slice, columns sharded", (997, 605), "[{}, {x}]", lambda a: a[10:900, 1:-1]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_one_exchange_within_bound(comm, case):
    name, shape, layout, op = case
    g = data(shape)
    a = DistArray.from_global(g, Mesh({"x": comm.size}), layout)
    r, used = _measured(comm, lambda: op(a))
    s, t = a.local.nbytes, r.local.nbytes
    bound = _bound(comm, s, t, max(s, t))
    all_ok(comm, used <= bound, f"{name}: E = {used} > max(S={s}, T={t}) + W + slack = {bound}")
    all_ok(comm, close(r.gather(), op(g)), f"{name}: values")


def test_concatenate_1d_sharded_within_bound(comm):
    parts = [data((n,), seed=n) for n in (100003, 7, 50001)]
    mesh = Mesh({"x": comm.size})
    arrs = [DistArray.from_global(p, mesh, "[{x}]") for p in parts]
    r, used = _measured(comm, lambda: concatenate(arrs))
    s = sum(a.local.nbytes for a in arrs)
    t = r.local.nbytes
    bound = _bound(comm, s, t, max(t, *(a.local.nbytes for a in arrs)))
    all_ok(comm, used <= bound, f"1-D concatenate: E = {used} > {bound} (S={s}, T={t})")
    all_ok(comm, close(r.gather(), np.concatenate(parts)), "1-D concatenate: values")
