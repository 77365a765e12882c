"""Who talks to whom: sub-communicator members, permute pairs, exchange peers.

Pure functions of the mesh, the layouts and a rank's digits (no MPI), shared
by the simulator and the MPI executor so that both move the same data.

Permute (layouts with the same shard count per dim): rank ``r`` receives the
block it needs from the rank ``s`` whose source block is ``r``'s target block;
digits that neither layout constrains are copied from ``r``, the others are
matched by mixed-radix order, which makes the pairing a bijection.

Exchange: rank ``r`` takes a piece of its target block from itself when it
holds it.  Otherwise the holders of that source block differ only in the
free digits (sub-axes the source neither shards nor holds partial sums
over); ``r`` picks the holder whose free digits are its own rotated by the
index of its own source block, which spreads the receivers of one block
evenly over its holders.
"""

import itertools

from ..core.blocks import block_index, group_size, interval, overlap, rank_block
from ..core.subaxes import sub_axes

__all__ = ["all_sub_axes", "digits_to_rank", "member_ranks", "permute_source",
           "permute_dest", "exchange_recvs", "exchange_sends", "member_digits"]


def all_sub_axes(mesh):
    """All sub-axes of ``mesh`` in mesh order, major digits first."""
    subs = sub_axes(mesh.axes)
    return tuple(s for name in mesh.names for s in subs[name])


def digits_to_rank(mesh, digits):
    subs = sub_axes(mesh.axes)
    coords = [sum(digits[s] * s.stride for s in subs[name]) for name in mesh.names]
    return mesh.rank(coords)


def member_digits(digits, group, m):
    """Digits of member ``m`` (mixed-radix index over ``group``) of the group of ``digits``."""
    d = dict(digits)
    _unflatten(d, group, m)
    return d


def member_ranks(mesh, digits, group):
    """Ranks of the sub-communicator over ``group`` that contains ``digits``.

    Ordered by the mixed-radix index of ``group`` (first sub-axis major).
    """
    out, d = [], dict(digits)
    for combo in itertools.product(*(range(s.size) for s in group)):
        d.update(zip(group, combo))
        out.append(digits_to_rank(mesh, d))
    return out


def _set_block(digits, dims, blocks):
    """Write into ``digits`` the digits of ``dims`` that give block ``blocks``."""
    for group, p in zip(dims, blocks):
        for s in reversed(group):
            p, digits[s] = divmod(p, s.size)


def _unflatten(digits, group, q):
    for s in reversed(group):
        q, digits[s] = divmod(q, s.size)


def permute_source(mesh, before, after, digits):
    """Rank whose ``before`` block is the ``after`` block of the rank ``digits``."""
    everything = all_sub_axes(mesh)
    used_b, used_a = before.used(), after.used()
    free_b = [s for s in everything if s not in used_b and s in used_a]
    free_a = [s for s in everything if s not in used_a and s in used_b]
    src = dict(digits)
    _set_block(src, before.dims, [block_index(g, digits) for g in after.dims])
    _unflatten(src, free_b, block_index(free_a, digits))
    return digits_to_rank(mesh, src)


def permute_dest(mesh, before, after, digits):
    """Rank that receives the ``before`` block of the rank ``digits``."""
    return permute_source(mesh, after, before, digits)


def free_axes(mesh, before):
    """Sub-axes that neither shard ``before`` nor carry its partial sums."""
    taken = before.used() | frozenset(before.partial)
    return tuple(s for s in all_sub_axes(mesh) if s not in taken)


def shard_axes(mesh, before):
    """Sub-axes that shard ``before``, in mesh order."""
    used = before.used()
    return tuple(s for s in all_sub_axes(mesh) if s in used)


def _holder(mesh, before, digits, blocks):
    d = dict(digits)
    _set_block(d, before.dims, blocks)
    if d == digits:
        return digits_to_rank(mesh, d)
    free = free_axes(mesh, before)
    shift = block_index(shard_axes(mesh, before), digits)
    _unflatten(d, free, (block_index(free, digits) + shift) % group_size(free))
    return digits_to_rank(mesh, d)


def _block_range(n, k, lo, hi):
    """Indices of the shards (of ``k``) that meet ``[lo, hi)``."""
    if lo >= hi:
        return range(0)
    c = -(-n // k)
    return range(lo // c, min(k, -(-hi // c)))


def exchange_recvs(mesh, shape, before, after, digits):
    """List of ``(rank, box)``: where each piece of this rank's target comes from.

    ``box`` is the global per-dim ``(start, stop)`` of the piece.
    """
    mine = rank_block(shape, after, digits)
    ranges = [_block_range(n, group_size(g), lo, hi)
              for n, g, (lo, hi) in zip(shape, before.dims, mine)]
    out = []
    for blocks in itertools.product(*ranges):
        src_box = tuple(interval(n, group_size(g), p)
                        for n, g, p in zip(shape, before.dims, blocks))
        box = overlap(mine, src_box)
        if box is not None:
            out.append((_holder(mesh, before, digits, blocks), box))
    return out


def exchange_sends(mesh, shape, before, after, digits):
    """List of ``(rank, box)``: the pieces of this rank's source that others need.

    The mirror image of :func:`exchange_recvs`: for each setting ``u`` of the
    shard digits other than its own, exactly one rank with those digits picks
    this rank as holder.
    """
    mine = rank_block(shape, before, digits)
    shard, free = shard_axes(mesh, before), free_axes(mesh, before)
    own, nfree = block_index(free, digits), group_size(free)
    out = []
    for combo in itertools.product(*(range(s.size) for s in shard)):
        d = dict(digits)
        d.update(zip(shard, combo))
        if d == digits:
            continue
        _unflatten(d, free, (own - block_index(shard, d)) % nfree)
        box = overlap(mine, rank_block(shape, after, d))
        if box is not None:
            out.append((digits_to_rank(mesh, d), box))
    return out
