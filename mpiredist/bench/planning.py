"""Planning speed: median time to plan large meshes, no MPI.

    python -m mpiredist.bench.planning [--repeats 50] [--json FILE]

Plans a set of 6-dimensional redistributions on a 4-axis mesh of 4096
devices (8x8x8x8) with every cache cleared before each repeat, and prints
the median, min and max per case and strategy.  The target for
``collectives`` is a median under 5 ms.
"""

import argparse
import json
import statistics
import sys
import time

from ..core import blocks
from ..planning import costs
from ..planning import planner

MESH = {"a": 8, "b": 8, "c": 8, "d": 8}

CASES = [
    ("transpose_pencils", (64, 64, 64, 64, 32, 32),
     "[{a},{b},{c},{d},{},{}]", "[{},{a},{b},{c},{d},{}]"),
    ("regroup_axes", (64, 64, 64, 64, 32, 32),
     "[{a,b},{c},{d},{},{},{}]", "[{},{},{},{d,c},{b},{a}]"),
    ("partial_to_sharded", (4096, 4096, 8, 8, 8, 8),
     "[{a,b},{},{},{},{},{}] sum{c,d}", "[{c,d},{a,b},{},{},{},{}]"),
    ("gather_one_axis", (4096, 4096, 8, 8, 8, 8),
     "[{a,b},{c,d},{},{},{},{}]", "[{a,b,c},{},{},{},{},{d}]"),
    ("uneven_swap", (4099, 4093, 9, 8, 8, 8),
     "[{a,b},{c,d},{},{},{},{}]", "[{c,d},{a,b},{},{},{},{}]"),
]

TARGET_MS = 5.0


def _clear():
    for f in (planner._plan, planner._move_elems, costs.missing_elements,
              costs.exchange_bytes, blocks.all_blocks):
        f.cache_clear()


def time_plan(shape, src, dst, strategy, repeats):
    """Seconds per uncached :func:`mpiredist.planning.planner.plan`, one per repeat."""
    out = []
    for _ in range(repeats):
        _clear()
        t0 = time.perf_counter()
        planner.plan(shape, "float32", MESH, src, dst, strategy)
        out.append(time.perf_counter() - t0)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m mpiredist.bench.planning",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--strategies", default="collectives,direct,replicate")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    rows = []
    print(f"mesh {MESH} (4096 devices), {args.repeats} repeats, caches cleared each time")
    print(f"{'case':20s} {'strategy':12s} {'median ms':>10s} {'min':>8s} {'max':>8s}  steps")
    for name, shape, src, dst in CASES:
        for strategy in args.strategies.split(","):
            ts = time_plan(shape, src, dst, strategy, args.repeats)
            plan = planner.plan(shape, "float32", MESH, src, dst, strategy)
            row = {"case": name, "strategy": strategy, "median_ms": statistics.median(ts) * 1e3,
                   "min_ms": min(ts) * 1e3, "max_ms": max(ts) * 1e3,
                   "steps": [s.op for s in plan.steps]}
            rows.append(row)
            print(f"{name:20s} {strategy:12s} {row['median_ms']:10.2f} {row['min_ms']:8.2f} "
                  f"{row['max_ms']:8.2f}  {','.join(row['steps'])}")
    worst = max(r["median_ms"] for r in rows if r["strategy"] == "collectives")
    print(f"worst collectives median {worst:.2f} ms (target < {TARGET_MS} ms): "
          f"{'met' if worst < TARGET_MS else 'MISSED'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mesh": MESH, "rows": rows, "target_ms": TARGET_MS}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
