"""mpiredist.redistribute against the numpy oracle, on any number of ranks.

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_redistribute.py

Runs and passes at every N (1, 2, 3, 4, 8, ...).  The shared cases of
``cases.json`` have meshes of 8 or 16 devices; on another number of ranks
each case keeps its axis names (in order) and its layouts, and gets axis
sizes whose product is ``comm.size`` (see :func:`fit_mesh`), so every case
runs at every N.

Covered: (a) every shared case, scaled down (:func:`small_shape`), for every
strategy and several dtypes, each call run out of place, in place
(``workspace_bytes=0``) and donated for some dtypes; (b) seeded random
meshes, layouts (partial sums with sum/max/min), shapes 0..9 and modes;
(c) non-contiguous source blocks; (d) one ``StepRecord`` per plan step, and
the bytes each step sent (max over ranks) at most the plan's figure, equal on
evenly divisible cases without reductions.

Every rank checks its own target block against ``tests/oracle.py`` and the
verdicts are agreed across ranks (``helpers.all_ok``): a failure on one rank
fails all ranks instead of leaving the others waiting in a collective.
"""

import json
import math
import pathlib
import warnings

import numpy as np
import pytest
from helpers import all_ok

import oracle

MPI = pytest.importorskip("mpi4py.MPI")

import mpiredist as mr  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()

STRATEGIES = ("collectives", "replicate", "direct")
DTYPES = ("float32", "int64", "complex128", "bool")
STRUCT = np.dtype([("a", "i4"), ("b", "f8")])


def _load_cases():
    here = pathlib.Path(__file__).resolve()
    for path in (here.parents[3] / "shared" / "cases.json",
                 here.parents[2] / "mpiredist" / "bench" / "data" / "cases.json"):
        if path.exists():
            return json.loads(path.read_text())["cases"]
    return []


CASES = _load_cases()


# ------------------------------------------------------------------ helpers

def prime_factors(n):
    """Prime factors of ``n``, largest first (``[]`` for 1)."""
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return sorted(out, reverse=True)


def fit_mesh(case_mesh, n):
    """The case's mesh on ``n`` ranks: same axis names, sizes with product ``n``.

    Rule: if the case's mesh already has ``n`` devices it is kept as is.
    Otherwise every axis starts at size 1 and the prime factors of ``n``,
    largest first, are dealt to the axes round-robin in mesh order.  E.g. for
    ``x,y``: n=3 gives x=3,y=1; n=4 gives x=2,y=2; n=8 gives x=4,y=2; n=1
    gives x=1,y=1.
    """
    names = list(case_mesh)
    if math.prod(case_mesh.values()) == n:
        return {a: int(case_mesh[a]) for a in names}
    sizes = [1] * len(names)
    for i, p in enumerate(prime_factors(n)):
        sizes[i % len(names)] *= p
    return dict(zip(names, sizes))


