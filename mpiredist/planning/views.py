"""Views that split one dim at a node boundary, for plans across nodes (pure).

A dim of length ``N`` whose shards go over sub-axes ``(a, b, ...)`` with the
major ones ``a`` crossing nodes and the rest inside them is, when the
lengths divide evenly, the same memory as a view of shape ``(k, N / k)``
(``k`` the size of the crossing part) sharded ``[{a}, {b, ...}]``: every
rank's block is one block of the view, byte for byte.  On that view the
crossing part of the dim is a dim of its own, so a plan can gather or
reduce-scatter it *first* (all-gather) or *last* (reduce-scatter), while
the block that crosses the links is small, which on the unsplit dim would
need a strided block no layout describes.  Example, ``x = 8`` over two
nodes of four (``x:0`` crosses), an all-gather ``[{x}, {}] -> [{}, {}]``::

    unsplit:  all_gather(x) on dim 0               7/8 of the array crosses
    view:     [{x:0}, {x:1,x:2}, {}] -> [{}, {}, {}]
              all_gather(x:0) on dim 0, then        1/8 crosses (the bound)
              all_gather(x:1,x:2) on dim 1 inside nodes

The planner (:func:`mpiredist.planning.planner.plan`, with a topology and
a profile that prices across-node bytes) plans on each such view as on any
shape and keeps it when it is predicted faster; the plan then records its
``view_shape`` and its steps run on it.  The runtime reshapes the caller's
block to the view's (splitting one dim is a view of any strided array, no
copy) and the result back.
"""

from ..core.subaxes import SubLayout, group_size

__all__ = ["split_group", "split_layout", "node_views"]


def split_group(group, k):
    """``(major, minor)`` groups of ``group`` on dim ``(k, N / k)`` of a split
    dim, or None where the blocks would not be blocks of the view.

    A group whose leading sub-axes multiply to exactly ``k`` splits after
    them; one whose size divides ``k`` stays whole on the major dim (its
    blocks are whole rows of the view).  Lengths must divide evenly (the
    caller checks).
    """
    if k % group_size(group) == 0:
        return tuple(group), ()
    size = 1
    for i, s in enumerate(group):
        size *= s.size
        if size == k:
            return tuple(group[:i + 1]), tuple(group[i + 1:])
        if size > k or k % size:
            return None
    return None


def split_layout(layout, d, k):
    """``layout`` (a :class:`SubLayout`) on the view that splits dim ``d`` at
    ``k``, or None (see :func:`split_group`)."""
    parts = split_group(layout.dims[d], k)
    if parts is None:
        return None
    dims = layout.dims[:d] + parts + layout.dims[d + 1:]
    return SubLayout(dims, layout.partial, layout.op)


def split_shape(shape, d, k):
    """``shape`` with dim ``d`` split into ``(k, shape[d] // k)``."""
    return tuple(shape[:d]) + (k, shape[d] // k) + tuple(shape[d + 1:])


def node_views(shape, S, T, crossing):
    """``[(view_shape, S', T')]``: each view that splits a dim at its crossing part.

    For each dim whose group in ``S`` or ``T`` starts with sub-axes that
    cross nodes (``crossing``) followed by some that do not, the view at the
    size of that leading part, where the dim's length divides evenly by both
    groups and both layouts are layouts of the view.
    """
    out, seen = [], set()
    for d, n in enumerate(shape):
        for group in (S.dims[d], T.dims[d]):
            lead = 0
            while lead < len(group) and group[lead] in crossing:
                lead += 1
            if not lead or lead == len(group):
                continue
            k = group_size(group[:lead])
            if (d, k) in seen or n % k or any(n % group_size(g) for g in (S.dims[d],
                                                                        T.dims[d])):
                continue
            seen.add((d, k))
            s, t = split_layout(S, d, k), split_layout(T, d, k)
            if s is not None and t is not None:
                out.append((split_shape(shape, d, k), s, t))
    return out
