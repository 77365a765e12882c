"""``python -m benchmarks.bench_analytics``, run in-process at a tiny size (any rank count).

    timeout 300 mpiexec -n 2 python -m pytest -q --with-mpi tests/mpi/test_bench_analytics.py
"""

import numpy as np
import pytest
from helpers import all_ok, run_json

from mpiredist import Mesh
from mpiredist.arrays.base import DistArrayBase
from mpiredist.arrays.distarray import DistArray
from benchmarks.bench_analytics import counting, main

pytestmark = pytest.mark.mpi


def _run(comm, argv):
    """``main(argv + --json F)`` on every rank; (rc, rows) agreed."""
    rc, doc = run_json(comm, main, argv)
    return rc, doc["rows"]


def test_rows_are_correct_and_count_bytes(comm):
    rc, rows = _run(comm, ["--size", "0.01", "--repeats", "1"])
    all_ok(comm, rc == 0, f"rc {rc}")
    meshes = 1 + any(comm.size % k == 0 for k in range(2, comm.size))
    all_ok(comm, len(rows) == 5 * meshes, f"{len(rows)} rows")
    for r in rows:
        what = f"{r['mesh']} {r['op']}"
        all_ok(comm, r["check"] == "ok", f"{what}: check {r['check']}")
        for key in ("bytes_moved", "peak_bytes", "s_plus_t_bytes", "redistributions"):
            all_ok(comm, isinstance(r[key], int) and r[key] >= 0, f"{what}: {key} {r[key]!r}")
        all_ok(comm, r["median_s"] >= 0, what)
        if r["op"] == "a.T":
            all_ok(comm, r["bytes_moved"] == 0 and r["redistributions"] == 0,
                   f"{what} moved {r['bytes_moved']} B")
        if r["op"] == "a + b" and comm.size > 1:
            all_ok(comm, r["bytes_moved"] > 0, f"{what} moved no bytes")


def test_counting_restores_and_shares_records(comm):
    orig = DistArrayBase.redistribute
    a = DistArray.from_global(np.arange(12.0).reshape(4, 3), Mesh({"x": comm.size}, comm),
                              "[{x}, {}]")
    mine = []
    with counting() as (calls, records):
        b = a.redistribute("[{}, {}]", records=mine)
    all_ok(comm, DistArrayBase.redistribute is orig, "method restored")
    all_ok(comm, calls == ["[{}, {}]"] and records == mine
           and (len(mine) >= 1 or comm.size == 1),
           f"{calls} {records} {mine}")
    all_ok(comm, np.array_equal(b.local, np.arange(12.0).reshape(4, 3)), "values")