def small_shape(case):
    """The case's shape scaled down: each length // 256, at least 8.

    c13 (uneven transpose, 4099 x 4093) stays uneven as 67 x 61.
    """
    if case["id"].startswith("c13"):
        return (67, 61)
    return tuple(max(8, n // 256) for n in case["shape"])


def global_array(shape, dtype, rng):
    """The same random global array on every rank (``rng`` seeded alike)."""
    dtype = np.dtype(dtype)
    if dtype == STRUCT:
        g = np.empty(shape, dtype=STRUCT)
        g["a"] = rng.integers(-1000, 1000, size=shape)
        g["b"] = rng.integers(-1000, 1000, size=shape) / 4
        return g
    return oracle.global_array(shape, dtype, rng)


def mesh_axes(mesh):
    return list(mesh.items())


def divisible(shape, mesh, dims):
    """True if every dim's length is a multiple of its shard count."""
    return all(n % math.prod(mesh[a] for a in axes) == 0 for n, axes in zip(shape, dims))


def source_block(G, mesh, dims, partial, op, seed):
    """This rank's source block; partial contributions drawn alike on every rank."""
    axes = mesh_axes(mesh)
    if partial:
        rng = np.random.default_rng(seed)
        return oracle.partial_blocks(G, axes, dims, partial, op, rng)[RANK]
    return oracle.local_block(G, axes, dims, RANK)


def describe_error(exc):
    return f"{type(exc).__name__}: {exc}"


# How a call runs: the default (out-of-place executor for these tiny arrays),
# in place inside one buffer without donating (workspace_bytes=0), donated.
MODES = {"out": {}, "inplace": {"workspace_bytes": 0}, "donate": {"donate": True}}
# The shared cases run every mode for these dtypes, the default for the others
# (8 oversubscribed ranks must finish the suite in about a minute).
EXTRA_MODE_DTYPES = ("float32", "complex128")


def check_call(failures, what, G, mesh, src, dst, dims_src, dims_dst, partial, op,
               strategy, seed, block=None, records=None, mode="out"):
    """Run one redistribute on every rank and append any problem to ``failures``.

    Checks the target block against the oracle and, unless the block was
    donated, that the source buffer is unchanged and that the result shares
    no memory with it.  Returns the target block (or None if the call raised
    on this rank).
    """
    if block is None:
        block = source_block(G, mesh, dims_src, partial, op, seed)
    before = block.copy()
    what = f"{what} [{mode}]"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", mr.BudgetWarning)
            out = mr.redistribute(block, G.shape, mr.Mesh(mesh), src, dst,
                                  strategy=strategy, records=records, **MODES[mode])
    except Exception as exc:  # noqa: BLE001 - reported, then agreed across ranks
        failures.append(f"{what}: raised {describe_error(exc)}")
        return None
    want = oracle.expected(G, mesh_axes(mesh), dims_dst, RANK)
    if not isinstance(out, np.ndarray):
        failures.append(f"{what}: returned {type(out).__name__}")
        return None
    if out.shape != want.shape or out.dtype != want.dtype:
        failures.append(f"{what}: got {out.shape} {out.dtype}, "
                        f"expected {want.shape} {want.dtype}")
    elif not np.array_equal(out, want):
        failures.append(f"{what}: wrong values\n{out!r}\nexpected\n{want!r}")
    if mode != "donate":
        if not np.array_equal(block, before):
            failures.append(f"{what}: source buffer was modified (not donated)")
        if out.size and np.shares_memory(out, block):
            failures.append(f"{what}: result shares memory with the source")
    return out


def agree_no_failures(failures, label):
    """Fail on every rank if any rank recorded a failure."""
    all_ok(COMM, not failures, f"{label}: " + "\n".join(failures[:4]))


# -------------------------------------------------- (a) + (d) shared cases

@pytest.mark.mpi
@pytest.mark.skipif(not CASES, reason="cases.json not found (shared/ or mpiredist/bench/data/)")
@pytest.mark.parametrize("case", CASES, ids=lambda c: c["id"])
def test_shared_case(case):
    mesh = fit_mesh(case["mesh"], SIZE)
    shape = small_shape(case)
    src_l, dst_l = mr.Layout.from_dict(case["src"]), mr.Layout.from_dict(case["dst"])
    dims_src = [list(d) for d in src_l.dims]
    dims_dst = [list(d) for d in dst_l.dims]
    partial = list(src_l.partial)
    exact_bytes = not partial and divisible(shape, mesh, dims_src) and divisible(
        shape, mesh, dims_dst)
    failures = []
    dtypes = DTYPES if partial else DTYPES + (STRUCT,)
    for di, dtype in enumerate(dtypes):
        dtype = np.dtype(dtype)
        # bool has no meaningful partial sum: reduce bools with max (logical or).
        op = "max" if partial and dtype.kind == "b" else "sum"
        src = mr.Layout(src_l.dims, partial, op)
        G = global_array(shape, dtype, np.random.default_rng(100 + di))
        for strategy in STRATEGIES:
            what = f"mesh {mesh} {shape} {dtype} {strategy}"
            try:
                plans = [mr.plan(shape, dtype, mr.Mesh(mesh), src, dst_l, strategy)]
                if strategy == "collectives":
                    plans.append(mr.plan(shape, dtype, mr.Mesh(mesh), src, dst_l,
                                         strategy, allow_exchange=False))
            except Exception as exc:  # noqa: BLE001 - the same on every rank
                failures.append(f"{what}: plan raised {describe_error(exc)}")
                continue
            for mode in MODES if dtype.name in EXTRA_MODE_DTYPES else ("out",):
                records = []
                check_call(failures, what, G, mesh, src, dst_l, dims_src, dims_dst,
                           partial, op, strategy, seed=7 + di, records=records,
                           mode=mode)
                _check_records(failures, f"{what} [{mode}]",
                               plans if mode != "out" else plans[:1], records, exact_bytes)
    agree_no_failures(failures, case["id"])


def _check_records(failures, what, plans, records, exact):
    """(d): one record per step of the plan that ran, bytes (max over ranks) vs it.

    ``plans`` are the plans that may have run: ``redistribute`` re-plans
    ``collectives`` without exchange steps when it runs in place, so a
    donated or in-place call may run the second one.  Collective (an
    Allreduce of a fixed-length array) on every rank, whatever happened
    before, so that ranks stay in step.
    """
    ops = [r.op for r in records]
    ran = next((p for p in plans if [s.op for s in p.steps] == ops), None)
    width = max(len(p.steps) for p in plans) or 1
    mine = np.full(width, -1, dtype=np.int64)
    if ran is None:
        failures.append(f"{what}: records {ops} match no plan's steps "
                        f"{[[s.op for s in p.steps] for p in plans]}")
    else:
        mine[:len(records)] = [r.bytes_sent for r in records]
    top = np.empty_like(mine)
    COMM.Allreduce(mine, top, op=MPI.MAX)
    if ran is None:
        return
    for i, step in enumerate(ran.steps):
        got, planned = int(top[i]), step.bytes_sent_per_rank
        if got > planned:
            failures.append(f"{what}: step {i} {step.op} sent {got} B on some rank, "
                            f"more than the plan's maximum {planned} B")
        elif exact and got != planned:
            failures.append(f"{what}: step {i} {step.op} sent at most {got} B, the plan "
                            f"says {planned} B (even shards: should be equal)")


# --------------------------------------------------- (b) random properties

AXIS_NAMES = ("x", "y", "z")
RANDOM_DTYPES = ("float32", "float64", "int64", "int32", "complex128", "bool", "uint8")


def random_factorisation(rng, n, k):
    """``k`` sizes (ordered, 1s allowed) with product ``n``."""
    sizes = [1] * k
    for p in prime_factors(n):
        sizes[int(rng.integers(k))] *= p
    return sizes


def random_case(seed):
    """A random (mesh, shape, dtype, src, dst, strategy) drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 4))
    mesh = dict(zip(AXIS_NAMES, random_factorisation(rng, SIZE, k)))
    ndim = int(rng.integers(1, 5))
    shape = tuple(int(v) for v in rng.integers(0, 10, size=ndim))
    dtype = np.dtype(RANDOM_DTYPES[int(rng.integers(len(RANDOM_DTYPES)))])
    ops = ["sum", "max", "min"]
    if dtype.kind == "c":
        ops = ["sum"]
    elif dtype.kind == "b":
        ops = ["max", "min"]
    op = ops[int(rng.integers(len(ops)))]
    src_dims = [[] for _ in range(ndim)]
    dst_dims = [[] for _ in range(ndim)]
    src_partial, dst_partial = [], []
    for axis in rng.permutation(list(mesh)):
        axis = str(axis)
        r = rng.random()
        if r < 0.25:
            src_partial.append(axis)
        elif r < 0.75:
            src_dims[int(rng.integers(ndim))].append(axis)
        if axis in src_partial and rng.random() < 0.35:
            dst_partial.append(axis)
        elif rng.random() < 0.6:
            dst_dims[int(rng.integers(ndim))].append(axis)
    strategy = STRATEGIES[int(rng.integers(len(STRATEGIES)))]
    mode = list(MODES)[int(rng.integers(len(MODES)))]
    return (mesh, shape, dtype, src_dims, src_partial, dst_dims, dst_partial, op,
            strategy, mode)


RANDOM_SEEDS = range(40)


@pytest.mark.mpi
@pytest.mark.parametrize("seed", RANDOM_SEEDS)
def test_random_property(seed):
    (mesh, shape, dtype, src_dims, src_partial, dst_dims, dst_partial, op,
     strategy, mode) = random_case(seed)
    src = oracle.layout_text(src_dims, src_partial, op)
    dst = oracle.layout_text(dst_dims, dst_partial, op)
    what = f"mesh {mesh} {shape} {dtype} {src} -> {dst} ({strategy}, {mode})"
    axes = mesh_axes(mesh)
    G = oracle.global_array(shape, dtype, np.random.default_rng(1000 + seed))
    blocks = oracle.source_blocks(G, axes, src_dims, src_partial, op,
                                  np.random.default_rng(2000 + seed))
    block = blocks[RANK]
    before = block.copy()
    failures = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", mr.BudgetWarning)
            out = mr.redistribute(block, shape, mr.Mesh(mesh), src, dst, strategy=strategy,
                                  **MODES[mode])
    except Exception as exc:  # noqa: BLE001
        failures.append(f"{what}: raised {describe_error(exc)}")
        out = None
    if mode != "donate" and not np.array_equal(block, before):
        failures.append(f"{what}: source buffer was modified")
    # Tiny arrays: every rank sees every target block and runs the same check
    # (targets that stay partial are checked through their reduction).
    outs = COMM.allgather(out)
    if all(o is not None for o in outs):
        bad = oracle.target_mismatch(outs, G, axes, dst_dims, dst_partial, op)
        if bad:
            failures.append(f"{what}: {bad}")
    elif out is not None:
        failures.append(f"{what}: raised on another rank")
    agree_no_failures(failures, f"seed {seed}")


# ------------------------------------------------------ (c) non-contiguous

def _noncontiguous(block, kind):
    if kind == "transposed":
        view = np.ascontiguousarray(block.T).T          # F-ordered view
    else:
        base = np.zeros(tuple(2 * n for n in block.shape), dtype=block.dtype)
        view = base[tuple(slice(None, None, 2) for _ in block.shape)]
        view[...] = block
    assert np.array_equal(view, block)
    return view


@pytest.mark.mpi
@pytest.mark.parametrize("kind", ["transposed", "strided"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_noncontiguous_input(kind, strategy):
    mesh = fit_mesh({"x": 2, "y": 4}, SIZE)
    shape = (11, 9)
    failures = []
    for i, (src, dst) in enumerate([("[{x}, {y}]", "[{y}, {x}]"),
                                    ("[{x,y}, {}]", "[{}, {}]"),
                                    ("[{}, {}]", "[{}, {y,x}]")]):
        G = oracle.global_array(shape, "int64", np.random.default_rng(i))
        ls, ld = mr.Layout.parse(src), mr.Layout.parse(dst)
        ds, dd = [list(d) for d in ls.dims], [list(d) for d in ld.dims]
        block = _noncontiguous(oracle.local_block(G, mesh_axes(mesh), ds, RANK), kind)
        check_call(failures, f"{kind} {strategy} {src} -> {dst}", G, mesh, src, dst,
                   ds, dd, [], "sum", strategy, seed=0, block=block)
    agree_no_failures(failures, f"{kind} {strategy}")


@pytest.mark.mpi
def test_noncontiguous_partial_source():
    mesh = {"x": SIZE}
    G = oracle.global_array((6, 5), "float64", np.random.default_rng(3))
    block = oracle.partial_blocks(G, mesh_axes(mesh), [[], []], ["x"], "sum",
                                  np.random.default_rng(4))[RANK]
    failures = []
    for strategy in STRATEGIES:
        check_call(failures, f"partial {strategy}", G, mesh, "[{}, {}] sum{x}",
                   "[{}, {x}]", [[], []], [[], ["x"]], ["x"], "sum", strategy, seed=0,
                   block=_noncontiguous(block, "transposed"))
    agree_no_failures(failures, "partial non-contiguous")
