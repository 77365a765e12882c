"""Bytes sent per rank, by the conventions of docs/semantics.md (Plans).

With ``G`` the sub-communicator size and ``operand`` the largest local input
(for all-to-all and reduce-scatter on uneven shards, and for exchange, the
exact count: the larger of what a rank sends and what it receives):
all-gather ``operand*(G-1)``; all-to-all and reduce-scatter
``operand*(G-1)/G``; all-reduce ``2*operand*(G-1)/G``; permute ``operand``
if some rank sends to another; exchange the exact bytes sent to other ranks.
The lower bound is the most target bytes a rank does not already hold.
"""

import math
from functools import lru_cache

import numpy as np

from ..core.blocks import (SLAB, chunk, local_shape, slab_digit, slab_index, slab_interval,
                           slabs)
from ..core.subaxes import group_size, mesh_sub_axes

__all__ = ["collective_bytes", "exchange_bytes", "lower_bound_bytes", "most_missing",
           "block_extremes", "group_sends", "exchange_messages", "most_met"]

# Above this many (receiver, source block) pairs the exchange volume is taken
# from the receive side (exact per receiver) instead of the send side.
EXACT_PAIR_LIMIT = 1 << 16


def collective_bytes(op, operand, group):
    """Bytes each rank sends in collective ``op`` on ``group`` sub-axes."""
    g = group_size(group)
    if op == "all_gather":
        return operand * (g - 1)
    if op in ("all_to_all", "reduce_scatter"):
        return operand * (g - 1) // g
    if op == "all_reduce":
        return 2 * operand * (g - 1) // g
    raise ValueError(f"no byte convention for collective {op!r}")


@lru_cache(maxsize=1024)
def block_extremes(shape, before, after, mesh_axes):
    """``(missing, unsent)``: max over ranks of the elements of the rank's
    ``after`` block not in its ``before`` block, and of the reverse.

    Computed over the digits of the sub-axes either layout uses, a slab at a
    time (:func:`mpiredist.core.blocks.slabs`): no per-rank arrays.
    """
    space = mesh_sub_axes(mesh_axes, before.used() | after.used())
    missing = unsent = 0
    for combos in slabs(space):
        have = need = kept = 1
        for n, b, a in zip(shape, before.dims, after.dims):
            s0, s1 = slab_interval(n, b, space, combos)
            d0, d1 = slab_interval(n, a, space, combos)
            have, need = have * (s1 - s0), need * (d1 - d0)
            kept = kept * np.maximum(np.minimum(s1, d1) - np.maximum(s0, d0), 0)
        missing = max(missing, int(np.max(need - kept)))
        unsent = max(unsent, int(np.max(have - kept)))
    return missing, unsent


def most_missing(shape, before, after, mesh_axes):
    """Max over ranks: elements of its ``after`` block not in its ``before`` block."""
    return block_extremes(shape, before, after, mesh_axes)[0]


@lru_cache(maxsize=1024)
def exchange_bytes(shape, itemsize, before, after, mesh_axes):
    """``(bytes, exact)``: max over ranks of bytes an exchange sends or receives.

    With uneven shards a rank may receive more than any rank sends; the
    larger figure is the per-rank traffic, and it is what the lower bound
    (a bound on received bytes) is compared with.
    """
    size = math.prod(s for _, s in mesh_axes)
    sources = math.prod(group_size(g) for g in before.dims)
    recv = most_missing(shape, before, after, mesh_axes)
    if size * sources > EXACT_PAIR_LIMIT or not shape:
        return recv * itemsize, not shape
    return max(_most_sent(shape, before, after, mesh_axes), recv) * itemsize, True


