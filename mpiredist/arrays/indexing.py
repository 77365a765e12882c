"""Basic indexing ``a[key]``: ints, slices (any step), Ellipsis, None.

The result keeps the sharding of the dims it keeps (a sliced dim keeps its
mesh axes, now over its new length by the ceil-chunk rule); dims indexed by
an int disappear and their axes replicate; ``None`` adds a whole dim.

Routes (every decision from shapes and layouts only):

* No touched dim (int, or a slice that is not the whole dim) is sharded:
  the block is indexed locally -- a view, no communication, partial axes
  kept.
* Touched sharded dims, every slice of step 1: one exchange in rounds
  (:mod:`mpiredist.arrays.moves`).  Each rank offers the part of its block
  that the key selects, as a box of the result, and receives its block of
  the result's layout (ceil-chunk over the new lengths); partial sums are
  combined on the way.  Memory: the result's block plus at most W.
* Touched sharded dims with a slice of another step: the touched dims' mesh
  axes move onto the longest untouched dim
  (:func:`mpiredist.arrays.shape.off_dims`; one bounded redistribution),
  the block is indexed locally there, and the result is redistributed to
  its layout (a second bounded redistribution).  When every dim is touched,
  the touched axes replicate in the middle step: each rank then holds the
  source's block times the number of shards of those axes (documented
  limitation of strided slices).

Errors (:class:`IndexingError`, a ShapeError and an IndexError) are raised
on every rank before any data moves: the key depends only on the shape.
"""

import operator

from ..core.errors import ShapeError
from ..core.layout import Layout
from . import ops
from .base import DistArrayBase
from ..core.backend import array_module
from ..runtime.groups import base_group
from . import moves
from .moves import source_entries
from .shape import off_dims

__all__ = ["getitem", "IndexingError"]


class IndexingError(ShapeError, IndexError):
    """An index that does not fit the array (also an IndexError, as NumPy's)."""


def _parse(key, shape):
    """Per source dim ('int', i) / ('slice', slice) plus the result's dim plan."""
    if not isinstance(key, tuple):
        key = (key,)
    n_ell = sum(k is Ellipsis for k in key)
    if n_ell > 1:
        raise IndexingError("an index can only have a single ellipsis ('...')")
    used = sum(1 for k in key if k is not None and k is not Ellipsis)
    if used > len(shape):
        raise IndexingError(f"too many indices for array of shape {shape}: {used} "
                            f"were indexed")
    if n_ell == 0:
        key = key + (Ellipsis,)
    items, dim = [], 0
    for k in key:
        if k is Ellipsis:
            for _ in range(len(shape) - used):
                items.append(("slice", dim, slice(None)))
                dim += 1
        elif k is None:
            items.append(("new", None, None))
        elif isinstance(k, slice):
            items.append(("slice", dim, slice(*k.indices(shape[dim]))))
            dim += 1
        else:
            try:
                i = operator.index(k)
            except TypeError:
                raise IndexingError(f"only integers, slices, Ellipsis and None are valid "
                                    f"indices of a DistArray, found {k!r}") from None
            n = shape[dim]
            if not -n <= i < n:
                raise IndexingError(f"index {i} is out of bounds for axis {dim} with "
                                    f"size {n}")
            items.append(("int", dim, i % n))
            dim += 1
    return items


def _touched(items, shape):
    out = set()
    for kind, d, k in items:
        if kind == "int":
            out.add(d)
        elif kind == "slice" and (k.start, k.stop, k.step) != (0, shape[d], 1):
            out.add(d)
    return out


def _result(items, layout):
    """Result shape-less layout dims and the local key."""
    dims, key = [], []
    for kind, d, k in items:
        if kind == "new":
            dims.append(())
            key.append(None)
        elif kind == "int":
            key.append(k)
        else:
            dims.append(layout.dims[d])
            key.append(k)
    return dims, tuple(key)


def _length(s, n):
    return len(range(*s.indices(n)))


def getitem(a, key):
    """``a[key]`` (collective when a touched dim is sharded); see the module docstring."""
    if not isinstance(a, DistArrayBase):
        raise ops.OperandError(f"getitem: expected a DistArray, found {type(a).__name__}")
    items = _parse(key, a.shape)
    shape = tuple(1 if kind == "new" else _length(k, a.shape[d])
                  for kind, d, k in items if kind != "int")
    touched = _touched(items, a.shape)
    if not any(a.layout.dims[d] for d in touched):
        dims, lkey = _result(items, a.layout)
        lay = Layout(tuple(dims), a.layout.partial, a.layout.op)
        return type(a)(a.local[lkey], shape, lay, a.mesh)
    if all(kind != "slice" or k.step == 1 for kind, _, k in items):
        return _exchanged(a, items, shape)
    work = off_dims(a.layout, a.shape, touched)
    b = ops.reduce(a, work) if a.layout.partial else a.redistribute(work)
    dims, lkey = _result(items, work)
    mid = type(a)(b.local[lkey], shape, Layout(tuple(dims)), a.mesh)
    del b
    keep = a.layout.without_partial()
    want, _ = _result(items, keep)
    want = Layout(tuple(want))
    return mid if mid.layout == want else mid.redistribute(want)


def _project(box, items):
    """The result box of a source ``box`` and this rank's local key, or None."""
    out, key = [], []
    for kind, d, k in items:
        if kind == "new":
            out.append((0, 1))
            key.append(None)
            continue
        lo, hi = box[d]
        if kind == "int":
            if not lo <= k < hi:
                return None, None
            key.append(k - lo)
            continue
        a, b = max(lo, k.start), min(hi, k.stop)
        if a >= b:
            return None, None
        out.append((a - k.start, b - k.start))
        key.append(slice(a - lo, b - lo))
    return tuple(out), tuple(key)


def _exchanged(a, items, shape):
    """``a[key]`` for step-1 slices and ints: one exchange from the selected part of
    every block to the result's blocks (partial sums combined on the way)."""
    want = Layout(tuple(_result(items, a.layout.without_partial())[0]))
    rank = base_group(a.mesh).rank
    src, local = [], None
    for r, entry in enumerate(source_entries(a.shape, a.mesh, a.layout)):
        box, key = (None, None) if entry is None else _project(entry[0], items)
        src.append(None if box is None else (box, entry[1]))
        if r == rank and box is not None:
            local = a.local[key]
    dst = [None if e is None else e[0] for e in source_entries(shape, a.mesh, want)]
    out = None
    if dst[rank] is not None:
        out = array_module(a.local).empty(tuple(hi - lo for lo, hi in dst[rank]), a.dtype)
    moves.exchange_into(a.mesh, a.dtype, src, dst, local, out, a.layout.op)
    return type(a)(out, shape, want, a.mesh)
