"""HeAT-style analytics under MPI, checked against numpy: broadcasting and
mixed layouts, transpose, astype/copy, var/std, argmax/argmin.

    timeout 300 mpiexec -n 4 python -m pytest -q --with-mpi tests/mpi/test_analytics_ops.py

Shapes are uneven so that some ranks hold empty blocks at 3, 4 and 8 ranks.
Every check is agreed across ranks (``helpers.all_ok``).
"""

import numpy as np
import pytest
from analytics_data import close, data
from analytics_data import meshes as _meshes
from helpers import all_ok, need_ranks

from mpiredist import Layout, Mesh, ops
from mpiredist.arrays.distarray import DistArray
from mpiredist.core.errors import ShapeError

pytestmark = pytest.mark.mpi


def meshes(size):
    return _meshes(size, ("[{x}, {y}]", "[{y,x}, {}]", "[{}, {x}]"))


def test_mixed_layouts_pick_the_cheaper_move(comm):
    for mesh, layouts in meshes(comm.size):
        for la in layouts:
            for lb in layouts:
                for dtype in ("float32", "int64"):
                    g, h = data((9, 5), dtype, 1), data((9, 5), dtype, 2)
                    a = DistArray.from_global(g, mesh, la)
                    b = DistArray.from_global(h, mesh, lb)
                    c = a * b + a
                    all_ok(comm, close(c.gather(), g * h + g, exact=dtype == "int64", tol=1e-5),
                           f"{la} * {lb} {dtype}")
                    all_ok(comm, c.layout in (Layout.parse(la), Layout.parse(lb)), str(c.layout))
    # replicated against sharded: slicing the replicated one is free
    mesh = Mesh({"x": comm.size})
    a = DistArray.from_global(data((7, 3)), mesh, "[{}, {}]")
    b = DistArray.from_global(data((7, 3), seed=3), mesh, "[{x}, {}]")
    all_ok(comm, comm.size == 1 or (a + b).layout == Layout.parse("[{x}, {}]"), "cheaper side")


def test_broadcasting_distarrays_numpy_and_scalars(comm):
    for mesh, layouts in meshes(comm.size):
        for la in layouts:
            g = data((6, 5), "float64", 4)
            a = DistArray.from_global(g, mesh, la)
            row = DistArray.from_global(data((5,), seed=5), mesh, "[{x}]")
            col = DistArray.from_global(data((6, 1), seed=6), mesh, "[{x}, {}]")
            c = a - row * col + 2.5
            want = g - data((5,), seed=5) * data((6, 1), seed=6) + 2.5
            all_ok(comm, close(c.gather(), want), f"broadcast {la}")
            v = data((5,), seed=7)
            all_ok(comm, close((a * v).gather(), g * v), f"numpy row {la}")
            all_ok(comm, close((v / (a + 10)).gather(), v / (g + 10)), f"numpy left {la}")
            m = data((6, 1), seed=8)
            all_ok(comm, close(np.add(m, a).gather(), m + g), f"numpy col {la}")
            # a reduction's result (partial) broadcasts: centring
            z = a - a.mean(0)
            all_ok(comm, close(z.gather(), g - g.mean(0)), f"centre {la}")
            s = a.sum()
            all_ok(comm, close((a / s).gather(), g / g.sum()), f"0-d partial {la}")
            # complex
            gc = data((6, 5), "complex128", 9)
            ac = DistArray.from_global(gc, mesh, la)
            all_ok(comm, close((ac * a).gather(), gc * g), f"complex {la}")


def test_partials_reduced_where_values_are_needed(comm):
    mesh = Mesh({"x": comm.size})
    g = data((7, 3))
    a = DistArray.from_global(g, mesh, "[{x}, {}]")
    s = a.sum(0)
    kept = -(s + s) * 2.0
    all_ok(comm, kept.layout.partial == ("x",) or comm.size == 1 and True, str(kept.layout))
    all_ok(comm, close(ops.reduce(kept).local, -4 * g.sum(0)), "linear stays partial")
    for f, ref in ((lambda t: t + 1, lambda t: t + 1), (lambda t: t * t, lambda t: t * t),
                   (np.sin, np.sin), (lambda t: 1 / t, lambda t: 1 / t)):
        all_ok(comm, close(f(s).gather(), ref(g.sum(0))), "reduced first")
    m = a.max(0)
    all_ok(comm, close((m * 2).gather(), g.max(0) * 2), "max partial")


