"""Elementwise ufuncs and reductions of :class:`~mpiredist.arrays.distarray.DistArray`.

Nothing here moves data except :func:`reduce` (and the reductions' callers
when they reduce).  The rules:

Ufuncs (:func:`array_ufunc`, NumPy's ``__array_ufunc__`` protocol)
    Applied to the local blocks when every DistArray operand has the same
    global shape, mesh and layout; other operands must be scalars (Python
    numbers, NumPy scalars, 0-d arrays).  Operands in different layouts raise
    :class:`LayoutError` naming both: redistribute one of them explicitly,
    nothing is moved behind your back.  A partial layout (sum) allows only
    ``multiply`` by a scalar and ``divide`` by a scalar, the operations that
    commute with the pending reduction; the scalar must be the same on every
    rank.

Reductions (:func:`sum`, :func:`mean`, :func:`min`, :func:`max`)
    Reduce the local block over the given dim(s), like NumPy (the dim
    disappears unless ``keepdims``).  Where a reduced dim is sharded over mesh
    axes A, ranks hold partial results: the returned array has partial axes A
    with op sum/min/max and no communication has happened.  Call
    :func:`reduce` (collective) to combine them; the planner picks
    reduce-scatter or all-reduce for the target layout.  A rank whose block
    along a reduced dim is empty contributes the identity of the op.  Mesh
    axes that only replicate the data are not partial.

Examples (any number of ranks, e.g. ``mpirun -n 4``)::

    a = DistArray.from_global(g, Mesh({"x": 4}), "[{x}, {}]")
    s = ops.sum(a, 0)         # layout [{}] sum{x}: partial sums
    s = ops.reduce(s)         # layout [{}]: np.sum(g, 0) on every rank
    s = ops.reduce(ops.sum(a, 0), "[{x}]")   # reduce-scatter instead
"""

import numbers
import operator

import numpy as np

from ..core.backend import array_module
from ..core.errors import LayoutError, MpiredistError, ShapeError
from ..core.layout import Layout
from .base import DistArrayBase

__all__ = ["OperandError", "array_ufunc", "elementwise", "sum", "mean", "min", "max", "reduce",
           "OPERATORS", "result_layout"]


class OperandError(MpiredistError, ValueError):
    """An operand or keyword that distributed elementwise code cannot honour."""


# Operators a DistArray gets from numpy.lib.mixins.NDArrayOperatorsMixin, all
# of which go through __array_ufunc__.  Left out on purpose: __eq__/__ne__
# (they would make DistArray unhashable; use numpy.equal) and the in-place
# forms (__iadd__ ...), which pass out=: without them ``a += 1`` rebinds
# ``a`` to ``a + 1``.  __matmul__ is no ufunc of the elementwise kind either.
OPERATORS = (
    "__lt__", "__le__", "__gt__", "__ge__",
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
    "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__",
    "__mod__", "__rmod__", "__divmod__", "__rdivmod__", "__pow__", "__rpow__",
    "__lshift__", "__rlshift__", "__rshift__", "__rrshift__",
    "__and__", "__rand__", "__xor__", "__rxor__", "__or__", "__ror__",
    "__neg__", "__pos__", "__abs__", "__invert__",
)

# Ufuncs that commute with a pending sum when the other operand is a scalar:
# (ufunc, positions of the DistArray operand that are allowed).
_LINEAR_WITH_SCALAR = {np.multiply: (0, 1), np.true_divide: (0,)}


def _distarray_type():
    """The base class every DistArray derives from (results keep the operand's class)."""
    return DistArrayBase


def _is_scalar(x):
    if isinstance(x, (numbers.Number, np.generic, bool)):
        return True
    return isinstance(x, np.ndarray) and x.ndim == 0


def _describe(x):
    if isinstance(x, np.ndarray):
        return f"a numpy array of shape {x.shape}"
    return f"an object of type {type(x).__name__}"


# ----------------------------------------------------------------- ufuncs

