"""Run a plan inside one working buffer: the measured peak stays at the bound.

The buffer has the plan's peak size, at most max(S, T) (the theorem).  When
the caller donates its block the buffer is that block's own memory, grown or
shrunk with ``realloc`` (``ndarray.resize``), so only max(0, T - S) bytes are
new (the buffer's life: :mod:`mpiredist.runtime.workbuffer`).  Every step keeps the
current block C-contiguous at the front:

============== ==========================================================
slice          :func:`~mpiredist.runtime.inplace.compact` (chunked, in place)
all_gather     expand own block to its slot, ``Allgather(v)(MPI_IN_PLACE)``
               (plain bytes when blocks follow each other, else a strided
               resized vector datatype)
all_to_all     block transpose that makes each member's piece one slot
               (before the swap if the split dim is the inner one, after it
               otherwise), slots swapped pairwise in parts, pipelined:
               contiguous parts sent straight, what arrives held in a
               ring of at most half the workspace until its slot is sent
reduce_scatter block transpose if the dim is not outermost, then
               ``Reduce_scatter(MPI_IN_PLACE)``; beyond the reduction room,
               pipelined parts combined by numpy into this member's part,
               moved to the front
all_reduce     ``Allreduce(MPI_IN_PLACE)``; beyond the reduction room, the
               same by slices, then ``Allgather(MPI_IN_PLACE)``
permute        ``Sendrecv`` when both blocks fit the buffer, else parts
               sent straight, received through a ring of half the
               workspace, copied in once their place is sent
exchange       not in place: an extra output buffer (the budget says so)
============== ==========================================================

Temporaries are at most half the workspace each.  Memory that MPI allocates
internally (e.g. for ``MPI_IN_PLACE`` reductions) is not visible to
tracemalloc and not counted here; the all-to-all avoids MPI's in-place
algorithm (which swaps through hidden buffers) for that reason.
"""

import math
import time

import numpy as np

from ..core.errors import CommunicationError
from ..planning.budget import frame_shape, inplace_reason
from ..planning.exchange import REDUCERS
from ..planning.routing import member_digits, permute_dest, permute_source
from . import packing, pipeline
from .context import Region, StepRecord, relative
from .counts import allreduce, message, reduce_limit, reduce_scatter, unit
from .executor import mpi_op, reduce_then_gather, reduction_rings, run_step
from .inplace import compact, expand, transpose
from .packing import contiguous_box, flat_offset
from .workbuffer import WorkBuffer

__all__ = ["execute_inplace"]


def execute_inplace(ctx, local, donate=False, workspace=1 << 20, records=None, out=None,
                    buffer=None, resizable=False):
    """Run ``ctx.plan`` in one buffer; return this rank's target block.

    ``ctx`` is the Transfer's :class:`~mpiredist.runtime.context.Context`.
    With ``donate`` (agreed by every rank, see
    :mod:`mpiredist.runtime.donation`) the caller's ``local`` becomes the
    buffer: it is resized and its contents are undefined afterwards.
    ``resizable`` (this rank's verdict) allows ``realloc`` of the donated
    block.  ``out``, if given, receives the result (a copy from the buffer,
    which may then be ``buffer``, a byte array the Transfer keeps between
    runs).
    """
    run = WorkBuffer(ctx, local, donate, workspace, buffer, resizable)
    if records is not None:
        records.extend(run.filled)
    steps = ctx.plan.steps
    for index in range(len(run.filled), len(steps)):
        step = steps[index]
        t0 = _now()
        run.reserve(step)
        if step.op not in ("slice", "permute"):
            run.to_front()
        try:
            if inplace_reason(ctx.plan, step) is None:
                sent = _STEP[step.op](run, step)
            else:
                sent = _out_of_place(run, index)
        except run.MPI.Exception as exc:
            raise CommunicationError(f"MPI failed in step {step}: {exc}") from exc
        finally:
            ctx.free_types()
        if records is not None:
            records.append(StepRecord(step.op, int(sent), _now() - t0))
    return run.result(out)


def _now():
    return time.perf_counter()


def _commit(run, t):
    run.ctx.types.append(t)
    return t.Commit()


