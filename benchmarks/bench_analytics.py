"""Analytics rows: reshape, transpose, transpose then matmul, a mixed-layout add
and slicing of float64 DistArrays, timed with the bytes their redistributions move.

    mpiexec -n 8 python -m benchmarks.bench_analytics [--size 1.0] [--repeats 5] [--json FILE]

Two global arrays ``g``, ``h`` of shape (4099, 1001) scaled by ``--size``
(uneven on most rank counts) become ``a`` and ``b`` on the mesh ``x=P``
(``a`` in ``[{x}, {}]``, ``b`` in ``[{}, {x}]``) and, when P factors as
p * q with p the smallest factor, on ``x=p,y=q`` (``[{x}, {y}]`` and
``[{y}, {x}]``).  The ops: ``a.reshape((m, n))`` (no shared leading dim),
``a.T`` (local), ``a.T @ a``, ``a + b``, ``a[10:-7, 3:500]``.  Columns:

``median s``  median over --repeats of the op's time, each the largest over
              ranks (a barrier before each run);
``moved B``   bytes sent to other ranks by the redistributions inside the op,
              summed over ranks: the StepRecords of every
              ``DistArrayBase.redistribute`` call and the bytes of every
              exchange (``mpiredist.arrays.moves.exchange_into``: reshape,
              slicing, concatenate) during the op, collected by wrapping
              both in this bench only (``redist``: calls of either);
``peak B``    bytes newly allocated during one untimed run (tracemalloc
              peak, the result included), max over ranks;
``S+T B``     the operands' blocks plus the result's block, max over ranks;
              ``peak/(S+T)`` is the largest ratio on any rank;
``numpy s``   the same op in numpy on the full arrays in one process (rank
              0): a serial reference, as HeAT's benchmarks quote one;
``check``     the result gathered and compared with that numpy result.
"""

import argparse
import contextlib
import inspect
import json
import sys
import time

import numpy as np

from mpiredist.runtime.failure import abort_on_exception

__all__ = ["SHAPE", "counting", "cases", "measure", "main"]

SHAPE = (4099, 1001)
SLICE = (slice(10, -7), slice(3, 500))


