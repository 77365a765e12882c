"""Shape operations: transpose, reshape, concatenate, astype, copy.

Routes and memory (S, T: this rank's source and target block bytes; each
``redistribute`` keeps its own bound ``max(S, T) + W``):

``transpose`` / ``T``
    Local transpose (a view, as NumPy) and the permuted layout: no
    communication, no new memory.
``astype`` / ``copy``
    Local; one new block.  ``astype`` of a partial array reduces it first
    (a cast does not commute with the pending sum), ``copy`` keeps it partial.
``concatenate(arrays, axis, layout)``
    Default layout: the first array's (without partial axes).  The result's
    block is allocated once and each input moves into its stretch of
    ``axis`` by one exchange in rounds (:mod:`mpiredist.arrays.moves`),
    whatever the layouts, sharded ``axis`` and 1-D arrays included; partial
    inputs are combined on the way.  Memory: the result's block plus at most
    W (an input of another dtype is first cast locally: one block more).
``reshape(shape, layout=None)``
    C order, one -1 allowed.  Default target layout: dim 0 split over every
    mesh axis the source shards with (in the source's order), the rest whole.
    Route: the source moves to dim 0 split over its axes (nothing moves when
    it is already so), where every block is one range of flat indices; one
    exchange in rounds (:mod:`mpiredist.arrays.moves`) gives each rank its
    flat range of the target split the same way over the target's axes
    (contiguous pieces, sent and received in place); then the target
    layout, if it shards other dims.  Each step is within its own bound;
    the exchange allocates the new block and at most W.
"""

import math
import operator

import numpy as np

from ..core.backend import array_module
from ..core.errors import LayoutError, ShapeError
from ..core.layout import Layout
from . import ops
from .base import DistArrayBase
from ..core.blocks import overlap
from ..runtime.groups import base_group
from . import moves
from .moves import shifted, source_entries

__all__ = ["transpose", "T", "astype", "copy", "concatenate", "reshape", "off_dims"]


def _dist(a, what):
    if not isinstance(a, DistArrayBase):
        raise ops.OperandError(f"{what}: expected a DistArray, found {type(a).__name__}")


def transpose(a, *axes):
    """Permute the dims (local: a view of the block and a permuted layout)."""
    _dist(a, "transpose")
    if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))):
        axes = axes[0]
    n = a.ndim
    if axes is None or axes == ():
        axes = tuple(reversed(range(n)))
    try:
        perm = tuple(operator.index(d) for d in axes)
    except TypeError:
        raise ShapeError(f"transpose: axes must be integers, found {axes!r}") from None
    if len(perm) != n or any(not -n <= d < n for d in perm) \
            or len({d % n for d in perm}) != n:
        raise ShapeError(f"transpose: axes {axes!r} are not a permutation of the "
                         f"{n} dims of an array of shape {a.shape}")
    perm = tuple(d % n for d in perm)
    lay = Layout(tuple(a.layout.dims[d] for d in perm), a.layout.partial, a.layout.op)
    shape = tuple(a.shape[d] for d in perm)
    return type(a)(a.local.transpose(perm), shape, lay, a.mesh)


def T(a):
    """``a.T``: the dims reversed (local)."""
    return transpose(a)


def astype(a, dtype, copy=True):
    """Cast to ``dtype`` (local; a partial array is reduced first)."""
    _dist(a, "astype")
    dtype = np.dtype(dtype)
    if a.layout.partial and dtype != a.dtype:
        a = ops.reduce(a)
    if dtype == a.dtype and not copy:
        return a
    return type(a)(a.local.astype(dtype), a.shape, a.layout, a.mesh)


def copy(a):
    """A copy with its own block (local; partial axes kept)."""
    _dist(a, "copy")
    return type(a)(a.local.copy(), a.shape, a.layout, a.mesh)


def _longest_other(shape, dims):
    """The longest dim not in ``dims`` (the first on a tie), or None."""
    free = [d for d in range(len(shape)) if d not in dims]
    return max(free, key=lambda d: (shape[d], -d)) if free else None


def off_dims(layout, shape, dims):
    """``layout`` with the axes of ``dims`` moved onto the longest other dim (pure).

    With no other dim those axes replicate.
    """
    layout = Layout.parse(layout)
    moving = tuple(x for d in dims for x in layout.dims[d])
    if not moving:
        return layout.without_partial()
    target = _longest_other(shape, dims)
    new = [() if d in dims else g for d, g in enumerate(layout.dims)]
    if target is not None:
        new[target] = tuple(new[target]) + moving
    return Layout(tuple(new))


def _norm_axis(axis, ndim, what):
    try:
        d = operator.index(axis)
    except TypeError:
        raise ShapeError(f"{what}: axis must be an integer, found {axis!r}") from None
    if not -ndim <= d < ndim:
        raise ShapeError(f"{what}: axis {d} is out of range for {ndim} dimension(s)")
    return d % ndim


