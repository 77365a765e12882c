"""HeAT-style analytics under MPI, checked against numpy: matmul, basic
indexing, concatenate, reshape.

    timeout 300 mpiexec -n 4 python -m pytest -q --with-mpi tests/mpi/test_analytics_shape.py
"""

import numpy as np
import pytest
from analytics_data import close, meshes
from analytics_data import data as _data
from helpers import all_ok

from mpiredist import Layout, Mesh
from mpiredist.arrays.distarray import DistArray, concatenate, matmul
from mpiredist.arrays.indexing import IndexingError
from mpiredist.core.errors import ShapeError

pytestmark = pytest.mark.mpi


def data(shape, dtype="float64", seed=0):
    return _data(shape, dtype, seed, bound=9)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "complex128"])
def test_matmul_matches_numpy(comm, dtype):
    tol = 1e-4 if dtype == "float32" else 1e-9
    for mesh, layouts in meshes(comm.size):
        for la in layouts:
            for lb in layouts[:2]:
                g, h = data((7, 5), dtype, 1), data((5, 3), dtype, 2)
                a = DistArray.from_global(g, mesh, la)
                b = DistArray.from_global(h, mesh, lb)
                c = a @ b
                all_ok(comm, close(c.gather(), g @ h, exact=dtype == "int64", tol=tol),
                       f"{dtype} {la} @ {lb}: layout {c.layout}")
                all_ok(comm, not c.layout.partial, str(c.layout))
    mesh = Mesh({"x": comm.size})
    a = DistArray.from_global(data((7, 5), dtype, 1), mesh, "[{}, {x}]")
    b = DistArray.from_global(data((5, 3), dtype, 2), mesh, "[{x}, {}]")
    c = matmul(a, b, layout="[{}, {x}]")
    all_ok(comm, c.layout == Layout.parse("[{}, {x}]"), str(c.layout))
    all_ok(comm, close(c.gather(), data((7, 5), dtype, 1) @ data((5, 3), dtype, 2),
                       exact=dtype == "int64", tol=tol), "target layout")


def test_matmul_gram_vector_batch_and_errors(comm):
    mesh = Mesh({"x": comm.size})
    g = data((11, 4), seed=3)
    z = DistArray.from_global(g, mesh, "[{x}, {}]")
    cov = z.T @ z
    all_ok(comm, close(cov.gather(), g.T @ g), f"z.T @ z: {cov.layout}")
    v = DistArray.from_global(data((4,), seed=4), mesh, "[{x}]")
    all_ok(comm, close((z @ v).gather(), g @ data((4,), seed=4)), "matrix @ vector")
    w = DistArray.from_global(data((11,), seed=5), mesh, "[{}]")
    all_ok(comm, close((w @ z).gather(), data((11,), seed=5) @ g), "vector @ matrix")
    gb, hb = data((3, 4, 5), seed=6), data((3, 5, 2), seed=7)
    ab = DistArray.from_global(gb, mesh, "[{x}, {}, {}]")
    bb = DistArray.from_global(hb, mesh, "[{}, {x}, {}]")
    all_ok(comm, close((ab @ bb).gather(), gb @ hb), "batched")
    m = data((4, 2), seed=8)
    all_ok(comm, close((z @ m).gather(), g @ m), "numpy operand of @")
    all_ok(comm, close(np.matmul(z, z.T).gather(), g @ g.T), "np.matmul")
    bad = DistArray.from_global(data((5, 4)), mesh, "[{x}, {}]")
    with pytest.raises(ShapeError, match="contracting"):
        z @ bad
    all_ok(comm, True, "after error")


def test_getitem_matches_numpy(comm):
    keys = [(2,), (-1, 1), (slice(1, 6),), (slice(None), slice(1, 3)), (slice(2, 9, 3), 0),
            (Ellipsis, 1), (None, slice(3, 4), Ellipsis), (slice(None), None, -2),
            (slice(8, 1, -2),), (slice(5, 5),), ()]
    for mesh, layouts in meshes(comm.size):
        for la in layouts:
            for dtype in ("float64", "int32"):
                g = data((9, 4), dtype, 8)
                a = DistArray.from_global(g, mesh, la)
                for key in keys:
                    r = a[key]
                    all_ok(comm, close(r.gather(), g[key], exact=True),
                           f"{la} {dtype} key {key}: {r.shape} {r.layout}")
    a = DistArray.from_global(data((9, 4)), Mesh({"x": comm.size}), "[{x}, {}]")
    all_ok(comm, a[1:7].layout == Layout.parse("[{x}, {}]"), "keeps sharding")
    all_ok(comm, a[:, 1:3].layout == a.layout, "local slice")
    s = a.sum(1)[2:5]
    all_ok(comm, close(s.gather(), a.gather().sum(1)[2:5]), "partial sliced")
    for bad in ((9,), (0, 0, 0), (Ellipsis, Ellipsis), ([1, 2],)):
        with pytest.raises(IndexingError):
            a[bad]
    with pytest.raises(IndexError):
        a[-10]
    all_ok(comm, True, "after errors")


def test_concatenate_matches_numpy(comm):
    for mesh, layouts in meshes(comm.size):
        for la in layouts:
            parts = [data((n, 3), seed=n) for n in (4, 1, 6)]
            arrs = [DistArray.from_global(p, mesh, la) for p in parts]
            for axis in (0, 1):
                ps = parts if axis == 0 else [p.T.copy() for p in parts]
                ars = arrs if axis == 0 else [a.T for a in arrs]
                r = concatenate(ars, axis)
                all_ok(comm, close(r.gather(), np.concatenate(ps, axis)),
                       f"concatenate {la} axis {axis}: {r.layout}")
            r = concatenate(arrs, 0, layout="[{}, {x}]")
            all_ok(comm, close(r.gather(), np.concatenate(parts)), "target layout")
    mesh = Mesh({"x": comm.size})
    v = [DistArray.from_global(np.arange(n, dtype=np.int32), mesh, "[{x}]") for n in (3, 5)]
    all_ok(comm, close(concatenate(v).gather(), np.concatenate([np.arange(3), np.arange(5)])
                       .astype(np.int32), exact=True), "1-d")
    with pytest.raises(ShapeError, match="must match"):
        concatenate([arrs[0], arrs[0].T])


def test_reshape_matches_numpy(comm):
    cases = [((6, 4), (6, 2, 2)), ((6, 4), (24,)), ((6, 4), (-1, 3)), ((4, 3, 2), (4, 6)),
             ((5, 6), (3, 10)), ((8, 3), (2, 12))]
    for mesh, layouts in meshes(comm.size):
        for la in layouts:
            for src, dst in cases:
                g = data(src, "int64", 9)
                lay = Layout.parse(la)
                lay = Layout(tuple(lay.dims) + ((),) * (len(src) - 2))
                a = DistArray.from_global(g, mesh, lay)
                r = a.reshape(dst)
                all_ok(comm, close(r.gather(), g.reshape(dst), exact=True),
                       f"reshape {src} {lay} -> {dst}: {r.layout}")
    a = DistArray.from_global(data((6, 4)), Mesh({"x": comm.size}), "[{x}, {}]")
    r = a.reshape((4, 6), layout="[{}, {x}]")
    all_ok(comm, r.layout == Layout.parse("[{}, {x}]") and
           close(r.gather(), a.gather().reshape(4, 6)), "target layout")
    with pytest.raises(ShapeError, match="reshape"):
        a.reshape(5, 5)