@contextlib.contextmanager
def counting():
    """Collect the StepRecords of every ``DistArrayBase.redistribute`` call inside,
    and the bytes of every exchange (:func:`mpiredist.arrays.moves.exchange_into`).

    Yields ``(calls, records)`` lists; the method is restored on exit.
    """
    from mpiredist.arrays.base import DistArrayBase

    orig = DistArrayBase.redistribute
    sig = inspect.signature(orig)
    calls, records = [], []

    def wrapped(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        user, mine = bound.arguments.get("records"), []
        bound.arguments["records"] = mine
        out = orig(*bound.args, **bound.kwargs)
        calls.append(str(bound.arguments["dst"]))
        records.extend(mine)
        if user is not None:
            user.extend(mine)
        return out

    from mpiredist.arrays import moves
    exchange = moves.exchange_into

    def exchanged(mesh, dtype, src, dst, *args, **kwargs):
        sent = exchange(mesh, dtype, src, dst, *args, **kwargs)
        calls.append("exchange")
        records.append(_Sent(sent))
        return sent

    DistArrayBase.redistribute = wrapped
    moves.exchange_into = exchanged
    try:
        yield calls, records
    finally:
        DistArrayBase.redistribute = orig
        moves.exchange_into = exchange


class _Sent:
    """The one field of a StepRecord the table reads, for an exchange."""

    def __init__(self, bytes_sent):
        self.bytes_sent = bytes_sent


def _meshes(p):
    """``[(axes, layout of a, layout of b)]``: x=P, and x=p,y=q when P factors."""
    out = [({"x": p}, "[{x}, {}]", "[{}, {x}]")]
    f = next((k for k in range(2, p) if p % k == 0), None)
    if f is not None:
        out.append(({"x": f, "y": p // f}, "[{x}, {y}]", "[{y}, {x}]"))
    return out


def cases(a, b):
    """``[(name, op on DistArrays, op on numpy, operands)]`` for ``a`` and ``b``."""
    n, m = a.shape
    return [("reshape", lambda a, b: a.reshape((m, n)), lambda g, h: g.reshape(m, n), 1),
            ("a.T", lambda a, b: a.T, lambda g, h: g.T, 1),
            ("a.T @ a", lambda a, b: a.T @ a, lambda g, h: g.T @ g, 1),
            ("a + b", lambda a, b: a + b, lambda g, h: g + h, 2),
            ("a[10:-7, 3:500]", lambda a, b: a[SLICE], lambda g, h: g[SLICE], 1)]


def _timed(comm, fn, repeats):
    """Median over ``repeats`` of the largest time over ranks."""
    from mpiredist.runtime.timing import slowest_median
    return slowest_median(comm, fn, repeats)


def _peak(fn):
    """(result, bytes newly allocated at the peak of ``fn()``: tracemalloc)."""
    from mpiredist.bench.measure import traced_peak

    with traced_peak() as e:
        out = fn()
    return out, e.bytes


def _check(comm, out, ref_fn, arrays):
    """(ok, numpy seconds): ``out`` gathered on every rank, compared on rank 0."""
    full = out.gather()
    ok, secs = True, 0.0
    if comm.rank == 0:
        t0 = time.perf_counter()
        ref = ref_fn(*arrays)
        secs = time.perf_counter() - t0
        ok = full.shape == ref.shape and np.allclose(full, ref, rtol=1e-10, atol=1e-9)
    return comm.bcast((bool(ok), secs))


def measure(comm, mesh, a, b, arrays, repeats):
    """The rows of every case on ``mesh`` (agreed on every rank)."""
    from mpi4py import MPI

    rows = []
    for name, op, ref_fn, k in cases(a, b):
        run = lambda: op(a, b)                                 # noqa: E731
        with counting() as (calls, records):
            out = run()                                        # warm-up; its bytes
        ok, np_s = _check(comm, out, ref_fn, arrays)
        del out
        out, peak = _peak(run)
        s_t = sum(x.local.nbytes for x in (a, b)[:k]) + out.local.nbytes
        layouts = " ".join(str(x.layout) for x in (a, b)[:k]) + f" -> {out.layout}"
        del out
        rows.append({"mesh": str(mesh), "op": name, "layouts": layouts,
                     "median_s": _timed(comm, run, repeats),
                     "bytes_moved": comm.allreduce(sum(r.bytes_sent for r in records)),
                     "redistributions": comm.allreduce(len(calls), op=MPI.MAX),
                     "peak_bytes": comm.allreduce(peak, op=MPI.MAX),
                     "s_plus_t_bytes": comm.allreduce(s_t, op=MPI.MAX),
                     "peak_over_s_plus_t": comm.allreduce(peak / max(s_t, 1), op=MPI.MAX),
                     "numpy_s": np_s, "check": "ok" if ok else "FAIL"})
    return rows


def run(comm, size=1.0, repeats=5):
    """Every row on every mesh of ``comm``'s ranks."""
    from mpiredist.arrays.distarray import DistArray
    from mpiredist.core.mesh import Mesh

    n, m = max(round(SHAPE[0] * size), 23), max(round(SHAPE[1] * size), 5)
    rng = np.random.default_rng(0)
    g, h = rng.standard_normal((n, m)), rng.standard_normal((n, m))
    rows = []
    for axes, la, lb in _meshes(comm.size):
        mesh = Mesh(axes, comm)
        a, b = DistArray.from_global(g, mesh, la), DistArray.from_global(h, mesh, lb)
        rows += measure(comm, mesh, a, b, (g, h), repeats)
        del a, b
    return rows


def format_rows(rows):
    """The table as text (rank 0 prints it)."""
    from mpiredist.bench.report import table

    head = ("mesh", "op", "layouts", "median s", "moved B", "redist", "peak B", "S+T B",
            "peak/(S+T)", "numpy s", "check")
    cells = [(r["mesh"], r["op"], r["layouts"], f"{r['median_s']:.4f}",
              f"{r['bytes_moved']:,}", str(r["redistributions"]), f"{r['peak_bytes']:,}",
              f"{r['s_plus_t_bytes']:,}", f"{r['peak_over_s_plus_t']:.2f}",
              f"{r['numpy_s']:.4f}", r["check"]) for r in rows]
    return table(cells, head, ["left"] * 3 + ["right"] * 7 + ["left"])


def main(argv=None, comm=None):
    """Run the analytics rows on ``comm`` (default COMM_WORLD); 0 if every check is ok."""
    from mpiredist.runtime.mpi import mpi

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_analytics",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=float, default=1.0,
                        help=f"scale of the {SHAPE[0]} x {SHAPE[1]} arrays")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    comm = comm or mpi().COMM_WORLD
    rows = run(comm, args.size, args.repeats)
    if comm.rank == 0:
        print(f"analytics, {comm.size} ranks, float64, medians of {args.repeats} "
              f"(max over ranks)")
        print(format_rows(rows))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"ranks": comm.size, "size": args.size, "rows": rows}, f, indent=1)
    return 0 if all(r["check"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(abort_on_exception(main))   # a failure on any rank ends the job
