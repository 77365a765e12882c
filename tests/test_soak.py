"""The soak's MPI-free parts: its cases and its oracle (benchmarks.soak).

The MPI run of the soak is ``tests/mpi/test_soak.py``; the last test here
launches a job of its own (as ``tests/test_failure.py`` does).
"""

import math
import subprocess
import sys

import numpy as np
import pytest
from jobs import MPIEXEC, ROOT, job_env

from benchmarks import soak
from mpiredist.core.blocks import rank_block
from mpiredist.core.layout import Layout
from mpiredist.core.mesh import Mesh
from mpiredist.core.subaxes import expand, rank_digits


def test_a_case_depends_only_on_seed_index_and_ranks():
    run = [soak.make_case(9, k, 7) for k in range(200)]
    assert [soak.make_case(9, k, 7) for k in (150, 3, 77)] == [run[150], run[3], run[77]]
    assert run != [soak.make_case(10, k, 7) for k in range(200)]
    case = run[57]
    assert "--seed 9 --case 57" in case.replay() and "-n 7 " in case.replay()


def test_factorisations_are_every_ordered_one():
    assert soak.factorisations(1) == ((1,), (1, 1), (1, 1, 1))
    six = soak.factorisations(6)
    assert len(six) == 1 + 4 + 9 and (2, 3) in six and (3, 1, 2) in six and (1, 6) in six
    assert all(math.prod(f) == 6 for f in six)


def test_block_box_follows_the_block_rule():
    lay = Layout.parse("[{x}]")
    assert [soak.block_box((10,), {"x": 4}, lay, {"x": p}) for p in range(4)] == \
        [((0, 3),), ((3, 6),), ((6, 9),), ((9, 10),)]
    assert [soak.block_box((2,), {"x": 4}, lay, {"x": p})[0] for p in range(4)] == \
        [(0, 1), (1, 2), (2, 2), (2, 2)]
    # two axes on a dim: the first is the most significant digit
    two = Layout.parse("[{y,x}, {}]")
    assert soak.block_box((12, 5), {"x": 2, "y": 3}, two, {"x": 1, "y": 2}) == ((10, 12), (0, 5))
    assert soak.block_box((0,), {"x": 3}, lay, {"x": 2}) == ((0, 0),)
    assert soak.block_box((), {"x": 3}, Layout.parse("[]"), {"x": 1}) == ()


def test_block_box_agrees_with_the_library_on_every_case():
    # two independent implementations of DESIGN.md's block rule
    for k in range(300):
        case = soak.make_case(4, k, 8)
        for axes, text in ((case.src_axes, case.src), (case.dst_axes or case.src_axes, case.dst)):
            mesh, lay = Mesh(dict(axes)), Layout.parse(text)
            for device in range(mesh.size):
                coords = dict(zip(mesh.names, np.unravel_index(device, mesh.sizes)))
                ours = soak.block_box(case.shape, dict(axes), lay, coords)
                theirs = rank_block(case.shape, expand(lay, mesh), rank_digits(mesh, device))
                assert [tuple(b) for b in theirs] == [tuple(b) for b in ours], (case, device)


@pytest.mark.parametrize("dtype", soak.DTYPES)
def test_partial_shares_reduce_exactly_and_stay_in_range(dtype):
    f = np.arange(600, dtype=np.uint64).reshape(20, 30)
    want = soak.global_values(dtype, f, 77, small=True)
    ops = ("sum", "prod") if np.dtype(dtype).kind == "c" else ("sum", "max", "min", "prod")
    for op in ops:
        for classes in (1, 2, 3, 5, 8):
            shares = [soak.partial_values(dtype, op, f, 77, q, classes) for q in range(classes)]
            assert all(s.dtype == np.dtype(dtype) and s.shape == f.shape for s in shares)
            assert np.array_equal(soak.reduce_shares(dtype, op, shares), want), (op, classes)
            if classes > 1 and op != "prod":
                assert any(not np.array_equal(s, want) for s in shares), "shares are trivial"
            if op == "sum" and np.dtype(dtype).kind in "iu":
                # no partial sum in any order leaves the range: MPI leaves overflow
                # undefined (Open MPI's AVX sums saturate 8- and 16-bit integers)
                info, wide = np.iinfo(dtype), np.stack(shares).astype(np.int64)
                for order in (wide, wide[::-1]):
                    partial = np.cumsum(order, axis=0)
                    assert partial.min() >= info.min and partial.max() <= info.max


def test_values_are_exact_deterministic_and_0d():
    f = np.arange(1000, dtype=np.uint64)
    for dtype in soak.DTYPES + soak.MOVED_ONLY:
        a, b = soak.global_values(dtype, f, 5), soak.global_values(dtype, f, 5)
        assert a.dtype == np.dtype(dtype) and a.tobytes() == b.tobytes()
        assert a.tobytes() != soak.global_values(dtype, f, 6).tobytes()
        if np.dtype(dtype).kind in "fc":
            assert np.isfinite(a).all()
        zero = soak.global_values(dtype, np.zeros((), np.uint64), 5)
        assert type(zero) is np.ndarray and zero.shape == ()


