"""Per-call overhead on small blocks: a Transfer's run against the bare MPI call.

    mpiexec -n 8 python -m benchmarks.bench_overhead [--bytes 4096] [--repeats 200]
        [--cases c01,c02] [--json FILE]

Each shared case (mapped onto the ranks as the benchmark maps it) is shrunk
until its larger block is about ``--bytes``; then, interleaved in one loop
with a barrier before each call, it times:

``raw``          the bare MPI collective of the same bytes on preallocated
                 contiguous buffers (:class:`~mpiredist.bench.runner.Raw`);
``run``          ``Transfer.run(block, out=out)``: the per-run check and its
                 agreement (one small Allreduce), then the plan;
``unchecked``    ``Transfer(..., checked=False).run(block, out=out)``: no
                 per-run agreement, what the plan itself costs;
``redistribute`` ``mr.redistribute(block, ...)``: validation, agreement and
                 the cached Transfer.

A time is the largest over ranks; the table gives medians in microseconds
and each against ``raw``.  Only rank 0 prints.
"""

import argparse
import json
import math
import statistics
import sys
from dataclasses import replace

import numpy as np

from mpiredist.runtime.failure import abort_on_exception
from mpiredist.runtime.timing import slowest_medians

__all__ = ["shrink", "measure", "main"]

KINDS = ("raw", "run", "unchecked", "redistribute")


def shrink(case, nbytes, itemsize=4):
    """``case`` with its largest dims halved until the larger block is <= ``nbytes``."""
    from mpiredist.planning import planner

    shape, dtype = list(case.shape), np.dtype(f"f{itemsize}")
    while True:
        plan = planner.plan(shape, dtype, case.mesh, case.src, case.dst)
        if max(plan.src_local_bytes, plan.dst_local_bytes) <= nbytes or max(shape) == 1:
            return replace(case, shape=tuple(shape)), plan
        d = max(range(len(shape)), key=lambda k: shape[k])
        shape[d] = (shape[d] + 1) // 2


def measure(comm, entry, nbytes, repeats):
    """One row: medians (s) of each kind for ``entry`` shrunk to ``nbytes`` blocks."""
    import mpiredist as mr
    from mpiredist.core.mesh import Mesh
    from mpiredist.runtime.groups import mesh_groups
    from mpiredist.bench.runner import global_array, make_raw, source_block

    case, plan = shrink(entry.case, nbytes)
    mesh = Mesh(case.mesh, comm)
    g = global_array(case.shape, np.float32, np.random.default_rng(0))
    src = source_block(g, mesh, case.src, comm.Get_rank())
    del g
    t = mr.Transfer(case.shape, np.float32, mesh, case.src, case.dst)
    fast = mr.Transfer(case.shape, np.float32, mesh, case.src, case.dst, checked=False)
    out = np.empty(t.target_shape, np.float32)
    raw = make_raw(plan, mesh_groups(mesh))
    calls = {"raw": raw.run,
             "run": lambda: t.run(src, out=out),
             "unchecked": lambda: fast.run(src, out=out),
             "redistribute": lambda: mr.redistribute(src, case.shape, mesh, case.src, case.dst)}
    for fn in calls.values():                   # warm-up: routing, caches
        for _ in range(5):
            fn()
    medians = slowest_medians(comm, {k: calls[k] for k in KINDS}, repeats,
                              seed=None)        # interleaved, the same order on every rank
    t.free()
    fast.free()
    row = {"case": entry.label, "shape": list(case.shape), "mesh": str(Mesh(case.mesh)),
           "ops": [s.op for s in plan.steps], "block_bytes": max(plan.src_local_bytes,
                                                                   plan.dst_local_bytes),
           "raw_op": raw.op}
    for k in KINDS:
        row[f"{k}_us"] = medians[k] * 1e6
    return row


def _ratio(row, k):
    raw = row["raw_us"]
    return row[f"{k}_us"] / raw if raw > 0 and row["raw_op"] != "none" else math.nan


def format_rows(rows):
    """The table as text (rank 0 prints it)."""
    head = (f"{'case':6} {'ops':28} {'block':>7} {'raw us':>8} {'run us':>8} {'run/raw':>8} "
            f"{'unchk us':>9} {'unchk/raw':>9} {'redist us':>10} {'redist/raw':>10}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['case']:6} {'+'.join(r['ops']) or '-':28.28} {r['block_bytes']:>7} "
                     f"{r['raw_us']:8.0f} {r['run_us']:8.0f} {_ratio(r, 'run'):8.2f} "
                     f"{r['unchecked_us']:9.0f} {_ratio(r, 'unchecked'):9.2f} "
                     f"{r['redistribute_us']:10.0f} {_ratio(r, 'redistribute'):10.2f}")
    moving = [r for r in rows if r["raw_op"] != "none"]
    for k in ("run", "unchecked", "redistribute"):
        if moving:
            gm = statistics.geometric_mean([_ratio(r, k) for r in moving])
            lines.append(f"geomean {k}/raw over the cases that move data: {gm:.2f}")
    return "\n".join(lines)


def main(argv=None, comm=None):
    """Run the overhead table on ``comm`` (default COMM_WORLD); 0 on success."""
    from mpiredist.runtime.mpi import mpi
    from mpiredist.bench.runner import suite

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_overhead",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", type=int, default=4096, help="larger block, bytes")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--cases", default=None, help="comma-separated case ids")
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    comm = comm or mpi().COMM_WORLD
    ids = args.cases.split(",") if args.cases else None
    rows = [measure(comm, e, args.bytes, args.repeats) for e in suite(comm.Get_size(), ids)]
    if comm.Get_rank() == 0:
        print(f"per-call overhead, {comm.Get_size()} ranks, blocks <= {args.bytes} B, "
              f"medians of {args.repeats} (max over ranks)")
        print(format_rows(rows))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"ranks": comm.Get_size(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(abort_on_exception(main))   # a failure on any rank ends the job
