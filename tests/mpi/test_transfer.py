"""mr.Transfer: plan once, run many; out=, memory of repeated runs, explain, free.

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_transfer.py
"""

import tracemalloc

import numpy as np
import pytest
from mpi4py import MPI

import mpiredist as mr
import oracle
from helpers import all_array_equal, all_ok, need_ranks

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
MESH = mr.Mesh({"x": SIZE})

# (src, dst, strategy, workspace): one step, several steps (gather then slice),
# a partial sum, a gather with no workspace, and a run in one buffer (the
# gathered intermediate does not fit the contract out of place)
CASES = [
    ("[{x}, {}]", "[{}, {x}]", "collectives", None),
    ("[{x}, {}]", "[{}, {x}]", "replicate", None),
    ("[{}, {}] sum{x}", "[{x}, {}]", "collectives", None),
    ("[{x}, {}]", "[{}, {}]", "collectives", 0),
    ("[{x}, {}]", "[{}, {x}]", "replicate", 64 << 10),
]
# What a run allocates besides data buffers: the Python objects of its
# bookkeeping (views, lists, step records), measured 1.5-2.9 KiB per run.
BOOKKEEPING = 16 << 10


def _blocks(src, dst, shape, dtype="float64"):
    g = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape) % 97
    s, d = mr.Layout.parse(src), mr.Layout.parse(dst)
    axes = list(MESH.axes)
    if s.partial:
        local = g.copy() if RANK == 0 else np.zeros_like(g)
    else:
        local = np.ascontiguousarray(oracle.local_block(g, axes, [list(x) for x in s.dims], RANK))
    want = oracle.local_block(g, axes, [list(x) for x in d.dims], RANK)
    return local, np.ascontiguousarray(want)


@pytest.mark.mpi
@pytest.mark.parametrize("src,dst,strategy,workspace", CASES)
def test_many_runs_into_out(src, dst, strategy, workspace):
    shape = (6 * SIZE + 1, 40)
    local, want = _blocks(src, dst, shape)
    kept = local.copy()
    with mr.Transfer(shape, "float64", MESH, src, dst, strategy=strategy,
                     workspace_bytes=workspace) as t:
        out = np.full(t.target_shape, -1.0)
        for _ in range(4):
            got = t.run(local, out=out)
            all_ok(COMM, got is out, "run returns out")
            all_array_equal(COMM, out, want, f"{src} -> {dst} ({strategy})")
        all_array_equal(COMM, t.run(local), want, "run without out")
    all_ok(COMM, np.array_equal(local, kept), "source unchanged")


@pytest.mark.mpi
@pytest.mark.parametrize("src,dst,strategy,workspace", CASES)
def test_repeated_runs_with_out_allocate_within_workspace(src, dst, strategy, workspace):
    shape = (256 * SIZE, 256)                  # 512 KiB float64 blocks and more
    local, want = _blocks(src, dst, shape)
    t = mr.Transfer(shape, "float64", MESH, src, dst, strategy=strategy,
                    workspace_bytes=workspace)
    out = np.empty(t.target_shape)
    t.run(local, out=out)                      # warm-up: routing, kept buffers
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(3):
            t.run(local, out=out)
        used = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    all_array_equal(COMM, out, want, "result")
    w = t.workspace_bytes
    worst = COMM.allreduce(used, op=MPI.MAX)
    all_ok(COMM, worst <= w + BOOKKEEPING, f"{src} -> {dst} ({strategy}, {t.executor}): "
                                           f"repeated runs allocated {worst} B > W = {w} B")
    t.free()


@pytest.mark.mpi(min_size=2)
def test_free_releases_kept_buffers():
    need_ranks(COMM, 2)                        # one rank gathers nothing: nothing kept
    shape = (256 * SIZE, 256)
    src, dst = "[{x}, {}]", "[{}, {x}]"       # replicate: gather everything, then slice
    local, _ = _blocks(src, dst, shape)
    tracemalloc.start()
    try:
        t = mr.Transfer(shape, "float64", MESH, src, dst, strategy="replicate")
        out = np.empty(t.target_shape)
        t.run(local, out=out)
        held = tracemalloc.get_traced_memory()[0]
        t.free()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # replicate keeps its gathered intermediate: the whole array (S * SIZE bytes)
    all_ok(COMM, held - after >= local.nbytes * SIZE, f"free released {held - after} B")
    all_ok(COMM, "Transfer" in t.explain(), "explain still works after free")