def _strided(run, outer, run_bytes, stride_bytes, extent):
    """``outer`` runs of ``run_bytes``, ``stride_bytes`` apart, resized to ``extent``.

    Built on a contiguous unit of ``run_bytes`` (mpi4py makes it BigMPI's
    way when it exceeds an ``int``), so no count here passes the limit.
    """
    unit = _commit(run, run.MPI.BYTE.Create_contiguous(run_bytes))
    base = unit if outer == 1 else run.ctx.MPI.Datatype.Create_vector(
        unit, outer, 1, stride_bytes // run_bytes)
    if base is not unit:
        run.ctx.types.append(base)
    return _commit(run, base.Create_resized(0, extent))


def _slice(run, step):
    """Narrow the block: only its offset moves when the box is one contiguous run."""
    starts, box = relative(run.block(step.after), run.block(step.before))
    if contiguous_box(run.shape, starts, box):
        if math.prod(box):
            run.offset += flat_offset(run.shape, starts) * run.itemsize
    else:
        run.to_front()
        compact(run.buf, run.shape, starts, box, run.itemsize, run.chunk)
    run.shape = box
    return 0


def _all_gather(run, step):
    (d,) = step.dims
    comm, digits = run.mc.sub(step.axes), run.mc.digits
    mine = run.block(step.after)
    out = tuple(hi - lo for lo, hi in mine)
    starts, lengths = [], []
    for m in range(comm.Get_size()):
        (lo, hi) = run.block(step.before, member_digits(digits, step.axes, m))[d]
        starts.append(lo - mine[d][0])
        lengths.append(hi - lo)
    me = comm.Get_rank()
    place = [0] * len(out)
    place[d] = starts[me]
    expand(run.buf, run.shape, place, out, run.itemsize, run.chunk)
    outer, inner = math.prod(out[:d]), math.prod(out[d + 1:]) * run.itemsize
    if outer * inner:
        _gather_in_place(run, comm, outer, inner, out[d], lengths, starts)
    sent = math.prod(run.shape) * run.itemsize * (comm.Get_size() - 1)
    run.shape = out
    return sent


def _gather_in_place(run, comm, outer, inner, length, lengths, starts):
    """``Allgather(v)(MPI_IN_PLACE)`` of each member's slot of the block.

    Blocks that follow each other go as plain bytes (fast in MPICH), or as
    one element of a contiguous type beyond the count limit; strided ones
    as a vector type per slice along the gathered dim.  Equal slots take
    ``Allgather`` (much faster in MPICH than ``Allgatherv``).
    """
    limit, IN_PLACE = run.ctx.count_limit, run.MPI.IN_PLACE
    even = len(set(lengths)) == 1 and starts == [m * lengths[0] for m in range(len(lengths))]
    if outer == 1:
        nbytes = [n * inner for n in lengths]
        if even:
            comm.Allgather(IN_PLACE, [run.buf, *unit(run.ctx, nbytes[0])])
        elif (starts[-1] + lengths[-1]) * inner <= limit:
            comm.Allgatherv(IN_PLACE, [run.buf, nbytes, [s * inner for s in starts],
                                       run.MPI.BYTE])
        else:
            _gather_pairs(run, comm, nbytes, [s * inner for s in starts])
        return
    t = _strided(run, outer, inner, length * inner, inner)
    if even:
        comm.Allgather(IN_PLACE, [run.buf, lengths[0], t])
    else:
        comm.Allgatherv(IN_PLACE, [run.buf, lengths, starts, t])


def _gather_pairs(run, comm, nbytes, offsets):
    """The byte slots of an in-place all-gather as point-to-point messages
    (displacements beyond the count limit): each member sends its own slot
    to every other member and receives theirs into their slots."""
    me, n = comm.Get_rank(), comm.Get_size()
    requests = []
    for k in range(1, n):
        src, dst = (me - k) % n, (me + k) % n
        if nbytes[src]:
            requests.append(comm.Irecv(message(run.ctx, run.buf, nbytes[src], offsets[src]),
                                       src, 7))
        if nbytes[me]:
            requests.append(comm.Isend(message(run.ctx, run.buf, nbytes[me], offsets[me]),
                                       dst, 7))
    run.MPI.Request.Waitall(requests)


def _pad(run, step):
    """Pad the block to the step's frame (uneven shards); return the true shape."""
    frame = frame_shape(run.plan, step)
    true = run.shape
    if frame != true:
        expand(run.buf, true, (0,) * len(true), frame, run.itemsize, run.chunk)
        run.shape = frame
    return true


def _unpad(run, true_after):
    if run.shape != true_after:
        compact(run.buf, run.shape, (0,) * len(true_after), true_after, run.itemsize,
                run.chunk)
        run.shape = true_after


def _all_to_all(run, step):
    """Pieces made contiguous slots, swapped pairwise in place, then placed.

    With ``i < j`` a block transpose first makes each member's piece one slot
    of ``(A, g, L)`` (``A`` = lengths before ``i``), and the received pieces
    land already in target order; with ``i > j`` the slots exist as they
    are and a block transpose after the swap puts the pieces in place.
    """
    i, j = step.dims
    comm = run.mc.sub(step.axes)
    true_before = _pad(run, step)
    g, shape, size = comm.Get_size(), list(run.shape), run.itemsize
    cj = shape[j] // g
    inner = math.prod(shape[j + 1:]) * size
    if math.prod(shape) and g > 1:
        if i < j:
            a, rows = math.prod(shape[:i]), shape[i] * math.prod(shape[i + 1:j])
            transpose(run.buf, a, rows, g, cj * inner, run.chunk)
            _swap(run, comm, a, rows * cj * inner)
        else:
            _swap(run, comm, math.prod(shape[:j]), cj * inner)
            transpose(run.buf, math.prod(shape[:j]), g, cj * math.prod(shape[j + 1:i]),
                      shape[i] * math.prod(shape[i + 1:]) * size, run.chunk)
    shape[i], shape[j] = shape[i] * g, cj
    run.shape = tuple(shape)
    after = run.block(step.after)
    _unpad(run, tuple(hi - lo for lo, hi in after))
    kept = math.prod(min(b1, a1) - max(b0, a0) if min(b1, a1) > max(b0, a0) else 0
                     for (b0, b1), (a0, a1) in zip(run.block(step.before), after))
    return (math.prod(true_before) - kept) * size


def _swap(run, comm, a, length):
    """In-place all-to-all of the slots of the front ``(a, g, length)`` bytes.

    Slot ``m`` (``[:, m, :]``) goes to member ``m`` and is replaced by what
    ``m`` sends.  Pairwise: this member swaps with ``(k - me) mod g`` at
    place k of the order (a symmetric pairing, every pair once), in parts,
    pipelined (:func:`mpiredist.runtime.pipeline.run`, ``paired``): a
    contiguous part (``a == 1``) is sent straight from its slot, a strided
    one packed into the send ring; what arrives waits in the receive ring
    until its place is released, then is copied in.  Unlike ``MPI_IN_PLACE``
    collectives, all the memory used is visible and bounded: the rings take
    at most ``run.chunk`` bytes.
    """
    g, me = comm.Get_size(), comm.Get_rank()
    slots = run.buf[:a * g * length].reshape(a, g, length)
    halves = 1 if a == 1 else 2                     # strided slots also pack
    share = run.chunk // halves
    cut = packing.parts((a, length), _part_bytes(run, share))
    order = [(k - me) % g for k in range(g) if (k - me) % g != me]
    room = min(share, (g - 1) * a * length)
    B = run.MPI.BYTE
    pipeline.run(run.MPI, comm,
                 (pipeline.Part(p, spec=[v, v.size, B]) if a == 1 else pipeline.Part(p, view=v)
                  for p, v in _slot_parts(slots, order, cut)),
                 (pipeline.Part(p, view=v) for p, v in _slot_parts(slots, order, cut)),
                 np.empty(room, np.uint8) if a > 1 else None, np.empty(room, np.uint8),
                 paired=True)


def _slot_parts(slots, order, cut):
    """``(member, view)`` of each part of each member's slot, in swap order (made lazily)."""
    for p in order:
        for (a0, l0), (na, nl) in cut:
            yield p, slots[a0:a0 + na, p, l0:l0 + nl]


def _part_bytes(run, share):
    """Bytes per part for rings of ``share`` bytes (agreed: from the workspace)."""
    depth = packing.DEPTH if share // packing.DEPTH >= packing.MIN_PART else 1
    return max(1, min(share // depth, run.ctx.count_limit))


def _reduce_scatter(run, step):
    (j,) = step.dims
    comm = run.mc.sub(step.axes)
    g = comm.Get_size()
    outer = math.prod(step.local_shape_before[:j])      # from the plan: alike on every rank
    if outer > 1:
        _pad(run, step)
        outer = math.prod(run.shape[:j])
    shape = run.shape
    inner = math.prod(shape[j + 1:])
    if outer > 1:
        if not run.pretransposed:
            transpose(run.buf, 1, outer, g, shape[j] // g * inner * run.itemsize, run.chunk)
        run.pretransposed = False
        counts = [outer * (shape[j] // g) * inner] * g
    else:
        lengths = [run.block(step.after, member_digits(run.mc.digits, step.axes, m))[j]
                   for m in range(g)]
        rows = math.prod(shape[:j])     # 0 or 1 here: alike on the group's members
        counts = [(hi - lo) * inner * rows for lo, hi in lengths]
    flat = run.typed((sum(counts),))
    me = comm.Get_rank()
    if sum(counts) <= reduce_limit(run.ctx) or not _scatter_by_parts(run, comm, flat, counts):
        reduce_scatter(run.ctx, comm, flat, counts, flat[:counts[me]], mpi_op(run.ctx),
                       in_place=True)
    run.shape = tuple(counts[me] // max(1, outer * inner) if k == j else n
                      for k, n in enumerate(shape))
    _unpad(run, tuple(hi - lo for lo, hi in run.block(step.after)))
    return (sum(counts) - counts[me]) * run.itemsize


def _scatter_by_parts(run, comm, flat, counts):
    """Reduce-scatter by pipelined parts (:func:`~mpiredist.runtime.packing.reduce_move`)
    into this member's own part, then moved to the front (in chunks); False
    (nothing done) when the rings cannot hold a part."""
    me = comm.Get_rank()
    offsets = [sum(counts[:m]) for m in range(len(counts))]
    pieces = {m: ((offsets[m],), (c,)) for m, c in enumerate(counts)}
    mine = Region(flat, *pieces[me])
    if not packing.reduce_move(run.ctx, comm, Region(flat), mine, pieces,
                               REDUCERS[run.plan.src.op], False, reduction_rings(run.ctx)):
        return False
    size = run.itemsize
    compact(run.buf, (sum(counts) * size,), (offsets[me] * size,), (counts[me] * size,), 1,
            run.chunk)
    return True


def _all_reduce(run, step):
    comm = run.mc.sub(step.axes)
    n = math.prod(run.shape)
    flat = run.typed((n,))
    if n <= reduce_limit(run.ctx) or not reduce_then_gather(run.ctx, comm, flat, flat):
        allreduce(run.ctx, comm, None, flat, mpi_op(run.ctx))
    g = comm.Get_size()
    return 2 * n * (g - 1) // g * run.itemsize


def _permute(run, step):
    """Send the block whole to one rank, receive another's.

    Both ends of a message must agree on its size, so the choice between
    one message and rounds comes from the plan: straight into free space of
    the buffer when the largest blocks before and after fit beside each
    other in a buffer whose size is the same on every rank (not a donated
    block's own memory, whose size differs); otherwise in parts, pipelined:
    every part is sent straight from the block, and part k of the incoming
    block waits in a receive ring of at most half the workspace until send
    k has finished, then is copied to the front (it overwrites only what
    parts 0..k held: the block starts at or after the front).
    """
    mc, plan = run.mc, run.plan
    dest = permute_dest(plan.mesh, step.before, step.after, mc.digits)
    source = permute_source(plan.mesh, step.before, step.after, mc.digits)
    out = tuple(hi - lo for lo, hi in run.block(step.after))
    if dest == mc.rank and source == mc.rank:
        return 0
    B = run.MPI.BYTE
    send = math.prod(run.shape) * run.itemsize
    recv = math.prod(out) * run.itemsize
    most = (math.prod(step.local_shape_before) + math.prod(step.local_shape_after)) * run.itemsize
    if not run.in_block and most <= run.buf.size:
        run.to_front()
        mc.comm.Sendrecv(message(run.ctx, run.buf, send), dest,
                         recvbuf=message(run.ctx, run.buf, recv, send), source=source)
        run.offset, run.shape = send, out
        return send if dest != mc.rank else 0
    o, chunk = run.offset, _part_bytes(run, run.chunk)
    rounds = -(-math.prod(step.local_shape_before) * run.itemsize // chunk)
    starts = range(0, rounds * chunk, chunk)     # receive k overwrites what sends 0..k read
    pipeline.run(run.MPI, mc.comm,
                 (pipeline.Part(dest, spec=[run.buf[o + lo:o + lo + _span(chunk, send, lo)],
                                            _span(chunk, send, lo), B])
                  for lo in starts),
                 (pipeline.Part(source, view=run.buf[lo:lo + _span(chunk, recv, lo)])
                  for lo in starts),
                 None, np.empty(min(run.chunk, max(recv, 1)), np.uint8), paired=True)
    run.offset, run.shape = 0, out
    return send if dest != mc.rank else 0


def _span(chunk, total, lo):
    """Bytes of the part at ``lo`` of ``total`` bytes cut every ``chunk``."""
    return max(0, min(chunk, total - lo))


def _out_of_place(run, index):
    """A step that cannot run in place: into a new array, then back."""
    region = Region(run.typed(run.shape))
    new, sent = run_step(run.ctx, index, region)
    data = new.view() if not new.whole else new.base
    run.shape = tuple(data.shape)
    np.copyto(run.typed(run.shape), data)
    return sent


_STEP = {"slice": _slice, "all_gather": _all_gather, "all_to_all": _all_to_all,
         "reduce_scatter": _reduce_scatter, "all_reduce": _all_reduce,
         "permute": _permute}

