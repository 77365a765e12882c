"""Run a plan: one loop, one implementation of each step kind, over a memory strategy.

:func:`run` walks the plan's steps; each kind is one function of the table
:data:`STEPS`, written against the strategy of :mod:`mpiredist.runtime.memory`
(a fresh output per step, or one buffer rearranged in place).  Where the
output is a separate array the step moves pieces from its input into it;
where it is the same buffer, the step first makes the pieces addressable in
place (a block transpose, an expansion) and then moves them there.  Every
move between ranks goes through the one exchange engine
(:func:`mpiredist.runtime.exchange.move`) or one count-safe collective
(:mod:`mpiredist.runtime.collectives`).

============== ======================================= ==========================================
step           separate output                          in place (one buffer)
============== ======================================= ==========================================
slice          the block becomes a box of its base      the box moved to the front (or an offset)
all_gather     ``Allgather(v)`` of bytes when blocks    own block expanded to its slot, then the
               follow each other, else pieces moved     same, ``MPI_IN_PLACE``
all_to_all     pieces moved (or one ``Alltoall(v)``     block transpose so each member's piece is
               for small blocks)                        one slot, slots swapped pairwise, placed
reduce_scatter ``Reduce_scatter`` within the reduction  parts made contiguous by a transpose, then
               room; else parts combined by numpy as    the same into this member's part, moved to
               they arrive; else rounds                 the front
all_reduce     ``Allreduce``; past the reduction room   the same on the buffer
               a reduce-scatter of slices by parts,
               then an in-place ``Allgather``
permute        ``Sendrecv`` of the whole block          ``Sendrecv`` beside the block when both fit,
                                                        else parts through a ring, in order
exchange       the pieces of the piece model moved     (a separate output: the budget says so)
============== ======================================= ==========================================

Every choice that both ends of a message must make alike (part sizes, one
call or parts, in place or not) comes from the plan, the agreed workspace
and the strategy (the same on every rank); what only one end sees (is this
part contiguous here, does it fit the ring now) changes only how that end
lays out its bytes.
"""

import math
import time
from dataclasses import dataclass

from ..core.backend import synchronize
from ..core.blocks import box_shape, contiguous_box, divides_evenly, overlap, rank_block
from ..core.errors import CommunicationError
from ..planning.pieces import part_limit, plan_pieces, ring_part_limit
from ..planning.routing import member_digits, permute_dest, permute_source
from . import collectives
from .collectives import allreduce, message, mpi_op, reduce_limit, reduce_scatter
from .exchange import ONE_CALL_MAX, Exchange, Recv, Send, move, move_once
from .failure import inject
from .memory import Region
from .onebuffer import compact, expand, transpose

