"""Run a plan on MPI: one function per step kind, buffers owned in one place.

The local block is tracked as a :class:`Region`: a box of a C-contiguous base
array.  Slices only shrink the box (no copy).  Each communicating step
allocates its output and moves data from the input box into its final place
there.  MPICH moves derived datatypes several times slower than contiguous
bytes, so contiguous blocks and pieces go as plain bytes at an offset, and
strided pieces are packed by numpy within the memory budget
(:mod:`mpiredist.runtime.packing`).

Step -> MPI call:

============== =====================================================
slice          none (the box shrinks)
all_gather     Allgather (Allgatherv if blocks differ) of bytes when
               the result is a concatenation in memory, else
               :func:`mpiredist.runtime.packing.move` on the group
all_to_all     :func:`mpiredist.runtime.packing.move` on the group: rounds of
               Isend/Irecv of contiguous or packed parts
reduce_scatter Reduce_scatter (typed), after packing if needed; beyond
               the reduction room, pipelined parts combined by numpy
               (:func:`mpiredist.runtime.packing.reduce_move`)
all_reduce     Allreduce (typed); beyond the reduction room, a pipelined
               reduce-scatter of slices and an in-place Allgather
permute        Sendrecv of the whole block (no call if it stays)
exchange       :func:`mpiredist.runtime.packing.move` on the mesh
============== =====================================================

Every peer's piece is ``before(sender) & after(receiver)``: for all-gather
and all-to-all inside a group this is exactly the collective's data; for the
exchange the receivers come from :func:`mpiredist.planning.routing.exchange_sends`.
"""

import itertools
import math
import time

import numpy as np

from ..core.backend import array_module, c_contiguous, synchronize
from ..core.blocks import rank_block
from ..core.errors import CommunicationError
from ..planning.budget import MARGIN, assess, reduction_room
from ..planning.exchange import REDUCERS
from ..planning.routing import member_digits, permute_dest, permute_source
from .context import Context, Region, StepRecord, relative, volume
from .counts import allreduce, message, reduce_limit, reduce_scatter_parts, unit
from .packing import group_sides, move, one_call, reduce_move

__all__ = ["execute", "run_steps", "run_step", "after_slice", "mpi_op", "reduce_then_gather",
           "reduction_rings", "Region", "StepRecord"]


def execute(plan, local, mc, records=None, slack=None, ctx=None, out=None):
    """Run ``plan`` on this rank's block ``local``; return the target block.

    ``local`` is never written.  ``mc`` is the mesh's
    :class:`~mpiredist.runtime.comm.MeshComm`.  ``slack`` is how many bytes
    of pack buffer the memory budget allows on top of the outputs (default:
    what the default workspace leaves, see :mod:`mpiredist.planning.budget`).
    ``ctx`` is the :class:`~mpiredist.runtime.context.Context` of the
    Transfer that runs the plan (its routing is kept between runs); without
    one a temporary context is made and freed.  ``out``, if given, is a
    C-contiguous array of the target block's shape that receives the result.
    If ``records`` is a list, one :class:`StepRecord` per step is appended.
    """
    own = ctx is None
    if own:
        ctx = Context(plan, mc, array_module(local))
    if slack is None:
        fits = assess(plan)
        slack = fits.limit - fits.out_of_place_peak
    ctx.slack, ctx.sliced = max(0, slack - MARGIN), False
    if own:
        ctx.reduce_room = reduction_room(assess(plan).workspace)
    try:
        if not c_contiguous(local):
            local = ctx.xp.ascontiguousarray(local)
        region = run_steps(ctx, Region(local), range(len(plan.steps)), records, out)
    finally:
        if own:
            ctx.free()
    return _result(region, local, out)


def _result(region, local, out):
    if out is not None:
        if region.base is not out:
            out[...] = region.view()
        return out
    if region.whole and region.base is not local:
        return region.base
    return region.view().copy()     # never hand back a view of the caller's buffer