def _most_sent(shape, before, after, mesh_axes):
    """Max over ranks of elements an exchange sends to others, by the holder rule
    of :mod:`mpiredist.planning.pieces` evaluated without enumerating ranks.

    Receiver ``r`` takes block ``u`` from the holder whose free digits are
    ``r``'s free index plus ``r``'s shard index; so rank ``q`` sends, for
    each setting ``u`` of the shard digits but its own, the part of its
    block that the rank with shard digits ``u`` and free digits
    ``own free - u`` needs.  Arrays are (ranks of a slab) x (all ``u``),
    at most ``SLAB`` entries (the caller keeps ranks x sources that small).
    """
    space = mesh_sub_axes(mesh_axes)            # combination number == rank
    used = before.used()
    taken = used | frozenset(before.partial)
    shard = tuple(s for s in space if s in used)
    free = tuple(s for s in space if s not in taken)
    u = np.arange(group_size(shard), dtype=np.int64)[None, :]
    most = 0
    for q in slabs(space, SLAB // u.size):
        q = q[:, None]
        src = [slab_interval(n, g, space, q) for n, g in zip(shape, before.dims)]
        rotated = (slab_index(free, space, q) - u) % group_size(free)
        where = dict.fromkeys(shard, (shard, u)) | dict.fromkeys(free, (free, rotated))
        vol = _overlap_volume(shape, src, after,
                              lambda s: slab_digit(s, *where.get(s, (space, q))))
        sent = np.where(slab_index(shard, space, q) != u, vol, 0).sum(axis=1)
        most = max(most, int(np.max(sent)))
    return most


def _overlap_volume(shape, src, after, digit):
    """Per rank: elements of its ``src`` boxes in the ``after`` block whose
    sub-axis digits ``digit(s)`` gives."""
    vol = 1
    for n, (s0, s1), group in zip(shape, src, after.dims):
        c, p = chunk(n, group_size(group)), 0
        for s in group:
            p = p * s.size + digit(s)
        d0, d1 = np.minimum(p * c, n), np.minimum(p * c + c, n)
        vol = vol * np.maximum(np.minimum(s1, d1) - np.maximum(s0, d0), 0)
    return vol


def group_sends(shape, itemsize, op, before, after, mesh_axes):
    """Max over ranks of bytes sent to (or received from) the rest of a group.

    Exact for all-to-all and reduce-scatter with uneven lengths, where the
    (G-1)/G convention undercounts.  Within a group the data is conserved,
    so a rank of an all-to-all sends all of its block but what it keeps and
    receives all of its new block but what it had; in a ring reduce-scatter
    every part but one passes through each member: the largest ``before``
    block less the smallest ``after`` block (the first and the last shard of
    every dim, since each dim's shard index ranges freely).
    """
    if op == "reduce_scatter":
        least = math.prod(max(0, n - (group_size(g) - 1) * chunk(n, group_size(g)))
                          for n, g in zip(shape, after.dims))
        return max(0, math.prod(local_shape(shape, before)) - least) * itemsize
    return max(block_extremes(shape, before, after, mesh_axes)) * itemsize


def lower_bound_bytes(shape, itemsize, src, dst, mesh_axes):
    """Max over ranks of target bytes not already held (see module docstring).

    A rank that holds only a partial contribution does not hold the reduced
    value: when partial sums are reduced, the whole target block is missing.
    """
    if any(s not in dst.partial for s in src.partial):
        return math.prod(-(-n // group_size(d)) for n, d in zip(shape, dst.dims)) * itemsize
    return most_missing(shape, src, dst, mesh_axes) * itemsize


def exchange_messages(shape, before, after):
    """Messages a rank receives in an exchange, at most: the product over
    dims of the most ``before`` blocks that one ``after`` block meets (each
    source block comes from one holder)."""
    return math.prod(most_met(n, a, b)
                     for n, b, a in zip(shape, before.counts(), after.counts()))


@lru_cache(maxsize=4096)
def most_met(n, k_from, k_to):
    """The most of ``k_to`` chunks of ``n`` that one of ``k_from`` chunks meets.

    A full ``from`` chunk starting at ``lo`` meets ``ceil((lo % c_to +
    c_from) / c_to)`` chunks, and ``lo % c_to`` repeats with period
    ``c_to / gcd(c_from, c_to)``: one period of full chunks (``SLAB`` at a
    time, until the most possible is found) and the last chunk decide.
    """
    if n == 0:
        return 1
    c_from, c_to = -(-n // k_from), -(-n // k_to)
    m = -(-n // c_from)                     # non-empty from chunks; the last may be short
    ceiling = -(-(c_to - 1 + c_from) // c_to)
    most = max(1, -(-n // c_to) - (m - 1) * c_from // c_to)
    full = min(m - 1, c_to // math.gcd(c_from, c_to))
    for start in range(0, full, SLAB):
        if most >= ceiling:
            break
        lo = np.arange(start, min(start + SLAB, full), dtype=np.int64) * c_from
        most = max(most, int(np.max(-(-(lo + c_from) // c_to) - lo // c_to)))
    return most
