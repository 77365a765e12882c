"""Planning speed and memory: time to plan large meshes, and what a first call allocates; no MPI.

    python -m benchmarks.bench_planning [--repeats 50] [--fresh 3] [--no-memory] [--json FILE]

Speed: plans a set of 6-dimensional redistributions on a 4-axis mesh of
4096 devices (8x8x8x8) with every planner cache (each ``lru_cache`` of
:mod:`mpiredist.core` and :mod:`mpiredist.planning`) cleared before each
repeat, and prints the median, min and max per case and strategy.  The
target for ``collectives`` is a median under 5 ms.

Memory: plans a few redistributions on meshes of up to 65,536 devices, each
in a fresh interpreter (the planner imported first, so that only planning
is counted), and prints the time of that first call (median of ``--fresh``
interpreters) and its tracemalloc peak (one more, traced).  The target is a
peak under 1 MiB.
"""

import argparse
import importlib
import json
import os
import pkgutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from mpiredist import core, planning
from mpiredist.planning import planner

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

# Issue 12: median under 1 ms per plan at 4096 devices (6-D shapes, 4 mesh axes).
TARGET_MS = 1.0

# (name, mesh, shape, src, dst): the first call of each is measured in a fresh process.
MEMORY_CASES = [
    ("transpose", {"x": 16, "y": 16}, (8192, 8192), "[{x},{y}]", "[{y},{x}]"),
    ("transpose", {"x": 64, "y": 64}, (8192, 8192), "[{x},{y}]", "[{y},{x}]"),
    ("transpose", {"x": 256, "y": 256}, (8192, 8192), "[{x},{y}]", "[{y},{x}]"),
    ("transpose_1d", {"x": 65536}, (524288, 262144), "[{x},{}]", "[{},{x}]"),
    ("uneven_transpose_1d", {"x": 65536}, (524672, 261952), "[{x},{}]", "[{},{x}]"),
    ("regroup_axes", {"a": 16, "b": 16, "c": 16, "d": 16}, (256, 256, 256, 256, 32, 32),
     "[{a,b},{c},{d},{},{},{}]", "[{},{},{},{d,c},{b},{a}]"),
]

MEMORY_TARGET_BYTES = 1 << 20

# Run in a fresh interpreter: argv[1] is the JSON of (mesh, shape, src, dst,
# strategy, traced); prints the JSON of {"ms", "peak_bytes"}.
_PROBE = """
import json, sys, time, tracemalloc
from mpiredist.planning.planner import plan
mesh, shape, src, dst, strategy, traced = json.loads(sys.argv[1])
if traced:
    tracemalloc.start()
t0 = time.perf_counter()
plan(tuple(shape), "float32", mesh, src, dst, strategy)
ms = (time.perf_counter() - t0) * 1e3
print(json.dumps({"ms": ms, "peak_bytes": tracemalloc.get_traced_memory()[1] if traced else None}))
"""


def planner_caches():
    """Every ``functools.lru_cache`` wrapper of the modules of core and planning."""
    out = []
    for package in (core, planning):
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            out += [f for f in vars(module).values()
                    if callable(getattr(f, "cache_parameters", None)) and f not in out]
    return out


def _clear():
    for f in planner_caches():
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


def first_call(mesh, shape, src, dst, strategy="collectives", traced=True):
    """``{"ms", "peak_bytes"}`` of the first plan in a fresh interpreter.

    ``peak_bytes`` is the tracemalloc peak of the call (None untraced); the
    time is measured in a separate, untraced interpreter.
    """
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    arg = json.dumps([mesh, list(shape), src, dst, strategy, traced])
    done = subprocess.run([sys.executable, "-c", _PROBE, arg], capture_output=True,
                          text=True, env=env, check=True)
    return json.loads(done.stdout)


def speed_rows(repeats, strategies):
    """Time every case of :data:`CASES`; print and return one row per case and strategy."""
    rows = []
    print(f"mesh {MESH} (4096 devices), {repeats} repeats, caches cleared each time")
    print(f"{'case':20s} {'strategy':12s} {'median ms':>10s} {'min':>8s} {'max':>8s}  steps")
    for name, shape, src, dst in CASES:
        for strategy in strategies:
            ts = time_plan(shape, src, dst, strategy, repeats)
            plan = planner.plan(shape, "float32", MESH, src, dst, strategy)
            row = {"case": name, "strategy": strategy, "median_ms": statistics.median(ts) * 1e3,
                   "min_ms": min(ts) * 1e3, "max_ms": max(ts) * 1e3,
                   "steps": [s.op for s in plan.steps]}
            rows.append(row)
            print(f"{name:20s} {strategy:12s} {row['median_ms']:10.2f} {row['min_ms']:8.2f} "
                  f"{row['max_ms']:8.2f}  {','.join(row['steps'])}")
    return rows


def memory_rows(fresh=3):
    """First call of every :data:`MEMORY_CASES` in fresh interpreters; print and return rows.

    The time is the median of ``fresh`` untraced interpreters.
    """
    rows = []
    print(f"\nplanning memory: first call in a fresh process (collectives), "
          f"target peak < {MEMORY_TARGET_BYTES / 2**20:.0f} MiB")
    print(f"{'case':20s} {'mesh':24s} {'devices':>8s} {'first ms':>9s} {'peak KiB':>9s}")
    for name, mesh, shape, src, dst in MEMORY_CASES:
        devices = 1
        for size in mesh.values():
            devices *= size
        ms = statistics.median(first_call(mesh, shape, src, dst, traced=False)["ms"]
                               for _ in range(fresh))
        peak = first_call(mesh, shape, src, dst)["peak_bytes"]
        text = ",".join(f"{k}={v}" for k, v in mesh.items())
        rows.append({"case": name, "mesh": mesh, "devices": devices, "shape": list(shape),
                     "src": src, "dst": dst, "first_call_ms": ms, "peak_bytes": peak})
        print(f"{name:20s} {text:24s} {devices:8d} {ms:9.2f} {peak / 1024:9.1f}")
    worst = max(r["peak_bytes"] for r in rows)
    print(f"largest peak {worst / 1024:.1f} KiB (target < {MEMORY_TARGET_BYTES >> 10} KiB): "
          f"{'met' if worst < MEMORY_TARGET_BYTES else 'MISSED'}")
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_planning",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--strategies", default="collectives,direct,replicate")
    parser.add_argument("--fresh", type=int, default=3,
                        help="fresh interpreters per first-call time (median; default 3)")
    parser.add_argument("--no-memory", action="store_true",
                        help="skip the planning-memory section (fresh processes)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    rows = speed_rows(args.repeats, args.strategies.split(","))
    worst = max((r["median_ms"] for r in rows if r["strategy"] == "collectives"), default=0.0)
    print(f"worst collectives median {worst:.2f} ms (target < {TARGET_MS} ms): "
          f"{'met' if worst < TARGET_MS else 'MISSED'}")
    memory = [] if args.no_memory else memory_rows(args.fresh)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mesh": MESH, "rows": rows, "target_ms": TARGET_MS, "memory": memory,
                       "memory_target_bytes": MEMORY_TARGET_BYTES}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