def concatenate(arrays, axis=0, layout=None):
    """Join DistArrays along ``axis`` (collective); see the module docstring."""
    arrays = list(arrays)
    if not arrays:
        raise ShapeError("concatenate: needs at least one array")
    for a in arrays:
        _dist(a, "concatenate")
    first = arrays[0]
    if first.ndim == 0:
        raise ShapeError("concatenate: zero-dimensional arrays cannot be concatenated")
    d = _norm_axis(axis, first.ndim, "concatenate")
    for i, a in enumerate(arrays[1:], 1):
        if a.mesh != first.mesh:
            raise ShapeError(f"concatenate: array {i} is on mesh {a.mesh}, array 0 on "
                             f"{first.mesh}")
        if a.ndim != first.ndim or any(n != m for k, (n, m) in
                                        enumerate(zip(a.shape, first.shape)) if k != d):
            raise ShapeError(f"concatenate: array {i} has shape {a.shape}, array 0 has "
                             f"{first.shape}; all dims but axis {d} must match")
    shape = list(first.shape)
    shape[d] = sum(a.shape[d] for a in arrays)
    shape = tuple(shape)
    dst = first.layout.without_partial() if layout is None else Layout.parse(layout)
    dst.validate(first.mesh, len(shape))
    if dst.partial:
        raise LayoutError(f"concatenate: target layout {dst} has partial axes")
    dtype = np.result_type(*[a.dtype for a in arrays])
    mesh = first.mesh
    rank = base_group(mesh).rank
    mine = source_entries(shape, mesh, dst)[rank][0]
    xp = array_module(first.local)
    out = xp.empty(tuple(hi - lo for lo, hi in mine), dtype)
    offset = 0
    for a in arrays:
        _join(a if a.dtype == dtype else astype(a, dtype, copy=False), d, offset, shape, dst,
              mine, out)
        offset += a.shape[d]
    return type(first)(out, shape, dst, mesh)


def _join(a, d, offset, shape, dst, mine, out):
    """Move ``a`` into its stretch ``[offset, offset + n)`` of dim ``d`` of the result
    blocks (one exchange; partial sums combined on the way)."""
    region = tuple((offset, offset + a.shape[d]) if k == d else (0, n)
                   for k, n in enumerate(shape))
    boxes = [None if e is None else overlap(e[0], region)
             for e in source_entries(shape, a.mesh, dst)]
    inside = [None if b is None else shifted(b, d, -offset) for b in boxes]
    rank = base_group(a.mesh).rank
    view = None
    if boxes[rank] is not None:
        view = out[tuple(slice(x - lo, y - lo) for (lo, _), (x, y) in zip(mine, boxes[rank]))]
    moves.exchange_into(a.mesh, a.dtype, source_entries(a.shape, a.mesh, a.layout), inside,
                  a.local, view, a.layout.op)


def _to(a, layout):
    if a.layout.partial:
        return ops.reduce(a, layout)
    return a if a.layout == layout else a.redistribute(layout)


def _target_shape(size, shape, what):
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        shape = [operator.index(n) for n in shape]
    except TypeError:
        raise ShapeError(f"{what}: shape must be integers, found {shape!r}") from None
    holes = [i for i, n in enumerate(shape) if n == -1]
    if len(holes) > 1 or any(n < -1 for n in shape):
        raise ShapeError(f"{what}: shape {tuple(shape)} may hold one -1 and no other "
                         "negative length")
    known = math.prod(n for n in shape if n != -1)
    if holes:
        if known == 0 or size % known:
            raise ShapeError(f"{what}: cannot reshape an array of size {size} into "
                             f"shape {tuple(shape)}")
        shape[holes[0]] = size // known
    if math.prod(shape) != size:
        raise ShapeError(f"{what}: cannot reshape an array of size {size} into shape "
                         f"{tuple(shape)}")
    return tuple(shape)


def reshape(a, *shape, layout=None):
    """The array in a new ``shape`` (C order; collective); see the module docstring."""
    _dist(a, "reshape")
    if len(shape) == 1:
        shape = shape[0]
    new = _target_shape(math.prod(a.shape), shape, "reshape")
    if layout is None:
        dst = _rows(a.layout.axes_used(), len(new))
    else:
        dst = Layout.parse(layout)
        dst.validate(a.mesh, len(new))
        if dst.partial:
            raise LayoutError(f"reshape: target layout {dst} has partial axes")
    if new == a.shape:
        return _to(a, dst)
    b = _to(a, _rows(a.layout.axes_used() + a.layout.partial, a.ndim))
    work = _rows(dst.axes_used(), len(new))
    out = _flat_move(b, new, work)
    del b
    return out if work == dst else out.redistribute(dst)


def _rows(axes, ndim):
    """Dim 0 split over ``axes``, the other dims whole: blocks are flat ranges."""
    return Layout(tuple(tuple(axes) if i == 0 else () for i in range(ndim)))


def _flat(box, shape):
    """The flat range of a block of a dim-0 split (a 1-D box)."""
    if not shape:
        return ((0, 1),)
    rest = math.prod(shape[1:])
    return ((box[0][0] * rest, box[0][1] * rest),)


def _flat_move(b, new, work):
    """``b`` (a dim-0 split) as shape ``new`` in layout ``work`` (a dim-0 split): one
    exchange of flat ranges."""
    mesh = b.mesh
    src = [None if e is None else (_flat(e[0], b.shape), e[1])
           for e in source_entries(b.shape, mesh, b.layout)]
    dst = [None if e is None else _flat(e[0], new)
           for e in source_entries(new, mesh, work)]
    lshape = tuple(hi - lo for lo, hi in _box(new, work, mesh))
    xp = array_module(b.local)
    out = xp.empty(lshape, b.dtype)
    moves.exchange_into(mesh, b.dtype, src, dst, xp.ascontiguousarray(b.local).reshape(-1),
                        out.reshape(-1), whole=True)
    return type(b)(out, new, work, mesh)


def _box(shape, layout, mesh):
    from .broadcast import this_block
    return this_block(shape, layout, mesh)