def test_cases_cover_the_space():
    for ranks in (5, 7, 8):
        cases = [soak.make_case(1, k, ranks) for k in range(4000)]
        srcs = [Layout.parse(c.src) for c in cases]
        dsts = [Layout.parse(c.dst) for c in cases]
        assert {c.route for c in cases} == set(soak.ROUTES)
        assert {c.strategy for c in cases} == set(soak.STRATEGIES)
        assert {c.dtype for c in cases} == set(soak.DTYPES + soak.MOVED_ONLY)
        assert {c.memory for c in cases} == {"c", "fortran", "strided", "readonly"}
        assert {s.op for s in srcs if s.partial} == {"sum", "max", "min", "prod"}
        assert {c.donate for c in cases} == {True, False}
        assert {c.workspace for c in cases} == set(soak.WORKSPACES)
        whole = {tuple(s for _, s in c.src_axes) for c in cases
                 if c.comm_size == ranks and not c.between}
        assert whole == set(soak.factorisations(ranks))        # every factorisation of P
        assert {c.comm_size for c in cases} == set(range(1, ranks + 1))
        sizes = {s for c in cases for _, s in c.src_axes + (c.dst_axes or ())}
        assert sizes >= {n for n in (4, 6, 8) if n <= ranks}    # split into prime sub-axes
        assert any(len(d) >= 2 for s in srcs for d in s.dims)   # axes sharing a dim
        assert any(0 in c.shape for c in cases) and any(c.shape == () for c in cases)
        assert any(dst.partial for dst in dsts)                  # a target keeps partials
        assert any(c.src_ranks is not None and len(c.src_ranks) < c.comm_size for c in cases)
        assert any(c.dst_ranks is not None and c.dst_ranks != tuple(sorted(c.dst_ranks))
                   for c in cases)                              # another order
        assert any(c.dst_axes is not None and c.src_ranks is None and c.dst_ranks is None
                   for c in cases)                              # nesting meshes
        assert any(math.prod(c.shape) > soak.MAX_ELEMENTS for c in cases)
        # fewer elements than shards: some blocks are empty
        assert any(0 < n < math.prod(dict(c.src_axes)[a] for a in s.dims[d])
                   for c, s in zip(cases, srcs) for d, n in enumerate(c.shape))
        for c, s in zip(cases, srcs):
            assert not s.partial or c.dtype in soak.DTYPES
            assert np.dtype(c.dtype).kind != "c" or s.op in ("sum", "prod") or not s.partial


# The soak frees its sub-communicators at the end; freeing each drops the cache
# mpiredist keeps on it, which frees what it holds.  Three soaks in one 5-rank job.
_FREE_JOB = """
from mpi4py import MPI
from benchmarks import soak
for _ in range(3):
    soak.soak(MPI.COMM_WORLD, 11, range(40))
print("freed", MPI.COMM_WORLD.rank, flush=True)
"""


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec next to this Python or on PATH")
# Regression: freeing a communicator whose topology mpiredist had found
# segfaulted under MPICH when that used mpi4py's object allreduce (cc857c7).
def test_freeing_the_soaks_communicators_does_not_crash():
    _job_frees(5, _FREE_JOB)


def _job_frees(ranks, code):
    """Run ``code`` on ``ranks`` ranks: it exits 0 and prints "freed" on each."""
    done = subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, "-c", code], cwd=ROOT,
                          env=job_env(ranks), capture_output=True, text=True, timeout=240)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and out.count("freed") == ranks, out[-3000:]


# Freeing a communicator runs the delete callbacks of its attributes, newest
# first, while MPICH's attribute list still starts at the ones already freed;
# a freed one's keyval is the allocator's next free slot, NULL when the pool
# ran dry.  A Python delete callback (mpi4py wraps the handle, calling
# MPI_Topo_test, which walks that list) then segfaulted whenever an attribute
# set after mpiredist's was freed at a pool boundary: a user's attribute,
# mpi4py's own.  Both parities of the pool are tried; thousands of live
# attributes cross several of MPICH's 1024-slot blocks.
_ATTR_JOB = """
from mpi4py import MPI
import mpiredist as mr
from mpiredist.runtime.groups import as_group, kept, mesh_groups
W = MPI.COMM_WORLD
mesh_groups(mr.Mesh({"x": W.Get_size()}))              # a mesh's communicators exist
theirs = MPI.Comm.Create_keyval()
freed = []
class Kept:
    def free(self):
        freed.append(1)
for shift in (0, 1):
    if shift:
        W.Set_attr(theirs, "one more live attribute")
    live = []
    for i in range(2400):
        c = W.Dup()
        kept(as_group(c), "test")["x"] = Kept()  # mpiredist's attribute first
        c.Set_attr(theirs, i)          # then someone else's
        (live.append if i % 3 == 0 else lambda c: c.Free())(c)
    for c in live:
        c.Free()
assert len(freed) == 4800, len(freed)        # what mpiredist kept was freed with each
print("freed", W.rank, flush=True)
"""


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec next to this Python or on PATH")
def test_freeing_a_communicator_with_a_later_attribute_does_not_crash():
    _job_frees(2, _ATTR_JOB)
