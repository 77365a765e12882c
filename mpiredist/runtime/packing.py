"""Moving pieces between ranks as contiguous bytes, pipelined within the budget.

MPICH moves derived datatypes several times slower than the same bytes in a
contiguous buffer (measured at 8 ranks, 8 MiB blocks, c13: Alltoallw with
subarray types 170 ms, this module 19 ms, a bare Alltoall 10 ms).  So
:func:`move` sends every piece that is one contiguous run of its array
straight from it, packs the others with numpy into one buffer of at most
``ctx.slack`` bytes (what the memory budget leaves, see
:mod:`mpiredist.planning.budget`), and cuts pieces into parts (:func:`parts`) so that
several parts fit that buffer, packed while earlier ones travel
(:mod:`mpiredist.runtime.pipeline`).  The executor uses it for every
all-to-all, for all-gathers whose blocks do not lie one after another in
the output, and for exchanges.

Every choice that both ends of a message must agree on (the part size)
depends only on the plan and the budget; what only one end sees (whether a
part is contiguous, whether it fits the buffer) is decided locally, and a
part that does not fit the buffer goes as a subarray datatype.
"""

import math

from ..core.backend import synchronize
from ..core.blocks import divides_evenly, rank_block
from . import pipeline
from ..planning.routing import exchange_recvs, exchange_sends
from ..core.subaxes import rank_digits

__all__ = ["move", "reduce_move", "one_call", "parts", "part_limit", "group_sides", "rank0_sides",
           "contiguous_box", "flat_offset", "MIN_PART"]


MIN_PART = 4096     # bytes: smaller parts cost more in latency than packing saves
DEPTH = 2           # packed parts in flight per side, when parts stay over MIN_PART
# Blocks up to this size may go in one Alltoallv (:func:`one_call`): where a
# message costs more than moving its bytes.  Measured at 8 ranks on 2 cores,
# 4 KiB blocks: rounds of Isend/Irecv 1.3 ms, one Alltoallv 0.8 ms.
ONE_CALL_MAX = 256 << 10


def parts(shape, limit):
    """Split a box of ``shape`` into boxes of at most ``limit`` elements.

    Returns ``(starts, shape)`` boxes in C order.  Cuts go across the
    outermost dim longer than one, so a box that is contiguous in memory
    stays contiguous in every part.  The split depends only on ``shape``
    and ``limit``: sender and receiver of a piece compute the same one.
    """
    ndim = len(shape)
    if math.prod(shape) <= limit or not ndim:
        return [((0,) * ndim, tuple(shape))]
    d = next(k for k, n in enumerate(shape) if n > 1)
    inner = math.prod(shape[d + 1:])
    out = []
    if inner <= limit:
        rows = limit // inner
        for lo in range(0, shape[d], rows):
            starts = (0,) * ndim
            box = shape[:d] + (min(rows, shape[d] - lo),) + shape[d + 1:]
            out.append((starts[:d] + (lo,) + starts[d + 1:], box))
        return out
    below = shape[:d] + (1,) + shape[d + 1:]
    for lo in range(shape[d]):
        for starts, box in parts(below, limit):
            out.append((starts[:d] + (lo,) + starts[d + 1:], box))
    return out


def part_limit(ctx, sides, room=None):
    """Elements per part, from the plan and the budget alone (every rank
    computes the same): ``sides`` is ``(send, recv)``, whether the sends and
    the receives of the move pack (:func:`group_sides`, :func:`rank0_sides`).

    The slack is shared by the packing sides; a part is a ``DEPTH``-th of
    its side's share, so that several parts are in flight while the next is
    packed, or the whole share if that part would be under ``MIN_PART``
    bytes.  No limit (parts that do not fit go as datatypes) when nothing
    packs or the share itself is under ``MIN_PART``.  ``room``: the bytes of
    the rings, if not ``ctx.slack``.
    """
    packing = sum(map(bool, sides))
    if not packing:
        return math.inf
    share = (ctx.slack if room is None else room) // packing // ctx.itemsize
    for depth in (DEPTH, 1):
        if share // depth * ctx.itemsize >= MIN_PART:
            return share // depth
    return math.inf


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


