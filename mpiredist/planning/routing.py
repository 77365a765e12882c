"""Who talks to whom in a collective: sub-communicator members and permute pairs.

Pure functions of the mesh, the layouts and a rank's digits (no MPI).  Who
sends which piece in an exchange is the piece model's
(:mod:`mpiredist.planning.pieces`).

Permute (layouts with the same shard count per dim): rank ``r`` receives the
block it needs from the rank ``s`` whose source block is ``r``'s target block;
digits that neither layout constrains are copied from ``r``, the others are
matched by mixed-radix order, which makes the pairing a bijection.
"""

import itertools

from ..core.blocks import block_index
from ..core.subaxes import sub_axes

__all__ = ["all_sub_axes", "digits_to_rank", "member_ranks", "permute_source",
           "permute_dest", "member_digits"]


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