def array_ufunc(self, ufunc, method, *inputs, **kwargs):
    """Apply ``ufunc`` to the local blocks (NumPy's ``__array_ufunc__``).

    Local: no communication.  Returns a DistArray (a tuple of them for
    ufuncs with several outputs) with the operands' layout, shape and mesh.

    Raises
    ------
    LayoutError
        DistArray operands in different layouts (both are named), or a
        partial operand in anything but a multiplication or division by a
        scalar (sum partials only).
    ShapeError
        DistArray operands of different global shapes or meshes.
    OperandError
        ``out=`` or ``where=`` given; an operand that is an array with
        dimensions (wrap it with ``DistArray.from_global``) or of an unknown
        type; a ufunc method other than ``__call__`` (use
        :func:`sum` / :func:`min` / :func:`max` for reductions).
    """
    DistArray = _distarray_type()
    name = getattr(ufunc, "__name__", str(ufunc))
    if method != "__call__":
        raise OperandError(f"numpy.{name}.{method} is not supported on a DistArray; "
                           "only elementwise calls are (for reductions use "
                           "mpiredist.arrays.ops.sum/min/max/mean)")
    if kwargs.get("out") is not None:
        raise OperandError(f"numpy.{name}(..., out=...) is not supported on a "
                           "DistArray: results are new DistArrays; assign the result")
    if kwargs.get("where", True) is not True:
        raise OperandError(f"numpy.{name}(..., where=...) is not supported on a DistArray")
    kwargs = {k: v for k, v in kwargs.items() if k not in ("out", "where")}

    dist = [(i, x) for i, x in enumerate(inputs) if isinstance(x, DistArray)]
    if not dist:
        raise OperandError(f"numpy.{name}: no operand is a DistArray")
    for i, x in enumerate(inputs):
        if not isinstance(x, DistArray) and not _is_scalar(x):
            if hasattr(x, "__array_ufunc__") and not isinstance(x, np.ndarray) \
                    and x.__array_ufunc__ is not None and not _is_local_type(x):
                return NotImplemented   # let another array type try
            raise OperandError(f"numpy.{name}: operand {i} is {_describe(x)}; only "
                               "DistArrays of the same shape and layout and scalars "
                               "combine elementwise (wrap arrays with "
                               "DistArray.from_global)")
    ref_i, ref = dist[0]
    for i, x in dist[1:]:
        _check_same(name, ref_i, ref, i, x)
    if ref.layout.partial:
        _check_partial_ok(name, ufunc, inputs, dist)

    args = tuple(x.local if isinstance(x, DistArray) else x for x in inputs)
    xp = array_module(ref.local)
    out = ufunc(*args, **kwargs)
    outs = out if ufunc.nout > 1 else (out,)
    # A 0-d block comes back as a scalar: keep blocks arrays.
    wrapped = tuple(type(ref)(xp.asarray(o), ref.shape, ref.layout, ref.mesh) for o in outs)
    return wrapped if ufunc.nout > 1 else wrapped[0]


def elementwise(ufunc, *inputs, **kwargs):
    """Apply ``ufunc`` to DistArrays and scalars: ``ufunc(*inputs)`` (local).

    The same as calling the ufunc directly once ``DistArray.__array_ufunc__``
    is :func:`array_ufunc`; usable without it.

    >>> elementwise(numpy.abs, a)        # doctest: +SKIP
    """
    out = array_ufunc(None, ufunc, "__call__", *inputs, **kwargs)
    if out is NotImplemented:
        raise OperandError(f"numpy.{getattr(ufunc, '__name__', ufunc)}: operands of "
                           f"types {[type(x).__name__ for x in inputs]} do not combine")
    return out


def _is_local_type(x):
    """True for arrays that may be a block (CuPy), still not a valid operand."""
    return hasattr(x, "__cuda_array_interface__")


def _check_same(name, i, a, j, b):
    if a.mesh != b.mesh:
        raise ShapeError(f"numpy.{name}: operand {i} is on mesh {a.mesh}, operand {j} "
                         f"on mesh {b.mesh}")
    if a.shape != b.shape:
        raise ShapeError(f"numpy.{name}: operand {i} has global shape {a.shape}, "
                         f"operand {j} has {b.shape}; DistArrays do not broadcast")
    if a.layout != b.layout:
        raise LayoutError(f"numpy.{name}: operand {i} has layout {a.layout}, operand "
                          f"{j} has layout {b.layout}; redistribute one of them first "
                          f"(e.g. b.redistribute('{a.layout}'))")