def run_steps(ctx, region, indices, records=None, out=None):
    """Run the plan's steps ``indices`` on ``region``; return the last region.

    When the last step communicates, it writes straight into ``out`` (if given).
    """
    steps = ctx.plan.steps
    last = indices[-1] if len(indices) and steps[indices[-1]].op != "slice" else None
    for i in indices:
        t0 = time.perf_counter()
        into = (lambda shape: out) if out is not None and i == last else None
        region, sent = run_step(ctx, i, region, into)
        if records is not None:
            records.append(StepRecord(steps[i].op, int(sent), time.perf_counter() - t0))
    return region


def run_step(ctx, index, region, into=None):
    """Run step ``index`` of the plan on ``region``; return ``(region, bytes sent)``.

    ``into``, if given, is a callable ``shape -> array`` that provides the
    step's output buffer (the one-buffer executor passes its own buffer).
    MPI failures become :class:`CommunicationError` naming the step.
    """
    step = ctx.plan.steps[index]
    ctx.current = index
    try:
        region, sent = _RUN[step.op](ctx, index, region, into)
        ctx.sliced = after_slice(ctx.sliced, step)
        return region, sent
    except ctx.MPI.Exception as exc:
        raise CommunicationError(f"MPI failed in step {step}: {exc}") from exc
    finally:
        ctx.free_types()


def after_slice(sliced, step):
    """Whether the block is a strided part of its base after ``step`` (from the plan).

    A slice of one dim, all dims before it of length 1, keeps rows whole:
    runs that are contiguous in the block stay contiguous in the base.
    """
    if step.op != "slice":
        return False
    dims = set(step.dims)
    first = min(dims, default=0)
    return sliced or len(dims) > 1 or any(n > 1 for n in step.local_shape_before[:first])


def _block(ctx, layout, digits):
    return rank_block(ctx.plan.global_shape, layout, digits)


def _new(ctx, shape, into):
    if into is not None:
        return into(tuple(shape))
    return ctx.new_array(shape)


def _empty(ctx, block, into):
    return _new(ctx, tuple(hi - lo for lo, hi in block), into)


def _slice(ctx, index, region, into=None):
    step, digits = ctx.plan.steps[index], ctx.mc.digits
    before, after = _block(ctx, step.before, digits), _block(ctx, step.after, digits)
    starts, shape = relative(after, before)
    if not math.prod(shape):            # an empty block need not lie inside the old one
        return Region(ctx.xp.empty(shape, dtype=ctx.plan.dtype)), 0
    return region.sub(starts, shape), 0


def _group_move(ctx, index, region, into):
    """All-gather or all-to-all in the group: each member gets before & after."""
    step = ctx.plan.steps[index]
    comm = ctx.mc.sub(step.axes)
    out = Region(_empty(ctx, _block(ctx, step.after, ctx.mc.digits), into))
    pieces_out, pieces_in, sent = ctx.group_pieces(index)
    if step.op == "all_gather" and _gather_is_concat(step):
        _allgatherv(ctx, comm, region, out, pieces_in)
    else:
        move(ctx, comm, region, out, pieces_out, pieces_in,
             group_sides(step, not ctx.sliced), one_call(ctx, step))
    return out, sent * ctx.itemsize


def _gather_is_concat(step):
    """True if the gathered blocks lie one after another in the output (from the plan)."""
    (d,) = step.dims
    return all(n == 1 for n in step.local_shape_after[:d])


def _allgatherv(ctx, comm, region, out, pieces_in):
    """Allgather when all blocks are equal (MPICH's Allgatherv is much slower).

    ``pieces_in[m]`` is member ``m``'s block in ``out`` (absent if empty).
    """
    counts = [math.prod(pieces_in[m][1]) * ctx.itemsize if m in pieces_in else 0
              for m in range(comm.Get_size())]
    send = ctx.whole(region)
    synchronize(region.base)
    if len(set(counts)) == 1:
        comm.Allgather(send, [out.base, *unit(ctx, counts[0])])
        return
    displs = [0, *itertools.accumulate(counts)][:-1]
    if displs[-1] + counts[-1] > ctx.count_limit:      # v-counts are ints: go by pairs
        _gather_pairs(ctx, comm, region, out, counts, displs)
        return
    comm.Allgatherv(send, [out.base, counts, displs, ctx.MPI.BYTE])


