"""mpiredist.DistArray on any number of ranks.

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_distarray.py

Expected blocks come from the numpy oracle (``tests/oracle.py``); every
verdict is agreed across ranks (``helpers.all_ok``).  Meshes are built for
``comm.size`` ranks, so every test runs at every N except the one marked
``min_size=2``, which skips with a reason on one rank.
"""

import numpy as np
import pytest
from helpers import all_ok, need_ranks

import oracle

MPI = pytest.importorskip("mpi4py.MPI")

import mpiredist as mr  # noqa: E402
from mpiredist.runtime.mpi import free_all  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
STRATEGIES = ("collectives", "replicate", "direct")


def two_axis_mesh(comm=None):
    """``x, y`` with product ``comm.size``: x=2 when the size is even, else x=1."""
    size = (comm or COMM).Get_size()
    x = 2 if size % 2 == 0 else 1
    return mr.Mesh({"x": x, "y": size // x}, comm=comm)


def expected(g, mesh, layout, rank=RANK):
    dims = [list(d) for d in mr.Layout.parse(layout).dims]
    return oracle.expected(g, list(mesh.axes), dims, rank)


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)


def global_array(shape, dtype="float64", seed=0):
    return oracle.global_array(shape, dtype, np.random.default_rng(seed))


LAYOUTS = ["[{x}, {y}]", "[{y,x}, {}]", "[{}, {x,y}]", "[{}, {}]", "[{y}, {x}]"]


@pytest.mark.mpi
@pytest.mark.parametrize("shape", [(7, 5), (1, 3), (0, 4)], ids=["uneven", "tiny", "empty"])
def test_from_global_properties_and_gather(shape):
    mesh = two_axis_mesh()
    g = global_array(shape, "int64")
    for layout in LAYOUTS:
        a = mr.DistArray.from_global(g, mesh, layout)
        ok = (same(a.local, expected(g, mesh, layout)) and a.shape == shape
              and a.ndim == 2 and a.dtype == g.dtype and a.mesh == mesh
              and a.layout == mr.Layout.parse(layout)
              and isinstance(a.layout, mr.Layout) and not np.shares_memory(a.local, g))
        all_ok(COMM, ok, f"from_global {shape} {layout}: properties or block wrong")
        all_ok(COMM, same(a.gather(), g), f"gather of {layout} {shape}")


@pytest.mark.mpi
def test_from_local_round_trip():
    mesh = two_axis_mesh()
    g = global_array((9, 4), "complex128", seed=1)
    for layout in LAYOUTS:
        block = expected(g, mesh, layout)
        a = mr.DistArray.from_local(block, mesh, layout, [9, 4])
        ok = (a.local is block and a.shape == (9, 4) and a.layout == mr.Layout.parse(layout)
              and a.dtype == np.complex128)
        all_ok(COMM, ok, f"from_local {layout}: properties")
        all_ok(COMM, same(a.gather(), g), f"from_local {layout}: gather")
        # from_global of the gathered array gives back the same blocks.
        b = mr.DistArray.from_global(a.gather(), mesh, layout)
        all_ok(COMM, same(b.local, block), f"from_local {layout}: round trip")


@pytest.mark.mpi
def test_from_local_partial_sums_gather_to_the_sum():
    mesh = mr.Mesh({"x": SIZE})
    g = global_array((5, 3), "int64", seed=2)
    parts = oracle.partial_blocks(g, list(mesh.axes), [[], []], ["x"], "sum",
                                  np.random.default_rng(3))
    a = mr.DistArray.from_local(parts[RANK], mesh, "[{}, {}] sum{x}", (5, 3))
    all_ok(COMM, a.layout.partial == ("x",), "partial axes lost")
    all_ok(COMM, same(a.gather(), g), "gather of partial sums is not their sum")


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_redistribute_returns_distarray(strategy):
    mesh = two_axis_mesh()
    g = global_array((7, 6), "float32", seed=4)
    a = mr.DistArray.from_global(g, mesh, "[{x}, {y}]")
    before = a.local.copy()
    for dst in ("[{y}, {x}]", mr.Layout.parse("[{}, {x,y}]"), "[{}, {}]"):
        b = a.redistribute(dst, strategy=strategy)
        ok = (isinstance(b, mr.DistArray) and b is not a and b.layout == mr.Layout.parse(dst)
              and b.shape == a.shape and b.mesh == a.mesh and b.dtype == a.dtype
              and same(b.local, expected(g, mesh, dst))
              and not (b.local.size and np.shares_memory(b.local, a.local)))
        all_ok(COMM, ok, f"{strategy}: redistribute to {dst}")
        all_ok(COMM, a.layout == mr.Layout.parse("[{x}, {y}]") and same(a.local, before),
               f"{strategy}: the source DistArray changed")


@pytest.mark.mpi
def test_redistribute_records_and_plan():
    mesh = two_axis_mesh()
    a = mr.DistArray.from_global(global_array((8, 8)), mesh, "[{x,y}, {}]")
    plan = a.plan("[{}, {x,y}]")
    records = []
    a.redistribute("[{}, {x,y}]", records=records)
    ok = (isinstance(plan, mr.Plan) and len(records) == len(plan.steps)
          and [r.op for r in records] == [s.op for s in plan.steps])
    all_ok(COMM, ok, f"records {records} do not match plan steps {plan.steps}")


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_redistribute_in_place(strategy):
    mesh = two_axis_mesh()
    g = global_array((6, 7), "int64", seed=5)
    a = mr.DistArray.from_global(g, mesh, "[{x}, {}]")
    for dst in ("[{}, {y,x}]", "[{y}, {x}]", "[{}, {}]", "[{x,y}, {}]"):
        out = a.redistribute_(dst, strategy=strategy)
        ok = (out is a and a.layout == mr.Layout.parse(dst) and a.shape == (6, 7)
              and same(a.local, expected(g, mesh, dst)))
        all_ok(COMM, ok, f"{strategy}: redistribute_ to {dst}")
    all_ok(COMM, same(a.gather(), g), f"{strategy}: gather after in-place moves")


@pytest.mark.mpi
def test_repr_does_not_communicate():
    mesh = two_axis_mesh()
    a = mr.DistArray.from_global(global_array((7, 5)), mesh, "[{x}, {y}]")
    ok, text = True, ""
    if RANK == 0:
        # Only rank 0 prints: if repr or str entered a collective, rank 0
        # would wait here while the others wait in all_ok below.
        text = repr(a) + str(a)
        ok = "(7, 5)" in text and "[{x}, {y}]" in text
    all_ok(COMM, ok, f"repr lacks shape or layout: {text}")


@pytest.mark.mpi
@pytest.mark.parametrize("kind", ["none", "world", "dup"])
def test_mesh_communicators(kind):
    comm = {"none": None, "world": COMM, "dup": COMM.Dup() if kind == "dup" else None}[kind]
    try:
        mesh = two_axis_mesh(comm)
        all_ok(COMM, mesh.comm is comm, "mesh.comm")
        g = global_array((5, 6), "float64", seed=6)
        a = mr.DistArray.from_global(g, mesh, "[{x}, {y}]")
        b = a.redistribute("[{y}, {x}]")
        all_ok(COMM, same(b.local, expected(g, mesh, "[{y}, {x}]")), f"{kind}: redistribute")
        all_ok(COMM, same(b.gather(), g), f"{kind}: gather")
        local = mr.redistribute(b.local, g.shape, mesh, "[{y}, {x}]", "[{}, {}]")
        all_ok(COMM, same(local, g), f"{kind}: mr.redistribute")
    finally:
        if kind == "dup":
            free_all()       # mpiredist caches per-communicator state; see below
            comm.Free()


def test_freed_communicators_are_not_kept_alive():
    """mpiredist's per-communicator cache does not hold a communicator the user
    freed: after 5 communicators used and freed, at most the last one's
    wrapper is still referenced (dropped when the next cache is made)."""
    import gc
    import weakref
    g = global_array((2 * SIZE, 3), "int64", seed=8)
    refs = []
    for _ in range(5):
        comm = COMM.Dup()
        a = mr.DistArray.from_global(g, mr.Mesh({"x": SIZE}, comm=comm), "[{x}, {}]")
        all_ok(COMM, same(a.redistribute("[{}, {x}]").gather(), g), "redistribute")
        refs.append(weakref.ref(comm))
        del a
        comm.Free()
        del comm
    gc.collect()
    alive = sum(r() is not None for r in refs)
    all_ok(COMM, alive <= 1, f"{alive} of 5 freed communicators still referenced")


@pytest.mark.mpi(min_size=2)
def test_mesh_on_new_communicator_after_free():
    """A communicator freed and its handle reused must not see a stale cache."""
    need_ranks(COMM, 2)
    g = global_array((2 * SIZE, 3), "int64", seed=7)
    first = COMM.Dup()
    second = None
    try:
        a = mr.DistArray.from_global(g, mr.Mesh({"x": SIZE}, comm=first), "[{x}, {}]")
        all_ok(COMM, same(a.gather(), g), "first communicator")
        first.Free()
        first = None
        second = COMM.Split(0, key=SIZE - 1 - RANK)     # same size, ranks reversed
        mesh = mr.Mesh({"x": SIZE}, comm=second)
        b = mr.DistArray.from_global(g, mesh, "[{x}, {}]").redistribute("[{}, {x}]")
        want = expected(g, mesh, "[{}, {x}]", rank=second.Get_rank())
        all_ok(COMM, same(b.local, want), "second communicator: wrong block")
    finally:
        free_all()
        for c in (first, second):
            if c is not None:
                c.Free()
