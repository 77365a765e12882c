"""The packed move (mpiredist.runtime.packing.move) in many rounds, against the oracle.

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_packing.py

At the sizes the other tests use, every piece fits in one round; here the
executor runs with small pack budgets (``slack``) and a tiny minimum part
size, so that pieces are cut into many parts, some parts are packed, some go
straight from or into the arrays and some, when the buffer is full, as
datatypes.  Random meshes, layouts (collective all-to-alls and all-gathers,
and exchanges from the ``direct`` strategy), shapes with uneven lengths and
several dtypes.  Each rank checks its block against ``tests/oracle.py`` and
the verdicts are agreed across ranks.
"""

import math

import numpy as np
import pytest
from helpers import all_ok, need_ranks

import oracle

MPI = pytest.importorskip("mpi4py.MPI")

from mpiredist.planning import planner  # noqa: E402
from mpiredist import redistribute  # noqa: E402
from mpiredist.runtime import executor, executor_inplace, packing  # noqa: E402
from mpiredist.planning.budget import MARGIN  # noqa: E402
from mpiredist.runtime.comm import mesh_comm  # noqa: E402
from mpiredist.core.mesh import Mesh  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
DTYPES = ("float64", "int32", "complex128", "uint8")
# Pack budgets on top of the executor's bookkeeping margin: none (every
# non-contiguous part as a datatype), a few parts per round, room for all.
SLACKS = (0, 300, 5000, 1 << 20)


def _factorise(rng, n, k):
    sizes = [1] * k
    p = 2
    while n > 1:
        while n % p == 0:
            sizes[int(rng.integers(k))] *= p
            n //= p
        p += 1
    return sizes


def _case(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 4))
    mesh = dict(zip("xyz", _factorise(rng, SIZE, k)))
    ndim = int(rng.integers(1, 4))
    shape = tuple(int(v) for v in rng.integers(0, 26, size=ndim))
    src, dst = [[] for _ in range(ndim)], [[] for _ in range(ndim)]
    for axis in rng.permutation(list(mesh)):
        if rng.random() < 0.8:
            src[int(rng.integers(ndim))].append(str(axis))
        if rng.random() < 0.8:
            dst[int(rng.integers(ndim))].append(str(axis))
    dtype = np.dtype(DTYPES[int(rng.integers(len(DTYPES)))])
    strategy = ("collectives", "direct")[int(rng.integers(2))]
    return mesh, shape, dtype, src, dst, strategy


@pytest.fixture
def tiny_parts(monkeypatch):
    monkeypatch.setattr(packing, "MIN_PART", 8)


@pytest.mark.mpi
@pytest.mark.parametrize("seed", range(24))
def test_move_in_rounds(seed, tiny_parts):
    mesh, shape, dtype, src, dst, strategy = _case(seed)
    plan = planner.plan(shape, dtype, Mesh(mesh), oracle.layout_text(src),
                        oracle.layout_text(dst), strategy)
    axes = list(mesh.items())
    G = oracle.global_array(shape, dtype, np.random.default_rng(seed))
    block = oracle.local_block(G, axes, src, RANK)
    want = oracle.expected(G, axes, dst, RANK)
    _check_slacks(plan, Mesh(mesh), block, want, f"{mesh} {shape} {dtype} {src} -> {dst} "
                  f"{strategy}")


def _check_slacks(plan, mesh, block, want, what):
    """Run ``plan`` with every pack budget of SLACKS; agree that each gave ``want``."""
    mc = mesh_comm(mesh)
    failures = []
    for slack in SLACKS:
        try:
            out = executor.execute(plan, block, mc, slack=MARGIN + slack)
        except Exception as exc:  # noqa: BLE001 - reported, then agreed across ranks
            failures.append(f"{what} slack {slack}: raised {type(exc).__name__}: {exc}")
            continue
        if out.shape != want.shape or not np.array_equal(out, want):
            failures.append(f"{what} slack {slack}: wrong block {out.shape}, "
                            f"expected {want.shape}")
    all_ok(COMM, not failures, "\n".join(failures[:3]))


