"""Run a plan: one loop, one implementation of each step kind, over a memory strategy.

:func:`run` walks the plan's steps; each kind is one function of the table
:data:`STEPS`, written against the strategy of :mod:`mpiredist.runtime.memory`
(a fresh output per step, or one buffer rearranged in place).  Where the
output is a separate array the step moves pieces from its input into it;
where it is the same buffer, the step first makes the pieces addressable in
place (a block transpose, an expansion) and then moves them there.  Every
move between ranks goes through the one exchange engine
(:func:`mpiredist.runtime.exchange.move`) or one collective of the
transport (:mod:`mpiredist.runtime.transport`).  The in-place half of each
kind belongs to the one-buffer strategy
(:class:`~mpiredist.runtime.onebuffer.OneBuffer`); the steps call it when
``mem.in_place(step)`` is true.

============== ======================================= ==========================================
step           separate output                          in place (one buffer)
============== ======================================= ==========================================
slice          the block becomes a box of its base      the box moved to the front (or an offset)
all_gather     ``allgather`` of bytes when blocks       own block expanded to its slot, then the
               follow each other, else pieces moved     same, in place
all_to_all     pieces moved (or one ``alltoall(v)``     block transpose so each member's piece is
               for small blocks)                        one slot, slots swapped pairwise, placed
reduce_scatter ``reduce_scatter`` within the reduction  parts made contiguous by a transpose, then
               room; else parts combined by numpy as    the same into this member's part, moved to
               they arrive                              the front
all_reduce     ``allreduce``; past the reduction room   the same on the buffer
               a reduce-scatter of slices by parts,
               then an in-place ``allgather``
permute        ``sendrecv`` of the whole block (parts   ``sendrecv`` beside the block when both fit,
               of a sliced block where the transport    else parts through a ring, in order
               takes no boxes)
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

from ..core.blocks import (box_index, box_shape, contiguous_box, contiguous_in, divides_evenly,
                           overlap, rank_block, relative)
from ..core.errors import CommunicationError
from ..planning.pieces import part_limit, plan_pieces
from ..planning.routing import member_digits, permute_dest, permute_source
from .exchange import Exchange, Recv, Send, StepRecord, move
from .failure import inject
from .memory import Region, after_slice
from .reductions import reduce_by_parts, reduce_limit, reduction_rings
from .transport import Strided

__all__ = ["run", "StepRecord", "STEPS", "ONE_CALL_MAX"]

# Blocks up to this size may go in one alltoall(v) (move_once): where a
# message costs more than moving its bytes.  Measured at 8 ranks on 2 cores,
# 4 KiB blocks: rounds of Isend/Irecv 1.3 ms, one Alltoallv 0.8 ms.
ONE_CALL_MAX = 256 << 10


def run(ctx, mem, records=None):
    """Run ``ctx.plan`` with the memory strategy ``mem``; return the target block.

    If ``records`` is a list, one :class:`StepRecord` per step is appended.
    Failures of the transport become :class:`~mpiredist.CommunicationError`
    naming the step.
    """
    errors, before = ctx.group.errors, mem.before
    for index, step in enumerate(ctx.plan.steps):
        t0, calls = time.perf_counter(), ctx.calls
        ctx.current = index
        try:
            if ctx.fault is not None:
                inject(ctx.fault, index)
            if before is not None:
                before(index, step)
            sent = STEPS[step.op](ctx, mem, index, step)
        except errors as exc:
            error = CommunicationError(f"{ctx.group.name} failed in step {index} ({step}): "
                                       f"{exc}")
            error.mpiredist_step = f"{index} ({step})"
            raise error from exc
        except BaseException as exc:
            exc.mpiredist_step = f"{index} ({step})"    # named if the job aborts
            raise
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
                     lambda: rank_block(ctx.plan.step_shape, layout, ctx.groups.digits))


def _group_pieces(ctx, index, sliced):
    """``(sends, recvs, elements sent)`` of this rank in group step ``index``
    (all-to-all, all-gather): member m gets ``before(me) & after(m)``;
    keys ``(m - me) mod g`` at both ends.  A piece goes whole where it is one
    run of both blocks and the source is not a strided view."""
    return ctx.route(("group", index, sliced),
                     lambda: _group_geometry(ctx, ctx.plan.steps[index], sliced))


def _group_geometry(ctx, step, sliced):
    digits, g = ctx.groups.digits, step.group_size
    me = _member(step, digits)
    mine_b, mine_a = _block(ctx, step.before), _block(ctx, step.after)
    sends, recvs, sent = [], [], 0
    for m in range(g):
        other = member_digits(digits, step.axes, m)
        theirs_b, theirs_a = _block(ctx, step.before, other), _block(ctx, step.after, other)
        box = overlap(mine_b, theirs_a)
        if box is not None:
            whole = not sliced and contiguous_in(box, mine_b) and contiguous_in(box, theirs_a)
            sends.append(Send(((m - me) % g,), m, relative(box, mine_b), whole))
            sent += math.prod(box_shape(box)) if m != me else 0
        box = overlap(theirs_b, mine_a)
        if box is not None:
            whole = not sliced and contiguous_in(box, theirs_b) and contiguous_in(box, mine_a)
            own = relative(box, mine_b) if m == me else None
            recvs.append(Recv(((me - m) % g,), m, relative(box, mine_a), whole, False, own))
    return sends, recvs, sent


def _member(step, digits):
    p = 0
    for s in step.axes:
        p = p * s.size + digits[s]
    return p


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
    is at most ``ONE_CALL_MAX`` and the transport's ``count_limit``, from
    the plan and the budget alone: a rank's packed sides are at most its
    largest block, so either every rank's fit one call or none is tried (one
    rank's own sums must never pick the call: under Intel MPI a rank in
    ``Alltoallv`` beside ranks sending messages hung).
    ``"even"``: an all-to-all whose pieces all have one size (every dim
    divides evenly in both layouts), sent with ``Alltoall``; else ``"v"``.
    """
    most = max(math.prod(step.local_shape_before), math.prod(step.local_shape_after))
    most *= ctx.itemsize
    if not (2 * most <= room and most <= min(ONE_CALL_MAX, ctx.count_limit)):
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
        zero = ex if ctx.group.rank == 0 else Exchange(ctx, sources, targets, 0,
                                                       plan.src.op, sliced, rank=0)
        sides = (sliced or any(not contiguous_box(zero.source_shape, *x.box)
                               for x in zero.sends if x.peer != 0),
                 any(not contiguous_box(zero.target_shape, *x.box)
                     for x in zero.recvs if x.peer != 0))
        ctx.routes[key] = ex, sides
    return ctx.routes[key]