def _check_partial_ok(name, ufunc, inputs, dist):
    layout = dist[0][1].layout
    allowed = _LINEAR_WITH_SCALAR.get(ufunc, ())
    ok = (layout.op == "sum" and len(inputs) == 2 and len(dist) == 1
          and dist[0][0] in allowed)
    if not ok:
        raise LayoutError(f"numpy.{name}: operand {dist[0][0]} has partial layout "
                          f"{layout}; partial results only allow multiplication by a "
                          "scalar and division by a scalar (op sum); reduce it first "
                          "with mpiredist.arrays.ops.reduce")


# ------------------------------------------------------------- reductions

def _normalise_axes(axis, ndim, what):
    if axis is None:
        return tuple(range(ndim))
    items = axis if isinstance(axis, tuple) else (axis,)
    out = []
    for a in items:
        try:
            d = operator.index(a)
        except TypeError:
            raise ShapeError(f"{what}: axis must be None, an int or a tuple of ints, "
                             f"found {axis!r}") from None
        if not -ndim <= d < ndim:
            raise ShapeError(f"{what}: axis {d} is out of range for an array of "
                             f"{ndim} dimension(s)")
        out.append(d % ndim)
    if len(set(out)) != len(out):
        raise ShapeError(f"{what}: axis {axis!r} repeats a dim")
    return tuple(sorted(out))


def result_layout(layout, dims, op, keepdims=False):
    """Layout after reducing ``dims`` of ``layout`` with ``op`` (pure).

    The axes that sharded ``dims`` become partial axes (after any partial
    axes ``layout`` already has, which must use the same ``op``).

    >>> str(result_layout(Layout.parse("[{x}, {y}]"), (0,), "sum"))
    '[{y}] sum{x}'
    """
    layout = Layout.parse(layout)
    new = tuple(a for d in dims for a in layout.dims[d])
    if layout.partial and new and layout.op != op:
        raise LayoutError(f"layout {layout} holds partial {layout.op} results; a {op} "
                          "over a sharded dim cannot be combined with them; reduce first")
    if layout.partial and not new and layout.op != op:
        raise LayoutError(f"layout {layout} holds partial {layout.op} results, which a "
                          f"{op} does not commute with; reduce first")
    kept = tuple(() if d in dims else g for d, g in enumerate(layout.dims)
                 if keepdims or d not in dims)
    partial = layout.partial + new
    return Layout(kept, partial, op if partial else "sum")


def _result_shape(shape, dims, keepdims):
    return tuple(1 if d in dims else n for d, n in enumerate(shape) if keepdims or d not in dims)


def _identity(op, dtype):
    dtype = np.dtype(dtype)
    if op == "sum":
        return 0
    big = op == "min"
    if dtype.kind == "b":
        return big
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.max if big else info.min
    if dtype.kind == "f":
        return np.inf if big else -np.inf
    if dtype.kind == "M" or dtype.kind == "m":
        raise ShapeError(f"{op} over a sharded dim is not supported for dtype {dtype}")
    raise ShapeError(f"{op} is not defined for dtype {dtype} across ranks")


def _reduce(a, axis, op, keepdims, dtype, what):
    DistArray = _distarray_type()
    if not isinstance(a, DistArray):
        raise OperandError(f"{what}: expected a DistArray, found {type(a).__name__}")
    dims = _normalise_axes(axis, a.ndim, what)
    layout = result_layout(a.layout, dims, op, keepdims)
    shape = _result_shape(a.shape, dims, keepdims)
    xp = array_module(a.local)
    local = a.local
    sharded = any(a.layout.dims[d] for d in dims)
    if op == "sum":
        out = xp.sum(local, axis=dims, dtype=dtype, keepdims=keepdims)
    else:
        if sharded and np.dtype(local.dtype).kind == "c":
            raise ShapeError(f"{what}: {op} of complex dtype {local.dtype} over a "
                             f"sharded dim (layout {a.layout}) has no MPI reduction")
        fn = xp.min if op == "min" else xp.max
        if any(local.shape[d] == 0 for d in dims):
            lshape = _result_shape(local.shape, dims, keepdims)
            out = xp.full(lshape, _identity(op, local.dtype), dtype=local.dtype)
        else:
            out = fn(local, axis=dims, keepdims=keepdims)
    out = xp.asarray(out)   # 0-d results come back as scalars
    return type(a)(out, shape, layout, a.mesh)