@pytest.mark.mpi
def test_explain_names_executor_parts_bytes_and_workspace():
    t = mr.Transfer((64 * SIZE, 64), "float32", MESH, "[{x}, {}]", "[{}, {x}]")
    text = t.explain()
    words = ("executor", "part(s) per piece, pipelined", "sends", "predicted peak", "W =") if SIZE > 1 else \
        ("executor", "no steps", "predicted peak", "W =")
    for word in words:
        all_ok(COMM, word in text, f"explain() names {word!r}:\n{text}")
    all_ok(COMM, t.executor in ("out of place", "in place"), "executor property")
    t.free()


@pytest.mark.mpi
def test_wrong_block_on_one_rank_raises_everywhere_then_works():
    shape = (3 * SIZE + 1, 5)
    src, dst = "[{x}, {}]", "[{}, {x}]"
    local, want = _blocks(src, dst, shape, "float32")
    t = mr.Transfer(shape, "float32", MESH, src, dst)
    bad = local.astype("float64") if RANK == SIZE - 1 else local
    try:
        t.run(bad)
        err = None
    except ValueError as exc:
        err = exc
    all_ok(COMM, isinstance(err, mr.ShapeError)
           and isinstance(err, mr.RemoteError) == (RANK != SIZE - 1)
           and len(set(COMM.allgather(str(err)))) == 1, f"rank {RANK} raised {err!r}")
    all_array_equal(COMM, t.run(local), want, "the next run works")
    out_bad = np.empty((1, 1), dtype="float32") if RANK == 0 else None
    try:
        t.run(local, out=out_bad)
        err = None
    except ValueError as exc:
        err = exc
    all_ok(COMM, isinstance(err, mr.ShapeError) and "rank 0" in str(err), f"bad out: {err!r}")
    t.free()


@pytest.mark.mpi
def test_constructor_with_bad_layout_on_one_rank_raises_everywhere():
    dst = "[{}, {q}]" if RANK == 0 else "[{}, {x}]"
    try:
        mr.Transfer((4 * SIZE, 4), "float32", MESH, "[{x}, {}]", dst)
        err = None
    except ValueError as exc:
        err = exc
    all_ok(COMM, isinstance(err, mr.LayoutError) and ("rank 0: " in str(err) or SIZE == 1)
           and isinstance(err, mr.RemoteError) == (RANK != 0), f"raised {err!r}")


@pytest.mark.mpi
def test_unchecked_runs_match_and_a_bad_block_raises_on_its_rank_without_a_hang():
    shape = (3 * SIZE + 2, 6)
    src, dst = "[{x}, {}]", "[{}, {x}]"
    local, want = _blocks(src, dst, shape, "float32")
    t = mr.Transfer(shape, "float32", MESH, src, dst, checked=False)
    out = np.empty(t.target_shape, "float32")
    for _ in range(3):
        all_array_equal(COMM, t.run(local, out=out), want, "unchecked run")
    bad = local[:, :1] if RANK == 0 else local     # wrong shape on rank 0 only
    try:
        t.run(bad)
        err = None
    except ValueError as exc:
        err = exc
    all_ok(COMM, isinstance(err, mr.ShapeError) == (RANK == 0), f"rank {RANK}: {err!r}")
    all_array_equal(COMM, t.run(local), want, "every rank is still in step")
    t.free()


@pytest.mark.mpi
def test_unchecked_with_donation_is_refused_on_every_rank():
    try:
        mr.Transfer((2 * SIZE, 2), "float32", MESH, "[{x}, {}]", "[{}, {x}]", donate=True,
                    checked=False)
        err = None
    except ValueError as exc:
        err = exc
    all_ok(COMM, isinstance(err, mr.PlanError), f"raised {err!r}")