def _gather_pairs(ctx, comm, region, out, counts, displs):
    """Allgatherv as point-to-point messages, for displacements beyond the count limit."""
    me, n = comm.Get_rank(), comm.Get_size()
    mine = region.view()
    whole = out.base.reshape(-1).view("u1")
    whole[displs[me]:displs[me] + counts[me]] = ctx.xp.ascontiguousarray(mine).reshape(-1).view("u1")
    requests = []
    for k in range(1, n):
        src, dst = (me - k) % n, (me + k) % n
        if counts[src]:
            requests.append(comm.Irecv(message(ctx, out.base, counts[src], displs[src]), src, 7))
        if counts[me]:
            requests.append(comm.Isend(message(ctx, out.base, counts[me], displs[me]), dst, 7))
    ctx.MPI.Request.Waitall(requests)


def mpi_op(ctx):
    """The MPI reduction of the plan's partial op (logical for bool)."""
    op, MPI = ctx.plan.src.op, ctx.MPI
    if ctx.plan.dtype == np.bool_:
        return {"sum": MPI.LOR, "max": MPI.LOR, "min": MPI.LAND, "prod": MPI.LAND}[op]
    return {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}[op]


def _contiguous(ctx, region):
    return region.base if region.whole else ctx.xp.ascontiguousarray(region.view())


def _reduce_scatter(ctx, index, region, into):
    """One ``Reduce_scatter`` when it fits the reduction room (MPI's buffers
    inside it stay within W/2); else pipelined parts combined by numpy
    (:func:`~mpiredist.runtime.packing.reduce_move`: no MPI buffers, and no
    round waits for every member), or rounds of ``Reduce_scatter`` when the
    slack cannot hold a part."""
    step = ctx.plan.steps[index]
    comm, digits = ctx.mc.sub(step.axes), ctx.mc.digits
    (j,) = step.dims
    mine_b = _block(ctx, step.before, digits)
    src = region.view()
    boxes, parts, counts = {}, [], []
    for m in range(comm.Get_size()):
        box = _block(ctx, step.after, member_digits(digits, step.axes, m))
        boxes[m] = relative(box, mine_b)
        starts, shape = boxes[m]
        parts.append(src[tuple(slice(s, s + n) for s, n in zip(starts, shape))])
        counts.append(math.prod(shape))
    out = _empty(ctx, _block(ctx, step.after, digits), into)
    send_packs = ctx.sliced or any(n > 1 for n in step.local_shape_before[:j])
    if sum(counts) <= reduce_limit(ctx):
        _reduce_scatter_once(ctx, comm, region, j, parts, counts, out)
    elif not reduce_move(ctx, comm, region, Region(out), boxes, REDUCERS[ctx.plan.src.op],
                         send_packs, reduction_rings(ctx)):
        reduce_scatter_parts(ctx, comm, parts, out, mpi_op(ctx))
    me = comm.Get_rank()
    sent = sum(c for m, c in enumerate(counts) if m != me)
    return Region(out), sent * ctx.itemsize


def _reduce_scatter_once(ctx, comm, region, j, parts, counts, out):
    """One ``Reduce_scatter``: from the block itself when its parts follow each
    other in memory, else after packing them into one buffer."""
    if all(n == 1 for n in region.shape[:j]) and region.whole:
        packed = region.base
    else:
        packed = ctx.scratch(sum(counts))
        offset = 0
        for part, n in zip(parts, counts):
            packed[offset:offset + n].reshape(part.shape)[...] = part
            offset += n
    synchronize(packed)
    typed = ctx.typed()
    comm.Reduce_scatter([packed, typed], [out, typed], counts, mpi_op(ctx))


def _all_reduce(ctx, index, region, into):
    """One ``Allreduce`` within the reduction room; past it, a reduce-scatter
    by pipelined parts (each member reduces one slice) and an in-place
    ``Allgather`` of the slices, or rounds of ``Allreduce`` when the slack
    cannot hold a part."""
    step = ctx.plan.steps[index]
    comm = ctx.mc.sub(step.axes)
    src = _contiguous(ctx, region)
    out = _new(ctx, src.shape, into)
    synchronize(src)
    flat, whole = src.reshape(-1), out.reshape(-1)
    if flat.size <= reduce_limit(ctx) or not reduce_then_gather(ctx, comm, flat, whole):
        allreduce(ctx, comm, flat, whole, mpi_op(ctx))
    g = comm.Get_size()
    return Region(out), 2 * out.size * (g - 1) // g * ctx.itemsize


