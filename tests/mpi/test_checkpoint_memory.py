"""A load's memory: within T + W per rank (tracemalloc), T + W + 1 MiB (resident set).

    MALLOC_MMAP_THRESHOLD_=131072 NUMPY_MADVISE_HUGEPAGE=0 \\
        mpiexec -n 8 python -m pytest -q --with-mpi tests/mpi/test_checkpoint_memory.py

T: this rank's target bytes; W: the load's workspace (default T/4 + 1 MiB).
New arrays (T is allocated by the load) and targets filled in place (E
within W), from a save on Shard(0) into Shard(1) (every saved box overlaps
every target) and into Shard(0) on 3 ranks' worth of uneven blocks.
"""

import os
import shutil
import tempfile
import tracemalloc

import numpy as np
import pytest
from mpi4py import MPI

import mpiredist as mr
from helpers import all_ok
from mpiredist import Mesh
from mpiredist.checkpoint.api import workspace

COMM = MPI.COMM_WORLD
RANK, P = COMM.Get_rank(), COMM.Get_size()
NOISE = 1 << 20
SHAPES = {"a": (2048, 1024), "b": (1024, 2048), "c": (3001, 512), "d": (1 << 20,)}


@pytest.fixture(scope="module")
def saved():
    path = tempfile.mkdtemp(prefix="mpiredist-ckmem-") if RANK == 0 else None
    path = COMM.bcast(path)
    mesh = Mesh({"x": P})
    state = {}
    for k, shape in SHAPES.items():
        G = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        state[k] = mr.DistArray.from_global(G, mesh, "[{x}" + ", {}" * (len(shape) - 1) + "]")
    mr.save(os.path.join(path, "ck"), state)
    del state
    yield os.path.join(path, "ck")
    COMM.Barrier()
    if RANK == 0:
        shutil.rmtree(path, ignore_errors=True)


def _targets(mesh, kind):
    two = "[{}, {x}]" if kind == "columns" else "[{x}, {}]"
    return {k: (mesh, "[{x}]" if len(s) == 1 else two) for k, s in SHAPES.items()}


def _expected(mesh, targets):
    out = {}
    for k, (m, layout) in targets.items():
        G = np.arange(np.prod(SHAPES[k]), dtype=np.float32).reshape(SHAPES[k])
        out[k] = mr.DistArray.from_global(G, m, layout).local
    return out


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", ["columns", "rows-uneven"])
def test_load_within_t_plus_w(saved, kind):
    mesh = Mesh({"x": P}) if kind == "columns" else Mesh({"x": max(1, P - 1)},
                                                         ranks=list(range(max(1, P - 1))))
    targets = _targets(mesh, kind)
    want = _expected(mesh, targets)
    t = sum(v.nbytes for v in want.values() if v is not None)
    w = workspace(t, None)
    tracemalloc.start()
    try:
        COMM.Barrier()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = mr.load(saved, targets)
        used = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    all_ok(COMM, all((out[k].local is None and want[k] is None)
                     or np.array_equal(out[k].local, want[k]) for k in SHAPES), "values")
    worst = COMM.allreduce(used - t - w, op=MPI.MAX)
    all_ok(COMM, used <= t + w, f"{kind}: E = {used} B > T + W = {t} + {w} (worst excess "
                                f"over ranks {worst} B)")
    # in place: the targets exist, so only W may be new
    placed = {k: mr.DistArray(np.zeros_like(v) if v is not None else None, SHAPES[k],
                              mr.Layout.parse(targets[k][1]), mesh) for k, v in want.items()}
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        mr.load(saved, placed)
        used = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    all_ok(COMM, used <= w, f"{kind} in place: E = {used} B > W = {w}")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", ["columns", "rows-uneven"])
def test_load_resident_set_within_t_plus_w(saved, kind):
    from mpiredist.bench.measure import rss_environment_missing, rss_peak, rss_supported
    if not rss_supported() or rss_environment_missing():
        pytest.skip("needs /proc and " + " ".join(rss_environment_missing()))
    mesh = Mesh({"x": P}) if kind == "columns" else Mesh({"x": max(1, P - 1)},
                                                         ranks=list(range(max(1, P - 1))))
    targets = _targets(mesh, kind)
    want = _expected(mesh, targets)
    t = sum(v.nbytes for v in want.values() if v is not None)
    w = workspace(t, None)
    del want
    for _ in range(2):                          # a warm-up load, then the measured one
        COMM.Barrier()
        with rss_peak() as e:
            out = mr.load(saved, targets)
        del out
    worst = COMM.allreduce(e.bytes, op=MPI.MAX)
    all_ok(COMM, e.bytes <= t + w + NOISE,
           f"{kind}: RSS growth {e.bytes} B > T + W + 1 MiB = {t} + {w} + {NOISE} "
           f"(max over ranks {worst})")
