"""The runtime memory contract, measured with tracemalloc and as the OS sees it
(docs/semantics.md, Memory contract).

E = bytes newly allocated by ``redistribute`` at its peak.  With S, T the
source and target block bytes and W the default workspace:

- not donated: E <= max(S, T) + W
- donated:     E <= max(0, T - S) + W

Every shared case runs at a size where the larger block is at least 4 MiB.
The meshes of cases.json have 8 or 16 devices; at another rank count the
case keeps its axis names and layouts and its last axis takes all ranks
(the others have size 1).  tracemalloc starts before the source block is
allocated, so that growing a donated block with ``realloc`` counts only the
growth.  Blocks are computed from their global indices (no rank builds the
global array).
"""

import json
import math
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import mpiredist as mr
from mpiredist.planning.budget import default_workspace
from helpers import all_ok

CASES = json.loads((Path(mr.__file__).parent / "bench" / "data" / "cases.json").read_text())
MIN_BLOCK = 4 << 20


def _mesh(case, size):
    names = list(case["mesh"])
    if math.prod(case["mesh"].values()) == size:
        return dict(case["mesh"])
    return {n: (size if n == names[-1] else 1) for n in names}


def _shape(case, mesh):
    """The case's shape, grown or shrunk so the larger block is about 4-16 MiB."""
    shape = list(case["shape"])
    plan = mr.plan(shape, "float32", mesh, _layout(case, "src"), _layout(case, "dst"))
    big = max(plan.src_local_bytes, plan.dst_local_bytes)
    while big > 4 * MIN_BLOCK:
        shape[0] = (shape[0] + 1) // 2
        big //= 2
    return shape


def _layout(case, key):
    return mr.Layout.from_dict(case[key])


def _values(box, shape):
    """Deterministic float32 values of a global box (small integers: exact sums)."""
    index = np.indices(tuple(hi - lo for lo, hi in box), dtype=np.int64)
    flat = np.zeros(index.shape[1:], dtype=np.int64)
    for d, (lo, _) in enumerate(box):
        flat = flat * shape[d] + index[d] + lo
    return (flat % 251).astype(np.float32)


def _block(shape, mesh, layout, rank, holder=True):
    from mpiredist.core.blocks import rank_block
    from mpiredist.core.subaxes import expand, rank_digits
    m = mr.Mesh(mesh)
    box = rank_block(tuple(shape), expand(layout, m), rank_digits(m, rank))
    values = _values(box, shape)
    return values if holder else np.zeros_like(values)


def _holds_value(mesh, layout, rank):
    coords = dict(zip(mesh, mr.Mesh(mesh).coords(rank)))
    return all(coords[a] == 0 for a in layout.partial)


@pytest.mark.mpi
@pytest.mark.parametrize("donate", [False, True], ids=["kept", "donated"])
@pytest.mark.parametrize("case", CASES["cases"], ids=lambda c: c["id"])
def test_memory_contract(case, donate):
    comm = MPI.COMM_WORLD
    mesh = _mesh(case, comm.size)
    src, dst = _layout(case, "src"), _layout(case, "dst")
    shape = _shape(case, mesh)
    plan = mr.plan(shape, "float32", mesh, src, dst)
    s, t = plan.src_local_bytes, plan.dst_local_bytes
    if comm.size > 1 and max(s, t) < MIN_BLOCK:
        pytest.skip(f"blocks below 4 MiB at {comm.size} ranks ({max(s, t)} B)")
    limit = (max(0, t - s) if donate else max(s, t)) + default_workspace(plan)
    tracemalloc.start()
    try:
        local = _block(shape, mesh, src, comm.rank, _holds_value(mesh, src, comm.rank))
        kept = None if donate else local.copy()
        comm.Barrier()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = mr.redistribute(local, shape, mesh, src, dst, donate=donate)
        used = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    want = _block(shape, mesh, dst, comm.rank)
    all_ok(comm, out.shape == want.shape and np.array_equal(out, want),
           f"{case['id']}: result differs from the oracle")
    if kept is not None:
        all_ok(comm, np.array_equal(local, kept), f"{case['id']}: source was modified")
    used = comm.allreduce(used, op=MPI.MAX)
    all_ok(comm, used <= limit,
           f"{case['id']} donate={donate}: E = {used} B > limit {limit} B "
           f"(S = {s}, T = {t}, E/max(S,T) = {used / max(s, t):.3f})")


# ------------------------------------------------------------ resident set

RSS_BLOCK = 8 << 20             # the larger block is at least this, at most twice
RSS_NOISE = 1 << 20             # pages and interpreter noise the RSS figure may add


def _rss_shape(case, mesh):
    shape = list(case["shape"])
    plan = mr.plan(shape, "float32", mesh, _layout(case, "src"), _layout(case, "dst"))
    big = max(plan.src_local_bytes, plan.dst_local_bytes)
    while big < RSS_BLOCK:
        shape[0] *= 2
        big *= 2
    while big >= 2 * RSS_BLOCK:
        shape[0] = (shape[0] + 1) // 2
        big //= 2
    return shape


@pytest.fixture(scope="module")
def rss_environment():
    """The process started with large blocks mmapped at a fixed threshold and
    numpy's huge pages off (mpiredist.bench.measure.RSS_ENVIRONMENT; set by
    scripts/test.sh); skip where /proc is missing or they are not set."""
    from mpiredist.bench.measure import rss_environment_missing, rss_supported
    if not rss_supported():
        pytest.skip("needs Linux /proc/self/clear_refs to reset the peak resident set")
    missing = rss_environment_missing()
    if missing:
        pytest.skip("the resident set shows the allocator's history unless the process "
                    f"starts with {' '.join(missing)} (scripts/test.sh sets them)")
    return "MALLOC_MMAP_THRESHOLD_=131072 NUMPY_MADVISE_HUGEPAGE=0"


@pytest.mark.mpi(min_size=8)
@pytest.mark.parametrize("donate", [False, True], ids=["kept", "donated"])
@pytest.mark.parametrize("case", CASES["cases"], ids=lambda c: c["id"])
def test_memory_contract_rss(case, donate, rss_environment):
    """Growth of the peak resident set (MPI's own buffers included) within the
    contract plus 1 MiB: after a warm-up call, with malloc_trim first."""
    from mpiredist.bench.measure import rss_peak
    comm = MPI.COMM_WORLD
    if comm.size != 8:
        pytest.skip(f"measured at 8 ranks (the shared cases' meshes), not {comm.size}")
    mesh = _mesh(case, comm.size)
    src, dst = _layout(case, "src"), _layout(case, "dst")
    shape = _rss_shape(case, mesh)
    plan = mr.plan(shape, "float32", mesh, src, dst)
    s, t = plan.src_local_bytes, plan.dst_local_bytes
    limit = (max(0, t - s) if donate else max(s, t)) + default_workspace(plan)
    hold = _holds_value(mesh, src, comm.rank)
    for _ in range(2):                                  # a warm-up call, then the measured one
        local = _block(shape, mesh, src, comm.rank, hold)
        comm.Barrier()
        with rss_peak() as e:
            out = mr.redistribute(local, shape, mesh, src, dst, donate=donate)
        del out, local
    used = comm.allreduce(e.bytes, op=MPI.MAX)
    all_ok(comm, used <= limit + RSS_NOISE,
           f"{case['id']} donate={donate}: RSS growth {used} B > limit {limit} B + 1 MiB "
           f"(S = {s}, T = {t}, E/max(S,T) = {used / max(s, t):.3f}; {rss_environment})")
