"""Times that every rank agrees on: the median over repeats of the slowest rank.

The one timing loop of the package: the machine profile
(:mod:`mpiredist.runtime.calibrate`) and the benchmarks measure with it.
Collective over a group (an mpi4py communicator is taken too); the ranks
meet before each run in one small reduction, so that a run starts on every
rank together.
"""

import time

import numpy as np

from .groups import as_group

__all__ = ["slowest_median", "slowest_medians"]


def slowest_median(comm, fn, repeats, warmup=False):
    """Median over ``repeats`` runs of ``fn()`` of the largest time over ranks (collective).

    The ranks meet before each run; with ``warmup`` one untimed run comes first.
    """
    if warmup:
        fn()
    return slowest_medians(comm, {None: fn}, repeats)[None]


def slowest_medians(comm, fns, repeats, seed=0, before=None):
    """Time the functions of the dict ``fns`` side by side (collective): return
    ``{name: seconds}``, per function the median over ``repeats`` runs of the
    largest time over ranks.

    Side by side: each repeat runs every function once, in an order drawn
    from ``seed`` (alike on every rank; ``seed=None``: the dict's order every
    repeat), so that a slow spell of the machine and what a run leaves
    behind (freed memory, caches) fall on all of them alike.  The ranks meet
    before each run, and ``before()``, if given, comes before that
    (untimed).
    """
    group = as_group(comm)
    names = list(fns)
    draw = None if seed is None else np.random.default_rng(seed)
    times = np.empty((len(names), repeats))
    meet = np.zeros(1, dtype=np.uint64)
    for r in range(repeats):
        for i in range(len(names)) if draw is None else draw.permutation(len(names)):
            if before is not None:
                before()
            group.bitwise_or(meet)
            t0 = time.perf_counter()
            fns[names[i]]()
            times[i, r] = time.perf_counter() - t0
    worst = np.empty_like(times)
    group.allreduce(times, worst, "max")
    return {name: float(np.median(w)) for name, w in zip(names, worst)}
