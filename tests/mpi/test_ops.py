"""mpiredist.arrays.ops and mpiredist.arrays.heat under MPI: any number of ranks.

    timeout 300 mpiexec -n 4 python -m pytest -q --with-mpi tests/mpi/test_ops.py

Every result is gathered and compared with numpy on the global array, on
every rank, through ``helpers.all_ok`` (all ranks fail together).  Shapes
are uneven so that some ranks hold empty blocks at 3 and 4 ranks.
"""

import numpy as np
import pytest
from helpers import all_ok, need_ranks

from mpiredist import Layout, Mesh, ops
from mpiredist.arrays.distarray import DistArray
from mpiredist.core.errors import LayoutError, MeshError, ShapeError
from mpiredist.arrays.heat import layout_for_split, resplit, resplit_, split
from mpiredist.arrays.ops import OperandError

pytestmark = pytest.mark.mpi


def meshes(size):
    """Meshes of ``size`` devices with the layouts to try on each."""
    out = [(Mesh({"x": size}), ["[{x}, {}]", "[{}, {x}]", "[{}, {}]"])]
    if size % 2 == 0 and size > 2:
        out.append((Mesh({"x": 2, "y": size // 2}),
                    ["[{x}, {y}]", "[{x,y}, {}]", "[{x}, {}]", "[{}, {y,x}]"]))
    if size > 1:
        out.append((Mesh({"x": 1, "y": size}), ["[{y}, {x}]"]))
    return out


SHAPES = [(10, 7), (3, 5), (1, 6)]


def data(shape, dtype="float64", seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-50, 50, size=shape).astype(dtype)
    if np.dtype(dtype).kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.standard_normal(shape).astype(dtype)


def close(actual, expected, exact=False):
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return False
    if exact:
        return bool(np.array_equal(actual, expected))
    return bool(np.allclose(actual, expected, rtol=1e-12, atol=1e-12, equal_nan=True))


def cases(comm):
    for mesh, layouts in meshes(comm.size):
        for layout in layouts:
            for shape in SHAPES:
                yield mesh, Layout.parse(layout), shape


# ------------------------------------------------------------------ ufuncs

def test_elementwise_matches_numpy(comm):
    for mesh, layout, shape in cases(comm):
        g, h = data(shape, seed=1), data(shape, seed=2)
        a = DistArray.from_global(g, mesh, layout)
        b = DistArray.from_global(h, mesh, layout)
        c = np.sin(a) * 2.0 + b / 3 - np.float64(1.5) ** a
        what = f"{layout} {shape} on {mesh}"
        all_ok(comm, c.layout == layout and c.shape == shape and c.mesh == mesh, what)
        all_ok(comm, close(c.gather(), np.sin(g) * 2.0 + h / 3 - 1.5 ** g), what)
        lt = a < b
        all_ok(comm, close(lt.gather(), g < h, exact=True), f"less, {what}")
        q, r = divmod(a, np.array(0.7))
        all_ok(comm, close(q.gather(), g // 0.7) and close(r.gather(), g % 0.7),
               f"divmod, {what}")
        neg = -abs(a)
        all_ok(comm, close(neg.gather(), -np.abs(g)), f"neg abs, {what}")
        c = a
        c += 1      # no __iadd__: rebinds c to c + 1, a is untouched
        all_ok(comm, close(c.gather(), g + 1) and close(a.gather(), g), f"+=, {what}")


def test_elementwise_keeps_int_dtypes_and_blocks_untouched(comm):
    mesh = Mesh({"x": comm.size})
    g = data((9, 4), "int32")
    a = DistArray.from_global(g, mesh, "[{x}, {}]")
    before = a.local.copy()
    c = (a + 1) * np.int32(3)
    all_ok(comm, close(c.gather(), (g + 1) * np.int32(3), exact=True), "int ufuncs")
    all_ok(comm, np.array_equal(a.local, before), "operand block was modified")
    e = ops.elementwise(np.add, a, 1)
    all_ok(comm, close(e.gather(), g + 1, exact=True), "ops.elementwise")


def test_different_layouts_move_one_operand(comm):
    need_ranks(comm, 2)
    mesh = Mesh({"x": comm.size})
    g = data((6, 4))
    a = DistArray.from_global(g, mesh, "[{x}, {}]")
    b = DistArray.from_global(g, mesh, "[{}, {x}]")
    c = np.add(a, b)
    all_ok(comm, c.layout in (a.layout, b.layout), f"result layout {c.layout}")
    all_ok(comm, close(c.gather(), g + g), "a + b in different layouts")


def test_operand_errors(comm):
    mesh = Mesh({"x": comm.size})
    a = DistArray.from_global(data((6, 4)), mesh, "[{x}, {}]")
    b = DistArray.from_global(data((6, 5)), mesh, "[{x}, {}]")
    with pytest.raises(ShapeError, match=r"\(6, 4\).*\(6, 5\)"):
        a + b
    with pytest.raises(OperandError, match="out="):
        np.add(a, 1, out=a)
    with pytest.raises(ShapeError, match=r"\(6, 4\).*\(5,\)"):
        a + np.ones(5)
    with pytest.raises(OperandError, match="reduce"):
        np.add.reduce(a)
    with pytest.raises(OperandError, match="where="):
        np.add(a, 1, where=False)
    with pytest.raises(OperandError, match="no operand is a DistArray"):
        ops.elementwise(np.add, 1, 2)


def test_partial_operands(comm):
    mesh = Mesh({"x": comm.size})
    g = data((7, 3))
    a = DistArray.from_global(g, mesh, "[{x}, {}]")
    s = ops.sum(a, 0)
    scaled = 2.0 * (s * 3) / 4
    all_ok(comm, scaled.layout == Layout.parse("[{}] sum{x}"), str(scaled.layout))
    all_ok(comm, close(ops.reduce(scaled).local, 1.5 * g.sum(0)), "scaled partial sum")
    total = g.sum(0)
    needs_values = ((lambda: s + 1, total + 1), (lambda: s * s, total * total),
                    (lambda: 1 / s, 1 / total), (lambda: np.sin(s), np.sin(total)))
    for fn, want in needs_values:           # reduced first, then the ufunc
        got = fn()
        all_ok(comm, not got.layout.partial and close(got.gather(), want),
               f"partial operand reduced first: {got.layout}")
    m = ops.max(a, 0)
    all_ok(comm, close((m * 2).gather(), 2 * g.max(0)), "a max partial is reduced first")


# -------------------------------------------------------------- reductions

REFERENCE = {"sum": np.sum, "mean": np.mean, "min": np.min, "max": np.max}


def expected_layout(layout, dims, op):
    new = tuple(a for d in dims for a in layout.dims[d])
    kept = tuple(g for d, g in enumerate(layout.dims) if d not in dims)
    return Layout(kept, new, op if new else "sum")


def test_reductions_match_numpy(comm):
    dtypes = {(10, 7): "float64", (3, 5): "int32", (1, 6): "float64"}
    for mesh, layout, shape in cases(comm):
        dtype = dtypes[shape]
        g = data(shape, dtype, seed=3)
        a = DistArray.from_global(g, mesh, layout)
        for axis in (0, -1, None) if dtype == "float64" else (0, (0, 1)):
            dims = (0, 1) if axis is None or axis == (0, 1) else (axis % 2,)
            for name, ref in REFERENCE.items():
                what = f"{name}(axis={axis}) of {dtype} {shape} {layout} on {mesh}"
                r = getattr(ops, name)(a, axis)
                op = "sum" if name == "mean" else name
                all_ok(comm, r.layout == expected_layout(layout, dims, op),
                       f"{what}: layout {r.layout}")
                full = ops.reduce(r)
                all_ok(comm, full.layout == r.layout.without_partial(), what)
                exact = dtype == "int32" and name != "mean"
                all_ok(comm, close(full.gather(), ref(g, axis=axis), exact),
                       f"{what}: values")


def test_empty_blocks_contribute_the_identity(comm):
    # 2 rows on up to 4 ranks: ranks >= 2 hold nothing; data all negative for
    # max and all positive for min, so a wrong identity (0) shows.
    mesh = Mesh({"x": comm.size})
    for dtype in ("float64", "int64", "int8", "float32"):
        g = np.arange(1, 7, dtype=dtype).reshape(2, 3)
        for name, values in (("max", -g), ("min", g), ("sum", g), ("mean", g)):
            a = DistArray.from_global(values, mesh, "[{x}, {}]")
            r = ops.reduce(getattr(ops, name)(a, 0))
            want = REFERENCE[name](values, axis=0)
            all_ok(comm, close(r.local, want), f"{name} of {dtype} with empty blocks")
            r = ops.reduce(getattr(ops, name)(a))       # axis=None: a 0-d result
            all_ok(comm, r.shape == () and close(r.local, REFERENCE[name](values)),
                   f"{name} over all of {dtype} with empty blocks")


def test_bool_min_max(comm):
    mesh = Mesh({"x": comm.size})
    g = np.array([[True, False, True], [True, True, True]])
    a = DistArray.from_global(g, mesh, "[{x}, {}]")
    for name in ("min", "max", "sum"):
        r = ops.reduce(getattr(ops, name)(a, 0))
        all_ok(comm, close(r.local, REFERENCE[name](g, axis=0), exact=True), name)


def test_reduce_scatter_target_and_keepdims(comm):
    mesh = Mesh({"x": comm.size})
    g = data((11, 5), seed=4)
    a = DistArray.from_global(g, mesh, "[{x}, {}]")
    records = []
    s = ops.reduce(ops.sum(a, 0), "[{x}]", records=records)
    all_ok(comm, s.layout == Layout.parse("[{x}]"), str(s.layout))
    all_ok(comm, close(s.gather(), g.sum(0)), "reduce-scatter values")
    all_ok(comm, comm.size == 1 or [r.op for r in records] == ["reduce_scatter"],
           f"steps {[r.op for r in records]}")
    k = ops.max(a, 0, keepdims=True)
    all_ok(comm, k.shape == (1, 5) and k.layout == Layout.parse("[{}, {}] max{x}"),
           f"keepdims: {k.shape} {k.layout}")
    all_ok(comm, close(ops.reduce(k).local, g.max(0, keepdims=True)), "keepdims values")


def test_numpy_functions_dispatch_to_methods(comm):
    mesh = Mesh({"x": comm.size})
    g = data((5, 4), seed=5)
    a = DistArray.from_global(g, mesh, "[{x}, {}]")
    all_ok(comm, close(ops.reduce(np.sum(a, axis=0)).local, g.sum(0)), "np.sum")
    all_ok(comm, close(ops.reduce(np.mean(a)).local, g.mean()), "np.mean")
    all_ok(comm, close(ops.reduce(np.max(a, axis=1)).gather(), g.max(1)), "np.max")


def test_reduction_errors(comm):
    mesh = Mesh({"x": comm.size})
    a = DistArray.from_global(data((5, 4)), mesh, "[{x}, {}]")
    with pytest.raises(ShapeError, match="out of range"):
        ops.sum(a, 2)
    with pytest.raises(ShapeError, match="repeats"):
        ops.sum(a, (0, -2))
    with pytest.raises(OperandError, match="out="):
        ops.sum(a, 0, out=np.empty(4))
    with pytest.raises(LayoutError, match="partial"):
        ops.max(ops.sum(a, 0), 0)
    # the same op combines: a sum of partial sums stays partial
    s = ops.sum(ops.sum(a, 1), 0)
    all_ok(comm, close(ops.reduce(s).local, a.gather().sum()), "sum of partial sum")


def test_partial_axes_exclude_replicating_axes(comm):
    need_ranks(comm, 4)
    if comm.size % 2:
        pytest.skip("needs an even number of ranks for a 2 x n mesh")
    mesh = Mesh({"x": 2, "y": comm.size // 2})
    g = data((6, 5))
    a = DistArray.from_global(g, mesh, "[{x}, {}]")
    s = ops.sum(a, 0)
    all_ok(comm, s.layout == Layout.parse("[{}] sum{x}"), str(s.layout))
    all_ok(comm, close(ops.reduce(s).local, g.sum(0)), "values")
    t = ops.sum(a, 1)
    all_ok(comm, t.layout == Layout.parse("[{x}]"), str(t.layout))


# -------------------------------------------------------------------- heat

def test_resplit_matches_from_global(comm):
    mesh = Mesh({"x": comm.size})
    g = data((7, 5, 3), seed=6)
    a = DistArray.from_global(g, mesh, layout_for_split(0, 3, "x"))
    for axis in (1, -1, None, 0):
        b = resplit(a, axis)
        want = DistArray.from_global(g, mesh, layout_for_split(axis, 3, "x"))
        all_ok(comm, split(b) == (None if axis is None else axis % 3), str(b.layout))
        all_ok(comm, close(b.local, want.local, exact=True), f"resplit({axis})")
    all_ok(comm, split(a) == 0 and close(a.gather(), g, exact=True), "source kept")
    c = resplit_(a, 2)
    all_ok(comm, c is a and split(a) == 2, "resplit_ in place")
    all_ok(comm, close(a.gather(), g, exact=True), "resplit_ values")


def test_resplit_reduces_partials(comm):
    mesh = Mesh({"x": comm.size})
    g = data((5, 6), seed=7)
    a = DistArray.from_global(g, mesh, "[{x}, {}]")
    for name in ("sum", "max", "min"):
        r = resplit(getattr(ops, name)(a, 0), 0)
        all_ok(comm, split(r) == 0 and close(r.gather(), REFERENCE[name](g, 0)),
               f"resplit of partial {name}")
        p = getattr(ops, name)(a, 0)
        q = resplit_(p, None)
        all_ok(comm, q is p and split(p) is None and close(p.local, REFERENCE[name](g, 0)),
               f"resplit_ of partial {name}")
        again = resplit(p, 0)       # the reduced array redistributes as usual
        all_ok(comm, close(again.gather(), REFERENCE[name](g, 0)), f"after {name}")


def test_resplit_needs_1d_mesh(comm):
    need_ranks(comm, 4)
    if comm.size % 2:
        pytest.skip("needs an even number of ranks for a 2 x n mesh")
    mesh = Mesh({"x": 2, "y": comm.size // 2})
    a = DistArray.from_global(data((4, 4)), mesh, "[{x}, {}]")
    with pytest.raises(MeshError, match="1-D mesh"):
        resplit(a, 1)
