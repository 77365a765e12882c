"""Block geometry: which global indices a rank holds, computed locally.

For a dimension of length ``n`` split into ``k`` shards, shard ``p`` holds
``[p*c, min((p+1)*c, n))`` with ``c = ceil(n/k)`` (the XLA / ``torch.chunk``
convention), possibly empty.  Everything here is pure arithmetic: any rank's
block is known without communication.

A figure over all ranks (the most elements any rank lacks, say) depends only
on the digits of the sub-axes the layouts use, and every combination of those
digits is some rank's.  :func:`slabs` numbers the combinations of such a
*space* of sub-axes ``SLAB`` at a time, and :func:`slab_interval` gives each
combination's shard, so those figures take a few small arrays whatever the
number of ranks.
"""

import math
from functools import lru_cache

import numpy as np

from .subaxes import group_size

__all__ = ["chunk", "interval", "aligned", "divides_evenly", "block_index", "local_shape",
           "rank_block", "overlap", "box_size", "box_shape", "sub_index", "flat_offset",
           "contiguous_box", "contiguous_in", "offsets", "relative", "box_index", "SLAB", "slabs", "slab_digit", "slab_index", "slab_interval"]

# Digit combinations per slab: int64 arrays of 32 KiB, so that a figure over
# the 65,536 ranks of a large mesh needs a few hundred KiB, not O(P) arrays.
SLAB = 1 << 12


def chunk(n, k):
    """Largest shard length of a dimension of length ``n`` in ``k`` shards."""
    return -(-n // k)


def interval(n, k, p):
    """Global ``(start, stop)`` of shard ``p`` of ``k``."""
    c = chunk(n, k)
    return min(p * c, n), min((p + 1) * c, n)


def aligned(n, k, g):
    """True if splitting each of ``k`` shards into ``g`` gives the ``k*g`` shards.

    Slices and gathers of a minor sub-axis group of size ``g`` are exact
    (the fine shards tile each coarse shard) only when this holds.
    """
    if n == 0 or g == 1:
        return True
    coarse, fine = chunk(n, k), chunk(n, k * g)
    return fine * g == coarse or coarse >= n


def block_index(group, digits):
    """Mixed-radix index of ``digits`` (mapping SubAxis -> digit) over ``group``."""
    p = 0
    for s in group:
        p = p * s.size + digits[s]
    return p


def divides_evenly(global_shape, layouts, dims=None):
    """True if the ``dims`` (default all) split into equal shards in every layout."""
    dims = range(len(global_shape)) if dims is None else dims
    return all(global_shape[d] % group_size(lay.dims[d]) == 0 for lay in layouts for d in dims)


@lru_cache(maxsize=4096)
def local_shape(global_shape, sublayout):
    """Largest local block shape of ``sublayout`` (that of the first rank)."""
    return tuple(chunk(n, group_size(d)) for n, d in zip(global_shape, sublayout.dims))


def local_bytes(global_shape, sublayout, itemsize):
    return math.prod(local_shape(global_shape, sublayout)) * itemsize


def rank_block(global_shape, sublayout, digits):
    """Tuple of per-dim ``(start, stop)`` held by the rank with ``digits``."""
    return tuple(interval(n, group_size(d), block_index(d, digits))
                 for n, d in zip(global_shape, sublayout.dims))


def overlap(a, b):
    """Intersection of two per-dim interval tuples, or None if empty."""
    out = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b))
    if any(lo >= hi for lo, hi in out):
        return None
    return out


def box_size(box):
    """Number of elements of a per-dim interval tuple."""
    return math.prod(hi - lo for lo, hi in box)


def box_shape(box):
    """The shape of a per-dim interval tuple."""
    return tuple(hi - lo for lo, hi in box)


def sub_index(box, sub):
    """Index of the global box ``sub`` in a block holding ``box`` (a view, 0-d too)."""
    return tuple(slice(x - a, y - a) for (a, _), (x, y) in zip(box, sub)) + (Ellipsis,)


def flat_offset(full, starts):
    """Elements before index ``starts`` of a C-ordered array of shape ``full``."""
    offset = 0
    for n, s in zip(full, starts):
        offset = offset * n + s
    return offset


def contiguous_box(full, starts, shape):
    """True if the box at ``starts`` of ``shape`` is one run of a C-ordered array of
    shape ``full``: after its first dim longer than 1, every dim spans the
    whole array (the one contiguity test of the package)."""
    dims = [d for d, n in enumerate(shape) if n > 1]
    if not dims:
        return True
    return all(shape[d] == full[d] for d in range(dims[0] + 1, len(full)))


def offsets(counts):
    """Where each of ``counts`` starts when they lie one after another."""
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return out


def contiguous_in(piece, block):
    """True if the global box ``piece`` is one run of a C-order ``block`` (both
    per-dim interval tuples): :func:`contiguous_box` in global coordinates."""
    return contiguous_box([hi - lo for lo, hi in block],
                          [p - b for (p, _), (b, _) in zip(piece, block)],
                          [hi - lo for lo, hi in piece])


def relative(box, outer):
    """``(starts, shape)`` of the global ``box`` inside the block ``outer`` (None
    when there is no block)."""
    if outer is None:
        return None
    return (tuple(lo - o for (lo, _), (o, _) in zip(box, outer)),
            tuple(hi - lo for lo, hi in box))


def box_index(box):
    """The index of a relative box ``(starts, shape)``: a view, also of a 0-d array."""
    starts, shape = box
    return tuple(slice(s, s + k) for s, k in zip(starts, shape)) + (Ellipsis,)


def slabs(space, size=SLAB):
    """Yield int64 arrays numbering the digit combinations of ``space``.

    ``space`` is a tuple of sub-axes; combination ``i`` gives each sub-axis
    the digit of ``i`` in mixed radix over ``space`` (first sub-axis major).
    The arrays hold at most ``size`` combinations each and together cover
    all ``group_size(space)`` of them (one, numbered 0, for an empty space).
    """
    total, size = group_size(space), max(1, size)
    for start in range(0, total, size):
        yield np.arange(start, min(start + size, total), dtype=np.int64)


@lru_cache(maxsize=1024)
def _strides(space):
    """Map each sub-axis of ``space`` to its place value in mixed radix over ``space``."""
    out, stride = {}, 1
    for s in reversed(space):
        out[s] = stride
        stride *= s.size
    return out


@lru_cache(maxsize=1024)
def _runs(group, space):
    """``(place value, radix)`` per run of ``group`` that is consecutive in ``space`` too.

    A whole mesh axis is one run, so its index takes one division, not one
    per prime factor.
    """
    strides, runs, last = _strides(space), [], None
    for s in group:
        if runs and strides[s] * s.size == last:
            runs[-1] = (strides[s], runs[-1][1] * s.size)
        else:
            runs.append((strides[s], s.size))
        last = strides[s]
    return tuple(runs)


def slab_digit(s, space, combos):
    """Digit of sub-axis ``s`` in each combination of ``combos`` (over ``space``)."""
    return combos // _strides(space)[s] % s.size


def slab_index(group, space, combos):
    """Mixed-radix index over ``group`` of each combination (0 for no group)."""
    p = 0
    for stride, radix in _runs(group, space):
        p = p * radix + combos // stride % radix
    return p


def slab_interval(n, group, space, combos):
    """``(starts, stops)`` of the shard of a dim of length ``n`` split over ``group``."""
    c = chunk(n, group_size(group))
    p = slab_index(group, space, combos)
    return np.minimum(p * c, n), np.minimum(p * c + c, n)
