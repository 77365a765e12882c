"""Block geometry: which global indices a rank holds, computed locally.

For a dimension of length ``n`` split into ``k`` shards, shard ``p`` holds
``[p*c, min((p+1)*c, n))`` with ``c = ceil(n/k)`` (the XLA / ``torch.chunk``
convention), possibly empty.  Everything here is pure arithmetic: any rank's
block is known without communication.
"""

import math
from functools import lru_cache

import numpy as np

from .subaxes import all_digits, group_size

__all__ = ["chunk", "interval", "aligned", "divides_evenly", "block_index", "local_shape",
           "rank_block", "all_blocks", "overlap"]


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


@lru_cache(maxsize=256)
def all_blocks(global_shape, sublayout, mesh_axes):
    """Per-dim ``(starts, stops)`` int arrays over all ranks (vectorised, cached).

    ``global_shape`` must be a tuple; the arrays are read-only.
    """
    digits = all_digits(mesh_axes)
    size = math.prod(s for _, s in mesh_axes)
    out = []
    for n, d in zip(global_shape, sublayout.dims):
        p = np.zeros(size, dtype=np.int64)
        for s in d:
            p = p * s.size + digits[s]
        c = chunk(n, group_size(d))
        lo, hi = np.minimum(p * c, n), np.minimum((p + 1) * c, n)
        lo.setflags(write=False)
        hi.setflags(write=False)
        out.append((lo, hi))
    return tuple(out)


def overlap(a, b):
    """Intersection of two per-dim interval tuples, or None if empty."""
    out = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b))
    if any(lo >= hi for lo, hi in out):
        return None
    return out