def sum(a, axis=None, dtype=None, out=None, keepdims=False):
    """Sum over ``axis`` (int, tuple or None: all); partial over sharded dims.

    Local: the result holds partial sums over the mesh axes that sharded the
    reduced dims; pass it to :func:`reduce`.  ``dtype`` as in ``numpy.sum``
    (its default promotes small integers, identically on every rank).
    """
    _no_out(out, "sum")
    return _reduce(a, axis, "sum", keepdims, dtype, "sum")


def min(a, axis=None, out=None, keepdims=False):
    """Minimum over ``axis``; partial (op min) over sharded dims (local).

    Ranks with an empty block along a reduced dim contribute the identity
    (``+inf``, or the dtype's maximum for integers).
    """
    _no_out(out, "min")
    return _reduce(a, axis, "min", keepdims, None, "min")


def max(a, axis=None, out=None, keepdims=False):
    """Maximum over ``axis``; partial (op max) over sharded dims (local)."""
    _no_out(out, "max")
    return _reduce(a, axis, "max", keepdims, None, "max")


def mean(a, axis=None, dtype=None, out=None, keepdims=False):
    """Mean over ``axis``: partial sums already divided by the global count (local).

    Dividing before the pending sum is exact in real arithmetic (the sum is
    linear), so ``reduce(mean(a, d))`` is the mean.  The dtype follows
    ``numpy.mean``: float64 for integer and bool input.
    """
    _no_out(out, "mean")
    DistArray = _distarray_type()
    if not isinstance(a, DistArray):
        raise OperandError(f"mean: expected a DistArray, found {type(a).__name__}")
    dims = _normalise_axes(axis, a.ndim, "mean")
    if dtype is None:
        kind = np.dtype(a.dtype).kind
        dtype = np.float64 if kind in "biu" else a.dtype
    count = 1
    for d in dims:
        count *= a.shape[d]
    s = _reduce(a, dims, "sum", keepdims, dtype, "mean")
    xp = array_module(s.local)
    with np.errstate(invalid="ignore", divide="ignore"):   # count 0: nan, as numpy
        local = xp.true_divide(s.local, count, dtype=s.local.dtype)
    return type(s)(xp.asarray(local), s.shape, s.layout, s.mesh)


def _no_out(out, what):
    if out is not None:
        raise OperandError(f"{what}(..., out=...) is not supported on a DistArray; "
                           "the result is a new DistArray")


def reduce(a, dst=None, **kwargs):
    """Combine ``a``'s partial results into layout ``dst`` (collective).

    Parameters
    ----------
    a : DistArray
        Usually the result of :func:`sum`, :func:`min`, :func:`max` or
        :func:`mean`.
    dst : Layout or str, optional
        Target layout without (or with fewer) partial axes.  Default: the
        same dims, no partial axes (an all-reduce).  Sharding a dim over the
        partial axes, e.g. ``"[{x}]"`` for ``"[{}] sum{x}"``, makes it a
        reduce-scatter.
    **kwargs
        Passed to :meth:`DistArray.redistribute` (``donate``, ``strategy``,
        ``records``).
    """
    DistArray = _distarray_type()
    if not isinstance(a, DistArray):
        raise OperandError(f"reduce: expected a DistArray, found {type(a).__name__}")
    dst = a.layout.without_partial() if dst is None else Layout.parse(dst)
    if not (a.layout.partial and not dst.partial and a.layout.op != dst.op):
        return a.redistribute(dst, **kwargs)
    # Work around the planner comparing expanded layouts op included even
    # without partial axes ("[{}] max{x}" -> "[{}]" fails): ask for the
    # target with the source's op, hand back the plain layout.
    out = a.redistribute(Layout(dst.dims, (), a.layout.op), **kwargs)
    return type(out)(out.local, out.shape, dst, out.mesh)