def test_broadcast_errors_on_every_rank(comm):
    mesh = Mesh({"x": comm.size})
    a = DistArray.from_global(data((6, 4)), mesh, "[{x}, {}]")
    b = DistArray.from_global(data((6, 5)), mesh, "[{x}, {}]")
    with pytest.raises(ShapeError, match=r"\(6, 4\).*\(6, 5\)"):
        a + b
    with pytest.raises(ShapeError, match="broadcast"):
        a * np.ones(3)
    # still usable afterwards: nobody is left in a collective
    all_ok(comm, close((a + a).gather(), 2 * a.gather()), "after errors")


def test_transpose_is_local(comm):
    for mesh, layouts in meshes(comm.size):
        for la in layouts:
            g = data((2, 5, 3), seed=10)
            lay = Layout.parse(la)
            a = DistArray.from_global(g, mesh, Layout(lay.dims + ((),)))
            t = a.transpose(2, 0, 1)
            all_ok(comm, t.shape == (3, 2, 5) and close(t.gather(), g.transpose(2, 0, 1)),
                   f"transpose {la}")
            all_ok(comm, close(a.T.gather(), g.T), f".T {la}")
            all_ok(comm, np.shares_memory(t.local, a.local) or t.local.size == 0, "a view")
    with pytest.raises(ShapeError, match="permutation"):
        a.transpose(0, 0, 1)


def test_astype_copy(comm):
    mesh = Mesh({"x": comm.size})
    g = data((5, 4), seed=11) * 10
    a = DistArray.from_global(g, mesh, "[{x}, {}]")
    i = a.astype(np.int32)
    all_ok(comm, close(i.gather(), g.astype(np.int32), exact=True), "astype")
    c = a.copy()
    c.local[...] = 0
    all_ok(comm, close(a.gather(), g), "copy is independent")
    s = a.sum(0).astype(np.int64)
    all_ok(comm, close(s.gather(), g.sum(0).astype(np.int64), exact=True), "astype partial")


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "complex128"])
def test_var_std_match_numpy(comm, dtype):
    for mesh, layouts in meshes(comm.size):
        for la in layouts:
            g = data((7, 4), dtype, 12) + (1000 if dtype.startswith("float64") else 0)
            a = DistArray.from_global(g, mesh, la)
            tol = 1e-4 if dtype == "float32" else 1e-9
            for axis in (0, 1, None):
                for ddof in (0, 1):
                    v = a.var(axis, ddof=ddof)
                    all_ok(comm, close(v.gather(), np.var(g, axis, ddof=ddof), tol=tol),
                           f"var {dtype} {la} axis={axis} ddof={ddof}")
                s = np.std(a, axis=axis)
                all_ok(comm, close(s.gather(), np.std(g, axis), tol=tol),
                       f"std {dtype} {la} axis={axis}")


def test_var_is_stable(comm):
    mesh = Mesh({"x": comm.size})
    g = 1e9 + np.arange(10, dtype=np.float64) % 3
    a = DistArray.from_global(g, mesh, "[{x}]")
    all_ok(comm, close(a.var().local, g.var(), tol=1e-12), "two-pass var")


@pytest.mark.parametrize("dtype", ["float64", "int16", "float32"])
def test_argmax_argmin_first_occurrence(comm, dtype):
    for mesh, layouts in meshes(comm.size):
        for la in layouts:
            g = (data((7, 5), dtype, 13) % 3).astype(dtype)      # many ties
            a = DistArray.from_global(g, mesh, la)
            for axis in (0, 1, None):
                for name in ("argmax", "argmin"):
                    r = getattr(a, name)(axis)
                    all_ok(comm, close(r.gather(), getattr(np, name)(g, axis), exact=True),
                           f"{name} {dtype} {la} axis={axis}")
    if dtype == "float64":
        g[3, 2] = np.nan
        g[5, 1] = np.nan
        a = DistArray.from_global(g, Mesh({"x": comm.size}), "[{x}, {}]")
        for axis in (0, None):
            all_ok(comm, close(a.argmax(axis).gather(), np.argmax(g, axis), exact=True), "nan")
            all_ok(comm, close(np.argmin(a, axis=axis).gather(), np.argmin(g, axis),
                               exact=True), "nan min")
        e = DistArray.from_global(np.zeros((0, 3)), Mesh({"x": comm.size}), "[{x}, {}]")
        with pytest.raises(ShapeError, match="empty"):
            e.argmax(0)


def test_partial_sum_stays_cheap_with_empty_blocks(comm):
    need_ranks(comm, 3)
    mesh = Mesh({"x": comm.size})
    g = data((2, 3))
    a = DistArray.from_global(g, mesh, "[{x}, {}]")
    all_ok(comm, close((a - a.mean(0)).var(0).gather(), g.var(0)), "empty blocks")
