"""Reductions within a budget: how much one call may carry, and reduction by parts.

A reduction call of the transport (``allreduce``, ``reduce_scatter``)
carries at most the transport's count limit and at most the reduction room
(half the workspace), so that the buffers the library allocates inside it
stay within the memory contract (:func:`reduce_limit`); larger ones, and
every reduction of a dtype the transport cannot reduce (float16, bfloat16
over MPI), are combined by numpy from pipelined parts
(:func:`reduce_by_parts`), in a fixed order, so replicated results are
bitwise equal.
"""

import math

from ..planning.pieces import part_limit
from .exchange import Recv, Send, move

__all__ = ["reduce_limit", "reduction_rings", "reduce_by_parts"]


def reduce_limit(ctx, group):
    """Elements per reduction call on ``group``: the count limit, and the
    reduction room.

    -1 for a dtype the transport cannot reduce (float16, bfloat16 over MPI,
    also as the int16 bits of device arrays): no call is small enough, so
    numpy (or :meth:`Context.combiner`) combines every part, in the same
    fixed order as larger reductions of other dtypes.
    """
    if ctx.dtype != ctx.values or not group.reduces(ctx.dtype):
        return -1
    return max(1, min(ctx.count_limit, ctx.reduce_room // ctx.itemsize))


def reduction_rings(ctx, room):
    """Bytes for a reduction's rings: the pack room, at least the reduction
    room (W/2, which the budget sets aside for reductions: the library's
    buffers in rounds of ``Reduce_scatter`` or ``Allreduce``, which this
    replaces) and at most twice it (fresh rings of tens of MiB cost more in
    page faults than larger parts save: 8 ranks, c11 36 ms with 8.5 MiB
    rings, 45-68 ms with 55 MiB).  From the plan and W: alike on every rank."""
    return min(max(room, ctx.reduce_room), 2 * ctx.reduce_room)


def reduce_by_parts(ctx, group, source, boxes, target, reducer, send_packs, room):
    """A reduce-scatter by parts: ``boxes[m]`` (relative to ``source``) goes to
    member m; what the members send this rank is combined into ``target`` (a
    :class:`~mpiredist.runtime.memory.Region`) by ``reducer``, this member's
    own piece first, then member me + 1, me + 2, ... (keys ``(p - q) mod g``):
    the same order on every run and every replica of the group.  Memory:
    ``room`` bytes of rings (:func:`reduction_rings`); the transport reduces
    nothing, so it allocates nothing.
    """
    limit = part_limit(ctx.itemsize, room, (send_packs, True))
    g, me = group.size, group.rank
    whole = ((0,) * len(target.shape), tuple(target.shape))
    sends = [Send(((me - m) % g,), m, boxes[m], False) for m in range(g)
             if m != me and math.prod(boxes[m][1])]
    recvs = [Recv(((m - me) % g,), m, whole, False, m != me, boxes[me] if m == me else None)
             for m in range(g) if math.prod(whole[1])]
    move(ctx, group, sends, recvs, source, target, limit, room // ctx.itemsize, reducer)
