"""The exchange engine in many parts, against the oracle (public names only).

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_exchange.py

At the sizes the other tests use, every piece goes in one part; here a low
count limit (``MPIREDIST_COUNT_LIMIT``, the same on every rank, read when a
Transfer is made) and workspaces from none to the default cut pieces into
many parts, some packed, some sent straight from or into the arrays and,
where a ring is too small, some as datatypes.  Random meshes, layouts
(collective all-to-alls and all-gathers, and exchanges of the ``direct``
strategy), shapes with uneven lengths and several dtypes, kept and donated;
then partial sources, whose reductions past the reduction room go by parts
combined in order.  Each rank checks its block against ``tests/oracle.py``
and the verdicts are agreed across ranks; the per-step call counts
(:class:`mpiredist.runtime.steps.StepRecord`) show that the parts ran.
"""

import math
import warnings

import numpy as np
import pytest
from helpers import all_ok, need_ranks

import oracle

MPI = pytest.importorskip("mpi4py.MPI")

import mpiredist as mr  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
DTYPES = ("float64", "int32", "complex128", "uint8")
LIMIT = 64                      # bytes per message: pieces of a few elements
MODES = ({}, {"workspace_bytes": 0}, {"workspace_bytes": 3000}, {"donate": True})


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


def _run(monkeypatch, limit, mesh, shape, dtype, src, dst, block, strategy="collectives",
         **mode):
    """``(result or exception, calls of every step)`` of one Transfer run."""
    if limit is None:
        monkeypatch.delenv("MPIREDIST_COUNT_LIMIT", raising=False)
    else:
        monkeypatch.setenv("MPIREDIST_COUNT_LIMIT", str(limit))
    records = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", mr.BudgetWarning)
            with mr.Transfer(shape, dtype, mr.Mesh(mesh), src, dst, strategy=strategy,
                             **mode) as t:
                local = block.copy() if mode.get("donate") else block
                return t.run(local, records=records), sum(r.calls for r in records)
    except Exception as exc:  # noqa: BLE001 - reported, then agreed across ranks
        return exc, 0


def _check(monkeypatch, mesh, shape, dtype, src, dst, block, want, strategy="collectives"):
    """Run every mode with and without the low limit; agree they all gave ``want``.
    Returns the calls made without and with the limit."""
    failures, calls = [], {None: 0, LIMIT: 0}
    for limit in (None, LIMIT):
        for mode in MODES:
            out, n = _run(monkeypatch, limit, mesh, shape, dtype, src, dst, block, strategy,
                          **mode)
            calls[limit] += n
            what = f"{mesh} {shape} {dtype} {src} -> {dst} {strategy} {mode} limit {limit}"
            if isinstance(out, Exception):
                failures.append(f"{what}: raised {type(out).__name__}: {out}")
            elif out.shape != want.shape or not np.array_equal(out, want):
                failures.append(f"{what}: wrong block {out.shape}, expected {want.shape}")
    all_ok(COMM, not failures, "\n".join(failures[:3]))
    return calls[None], calls[LIMIT]


@pytest.mark.mpi
def test_moves_in_many_parts(monkeypatch):
    """24 random cases, every mode, with and without the limit; the limit makes
    more calls in at least a third of them, and fewer in none (the cut ran:
    all-gathers of contiguous blocks and small all-to-alls stay one call)."""
    more = 0
    for seed in range(24):
        mesh, shape, dtype, src, dst, strategy = _case(seed)
        src_text, dst_text = oracle.layout_text(src), oracle.layout_text(dst)
        G = oracle.global_array(shape, dtype, np.random.default_rng(seed))
        axes = list(mesh.items())
        block = np.ascontiguousarray(oracle.local_block(G, axes, src, RANK))
        want = oracle.expected(G, axes, dst, RANK)
        plain, cut = _check(monkeypatch, mesh, shape, dtype, src_text, dst_text, block, want,
                            strategy)
        cut, plain = COMM.allreduce(cut, MPI.SUM), COMM.allreduce(plain, MPI.SUM)
        all_ok(COMM, cut >= plain, f"seed {seed}: {cut} calls with the limit, {plain} without")
        more += cut > plain
    if SIZE > 1:
        assert more >= 8, f"only {more} of 24 cases made more calls in parts"


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
def test_reductions_by_parts(monkeypatch):
    """Reduce-scatters and all-reduces past the reduction room (the low limit
    caps a reduction call at a few elements) go by pipelined parts combined
    by numpy, then gathered (all-reduce); every op and dtype agrees with the
    oracle, kept, in one buffer and donated."""
    need_ranks(COMM, 2)
    reduced = 0
    for seed in range(16):
        mesh, shape, dtype, src, dst, partial, op = _partial_case(seed)
        src_text = oracle.layout_text(src, partial, op)
        dst_text = oracle.layout_text(dst)
        axes = list(mesh.items())
        G = oracle.global_array(shape, dtype, np.random.default_rng(seed))
        block = oracle.partial_blocks(G, axes, src, partial, op,
                                      np.random.default_rng(seed))[RANK]
        want = oracle.expected(G, axes, dst, RANK)
        _check(monkeypatch, mesh, shape, dtype, src_text, dst_text,
               np.ascontiguousarray(block), want)
        plan = mr.plan(shape, dtype, mesh, src_text, dst_text)
        reduced += any(s.op in ("reduce_scatter", "all_reduce")
                       and math.prod(s.local_shape_before) * dtype.itemsize > LIMIT
                       for s in plan.steps)
    assert reduced >= 5, f"only {reduced} cases reduce more than a part"


class _Recording:
    """A communicator that records the send argument of ``Allgather(v)``."""

    def __init__(self, comm):
        self._comm, self.sends = comm, []

    def Allgather(self, send, recv):
        self.sends.append(send)
        return self._comm.Allgather(send, recv)

    def Allgatherv(self, send, recv):
        self.sends.append(send)
        return self._comm.Allgatherv(send, recv)

    def __getattr__(self, name):
        return getattr(self._comm, name)


@pytest.mark.mpi
@pytest.mark.parametrize("even", [True, False])
def test_allgather_is_in_place_on_every_rank_or_none(even):
    """MPI wants ``MPI_IN_PLACE`` at all ranks or at none.  Whether a rank's
    own block is contiguous is its own affair (uneven blocks: one row is
    contiguous where several are not): here odd ranks pass a strided view,
    even ranks a contiguous block, and every rank must make the same call."""
    from mpiredist.runtime.mpi import MpiGroup
    rec = _Recording(COMM)
    group = MpiGroup(rec)
    rows = [3] * SIZE if even else [3 + r % 2 for r in range(SIZE)]
    whole = np.arange(sum(rows) * 4, dtype=np.int32).reshape(-1, 4)
    at = np.cumsum([0] + rows)
    mine = whole[at[RANK]:at[RANK + 1]]
    own = np.asfortranarray(mine) if RANK % 2 else np.ascontiguousarray(mine)
    out = np.zeros_like(whole)
    group.allgather(own, out, [r * 4 * 4 for r in rows])
    kinds = COMM.allgather([s is MPI.IN_PLACE for s in rec.sends])
    all_ok(COMM, np.array_equal(out, whole), f"rank {RANK}: wrong gather")
    all_ok(COMM, len({tuple(k) for k in kinds}) == 1, f"in place per rank: {kinds}")
