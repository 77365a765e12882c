"""Bytes sent per rank, by the conventions of DESIGN.md section 3.

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

from ..core.blocks import all_blocks, group_size
from ..core.subaxes import all_digits

__all__ = ["collective_bytes", "exchange_bytes", "lower_bound_bytes"]

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


def _volumes(boxes):
    vol = None
    for lo, hi in boxes:
        n = np.maximum(hi - lo, 0)
        vol = n if vol is None else vol * n
    return vol


def _held(shape, before, after, mesh_axes):
    """Per rank: elements of its target block that it already holds."""
    src = all_blocks(shape, before, mesh_axes)
    dst = all_blocks(shape, after, mesh_axes)
    inter = [(np.maximum(s0, d0), np.minimum(s1, d1)) for (s0, s1), (d0, d1) in zip(src, dst)]
    size = math.prod(s for _, s in mesh_axes)
    if not shape:
        return np.ones(size, dtype=np.int64), np.ones(size, dtype=np.int64)
    return _volumes(inter), _volumes(dst)


@lru_cache(maxsize=256)
def missing_elements(shape, before, after, mesh_axes):
    """Per rank: elements of its ``after`` block not in its ``before`` block."""
    held, need = _held(shape, before, after, mesh_axes)
    return need - held


@lru_cache(maxsize=256)
def exchange_bytes(shape, itemsize, before, after, mesh_axes):
    """``(bytes, exact)``: max over ranks of bytes an exchange sends or receives.

    With uneven shards a rank may receive more than any rank sends; the
    larger figure is the per-rank traffic, and it is what the lower bound
    (a bound on received bytes) is compared with.
    """
    size = math.prod(s for _, s in mesh_axes)
    sources = math.prod(group_size(g) for g in before.dims)
    if size * sources > EXACT_PAIR_LIMIT or not shape:
        return int(missing_elements(shape, before, after, mesh_axes).max(initial=0)) * itemsize, \
            not shape
    sent = _exact_sends(shape, before, after, mesh_axes).max(initial=0)
    recv = missing_elements(shape, before, after, mesh_axes).max(initial=0)
    return int(max(sent, recv)) * itemsize, True


def _rank_strides(mesh_axes):
    """Rank increment of one unit of each sub-axis digit."""
    strides, stride = {}, 1
    for name, size in reversed(mesh_axes):
        strides[name] = stride
        stride *= size
    return {s: s.stride * strides[s.name] for s in all_digits(mesh_axes)}


def _flat(digits, group):
    q = 0
    for s in group:
        q = q * s.size + digits[s]
    return q


def _set(ranks, digits, strides, group, q):
    """Ranks with the digits of ``group`` replaced by the mixed-radix value ``q``."""
    for s in reversed(group):
        q, d = np.divmod(q, s.size)
        ranks = ranks + (d - digits[s]) * strides[s]
    return ranks


def _box_volume(src, dst, r, swap=False):
    """Per rank q: |src(q) & dst(r[q])|, or |src(r[q]) & dst(q)| with ``swap``."""
    vol = None
    for (s0, s1), (d0, d1) in zip(src, dst):
        if swap:
            n = np.maximum(np.minimum(s1[r], d1) - np.maximum(s0[r], d0), 0)
        else:
            n = np.maximum(np.minimum(s1, d1[r]) - np.maximum(s0, d0[r]), 0)
        vol = n if vol is None else vol * n
    return vol


def _exact_sends(shape, before, after, mesh_axes):
    """Per rank: elements an exchange sends to others (see routing.exchange_sends)."""
    digits, strides = all_digits(mesh_axes), _rank_strides(mesh_axes)
    taken = before.used() | frozenset(before.partial)
    shard = tuple(s for s in digits if s in before.used())
    free = tuple(s for s in digits if s not in taken)
    nfree = group_size(free)
    size = math.prod(s for _, s in mesh_axes)
    ranks = np.arange(size)
    own_shard, own_free = _flat(digits, shard), _flat(digits, free)
    src = all_blocks(shape, before, mesh_axes)
    dst = all_blocks(shape, after, mesh_axes)
    sent = np.zeros(size, dtype=np.int64)
    for u in range(group_size(shard)):
        r = _set(ranks, digits, strides, shard, np.full(size, u))
        r = _set(r, digits, strides, free, (own_free - u) % nfree)
        sent += np.where(own_shard != u, _box_volume(src, dst, r), 0)
    return sent


def group_sends(shape, itemsize, op, before, after, mesh_axes):
    """Max over ranks of bytes sent to (or received from) the rest of a group.

    Exact for all-to-all and reduce-scatter with uneven lengths, where the
    (G-1)/G convention undercounts.  Within a group the data is conserved,
    so a rank of an all-to-all sends all of its block but what it keeps and
    receives all of its new block but what it had; in a ring reduce-scatter
    every part but one passes through each member.
    """
    src = all_blocks(shape, before, mesh_axes)
    dst = all_blocks(shape, after, mesh_axes)
    have, need = _volumes(src), _volumes(dst)
    if op == "reduce_scatter":
        # a ring reduce-scatter passes every part but one through each rank
        sent, recv = have - need, have.max(initial=0) - (need.min() if need.size else 0)
    else:
        kept = _volumes([(np.maximum(s0, d0), np.minimum(s1, d1))
                         for (s0, s1), (d0, d1) in zip(src, dst)])
        sent, recv = have - kept, need - kept
    return int(max(sent.max(initial=0), recv.max(initial=0))) * itemsize


def lower_bound_bytes(shape, itemsize, src, dst, mesh_axes):
    """Max over ranks of target bytes not already held (see module docstring).

    A rank that holds only a partial contribution does not hold the reduced
    value: when partial sums are reduced, the whole target block is missing.
    """
    if any(s not in dst.partial for s in src.partial):
        return math.prod(-(-n // group_size(d)) for n, d in zip(shape, dst.dims)) * itemsize
    return int(missing_elements(shape, src, dst, mesh_axes).max(initial=0)) * itemsize


def exchange_messages(shape, before, after):
    """Messages a rank receives in an exchange, at most: the product over
    dims of the most ``before`` blocks that one ``after`` block meets (each
    source block comes from one holder)."""
    return math.prod(most_met(n, a, b)
                     for n, b, a in zip(shape, before.counts(), after.counts()))


def most_met(n, k_from, k_to):
    """The most of ``k_to`` chunks of ``n`` that one of ``k_from`` chunks meets."""
    c_from, c_to = -(-n // k_from), -(-n // k_to)
    most = 1
    for p in range(k_from):
        lo, hi = min(n, p * c_from), min(n, (p + 1) * c_from)
        if hi > lo:
            most = max(most, -(-hi // c_to) - lo // c_to)
    return most
