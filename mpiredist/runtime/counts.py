"""Message sizes on every MPI library: counts of 2**31 and more, and bounded reductions.

MPI-3 libraries (Open MPI 5 among them) take counts and displacements as C
``int``; only MPI-4 added the large-count calls that mpi4py uses when the
library has them (MPICH 4 and later).  So no call here gets a count or a
displacement above :func:`count_limit` in its own units:

- a run of bytes longer than the limit goes as one element of a contiguous
  datatype of that length (mpi4py builds it BigMPI's way on MPI-3
  libraries): :func:`message`;
- packed moves cut their parts to the limit (:mod:`mpiredist.runtime.packing`);
- reductions go in rounds of at most the limit, and at most half the
  workspace, so that the buffers MPI allocates inside a reduction stay
  within the memory contract: :func:`allreduce`, :func:`reduce_scatter`.

``MPIREDIST_COUNT_LIMIT`` (a number of units) lowers the limit, e.g. to
exercise these paths with small arrays in tests; it must be the same on
every rank, like the MPI library itself.
"""

import math
import os

import numpy as np

from ..core.backend import synchronize

__all__ = ["INT_MAX", "count_limit", "as_bytes", "unit", "message", "allreduce", "reduce_scatter",
           "reduce_scatter_parts", "reduce_limit"]

INT_MAX = (1 << 31) - 1
ENV = "MPIREDIST_COUNT_LIMIT"


def count_limit(MPI):
    """The largest count or displacement one MPI call may carry, in its units."""
    value = os.environ.get(ENV, "").strip()
    if value:
        return max(1, int(value))
    return (1 << 62) if MPI.Get_version() >= (4, 0) else INT_MAX


def as_bytes(array):
    """The memory of a C-contiguous array as a flat byte array (a view)."""
    return array.reshape(-1).view(np.uint8)


def unit(ctx, nbytes):
    """``(count, datatype)`` for ``nbytes`` bytes: plain bytes, or one element
    of a contiguous datatype of that length beyond the count limit."""
    if nbytes <= ctx.count_limit:
        return nbytes, ctx.MPI.BYTE
    t = ctx.MPI.BYTE.Create_contiguous(nbytes).Commit()
    ctx.types.append(t)
    return 1, t


def message(ctx, array, nbytes, offset=0):
    """Buffer spec of ``nbytes`` of ``array``'s memory from byte ``offset``.

    Within the count limit: plain bytes at an offset.  Beyond it: a view of
    those bytes as one element of a contiguous datatype of ``nbytes``
    (freed with the step's other datatypes).
    """
    B = ctx.MPI.BYTE
    if nbytes <= ctx.count_limit and offset <= ctx.count_limit:
        return [array, (nbytes, offset), B]
    count, t = unit(ctx, nbytes)
    return [as_bytes(array)[offset:offset + nbytes], count, t]


def reduce_limit(ctx):
    """Elements per reduction call: the count limit, and half the workspace."""
    return max(1, min(ctx.count_limit, ctx.reduce_room // ctx.itemsize))


def allreduce(ctx, comm, send, recv, op):
    """``recv = op(send over comm)`` elementwise, in rounds (``send`` None: in place).

    ``send`` and ``recv`` are flat C-contiguous arrays of the same length on
    every member (a partial group holds equal blocks).
    """
    MPI, typed, n = ctx.MPI, ctx.typed(), recv.size
    step = reduce_limit(ctx)
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        src = MPI.IN_PLACE if send is None else [send[lo:hi], typed]
        comm.Allreduce(src, [recv[lo:hi], typed], op)


def reduce_scatter(ctx, comm, packed, counts, out, op, in_place=False):
    """Reduce the parts laid out one after another in ``packed`` (``counts[m]``
    elements for member ``m``) and leave member ``me``'s in ``out``.

    One ``Reduce_scatter`` when everything fits one round; otherwise the
    rounds of :func:`reduce_scatter_parts` over flat views of the parts.
    With ``in_place`` ``out`` is the front of ``packed``: round ``k`` writes
    elements ``[k*w, (k+1)*w)`` of ``out``, which lie at or before slice
    ``k`` of every part, already copied out by this or an earlier round.
    """
    MPI, typed = ctx.MPI, ctx.typed()
    total, step = sum(counts), reduce_limit(ctx)
    if total <= step:
        if in_place:
            comm.Reduce_scatter(MPI.IN_PLACE, [packed, total, typed], counts, op)
        else:
            comm.Reduce_scatter([packed, typed], [out, typed], counts, op)
        return
    at, parts = 0, []
    for c in counts:                    # each part a flat view: rounds as for any parts
        parts.append(packed[at:at + c])
        at += c
    reduce_scatter_parts(ctx, comm, parts, out, op)


def reduce_scatter_parts(ctx, comm, parts, out, op):
    """Reduce-scatter of member parts given as (strided) views, in rounds.

    Member ``m``'s part is cut into boxes of at most
    ``reduce_limit // g`` elements (:func:`~mpiredist.runtime.packing.parts`:
    every member cuts every part alike); round ``k`` packs box ``k`` of
    each part into a staging buffer, reduces it into a second one, and puts
    this member's reduced box in place in ``out``.  No copy of the whole
    block is made: the staging buffers hold one round.
    """
    from .packing import _index, parts as cut

    typed, me, g = ctx.typed(), comm.Get_rank(), len(parts)
    width = max(1, reduce_limit(ctx) // g)
    boxes = [cut(tuple(p.shape), width) for p in parts]
    rounds = max(len(b) for b in boxes)
    staging = ctx.xp.empty(g * width + width, dtype=out.dtype)
    back = staging[g * width:]
    for k in range(rounds):
        counts, at = [], 0
        for m in range(g):
            if k < len(boxes[m]) and math.prod(boxes[m][k][1]):
                starts, shape = boxes[m][k]
                n = math.prod(shape)
                staging[at:at + n].reshape(shape)[...] = parts[m][_index((starts, shape))]
                counts.append(n)
                at += n
            else:
                counts.append(0)
        synchronize(staging)
        comm.Reduce_scatter([staging[:at], typed], [back[:counts[me]], typed], counts, op)
        if counts[me]:
            starts, shape = boxes[me][k]
            out[_index((starts, shape))] = back[:counts[me]].reshape(shape)