def one_call(ctx, step):
    """``False``, or how a step's pieces go in one call, both sides packed.

    For small blocks, where each message costs a latency: MPI's own
    all-to-all algorithm then combines messages, which rounds of
    Isend/Irecv cannot.  Taken when both packed sides fit the pack room
    (twice the largest block): from the plan and the budget alone, so every
    rank decides alike.  ``"even"``: an all-to-all whose pieces all have one
    size (every dim divides evenly in both layouts), sent with ``Alltoall``
    (MPICH's small-message algorithm combines messages in log2 G rounds,
    which ``Alltoallv`` does not: measured at 8 ranks, 4 KiB blocks, c01
    1.18 ms against 0.74 ms for the bare collective); else ``"v"``:
    ``Alltoallv`` without the own piece.
    """
    most = max(math.prod(step.local_shape_before), math.prod(step.local_shape_after))
    if not (2 * most * ctx.itemsize <= ctx.slack and most * ctx.itemsize <= ONE_CALL_MAX):
        return False
    even = step.op == "all_to_all" and divides_evenly(ctx.plan.global_shape,
                                                      (step.before, step.after))
    return "even" if even else "v"


def move(ctx, comm, region, out, pieces_out, pieces_in, sides=(True, True), collective=False):
    """Send ``pieces_out[p]`` (boxes relative to ``region``) to every peer p and
    receive ``pieces_in[p]`` into ``out``; this rank's own piece is copied.

    Each piece goes in parts of :func:`part_limit` elements, through
    :func:`mpiredist.runtime.pipeline.run`: part r of the piece for the
    peer k ranks on goes at place ``(r, k)`` of the sequence, at both ends.
    A part that is one contiguous run of its array is sent from or received
    into it directly; any other is packed into, or unpacked from, a ring of
    the pack buffer (at most ``ctx.slack`` bytes for both sides); a part
    larger than its ring goes as a subarray datatype.
    """
    me = comm.Get_rank()
    if me in pieces_out and me in pieces_in:
        out.view()[_index(pieces_in[me])] = region.view()[_index(pieces_out[me])]
    if collective == "even":
        _alltoall(ctx, comm, region, out, pieces_out, pieces_in)
        return
    if collective:
        _alltoallv(ctx, comm, region, out, pieces_out, pieces_in)
        return
    # parts within the pack room, and no message beyond the MPI count limit
    limit = min(part_limit(ctx, sides), ctx.count_limit // ctx.itemsize)
    n = comm.Get_size()
    sends = _Sequence(pieces_out, [(me + k) % n for k in range(1, n)], limit)
    recvs = _Sequence(pieces_in, [(me - k) % n for k in range(1, n)], limit)
    send_room, recv_room = _rooms(ctx, sides, region, out, sends, recvs, limit)
    send_buffer, recv_buffer = _buffers(ctx, send_room, recv_room)
    synchronize(region.base)
    pipeline.run(ctx.MPI, comm,
                 (_part(ctx, p, region, box, send_room) for p, box in sends),
                 (_part(ctx, p, out, box, recv_room) for p, box in recvs),
                 send_buffer, recv_buffer)


def reduce_move(ctx, comm, region, out, pieces_out, reducer, send_packs, room):
    """A reduce-scatter by parts: ``pieces_out[m]`` (boxes relative to
    ``region``) goes to member m; what the members send this rank is
    combined into ``out`` (a :class:`Region`) by ``reducer`` (``np.add``...).

    Sends go straight from the block when contiguous, else packed
    (``send_packs``, from the plan, says whether to share the slack); every
    receive goes through the receive ring and is combined in a fixed order,
    this rank's own piece first and then the member 1, 2, ... ranks back, so
    the result is the same on every run and on every replica of the group.
    Memory: ``room`` bytes for both rings (the reduction's share of the
    budget, agreed by every rank); MPI reduces nothing, so it allocates
    nothing.  ``False`` (nothing done) when ``room`` cannot hold parts of
    ``MIN_PART`` bytes: the caller reduces in rounds instead.
    """
    limit = part_limit(ctx, (send_packs, True), room)
    if limit == math.inf:
        return False
    limit = min(limit, ctx.count_limit // ctx.itemsize)
    me, n = comm.Get_rank(), comm.Get_size()
    sends = _Sequence(pieces_out, [(me + k) % n for k in range(1, n)], limit)
    back = [(me - k) % n for k in range(n)]
    whole = ((0,) * len(out.shape), tuple(out.shape))
    recvs = _Sequence({p: whole for p in back}, back, limit)
    send_need = sum(math.prod(box[1]) for _, box in sends if not _is_run(region, box))
    share = room // ctx.itemsize // (2 if send_packs or send_need else 1)
    send_room = min(share, DEPTH * limit, send_need)
    recv_room = min(share, DEPTH * limit, sum(math.prod(box[1]) for _, box in recvs))
    send_buffer, recv_buffer = _buffers(ctx, send_room, recv_room)
    own, first = region.view(), pieces_out[me]
    synchronize(region.base)

    def received(p, box):
        view = out.view()[_index(box)]
        if p == me:
            return pipeline.Part(p, view=view, value=own[_index(_shift(first, box))])
        return pipeline.Part(p, view=view, combine=lambda t, d: reducer(t, d, out=t))

    pipeline.run(ctx.MPI, comm, (_part(ctx, p, region, box, send_room) for p, box in sends),
                 (received(p, box) for p, box in recvs), send_buffer, recv_buffer)
    return True


class _Sequence:
    """``(peer, box)`` of every part, made on iteration: part r for ``peers[k]``
    at place (r, k).

    ``peers[k]`` is the peer k + 1 ranks on (sends) or back (receives), so
    both ends of a message give it the same place, and any two messages the
    same order: the pipeline's condition for progress.
    """

    def __init__(self, pieces, peers, limit):
        self.cut = [(p, pieces[p], parts(pieces[p][1], limit)) for p in peers
                    if p in pieces and math.prod(pieces[p][1])]

    def __iter__(self):
        for r in range(max((len(ps) for _, _, ps in self.cut), default=0)):
            for p, piece, ps in self.cut:
                if r < len(ps):
                    yield p, _shift(piece, ps[r])


def _rooms(ctx, sides, region, out, sends, recvs, limit):
    """Ring sizes in elements: the slack shared by the sides that pack here
    (a side the plan says is contiguous packs only where it guessed wrong),
    each no larger than what its side packs, nor than ``DEPTH`` parts."""
    need = [sum(math.prod(box[1]) for _, box in seq if not _is_run(region_, box))
            for seq, region_ in ((sends, region), (recvs, out))]
    packing = [bool(n) for n in need]
    if not any(packing):
        return 0, 0
    share = min(ctx.slack // ctx.itemsize // sum(packing), DEPTH * limit)
    return tuple(min(share, n) for n in need)


def _buffers(ctx, send_room, recv_room):
    if not send_room + recv_room:
        return None, None
    both = ctx.scratch(send_room + recv_room)
    return (both[:send_room] if send_room else None,
            both[send_room:] if recv_room else None)


def _part(ctx, peer, region, box, room):
    """A :class:`pipeline.Part` for ``box`` of ``region``: straight bytes, a
    view to pack through the ring, or a datatype when it does not fit."""
    spec = _direct(ctx, region, box)
    if spec is not None:
        return pipeline.Part(peer, spec=spec)
    if math.prod(box[1]) <= room:
        return pipeline.Part(peer, view=region.view()[_index(box)])
    count, t = ctx.subarray(region, box)
    return pipeline.Part(peer, spec=[region.base, count, t])


def _direct(ctx, region, box):
    """The bytes of ``box`` in ``region``'s base when they are one run, else None."""
    if not _is_run(region, box):
        return None
    rel, shape = box
    starts = [a + b for a, b in zip(region.starts, rel)]
    offset = flat_offset(region.base.shape, starts) * ctx.itemsize
    return [region.base, (math.prod(shape) * ctx.itemsize, offset), ctx.MPI.BYTE]


def _is_run(region, box):
    rel, shape = box
    starts = [a + b for a, b in zip(region.starts, rel)]
    return bool(math.prod(shape)) and contiguous_box(region.base.shape, starts, shape)


def _alltoallv(ctx, comm, region, out, pieces_out, pieces_in):
    """Every piece but this rank's own in one ``Alltoallv`` of packed bytes."""
    n, me, size = comm.Get_size(), comm.Get_rank(), ctx.itemsize
    send_counts, recv_counts = [0] * n, [0] * n
    for p, (_, shape) in pieces_out.items():
        send_counts[p] = math.prod(shape) if p != me else 0
    for p, (_, shape) in pieces_in.items():
        recv_counts[p] = math.prod(shape) if p != me else 0
    send = ctx.scratch(sum(send_counts) + sum(recv_counts))
    recv = send[sum(send_counts):]
    at, src = 0, region.view()
    for p in range(n):
        if send_counts[p]:
            send[at:at + send_counts[p]].reshape(pieces_out[p][1])[...] = \
                src[_index(pieces_out[p])]
            at += send_counts[p]
    synchronize(send)
    B = ctx.MPI.BYTE
    comm.Alltoallv([send, [c * size for c in send_counts], _offsets(send_counts, size), B],
                   [recv, [c * size for c in recv_counts], _offsets(recv_counts, size), B])
    at, dst = 0, out.view()
    for p in range(n):
        if recv_counts[p]:
            dst[_index(pieces_in[p])] = recv[at:at + recv_counts[p]].reshape(pieces_in[p][1])
            at += recv_counts[p]


def _alltoall(ctx, comm, region, out, pieces_out, pieces_in):
    """Every piece, all of one size, in one ``Alltoall`` (the own piece rides along
    and is not unpacked: :func:`move` copied it)."""
    n, me = comm.Get_size(), comm.Get_rank()
    count = max(math.prod(shape) for _, shape in list(pieces_out.values()) +
                list(pieces_in.values())) if pieces_out or pieces_in else 0
    send = ctx.scratch(2 * n * count)
    recv = send[n * count:]
    src = region.view()
    for p, piece in pieces_out.items():
        if p != me:
            send[p * count:p * count + math.prod(piece[1])].reshape(piece[1])[...] = \
                src[_index(piece)]
    synchronize(send)
    unit = count * ctx.itemsize
    comm.Alltoall([send, unit, ctx.MPI.BYTE], [recv, unit, ctx.MPI.BYTE])
    dst = out.view()
    for p, piece in pieces_in.items():
        if p != me:
            dst[_index(piece)] = recv[p * count:p * count + math.prod(piece[1])] \
                .reshape(piece[1])


def _offsets(counts, size):
    out, at = [], 0
    for c in counts:
        out.append(at * size)
        at += c
    return out


def _index(box):
    return tuple(slice(s, s + k) for s, k in zip(*box))


def _shift(piece, part):
    """The part's box relative to the piece's array."""
    return tuple(a + b for a, b in zip(piece[0], part[0])), part[1]


def rank0_sides(plan, step):
    """``(send, recv)``: whether rank 0 has a strided piece to send, to receive.

    Every rank judges an exchange's packing on rank 0's pieces, so that all
    compute the same part size (see :meth:`Context.exchange_sides
    <mpiredist.runtime.context.Context.exchange_sides>`, which keeps the
    answer for the life of its Transfer).  Where another rank's pieces are
    less contiguous than rank 0's, its parts that do not fit the buffer go
    as datatypes (slower, never more memory).
    """
    digits = rank_digits(plan.mesh, 0)
    shape = plan.global_shape
    mine_b = rank_block(shape, step.before, digits)
    mine_a = rank_block(shape, step.after, digits)
    sends = exchange_sends(plan.mesh, shape, step.before, step.after, digits)
    recvs = exchange_recvs(plan.mesh, shape, step.before, step.after, digits)
    return (not all(_runs(box, mine_b) for _, box in sends),
            not all(_runs(box, mine_a) for _, box in recvs))


def _runs(box, block):
    """True if the global ``box`` is one contiguous run of ``block`` in C order."""
    full = [hi - lo for lo, hi in block]
    starts = [lo - b for (lo, _), (b, _) in zip(box, block)]
    return contiguous_box(full, starts, [hi - lo for lo, hi in box])


def flat_offset(full, starts):
    """Elements before index ``starts`` of a C-ordered array of shape ``full``."""
    offset = 0
    for n, s in zip(full, starts):
        offset = offset * n + s
    return offset


def contiguous_box(full, starts, shape):
    """True if the box is one run in C order: after its first dim longer
    than 1, every dim spans the whole array."""
    dims = [d for d, n in enumerate(shape) if n > 1]
    if not dims:
        return True
    return all(shape[d] == full[d] for d in range(dims[0] + 1, len(full)))