@pytest.mark.mpi
def test_cases_exercise_rounds():
    """The random cases above do move pieces in several parts (else the test says little)."""
    need_ranks(COMM, 2)
    limits, cut = 0, 0
    for seed in range(24):
        mesh, shape, dtype, src, dst, strategy = _case(seed)
        plan = planner.plan(shape, dtype, Mesh(mesh), oracle.layout_text(src),
                            oracle.layout_text(dst), strategy)
        moves = [s for s in plan.steps if s.op in ("all_to_all", "all_gather", "exchange")]
        limits += len(moves)
        cut += any(len(packing.parts(s.local_shape_before, 300 // dtype.itemsize // 2)) > 1
                   for s in moves)
    assert limits >= 8 and cut >= 6, (limits, cut)


OPS = {"float64": ("sum", "max", "min"), "int32": ("sum", "max", "min", "prod"),
       "complex128": ("sum",), "uint8": ("max", "min", "sum"), "bool": ("max", "min")}


def _partial_case(seed):
    """A random case whose source holds partial results over at least one axis."""
    rng = np.random.default_rng(1000 + seed)
    mesh, shape, _, src, dst, _ = _case(1000 + seed)
    names = list(mesh)
    partial = [a for a in names if rng.random() < 0.6] or [names[int(rng.integers(len(names)))]]
    src = [[a for a in axes if a not in partial] for axes in src]
    dtype = np.dtype(list(OPS)[int(rng.integers(len(OPS)))])
    op = OPS[dtype.name][int(rng.integers(len(OPS[dtype.name])))]
    return mesh, shape, dtype, src, dst, partial, op


@pytest.mark.mpi
@pytest.mark.parametrize("seed", range(16))
def test_reductions_in_parts(seed, tiny_parts, monkeypatch):
    """Reduce-scatters and all-reduces past the reduction room go by pipelined
    parts combined by numpy (packing.reduce_move; all-reduces then gather the
    slices), or in rounds when the slack holds no part; every op and dtype
    agrees with the oracle."""
    monkeypatch.setattr(executor, "reduce_limit", lambda ctx: 1)
    monkeypatch.setattr(executor_inplace, "reduce_limit", lambda ctx: 1)
    mesh, shape, dtype, src, dst, partial, op = _partial_case(seed)
    src_text = oracle.layout_text(src, partial, op)
    plan = planner.plan(shape, dtype, Mesh(mesh), src_text, oracle.layout_text(dst))
    axes = list(mesh.items())
    G = oracle.global_array(shape, dtype, np.random.default_rng(seed))
    block = oracle.partial_blocks(G, axes, src, partial, op, np.random.default_rng(seed))[RANK]
    want = oracle.expected(G, axes, dst, RANK)
    what = f"{mesh} {shape} {dtype} {src_text} -> {dst}"
    _check_slacks(plan, Mesh(mesh), block, want, what)
    # donated: the one-buffer executor, its reductions in place with the default W
    got = redistribute(block.copy(), shape, Mesh(mesh), src_text, oracle.layout_text(dst),
                       donate=True)
    all_ok(COMM, got.shape == want.shape and np.array_equal(got, want), f"{what} donated")


@pytest.mark.mpi
def test_partial_cases_reduce():
    """The random partial cases above do reduce-scatter and all-reduce (else
    the test says little)."""
    need_ranks(COMM, 2)
    scatters = reduces = 0
    for seed in range(16):
        mesh, shape, dtype, src, dst, partial, op = _partial_case(seed)
        plan = planner.plan(shape, dtype, Mesh(mesh), oracle.layout_text(src, partial, op),
                            oracle.layout_text(dst))
        scatters += any(s.op == "reduce_scatter" and math.prod(s.local_shape_after) > 1
                        for s in plan.steps)
        reduces += any(s.op == "all_reduce" and math.prod(s.local_shape_after) > 1
                       for s in plan.steps)
    assert scatters >= 5 and reduces >= 2, (scatters, reduces)