# ---------------------------------------------------------------- steps

def _slice(ctx, mem, index, step):
    starts, shape = ctx.route(("slice", index), lambda: relative(_block(ctx, step.after),
                                                                  _block(ctx, step.before)))
    mem.narrow(starts, shape, after_slice(mem.sliced, step))
    return 0


def _all_gather(ctx, mem, index, step):
    """Own block at its slot of the output, then the other members' blocks.

    Blocks that follow each other in the output (every dim before the
    gathered one of length 1, from the plan) go as one ``allgather`` of
    bytes; strided ones are moved by the engine, packed through the rings.
    """
    (d,) = step.dims
    group = ctx.groups.sub(step.axes)
    g, me = group.size, group.rank

    def geometry():                         # the output's shape and each member's slot
        mine = _block(ctx, step.after)
        slots = []
        for m in range(g):
            lo, hi = _block(ctx, step.before, member_digits(ctx.groups.digits, step.axes, m))[d]
            slots.append((lo - mine[d][0], hi - lo))
        return box_shape(mine), tuple(slots)
    shape, slots = ctx.route(("gather", index), geometry)
    own = mem.region
    sent = math.prod(own.shape) * ctx.itemsize * (g - 1)
    placed = mem.rearranges and mem.in_place(step)
    out = mem.place(shape, d, slots[me][0]) if placed else mem.output(shape)
    inner = math.prod(shape[d + 1:]) * ctx.itemsize
    if all(n == 1 for n in step.local_shape_after[:d]):
        if math.prod(shape):
            ctx.calls += group.allgather(None if placed else own.view(), out,
                                         [n * inner for _, n in slots]) or 1
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
            target.view()[box_index(slot(me))] = own.view()
        sides = (placed or mem.sliced, True)
        move(ctx, group, sends, recvs, source, target,
             part_limit(ctx.itemsize, mem.room, sides), mem.room // ctx.itemsize)
    mem.adopt(Region(out))
    return sent


def _all_to_all(ctx, mem, index, step):
    key = ("all_to_all", index, mem.sliced, mem.room)
    geo = ctx.routes.get(key)
    if geo is None:
        geo = ctx.routes[key] = _Moves(ctx, index, step, mem.sliced, mem.room)
    if mem.rearranges and mem.in_place(step):
        return mem.all_to_all(ctx, step, geo.group)
    out = Region(mem.output(geo.shape))
    if geo.once is not None:
        move_once(ctx, geo.group, geo.once, mem.region, out)
    else:
        move(ctx, geo.group, geo.sends, geo.recvs, mem.region, out,
             part_limit(ctx.itemsize, mem.room, group_sides(step, not mem.sliced)),
             mem.room // ctx.itemsize)
    mem.adopt(out)
    return geo.sent


class _Moves:
    """An all-to-all's geometry on this rank, worked out on its first run: its
    group, the output block's shape, the pieces (:func:`_group_pieces`), the
    bytes sent, and, for a move in one call (:func:`one_call`), its packing
    (:class:`OneCall`)."""

    __slots__ = ("group", "shape", "sends", "recvs", "sent", "once")

    def __init__(self, ctx, index, step, sliced, room):
        self.group = ctx.groups.sub(step.axes)
        self.shape = box_shape(_block(ctx, step.after))
        self.sends, self.recvs, sent = _group_pieces(ctx, index, sliced)
        self.sent = sent * ctx.itemsize
        once = one_call(ctx, step, room)
        self.once = None if not once else OneCall(self.group, self.sends, self.recvs,
                                                  once == "even", ctx.itemsize)


class OneCall:
    """How a move's pieces go in one ``alltoall`` (``even``: all pieces one size)
    or ``alltoallv``, both sides packed: this rank's own pieces (target index,
    source index), the packs and unpacks (element offset, count, shape,
    index), and the byte counts per member (worked out once)."""

    __slots__ = ("own", "packs", "unpacks", "send_bytes", "recv_bytes", "sent", "total",
                 "even")

    def __init__(self, group, sends, recvs, even, itemsize):
        n, me = group.size, group.rank
        self.own = [(box_index(r.box), box_index(r.own)) for r in recvs if r.own is not None]
        out = {s.peer: s for s in sends if s.peer != me}
        into = {r.peer: r for r in recvs if r.own is None}
        if even:
            count = max([math.prod(x.box[1]) for x in [*out.values(), *into.values()]] + [0])
            send_counts, recv_counts = [count] * n, [count] * n
        else:
            send_counts = [math.prod(out[p].box[1]) if p in out else 0 for p in range(n)]
            recv_counts = [math.prod(into[p].box[1]) if p in into else 0 for p in range(n)]
        self.packs, self.unpacks = [], []
        for pieces, counts, where in ((out, send_counts, self.packs),
                                      (into, recv_counts, self.unpacks)):
            at = 0
            for p in range(n):
                x = pieces.get(p)
                if x is not None:
                    where.append((at, math.prod(x.box[1]), x.box[1], box_index(x.box)))
                at += counts[p]
        self.sent, self.total = sum(send_counts), sum(send_counts) + sum(recv_counts)
        self.send_bytes = [c * itemsize for c in send_counts]
        self.recv_bytes = [c * itemsize for c in recv_counts]
        self.even = even


def move_once(ctx, group, plan, source, target):
    """Every piece but this rank's own in one ``alltoall`` or ``alltoallv`` of
    ``plan`` (a :class:`OneCall`), both sides packed: for small blocks, where
    the transport's own algorithm combines messages (MPICH's small-message
    Alltoall takes log2 G rounds; at 8 ranks, 4 KiB blocks, c01 1.18 ms in
    rounds of Isend/Irecv, 0.74 ms so).  Needs both packed sides in the
    scratch room."""
    src = source.base if source.whole else source.view()
    dst = target.base if target.whole else target.view()
    for into, own in plan.own:
        dst[into] = src[own]
    packed = ctx.scratch(plan.total, src.dtype)
    for at, k, shape, index in plan.packs:
        packed[at:at + k].reshape(shape)[...] = src[index]
    sent = plan.sent
    back = packed[sent:]
    if plan.even:
        ctx.calls += group.alltoall(packed[:sent], back) or 1
    else:
        ctx.calls += group.alltoallv(packed[:sent], plan.send_bytes, back,
                                     plan.recv_bytes) or 1
    for at, k, shape, index in plan.unpacks:
        dst[index] = back[at:at + k].reshape(shape)


def _reduce_scatter(ctx, mem, index, step):
    """This member's part of the group's reduction.

    Within the reduction room, one ``reduce_scatter`` (from the block when
    its parts follow each other, else after packing them, or in place);
    past it, pipelined parts combined by numpy in a fixed order (no
    transport buffers, no round that waits for every member).
    """
    (j,) = step.dims
    group = ctx.groups.sub(step.axes)
    g, me = group.size, group.rank
    op = ctx.plan.src.op
    reducer = ctx.combiner(op)
    if mem.rearranges and mem.in_place(step):
        return mem.reduce_scatter(ctx, step, group, op, reducer)
    digits = ctx.groups.digits
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
    if sum(counts) <= reduce_limit(ctx, group):
        if all(n == 1 for n in region.shape[:j]) and region.whole:
            packed = region.base
        else:
            packed = ctx.scratch(sum(counts))
            at = 0
            for view, n in zip(views, counts):
                packed[at:at + n].reshape(view.shape)[...] = view
                at += n
        ctx.calls += 1
        group.reduce_scatter(packed, out, counts, op)
    else:
        reduce_by_parts(ctx, group, region, boxes, Region(out), reducer, send_packs,
                        reduction_rings(ctx, mem.room))
    mem.adopt(Region(out))
    return sum(c for m, c in enumerate(counts) if m != me) * ctx.itemsize


def _all_reduce(ctx, mem, index, step):
    """One ``allreduce`` within the reduction room; past it, a reduce-scatter of
    slices by pipelined parts (each member reduces one slice) and an in-place
    ``allgather`` of the slices."""
    group = ctx.groups.sub(step.axes)
    op = ctx.plan.src.op
    if mem.rearranges and mem.in_place(step):
        src = out = mem.whole()
    else:
        region = mem.region
        src = region.base if region.whole else ctx.xp.ascontiguousarray(region.view())
        out = mem.output(src.shape)
    flat, whole = src.reshape(-1), out.reshape(-1)
    if flat.size <= reduce_limit(ctx, group):
        ctx.calls += 1
        group.allreduce(None if out is src else flat, whole, op)
    else:
        _reduce_then_gather(ctx, mem, group, flat, whole)
    mem.adopt(Region(out))
    g = group.size
    return 2 * out.size * (g - 1) // g * ctx.itemsize


def _reduce_then_gather(ctx, mem, group, flat, whole):
    """All-reduce as slices: member m reduces ``[m n / g, (m + 1) n / g)``
    (:func:`~mpiredist.runtime.reductions.reduce_by_parts`), then every slice
    is gathered in place.  ``whole`` may be ``flat`` itself (one buffer): no
    slice is written before its sends have finished."""
    g, me, size = group.size, group.rank, ctx.itemsize
    n = flat.size
    bounds = [m * n // g for m in range(g + 1)]
    boxes = {m: ((bounds[m],), (bounds[m + 1] - bounds[m],)) for m in range(g)}
    reduce_by_parts(ctx, group, Region(flat), boxes, Region(whole, *boxes[me]),
                    ctx.combiner(ctx.plan.src.op), False, reduction_rings(ctx, mem.room))
    ctx.calls += group.allgather(None, whole,
                                 [(bounds[m + 1] - bounds[m]) * size for m in range(g)]) or 1


def _permute(ctx, mem, index, step):
    """Send the block whole to one rank, receive another's.

    Out of place: one ``sendrecv`` of the block (a box of a larger array
    where the transport takes one; a sliced block on a transport that takes
    none goes in parts through the rings, from the plan alike on both ends).
    In place: the one-buffer strategy's half.
    """
    groups = ctx.groups
    mesh = ctx.plan.mesh
    dest, source = ctx.route(("permute", index), lambda: (
        permute_dest(mesh, step.before, step.after, groups.digits),
        permute_source(mesh, step.before, step.after, groups.digits)))
    me = groups.rank
    if dest == me and source == me:
        mem.unchanged()
        return 0
    sent = math.prod(box_shape(_block(ctx, step.before))) * ctx.itemsize if dest != me else 0
    after = box_shape(_block(ctx, step.after))
    group = groups.group
    if mem.rearranges and mem.in_place(step):
        mem.permute(ctx, step, group, dest, source, after)
        return sent
    region = mem.region
    out = mem.output(after)
    if ctx.strided or not mem.sliced:
        view = region.view()
        ctx.calls += 1
        group.sendrecv(view if view.flags.c_contiguous else
                       Strided(region.base, region.starts, region.shape), dest, out, source)
    else:
        shape = region.shape
        room = max(0, mem.room) // ctx.itemsize
        move(ctx, group, [Send((0,), dest, ((0,) * len(shape), shape), False)],
             [Recv((0,), source, ((0,) * len(after), after), False, False, None)],
             region, Region(out), part_limit(ctx.itemsize, mem.room, (True, False)), room)
    mem.adopt(Region(out))
    return sent


def _exchange(ctx, mem, index, step):
    """The pieces of the piece model (:mod:`mpiredist.planning.pieces`) on the
    mesh's blocks, moved by the engine into a separate output."""
    group = ctx.groups.group
    ex, sides = _exchange_of(ctx, index, mem.sliced)
    out = Region(mem.output(box_shape(_block(ctx, step.after))))
    once = one_call(ctx, step, mem.room)
    if once:
        key = ("once", index, mem.sliced)
        plan = ctx.routes.get(key)
        if plan is None:
            plan = ctx.routes[key] = OneCall(group, ex.sends, ex.recvs, False, ctx.itemsize)
        move_once(ctx, group, plan, mem.region, out)
    else:
        move(ctx, group, ex.sends, ex.recvs, mem.region, out,
             part_limit(ctx.itemsize, mem.room, sides), mem.room // ctx.itemsize)
    mem.adopt(out)
    return ex.bytes_sent


STEPS = {"slice": _slice, "all_gather": _all_gather, "all_to_all": _all_to_all,
         "reduce_scatter": _reduce_scatter, "all_reduce": _all_reduce,
         "permute": _permute, "exchange": _exchange}
