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
    Default layout: the first array's (without partial axes).  When it does
    not shard ``axis``, each input moves to that layout (on its own shape)
    and the blocks are joined locally.  When it does, ``axis``'s mesh axes
    are first moved onto the longest other dim (:func:`off_dims`), the
    blocks joined there and the result redistributed to ``layout``: two
    bounded redistributions; peak about the sum of the inputs' blocks plus
    the result's block.  A 1-D concatenate along a sharded dim has no other
    dim: its inputs are replicated first (each rank then holds the whole
    result once; documented limitation).
``reshape(shape, layout=None)``
    C order, one -1 allowed.  Default target layout: dim 0 split over every
    mesh axis the source shards with (in the source's order), the rest whole.
    Route (the simple one of the issue): when source and target share
    leading dims of equal lengths, both are moved to a layout that splits
    only the first of them over those axes; each rank's block is then the
    same range of flat indices in both shapes, reshaped locally, and
    redistributed to the target (bounded at each step).  When they share no
    leading dim, the blocks along dim 0 of the two shapes hold the same flat
    ranges only if ``ceil(n0/k) * rest`` agrees; otherwise the array is
    replicated (gathered) first: a full copy per rank, documented.
"""

import math
import operator

import numpy as np

from ..core.backend import array_module
from ..core.errors import LayoutError, ShapeError
from ..core.layout import Layout
from ..core.subaxes import expand
from ..core.blocks import local_shape
from . import ops
from .base import DistArrayBase

__all__ = ["transpose", "T", "astype", "copy", "concatenate", "reshape", "off_dims"]


def _dist(a, what):
    if not isinstance(a, DistArrayBase):
        raise ops.OperandError(f"{what}: expected a DistArray, found {type(a).__name__}")


def _reduced(a):
    return ops.reduce(a) if a.layout.partial else a


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
    work = off_dims(dst, shape, (d,)) if dst.dims[d] else dst
    blocks = [_to(a, work).local for a in arrays]
    xp = array_module(blocks[0])
    local = xp.concatenate([b.astype(dtype, copy=False) for b in blocks], axis=d)
    del blocks
    out = type(first)(local, shape, work, first.mesh)
    return out if work == dst else out.redistribute(dst)


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
    axes = a.layout.axes_used()
    if layout is None:
        dst = Layout(tuple(axes if i == 0 else () for i in range(len(new))))
    else:
        dst = Layout.parse(layout)
        dst.validate(a.mesh, len(new))
        if dst.partial:
            raise LayoutError(f"reshape: target layout {dst} has partial axes")
    a = _reduced(a) if a.layout.partial else a
    if new == a.shape:
        return a.redistribute(dst) if a.layout != dst else a
    both = tuple(dst.axes_used())
    lead = 0
    while lead < min(len(new), a.ndim) and new[lead] == a.shape[lead]:
        lead += 1
    mesh = a.mesh
    if lead:
        # split dim 0 over every axis that either layout uses: same flat ranges
        axes_all = tuple(dict.fromkeys(axes + both))
        src_work = Layout(tuple(axes_all if i == 0 else () for i in range(a.ndim)))
        dst_work = Layout(tuple(axes_all if i == 0 else () for i in range(len(new))))
    else:
        axes_all = tuple(dict.fromkeys(axes + both))
        src_work = Layout(tuple(axes_all if i == 0 else () for i in range(a.ndim)))
        dst_work = Layout(tuple(axes_all if i == 0 else () for i in range(len(new))))
        s_loc = local_shape(a.shape, expand(src_work, mesh))
        d_loc = local_shape(new, expand(dst_work, mesh))
        if math.prod(s_loc) != math.prod(d_loc) or a.shape[0] == 0 or new[0] == 0 or \
                _last_size(a.shape, src_work, mesh) != _last_size(new, dst_work, mesh):
            src_work = Layout.replicated(a.ndim)
            dst_work = Layout.replicated(len(new))
    b = a if a.layout == src_work else a.redistribute(src_work)
    lshape = tuple(hi - lo for lo, hi in _box(new, dst_work, mesh))
    out = type(a)(b.local.reshape(lshape), new, dst_work, mesh)
    del b
    return out if dst_work == dst else out.redistribute(dst)


def _box(shape, layout, mesh):
    from .broadcast import this_block
    return this_block(shape, layout, mesh)


def _last_size(shape, layout, mesh):
    """Elements of the last non-empty shard along dim 0 (every rank's share must agree)."""
    from ..core.blocks import chunk
    k = math.prod(mesh.axis_size(x) for x in layout.dims[0]) if layout.dims else 1
    c = chunk(shape[0], k)
    rest = math.prod(shape[1:])
    return [min(c, max(0, shape[0] - p * c)) * rest for p in range(k)]