__all__ = ["run", "StepRecord", "STEPS"]


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one step did on this rank: bytes sent to other ranks, time, and the
    MPI calls that move data (each collective call, and each point-to-point
    send or receive posted, counts one)."""

    op: str
    bytes_sent: int
    seconds: float
    calls: int = 0


def run(ctx, mem, records=None):
    """Run ``ctx.plan`` with the memory strategy ``mem``; return the target block.

    If ``records`` is a list, one :class:`StepRecord` per step is appended.
    MPI failures become :class:`~mpiredist.CommunicationError` naming the step.
    """
    for index, step in enumerate(ctx.plan.steps):
        t0, calls = time.perf_counter(), ctx.calls
        ctx.current = index
        try:
            inject(ctx.fault, index)
            mem.before(index, step)
            sent = STEPS[step.op](ctx, mem, index, step)
        except ctx.MPI.Exception as exc:
            error = CommunicationError(f"MPI failed in step {index} ({step}): {exc}")
            error.mpiredist_step = f"{index} ({step})"
            raise error from exc
        except BaseException as exc:
            exc.mpiredist_step = f"{index} ({step})"    # named if the job aborts
            raise
        finally:
            ctx.free_types()
        mem.after(index, step)
        if records is not None:
            records.append(StepRecord(step.op, int(sent), time.perf_counter() - t0,
                                      ctx.calls - calls))
    return mem.result()


# ------------------------------------------------------------ geometry

def _block(ctx, layout, digits=None):
    """The block of ``layout`` on this rank (kept in the context's routes) or on
    the rank of ``digits``."""
    if digits is not None:
        return rank_block(ctx.plan.step_shape, layout, digits)
    return ctx.route(("block", layout),
                     lambda: rank_block(ctx.plan.step_shape, layout, ctx.mc.digits))


def relative(box, outer):
    """``(starts, shape)`` of global ``box`` relative to the block ``outer``."""
    return (tuple(lo - o for (lo, _), (o, _) in zip(box, outer)),
            tuple(hi - lo for lo, hi in box))


def _volume(box):
    return math.prod(hi - lo for lo, hi in box)


def _group_pieces(ctx, index, sliced):
    """``(sends, recvs, elements sent)`` of this rank in group step ``index``
    (all-to-all, all-gather): member m gets ``before(me) & after(m)``;
    keys ``(m - me) mod g`` at both ends.  A piece goes whole where it is one
    run of both blocks and the source is not a strided view."""
    return ctx.route(("group", index, sliced),
                     lambda: _group_geometry(ctx, ctx.plan.steps[index], sliced))


def _group_geometry(ctx, step, sliced):
    digits, g = ctx.mc.digits, step.group_size
    me = _member(step, digits)
    mine_b, mine_a = _block(ctx, step.before), _block(ctx, step.after)
    sends, recvs, sent = [], [], 0
    for m in range(g):
        other = member_digits(digits, step.axes, m)
        theirs_b, theirs_a = _block(ctx, step.before, other), _block(ctx, step.after, other)
        box = overlap(mine_b, theirs_a)
        if box is not None:
            whole = not sliced and _runs(box, mine_b) and _runs(box, theirs_a)
            sends.append(Send(((m - me) % g,), m, relative(box, mine_b), whole))
            sent += _volume(box) if m != me else 0
        box = overlap(theirs_b, mine_a)
        if box is not None:
            whole = not sliced and _runs(box, theirs_b) and _runs(box, mine_a)
            own = relative(box, mine_b) if m == me else None
            recvs.append(Recv(((me - m) % g,), m, relative(box, mine_a), whole, False, own))
    return sends, recvs, sent


def _member(step, digits):
    p = 0
    for s in step.axes:
        p = p * s.size + digits[s]
    return p


def _runs(box, block):
    """True if the global ``box`` is one contiguous run of ``block`` in C order."""
    return contiguous_box([hi - lo for lo, hi in block],
                          [lo - b for (lo, _), (b, _) in zip(box, block)],
                          [hi - lo for lo, hi in box])


def group_sides(step, whole):
    """``(send, recv)``: whether a group move packs its sends, its receives
    (from the plan alone).

    A send piece is contiguous when the source block is ``whole`` (not a
    slice of a larger one) and every dim before the split one has length at
    most 1; a received piece likewise in the output, before the gathered dim.
    The plan's local shapes are the largest over ranks, so on a rank where
    the guess is wrong a piece is only more contiguous than assumed.
    """
    i, j = (step.dims[0], step.dims[0]) if step.op == "all_gather" else step.dims
    send = step.op == "all_to_all" and any(n > 1 for n in step.local_shape_before[:j])
    recv = any(n > 1 for n in step.local_shape_after[:i])
    return bool(send or not whole), bool(recv)


def one_call(ctx, step, room):
    """``False``, or how a step's pieces go in one call, both sides packed.

    For small blocks, where each message costs a latency: taken when both
    packed sides fit the pack room (twice the largest block) and the block
    is at most ``ONE_CALL_MAX``, from the plan and the budget alone.
    ``"even"``: an all-to-all whose pieces all have one size (every dim
    divides evenly in both layouts), sent with ``Alltoall``; else ``"v"``.
    """
    most = max(math.prod(step.local_shape_before), math.prod(step.local_shape_after))
    if not (2 * most * ctx.itemsize <= room and most * ctx.itemsize <= ONE_CALL_MAX):
        return False
    even = step.op == "all_to_all" and divides_evenly(ctx.plan.step_shape,
                                                      (step.before, step.after))
    return "even" if even else "v"


def _exchange_of(ctx, index, sliced):
    """The :class:`~mpiredist.runtime.exchange.Exchange` of exchange step ``index``
    (the piece model on the mesh's blocks) and its packing sides, judged on
    rank 0's pieces so that every rank cuts alike; kept in the context."""
    key = ("exchange", index, sliced)
    if key not in ctx.routes:
        step, plan = ctx.plan.steps[index], ctx.plan
        if step.before.partial != step.after.partial:
            raise AssertionError(f"internal planner error: exchange {step} reduces")
        sources, targets = plan_pieces(plan, step.before, step.after, keep_classes=True)
        ex = Exchange(ctx, sources, targets, 0, plan.src.op, views=sliced)
        zero = ex if ctx.comm.Get_rank() == 0 else Exchange(ctx, sources, targets, 0,
                                                            plan.src.op, sliced, rank=0)
        sides = (sliced or any(not _rel_runs(x.box, zero.source_shape)
                               for x in zero.sends if x.peer != 0),
                 any(not _rel_runs(x.box, zero.target_shape)
                     for x in zero.recvs if x.peer != 0))
        ctx.routes[key] = ex, sides
    return ctx.routes[key]


def _rel_runs(box, full):
    """True if ``box`` ``(starts, shape)`` is one run of a C-order block of shape ``full``."""
    return contiguous_box(full, *box)


# ---------------------------------------------------------------- steps

def _slice(ctx, mem, index, step):
    mem.narrow(*ctx.route(("slice", index),
                          lambda: relative(_block(ctx, step.after), _block(ctx, step.before))))
    return 0


def _all_gather(ctx, mem, index, step):
    """Own block at its slot of the output, then the other members' blocks.

    Blocks that follow each other in the output (every dim before the
    gathered one of length 1, from the plan) go as one ``Allgather(v)`` of
    bytes; strided ones are moved by the engine, packed through the rings.
    """
    (d,) = step.dims
    comm = ctx.mc.sub(step.axes)
    g, me = comm.Get_size(), comm.Get_rank()
    def geometry():                         # the output's shape and each member's slot
        mine = _block(ctx, step.after)
        slots = []
        for m in range(g):
            lo, hi = _block(ctx, step.before, member_digits(ctx.mc.digits, step.axes, m))[d]
            slots.append((lo - mine[d][0], hi - lo))
        return box_shape(mine), tuple(slots)
    shape, slots = ctx.route(("gather", index), geometry)
    own = mem.region
    sent = math.prod(own.shape) * ctx.itemsize * (g - 1)
    if mem.in_place(step):
        place = [0] * len(shape)
        place[d] = slots[me][0]
        expand(mem.buf, mem.shape, place, shape, mem.itemsize, mem.chunk)
        mem.shape = shape
        out, placed = mem.typed(shape), True
    else:
        out, placed = mem.output(shape), False
    inner = math.prod(shape[d + 1:]) * ctx.itemsize
    if all(n == 1 for n in step.local_shape_after[:d]):
        if math.prod(shape):
            collectives.allgather(ctx, comm, None if placed else own.view(), out,
                                  [n * inner for _, n in slots], [s * inner for s, _ in slots])
    else:
        target = Region(out)

        def slot(m):
            starts = [0] * len(shape)
            starts[d] = slots[m][0]
            box = list(shape)
            box[d] = slots[m][1]
            return tuple(starts), tuple(box)

        source, mine_box = (target, slot(me)) if placed else (own, ((0,) * len(shape), own.shape))
        sends = [Send(((m - me) % g,), m, mine_box, False) for m in range(g)
                 if m != me and math.prod(own.shape)]
        recvs = [Recv(((me - m) % g,), m, slot(m), False, False, None) for m in range(g)
                 if m != me and slots[m][1]]
        if not placed:
            target.view()[_index(slot(me))] = own.view()
        sides = (placed or mem.sliced, True)
        move(ctx, comm, sends, recvs, source, target,
             part_limit(ctx.itemsize, mem.room, sides), mem.room // ctx.itemsize)
    mem.adopt(Region(out))
    return sent


def _all_to_all(ctx, mem, index, step):
    comm = ctx.mc.sub(step.axes)
    if mem.in_place(step):
        return _all_to_all_in_place(ctx, mem, step, comm)
    out = Region(mem.output(box_shape(_block(ctx, step.after))))
    sends, recvs, sent = _group_pieces(ctx, index, mem.sliced)
    once = one_call(ctx, step, mem.room)
    if once:
        move_once(ctx, comm, sends, recvs, mem.region, out, once == "even")
    else:
        move(ctx, comm, sends, recvs, mem.region, out,
             part_limit(ctx.itemsize, mem.room, group_sides(step, not mem.sliced)),
             mem.room // ctx.itemsize)
    mem.adopt(out)
    return sent * ctx.itemsize


def _all_to_all_in_place(ctx, mem, step, comm):
    """Pieces made contiguous slots, swapped pairwise in place, then placed.

    With ``i < j`` a block transpose first makes each member's piece one slot
    of ``(A, g, L)`` (``A`` = lengths before ``i``), and the received pieces
    land already in target order; with ``i > j`` the slots exist as they
    are and a block transpose after the swap puts the pieces in place.
    Uneven shards are padded to the step's frame first (as XLA does).
    """
    i, j = step.dims
    true_before = mem.pad(step)
    g, shape, size = comm.Get_size(), list(mem.shape), mem.itemsize
    cj = shape[j] // g
    inner = math.prod(shape[j + 1:]) * size
    if math.prod(shape) and g > 1:
        if i < j:
            a, rows = math.prod(shape[:i]), shape[i] * math.prod(shape[i + 1:j])
            transpose(mem.buf, a, rows, g, cj * inner, mem.chunk)
            _swap(ctx, mem, comm, a, rows * cj * inner)
        else:
            _swap(ctx, mem, comm, math.prod(shape[:j]), cj * inner)
            transpose(mem.buf, math.prod(shape[:j]), g, cj * math.prod(shape[j + 1:i]),
                      shape[i] * math.prod(shape[i + 1:]) * size, mem.chunk)
    shape[i], shape[j] = shape[i] * g, cj
    mem.shape = tuple(shape)
    after = _block(ctx, step.after)
    mem.unpad(box_shape(after))
    kept = math.prod(min(b1, a1) - max(b0, a0) if min(b1, a1) > max(b0, a0) else 0
                     for (b0, b1), (a0, a1) in zip(_block(ctx, step.before), after))
    return (math.prod(true_before) - kept) * size


def _swap(ctx, mem, comm, a, length):
    """In-place all-to-all of the slots of the front ``(a, g, length)`` bytes.

    Slot ``m`` (``[:, m, :]``) goes to member ``m`` and is replaced by what
    ``m`` sends: a symmetric pairing (this member swaps with
    ``(k - me) mod g`` at place k, every pair once), in parts, paired in the
    engine: a contiguous part (``a == 1``) is sent straight from its slot, a
    strided one packed into the send ring; what arrives waits in the receive
    ring until its place is released, then is copied in.  Unlike
    ``MPI_IN_PLACE`` collectives, all the memory used is visible and
    bounded: the rings take at most ``mem.chunk`` bytes.
    """
    g, me = comm.Get_size(), comm.Get_rank()
    slots = Region(mem.buf[:a * g * length].reshape(a, g, length))
    sends, recvs = [], []
    for k in range(g):
        p = (k - me) % g
        if p == me:
            continue
        box = ((0, p, 0), (a, 1, length))
        sends.append(Send((k,), p, box, False))
        recvs.append(Recv((k,), p, box, False, False, None))
    room = min(mem.chunk, 2 * (g - 1) * a * length)
    move(ctx, comm, sends, recvs, slots, slots, ring_part_limit(1, mem.chunk, (a > 1, True)),
         room, paired=True)


def _reduce_scatter(ctx, mem, index, step):
    """This member's part of the group's reduction.

    Within the reduction room, one ``Reduce_scatter`` (from the block when
    its parts follow each other, else after packing them, or in place);
    past it, pipelined parts combined by numpy in a fixed order (no MPI
    buffers, no round that waits for every member); rounds of
    ``Reduce_scatter`` when the slack holds no part.
    """
    (j,) = step.dims
    comm = ctx.mc.sub(step.axes)
    g, me = comm.Get_size(), comm.Get_rank()
    op = mpi_op(ctx, ctx.plan.src.op)
    reducer = ctx.combiner(ctx.plan.src.op)
    if mem.in_place(step):
        return _reduce_scatter_in_place(ctx, mem, step, comm, op, reducer)
    digits = ctx.mc.digits
    mine_b = _block(ctx, step.before)
    region = mem.region
    src = region.view()
    boxes, views, counts = {}, [], []
    for m in range(g):
        box = _block(ctx, step.after, member_digits(digits, step.axes, m))
        boxes[m] = relative(box, mine_b)
        starts, shape = boxes[m]
        views.append(src[tuple(slice(s, s + n) for s, n in zip(starts, shape))])
        counts.append(math.prod(shape))
    out = mem.output(box_shape(_block(ctx, step.after)))
    send_packs = mem.sliced or any(n > 1 for n in step.local_shape_before[:j])
    if sum(counts) <= reduce_limit(ctx):
        if all(n == 1 for n in region.shape[:j]) and region.whole:
            packed = region.base
        else:
            packed = ctx.scratch(sum(counts))
            at = 0
            for view, n in zip(views, counts):
                packed[at:at + n].reshape(view.shape)[...] = view
                at += n
        reduce_scatter(ctx, comm, packed, counts, out, op)
    else:
        reduce_by_parts(ctx, comm, region, boxes, Region(out), reducer, send_packs,
                        reduction_rings(ctx, mem.room))
    mem.adopt(Region(out))
    return sum(c for m, c in enumerate(counts) if m != me) * ctx.itemsize


def _reduce_scatter_in_place(ctx, mem, step, comm, op, reducer):
    (j,) = step.dims
    g, me = comm.Get_size(), comm.Get_rank()
    outer = math.prod(step.local_shape_before[:j])      # from the plan: alike on every rank
    if outer > 1:
        mem.pad(step)
        outer = math.prod(mem.shape[:j])
    shape = mem.shape
    inner = math.prod(shape[j + 1:])
    if outer > 1:
        if not mem.pretransposed:
            transpose(mem.buf, 1, outer, g, shape[j] // g * inner * mem.itemsize, mem.chunk)
        mem.pretransposed = False
        counts = [outer * (shape[j] // g) * inner] * g
    else:
        lengths = [mem.block(step.after, member_digits(ctx.mc.digits, step.axes, m))[j]
                   for m in range(g)]
        rows = math.prod(shape[:j])     # 0 or 1 here: alike on the group's members
        counts = [(hi - lo) * inner * rows for lo, hi in lengths]
    flat = mem.typed((sum(counts),))
    offsets = [sum(counts[:m]) for m in range(g)]
    boxes = {m: ((offsets[m],), (c,)) for m, c in enumerate(counts)}
    if sum(counts) <= reduce_limit(ctx):
        reduce_scatter(ctx, comm, flat, counts, None, op)
    else:
        reduce_by_parts(ctx, comm, Region(flat), boxes, Region(flat, *boxes[me]), reducer,
                        False, reduction_rings(ctx, mem.room))
        size = mem.itemsize
        compact(mem.buf, (sum(counts) * size,), (offsets[me] * size,), (counts[me] * size,), 1,
                mem.chunk)
    mem.shape = tuple(counts[me] // max(1, outer * inner) if k == j else n
                      for k, n in enumerate(shape))
    mem.unpad(box_shape(mem.block(step.after)))
    return (sum(counts) - counts[me]) * mem.itemsize


def reduction_rings(ctx, room):
    """Bytes for a reduction's rings: the pack room, at least the reduction
    room (W/2, which the budget sets aside for reductions: MPI's buffers in
    rounds of ``Reduce_scatter`` or ``Allreduce``, which this replaces) and
    at most twice it (fresh rings of tens of MiB cost more in page faults
    than larger parts save: 8 ranks, c11 36 ms with 8.5 MiB rings, 45-68 ms
    with 55 MiB).  From the plan and W: alike on every rank."""
    return min(max(room, ctx.reduce_room), 2 * ctx.reduce_room)


def reduce_by_parts(ctx, comm, source, boxes, target, reducer, send_packs, room):
    """A reduce-scatter by parts: ``boxes[m]`` (relative to ``source``) goes to
    member m; what the members send this rank is combined into ``target`` (a
    :class:`Region`) by ``reducer``, this member's own piece first, then
    member me + 1, me + 2, ... (keys ``(p - q) mod g``): the same order on
    every run and every replica of the group.  Memory: ``room`` bytes of
    rings (:func:`reduction_rings`: at least 64 KiB, so parts of at least
    ``MIN_PART`` fit); MPI reduces nothing, so it allocates nothing.
    """
    limit = part_limit(ctx.itemsize, room, (send_packs, True))
    g, me = comm.Get_size(), comm.Get_rank()
    whole = ((0,) * len(target.shape), tuple(target.shape))
    sends = [Send(((me - m) % g,), m, boxes[m], False) for m in range(g)
             if m != me and math.prod(boxes[m][1])]
    recvs = [Recv(((m - me) % g,), m, whole, False, m != me, boxes[me] if m == me else None)
             for m in range(g) if math.prod(whole[1])]
    move(ctx, comm, sends, recvs, source, target, limit, room // ctx.itemsize, reducer)


def _all_reduce(ctx, mem, index, step):
    """One ``Allreduce`` within the reduction room; past it, a reduce-scatter of
    slices by pipelined parts (each member reduces one slice) and an in-place
    ``Allgather`` of the slices, or rounds of ``Allreduce`` when the rings
    cannot hold a part."""
    comm = ctx.mc.sub(step.axes)
    op = mpi_op(ctx, ctx.plan.src.op)
    if mem.in_place(step):
        src = out = mem.typed(mem.shape)
    else:
        region = mem.region
        src = region.base if region.whole else ctx.xp.ascontiguousarray(region.view())
        out = mem.output(src.shape)
    synchronize(src)
    flat, whole = src.reshape(-1), out.reshape(-1)
    if flat.size <= reduce_limit(ctx):
        allreduce(ctx, comm, None if out is src else flat, whole, op)
    else:
        _reduce_then_gather(ctx, mem, comm, flat, whole)
    mem.adopt(Region(out))
    g = comm.Get_size()
    return 2 * out.size * (g - 1) // g * ctx.itemsize


def _reduce_then_gather(ctx, mem, comm, flat, whole):
    """All-reduce as slices: member m reduces ``[m n / g, (m + 1) n / g)``
    (:func:`reduce_by_parts`), then every slice is gathered in place.
    ``whole`` may be ``flat`` itself (one buffer): no slice is written before
    its sends have finished."""
    g, me, size = comm.Get_size(), comm.Get_rank(), ctx.itemsize
    n = flat.size
    bounds = [m * n // g for m in range(g + 1)]
    boxes = {m: ((bounds[m],), (bounds[m + 1] - bounds[m],)) for m in range(g)}
    reduce_by_parts(ctx, comm, Region(flat), boxes, Region(whole, *boxes[me]),
                    ctx.combiner(ctx.plan.src.op), False, reduction_rings(ctx, mem.room))
    collectives.allgather(ctx, comm, None, whole, [(bounds[m + 1] - bounds[m]) * size
                                                   for m in range(g)],
                          [b * size for b in bounds[:-1]])


def _permute(ctx, mem, index, step):
    """Send the block whole to one rank, receive another's.

    In place, both ends of a message must agree on its size, so the choice
    between one message and parts comes from the plan: straight into free
    space of the buffer when the largest blocks before and after fit beside
    each other in a buffer whose size is the same on every rank (not a
    donated block's own memory, whose size differs); otherwise in parts,
    paired in the engine: every part is sent straight from the block, and
    part k of the incoming block waits in a receive ring of at most half the
    workspace until send k has finished, then is copied to the front (it
    overwrites only what parts 0..k held: the block starts at or after the
    front).
    """
    mc = ctx.mc
    mesh = ctx.plan.mesh
    dest, source = ctx.route(("permute", index), lambda: (
        permute_dest(mesh, step.before, step.after, mc.digits),
        permute_source(mesh, step.before, step.after, mc.digits)))
    if dest == mc.rank and source == mc.rank:
        mem.unchanged()
        return 0
    sent = _volume(_block(ctx, step.before)) * ctx.itemsize if dest != mc.rank else 0
    after = box_shape(_block(ctx, step.after))
    if not mem.in_place(step):
        region = mem.region
        out = mem.output(after)
        send = ctx.whole(region)
        synchronize(region.base)
        ctx.calls += 1
        mc.comm.Sendrecv(send, dest, recvbuf=message(ctx, out, out.size * ctx.itemsize),
                         source=source)
        mem.adopt(Region(out))
        return sent
    nbytes = math.prod(mem.shape) * mem.itemsize
    recv = math.prod(after) * mem.itemsize
    most = (math.prod(step.local_shape_before) + math.prod(step.local_shape_after)) \
        * mem.itemsize
    if not mem.in_block and most <= mem.buf.size:
        mem.to_front()
        ctx.calls += 1
        mc.comm.Sendrecv(message(ctx, mem.buf, nbytes), dest,
                         recvbuf=message(ctx, mem.buf, recv, nbytes), source=source)
        mem.offset, mem.shape = nbytes, after
        return sent
    o = mem.offset
    source_bytes = Region(mem.buf[o:o + nbytes])
    target_bytes = Region(mem.buf[:recv])
    move(ctx, mc.comm, [Send((0,), dest, ((0,), (nbytes,)), False)],
         [Recv((0,), source, ((0,), (recv,)), False, False, None)], source_bytes, target_bytes,
         ring_part_limit(1, mem.chunk, (False, True)), min(mem.chunk, max(recv, 1)),
         paired=True)
    mem.offset, mem.shape = 0, after
    return sent


def _exchange(ctx, mem, index, step):
    """The pieces of the piece model (:mod:`mpiredist.planning.pieces`) on the
    mesh's blocks, moved by the engine into a separate output."""
    comm = ctx.mc.comm
    ex, sides = _exchange_of(ctx, index, mem.sliced)
    out = Region(mem.output(box_shape(_block(ctx, step.after))))
    once = one_call(ctx, step, mem.room)
    if once:
        move_once(ctx, comm, ex.sends, ex.recvs, mem.region, out, False)
    else:
        move(ctx, comm, ex.sends, ex.recvs, mem.region, out,
             part_limit(ctx.itemsize, mem.room, sides), mem.room // ctx.itemsize)
    mem.adopt(out)
    return ex.bytes_sent


def _index(box):
    """The index of a box (a view, also of a 0-d array)."""
    return tuple(slice(s, s + k) for s, k in zip(*box)) + (Ellipsis,)


STEPS = {"slice": _slice, "all_gather": _all_gather, "all_to_all": _all_to_all,
         "reduce_scatter": _reduce_scatter, "all_reduce": _all_reduce,
         "permute": _permute, "exchange": _exchange}
