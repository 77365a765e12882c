"""Ufuncs between DistArrays of different layouts and shapes: NumPy broadcasting.

:func:`array_ufunc` is ``DistArray.__array_ufunc__``.  It extends the local
:func:`mpiredist.arrays.ops.array_ufunc` (same shape, same layout, scalars)
with the rules of the issue "HeAT-style analytics":

Broadcasting
    Global shapes broadcast as in NumPy (``numpy.broadcast_shapes``); a
    lower-dimensional DistArray (e.g. a reduction's result) or one with
    length-1 dims broadcasts.  A numpy array operand must be the same on
    every rank; each rank slices it to its block (no communication).

Mixed layouts
    Every operand must end in a layout *compatible* with one result layout
    ``L``: its dims of full length take ``L``'s axes, its dims of length 1
    (or missing) are replicated.  The candidates for ``L`` are the
    operands' own layouts (padded to the result's dims); each candidate is
    priced by the planner's own score under the machine profile
    (:func:`mpiredist.planning.planner.predicted_seconds` of the plans that
    move the other operands there) and the cheapest wins, the first
    operand's on a tie.  The choice depends only on shapes,
    layouts and dtypes, so every rank makes the same one.  Moves go through
    ``redistribute`` (each within its memory bound).

Partial operands
    Kept partial (no communication) where the ufunc commutes with the
    pending sum: ``multiply``/``divide`` by a scalar, ``negative``/``positive``,
    ``add``/``subtract`` of two partial-sum operands of the same layout and
    shape.  Anywhere else a partial operand is reduced first, straight into
    the layout the ufunc needs (one reduce-scatter or all-reduce).

Errors are raised on every rank before any data moves: shapes that do not
broadcast (:class:`ShapeError` naming both shapes), different meshes.
When a numpy array operand takes part, its shape is agreed across ranks
first (one small collective) since it is not known to be the same.
"""

import math

import numpy as np

from ..core.backend import array_module
from ..core.blocks import local_shape, rank_block
from ..core.errors import ShapeError
from ..core.layout import Layout
from ..core.subaxes import expand, rank_digits
from ..planning import planner
from ..runtime.agree import check_together
from ..runtime.groups import base_group
from . import ops
from .base import DistArrayBase

__all__ = ["array_ufunc", "compatible_layout", "move_cost", "align", "this_block"]

# Ufuncs that commute with a pending sum (see the module docstring).
_SCALAR_LINEAR = {np.multiply: (0, 1), np.true_divide: (0,)}
_UNARY_LINEAR = (np.negative, np.positive)
_PAIR_LINEAR = (np.add, np.subtract)


def compatible_layout(shape, result_shape, layout):
    """The layout of an operand of ``shape`` that lines up with ``layout`` of
    ``result_shape`` (pure): trailing dims aligned, broadcast dims replicated."""
    off = len(result_shape) - len(shape)
    return Layout(tuple(layout.dims[d + off] if n == result_shape[d + off] and n != 1
                        or (n == 1 and result_shape[d + off] == 1) else ()
                        for d, n in enumerate(shape)))


def _padded(layout, shape, result_shape):
    """An operand's layout as a candidate result layout: leading dims whole."""
    off = len(result_shape) - len(shape)
    dims = [()] * off + [g if n == result_shape[d + off] else ()
                         for d, (g, n) in enumerate(zip(layout.dims, shape))]
    return Layout(tuple(dims))


def move_cost(a, dst):
    """Predicted seconds of moving DistArray ``a`` to layout ``dst``, as the
    planner scores plans (pure)."""
    dst = Layout.parse(dst)
    if a.layout == dst:
        return 0.0
    if a.layout.partial and a.layout.op != "sum" and not dst.partial:
        dst = Layout(dst.dims, (), a.layout.op)
    p = planner.plan(a.shape, a.dtype, a.mesh, a.layout, dst)
    return planner.predicted_seconds(p)


def align(a, dst):
    """``a`` in layout ``dst`` (collective when it moves); partials are reduced."""
    dst = Layout.parse(dst)
    if a.layout == dst:
        return a
    if a.layout.partial and not dst.partial:
        return ops.reduce(a, dst)
    return a.redistribute(dst)


def this_block(shape, layout, mesh):
    """This rank's box ``((lo, hi), ...)`` of a global ``shape`` in ``layout``."""
    rank = base_group(mesh).rank
    return rank_block(tuple(shape), expand(Layout.parse(layout), mesh),
                      rank_digits(mesh, rank))


def _slice_numpy(x, result_shape, box):
    """This rank's part of numpy operand ``x`` broadcast to ``result_shape``."""
    off = len(result_shape) - x.ndim
    key = tuple(slice(None) if n == 1 else slice(*box[d + off]) for d, n in enumerate(x.shape))
    return x[key]


def _keeps_partial(ufunc, inputs, dist):
    lay = dist[0][1].layout
    if lay.op != "sum":
        return False
    if len(inputs) == 1 and ufunc in _UNARY_LINEAR:
        return True
    if len(inputs) == 2 and len(dist) == 1 and ufunc in _SCALAR_LINEAR:
        return dist[0][0] in _SCALAR_LINEAR[ufunc] and ops._is_scalar(inputs[1 - dist[0][0]])
    if len(inputs) == 2 and len(dist) == 2 and ufunc in _PAIR_LINEAR:
        a, b = dist[0][1], dist[1][1]
        return a.layout == b.layout and a.shape == b.shape and a.dtype == b.dtype
    return False