def reduction_rings(ctx):
    """Bytes for a reduction's rings: the pack room, at least the reduction
    room (W/2, which the budget sets aside for reductions: MPI's buffers in
    rounds of ``Reduce_scatter`` or ``Allreduce``, which this replaces) and
    at most twice it (fresh rings of tens of MiB cost more in page faults
    than larger parts save: 8 ranks, c11 36 ms with 8.5 MiB rings, 45-68 ms
    with 55 MiB).  From the plan and W: alike on every rank."""
    return min(max(ctx.slack, ctx.reduce_room), 2 * ctx.reduce_room)


def reduce_then_gather(ctx, comm, flat, whole):
    """All-reduce as slices: member m reduces ``[m n / g, (m + 1) n / g)``
    (:func:`~mpiredist.runtime.packing.reduce_move`), then every slice is
    gathered in place.  ``whole`` may be ``flat`` itself (the one-buffer
    executor): no slice is written before its sends have finished.  False
    (nothing done) where that does not apply."""
    g, me, size = comm.Get_size(), comm.Get_rank(), ctx.itemsize
    n = flat.size
    if n * size > ctx.count_limit:
        return False
    bounds = [m * n // g for m in range(g + 1)]
    pieces = {m: ((bounds[m],), (bounds[m + 1] - bounds[m],)) for m in range(g)}
    mine = Region(whole, *pieces[me])
    if not reduce_move(ctx, comm, Region(flat), mine, pieces, REDUCERS[ctx.plan.src.op], False,
                       reduction_rings(ctx)):
        return False
    counts = [(bounds[m + 1] - bounds[m]) * size for m in range(g)]
    synchronize(whole)
    if len(set(counts)) == 1:
        comm.Allgather(ctx.MPI.IN_PLACE, [whole, counts[0], ctx.MPI.BYTE])
    else:
        comm.Allgatherv(ctx.MPI.IN_PLACE, [whole, counts, [b * size for b in bounds[:-1]],
                                           ctx.MPI.BYTE])
    return True


def _permute(ctx, index, region, into):
    step, mc, plan = ctx.plan.steps[index], ctx.mc, ctx.plan
    dest = permute_dest(plan.mesh, step.before, step.after, mc.digits)
    source = permute_source(plan.mesh, step.before, step.after, mc.digits)
    if dest == mc.rank and source == mc.rank:
        if into is None:
            return region, 0
        out = Region(_new(ctx, region.shape, into))
        out.base[...] = region.view()
        return out, 0
    out = Region(_empty(ctx, _block(ctx, step.after, mc.digits), into))
    send = ctx.whole(region)
    synchronize(region.base)
    mc.comm.Sendrecv(send, dest, recvbuf=message(ctx, out.base, out.base.size * ctx.itemsize),
                     source=source)
    sent = volume(_block(ctx, step.before, mc.digits)) if dest != mc.rank else 0
    return out, sent * ctx.itemsize


def _exchange(ctx, index, region, into):
    step, mc = ctx.plan.steps[index], ctx.mc
    out = Region(_empty(ctx, _block(ctx, step.after, mc.digits), into))
    pieces_out, pieces_in = ctx.exchange_pieces(index)
    sent = sum(math.prod(s) for r, (_, s) in pieces_out.items() if r != mc.rank)
    move(ctx, mc.comm, region, out, pieces_out, pieces_in,
         ctx.exchange_sides(index, not ctx.sliced), one_call(ctx, step))
    return out, sent * ctx.itemsize


_RUN = {"slice": _slice, "all_gather": _group_move, "all_to_all": _group_move,
        "reduce_scatter": _reduce_scatter, "all_reduce": _all_reduce,
        "permute": _permute, "exchange": _exchange}
