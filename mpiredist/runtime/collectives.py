"""MPI collectives that work for any message size, and reductions within a budget.

MPI-3 libraries (Open MPI 5 among them) take counts and displacements as C
``int``; only MPI-4 added the large-count calls that mpi4py uses when the
library has them (MPICH 4 and later).  So no call here gets a count or a
displacement above :func:`count_limit` in its own units:

- a run of bytes longer than the limit goes as one element of a contiguous
  datatype of that length (mpi4py builds it BigMPI's way on MPI-3
  libraries): :func:`message`, :func:`unit`;
- an all-gather of byte slots whose displacements pass the limit goes as
  point-to-point messages (:func:`allgather`);
- a reduction call carries at most the limit, and at most the reduction
  room (half the workspace), so that the buffers MPI allocates inside it
  stay within the memory contract (:func:`reduce_limit`); larger ones are
  combined by numpy from pipelined parts instead
  (:func:`mpiredist.runtime.steps.reduce_by_parts`), and so are all
  reductions of dtypes that MPI lacks (float16, bfloat16).

Every call here adds the MPI calls it makes to ``ctx.calls`` (what a
:class:`~mpiredist.runtime.steps.StepRecord` reports).

``MPIREDIST_COUNT_LIMIT`` (a number of units) lowers the limit, e.g. to
exercise these paths with small arrays in tests; it must be the same on
every rank, like the MPI library itself.
"""

import os

import numpy as np

from ..core.backend import c_contiguous, synchronize
from ..planning.planner import mpi_reduces

__all__ = ["INT_MAX", "count_limit", "as_bytes", "unit", "message", "mpi_op", "typed",
           "reduce_limit", "allgather", "allreduce", "reduce_scatter"]

INT_MAX = (1 << 31) - 1
ENV = "MPIREDIST_COUNT_LIMIT"
GATHER_TAG = 7


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
    return 1, ctx.keep(ctx.MPI.BYTE.Create_contiguous(nbytes).Commit())


def message(ctx, array, nbytes, offset=0):
    """Buffer spec of ``nbytes`` of ``array``'s memory from byte ``offset``.

    Within the count limit: plain bytes at an offset.  Beyond it: a view of
    those bytes as one element of a contiguous datatype of ``nbytes``
    (freed with the step's other datatypes).
    """
    if nbytes <= ctx.count_limit and offset <= ctx.count_limit:
        return [array, (nbytes, offset), ctx.MPI.BYTE]
    count, t = unit(ctx, nbytes)
    return [as_bytes(array)[offset:offset + nbytes], count, t]


def mpi_op(ctx, op):
    """The MPI reduction of partial op ``op`` (logical for bool)."""
    MPI = ctx.MPI
    if ctx.dtype == np.bool_:
        return {"sum": MPI.LOR, "max": MPI.LOR, "min": MPI.LAND, "prod": MPI.LAND}[op]
    return {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}[op]


def typed(ctx):
    """The predefined MPI datatype of the dtype (reductions need one).

    ``Datatype.fromcode`` is mpi4py's public map from a numpy type code to
    the predefined datatype; ``mpi4py.util.dtlib.from_numpy_dtype``
    returns a duplicate instead, which MPICH refuses in reductions.
    """
    return ctx.MPI.Datatype.fromcode(ctx.dtype.char)


def reduce_limit(ctx):
    """Elements per reduction call: the count limit, and the reduction room.

    -1 for a dtype that MPI cannot reduce (float16, bfloat16, also as the
    int16 bits of device arrays): no call is small enough, so numpy (or
    :meth:`Context.combiner`) combines every part, in the same fixed order as
    larger reductions of other dtypes.
    """
    if ctx.dtype != ctx.values or not mpi_reduces(ctx.dtype):
        return -1
    return max(1, min(ctx.count_limit, ctx.reduce_room // ctx.itemsize))


def allgather(ctx, comm, own, out, nbytes, offsets):
    """Member m's ``nbytes[m]`` bytes land at byte ``offsets[m]`` of ``out`` (C-contiguous).

    ``own`` holds this member's values (an array), or is None when its slot
    of ``out`` already does (``MPI_IN_PLACE``).  Equal slots one after
    another take ``Allgather`` (much faster in MPICH than ``Allgatherv``);
    displacements beyond the count limit go as point-to-point messages.
    """
    MPI, me = ctx.MPI, comm.Get_rank()
    even = len(set(nbytes)) == 1 and offsets == [m * nbytes[0] for m in range(len(nbytes))]
    fits = offsets[-1] + nbytes[-1] <= ctx.count_limit
    slot = as_bytes(out)[offsets[me]:offsets[me] + nbytes[me]]
    if own is not None and (not c_contiguous(own) or not (even or fits)):
        slot.view(own.dtype).reshape(own.shape)[...] = own
        own = None
    send = MPI.IN_PLACE if own is None else message(ctx, own, nbytes[me])
    if own is not None:
        synchronize(own)
    synchronize(out)
    if even:
        ctx.calls += 1
        comm.Allgather(send, [out, *unit(ctx, nbytes[0])])
        return
    if fits:
        ctx.calls += 1
        comm.Allgatherv(send, [out, nbytes, offsets, MPI.BYTE])
        return
    n, requests = comm.Get_size(), []
    for k in range(1, n):
        src, dst = (me - k) % n, (me + k) % n
        if nbytes[src]:
            requests.append(comm.Irecv(message(ctx, out, nbytes[src], offsets[src]), src,
                                       GATHER_TAG))
        if nbytes[me]:
            requests.append(comm.Isend(message(ctx, out, nbytes[me], offsets[me]), dst,
                                       GATHER_TAG))
    ctx.calls += len(requests)
    MPI.Request.Waitall(requests)


def allreduce(ctx, comm, send, recv, op):
    """``recv = op(send over comm)`` elementwise in one call (``send`` None: in place);
    flat C-contiguous arrays of the same length on every member, at most
    :func:`reduce_limit` elements."""
    t = typed(ctx)
    ctx.calls += 1
    comm.Allreduce(ctx.MPI.IN_PLACE if send is None else [send, t], [recv, t], op)


def reduce_scatter(ctx, comm, packed, counts, out, op):
    """One ``Reduce_scatter`` of the parts laid out one after another in ``packed``
    (``counts[m]`` elements for member m) into ``out``; ``out`` None: in place,
    member me's part then lands at the front of ``packed``."""
    MPI, t = ctx.MPI, typed(ctx)
    synchronize(packed)
    ctx.calls += 1
    if out is None:
        comm.Reduce_scatter(MPI.IN_PLACE, [packed, sum(counts), t], counts, op)
    else:
        comm.Reduce_scatter([packed, t], [out, t], counts, op)