def array_ufunc(self, ufunc, method, *inputs, **kwargs):
    """Apply ``ufunc`` with NumPy broadcasting and mixed layouts (collective
    when an operand moves; see the module docstring).

    Raises
    ------
    ShapeError
        Shapes that do not broadcast, or operands on different meshes.
    OperandError
        ``out=``, ``where=``, a ufunc method other than ``__call__``, an
        operand of an unknown type.
    """
    DistArray = DistArrayBase
    name = getattr(ufunc, "__name__", str(ufunc))
    if method != "__call__" or kwargs.get("out") is not None \
            or kwargs.get("where", True) is not True:
        return ops.array_ufunc(self, ufunc, method, *inputs, **kwargs)
    kwargs = {k: v for k, v in kwargs.items() if k not in ("out", "where")}
    dist = [(i, x) for i, x in enumerate(inputs) if isinstance(x, DistArray)]
    if not dist:
        raise ops.OperandError(f"numpy.{name}: no operand is a DistArray")
    arrays = []
    for i, x in enumerate(inputs):
        if isinstance(x, DistArray) or ops._is_scalar(x):
            continue
        if isinstance(x, np.ndarray):
            arrays.append(i)
            continue
        if hasattr(x, "__array_ufunc__") and x.__array_ufunc__ is not None \
                and not ops._is_local_type(x):
            return NotImplemented
        if isinstance(x, (list, tuple)):
            raise ops.OperandError(f"numpy.{name}: operand {i} is a {type(x).__name__}; "
                                   "pass a numpy array (numpy.asarray) or a DistArray")
        raise ops.OperandError(f"numpy.{name}: operand {i} is {ops._describe(x)}; only "
                               "DistArrays, numpy arrays and scalars combine")
    ref = dist[0][1]
    for i, x in dist[1:]:
        if x.mesh != ref.mesh:
            raise ShapeError(f"numpy.{name}: operand {dist[0][0]} is on mesh {ref.mesh}, "
                             f"operand {i} on mesh {x.mesh}")

    def shapes_of():
        return [tuple(x.shape) for x in inputs if isinstance(x, (DistArray, np.ndarray))]

    def broadcast():
        try:
            return tuple(np.broadcast_shapes(*shapes_of()))
        except ValueError:
            parts = ", ".join(f"operand {i}: {tuple(x.shape)}" for i, x in enumerate(inputs)
                              if isinstance(x, (DistArray, np.ndarray)))
            raise ShapeError(f"numpy.{name}: shapes do not broadcast ({parts})") from None

    if arrays:   # numpy operands: not known to be equal on every rank
        def body(mesh, rank):
            return broadcast(), dict(shapes=shapes_of(), dtypes=[
                str(inputs[i].dtype) for i in arrays])
        _, result_shape = check_together(f"numpy.{name}", ref.mesh, body)
    else:
        result_shape = broadcast()

    # partial operands that stay partial: purely local
    if len(dist) == len(inputs) - sum(ops._is_scalar(x) for x in inputs) \
            and all(x.layout.partial for _, x in dist) and _keeps_partial(ufunc, inputs, dist) \
            and all(x.shape == result_shape for _, x in dist):
        return _apply(ufunc, kwargs, inputs, ref, result_shape, ref.layout, None)

    layout = choose_layout([x for _, x in dist], result_shape)
    moved = list(inputs)
    for i, x in dist:
        moved[i] = align(x, compatible_layout(x.shape, result_shape, layout))
    box = this_block(result_shape, layout, ref.mesh) if arrays else None
    for i in arrays:
        moved[i] = _slice_numpy(inputs[i], result_shape, box)
    return _apply(ufunc, kwargs, moved, ref, result_shape, layout, box)


def choose_layout(dist, result_shape):
    """The result layout that costs the least to line the operands up with (pure);
    on a tie the one with the smaller result block, then the first operand's."""
    best, best_cost = None, None
    seen = set()
    for x in dist:
        cand = _padded(x.layout.without_partial(), x.shape, result_shape)
        if cand in seen:
            continue
        seen.add(cand)
        cost = (sum(move_cost(y, compatible_layout(y.shape, result_shape, cand)) for y in dist),
                math.prod(local_shape(result_shape, expand(cand, dist[0].mesh))))
        if best_cost is None or cost < best_cost:
            best, best_cost = cand, cost
    return best


def _apply(ufunc, kwargs, inputs, ref, shape, layout, box):
    DistArray = DistArrayBase
    args = tuple(x.local if isinstance(x, DistArray) else x for x in inputs)
    xp = array_module(ref.local)
    out = ufunc(*args, **kwargs)
    outs = out if ufunc.nout > 1 else (out,)
    if box is None:
        box = this_block(shape, layout, ref.mesh)
    want = tuple(hi - lo for lo, hi in box)
    wrapped = []
    for o in outs:
        o = xp.asarray(o)
        if tuple(o.shape) != want:      # scalars only, or length-1 dims everywhere
            o = xp.ascontiguousarray(xp.broadcast_to(o, want))
        wrapped.append(type(ref)(o, shape, layout, ref.mesh))
    return tuple(wrapped) if ufunc.nout > 1 else wrapped[0]
