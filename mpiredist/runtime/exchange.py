"""The one exchange engine: pieces of one array moved into another, pipelined.

Every move of data between ranks that is not a single collective goes
through :func:`move`: the all-to-alls and strided all-gathers of a plan,
its reductions by parts, its ``exchange`` steps, the one-buffer swaps and
permutes, and :class:`Exchange` -- the compiled exchange between any two
sets of boxes (between meshes, ``reshape``, slicing, ``concatenate``).

A move is two lists of pieces, :class:`Send` and :class:`Recv`, each with a
*key* that both ends of a message compute alike (the callers': the piece
model of :mod:`mpiredist.planning.pieces` for exchanges, the group geometry
for collectives).  Each piece is cut into parts (:func:`parts
<mpiredist.planning.pieces.parts>` of ``limit`` elements, the same at both
ends; a *whole* piece only at the count limit), and parts are posted in
the order ``(part index, key)`` through the pipeline of
:mod:`mpiredist.runtime.p2p`, which matches every send with its receive
and cannot deadlock.  At each end a part is sent from, or received into,
its array directly when it is one contiguous run of it; otherwise it is
packed into a ring (at most ``room`` elements for the two sides together),
or, when it does not fit and the transport takes boxes of arrays (MPI's
subarray datatypes), sent as a :class:`~mpiredist.runtime.transport.Strided`
box.  Receives that *combine* (partial sums) always go through the
ring and are applied with the reducer in key order, so replicated results
are bitwise equal; this rank's own piece takes its place in that order.

MPICH moves derived datatypes several times slower than the same bytes in
a contiguous buffer (8 ranks, 8 MiB blocks, c13: Alltoallw with subarray
types 170 ms, packed moves 19 ms, a bare Alltoall 10 ms), hence the rings.
"""

import math
import time
from collections import namedtuple
from dataclasses import dataclass

import numpy as np

from ..core.backend import array_module, c_contiguous, cupy_or_error, device_dtype, synchronize
from ..core.blocks import box_index, box_shape, contiguous_box, flat_offset, relative
from ..planning.budget import MARGIN
from ..planning.pieces import (Holders, iter_parts, part_limit, recv_pieces,
                               send_pieces)
from . import p2p
from .memory import Region
from .transport import Strided

__all__ = ["Send", "Recv", "move", "Exchange", "part_elements", "StepRecord"]


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one step (or one exchange) did on this rank: bytes sent to other
    ranks, time, and the transport calls that move data (each collective
    call, and each point-to-point send or receive posted, counts one)."""

    op: str
    bytes_sent: int
    seconds: float
    calls: int = 0

Send = namedtuple("Send", "key peer box whole")
Send.__doc__ = """A piece to send: ``box`` ``(starts, shape)`` relative to the source
region; ``whole``: cut only at the count limit (contiguous at both ends)."""

Recv = namedtuple("Recv", "key peer box whole combine own")
Recv.__doc__ = """A piece to receive: ``box`` relative to the target region;
``combine``: reduce it into what is there; ``own``: for this rank's own
piece, its box in the source region (no message)."""


def move(ctx, group, sends, recvs, source, target, limit, room, reducer=None, paired=False,
         halves=False, posted=p2p.MAX_POSTED):
    """Move ``sends`` (boxes of ``source``) to their peers and ``recvs`` into
    ``target`` (both :class:`~mpiredist.runtime.memory.Region`) on ``group``.

    ``limit``: elements per part (agreed); ``room``: ring elements of both
    sides together (shared by the sides that pack here, or half each with
    ``halves``); ``reducer``: the ufunc of combining receives;
    ``paired``: in place (``source`` and ``target`` share memory; receive i
    overwrites only what sends 0..i read, see :func:`mpiredist.runtime.p2p.run`);
    ``posted``: parts in flight per side, at most.
    """
    me = group.rank
    dtype = _dtype(source, target)
    if dtype is None:                       # no block here: nothing to move
        return
    limit = part_elements(ctx, limit, dtype.itemsize)
    whole = part_elements(ctx, math.inf, dtype.itemsize)
    local = [r for r in recvs if r.own is not None]
    if reducer is None and not paired:
        for r in local:                     # nothing to combine: copied up front
            target.view()[box_index(r.box)] = source.view()[box_index(r.own)]
        recvs = [r for r in recvs if r.own is None]
    sends = [s for s in sends if s.peer != me]
    if not sends and not recvs:             # every piece this rank's own: no messages
        return
    send_seq = _Sequence(sends, limit, whole)
    recv_seq = _Sequence(recvs, limit, whole)
    send_room, recv_room = _rooms(ctx, room, source, target, send_seq, recv_seq, paired,
                                  halves)
    send_buffer, recv_buffer = _buffers(ctx, dtype, send_room, recv_room)
    if source.base is not None:
        synchronize(source.base)

    def received(piece, box):
        view = target.view()[box_index(box)]
        combine = (lambda t, d: reducer(t, d, out=t)) if piece.combine else None
        if piece.own is not None:
            shift = tuple(a - b for a, b in zip(box[0], piece.box[0]))
            own = (tuple(a + b for a, b in zip(piece.own[0], shift)), box[1])
            return p2p.Part(me, view=view, value=source.view()[box_index(own)], combine=combine)
        if combine is not None or paired:       # applied from the ring, in order
            return p2p.Part(piece.peer, view=view, combine=combine)
        return _part(ctx, piece.peer, target, box, recv_room)

    ctx.calls += p2p.run(group,
                         (_part(ctx, s.peer, source, box, send_room) for s, box in send_seq),
                         (received(r, box) for r, box in recv_seq), send_buffer, recv_buffer,
                         paired=paired, posted=posted)


def part_elements(ctx, limit, itemsize):
    """Elements per part as :func:`move` cuts them: at most ``limit`` and within
    the transport's count limit (at least one)."""
    return max(1, min(limit, ctx.count_limit // itemsize))


class _Sequence:
    """``(piece, part box)`` of every part, made on iteration, in ``(part, key)`` order.

    Both ends of a message cut its piece alike and give each part the same
    place relative to the other messages between them: the pipeline's
    condition for progress.  Parts are made one at a time (tiny parts under
    a low count limit would otherwise make lists of thousands).
    """

    def __init__(self, pieces, limit, whole):
        self.pieces = [(x, whole if x.whole else limit)
                       for x in sorted(pieces, key=lambda x: x.key) if math.prod(x.box[1])]

    def __iter__(self):
        live = [(x, iter_parts(x.box[1], limit)) for x, limit in self.pieces]
        while live:
            more = []
            for piece, cut in live:
                part = next(cut, None)
                if part is not None:
                    yield piece, _shift(piece.box, part)
                    more.append((piece, cut))
            live = more


def _rooms(ctx, room, source, target, sends, recvs, paired=False, halves=False):
    """Ring sizes in elements: ``room`` shared by the sides that pack here (or
    half each), each no larger than what its side packs."""
    need = [_need(ctx, seq, region, paired)
            for seq, region in ((sends, source), (recvs, target))]
    packing = [bool(n) for n in need]
    if not any(packing):
        return 0, 0
    share = room // (2 if halves else sum(packing))
    return tuple(min(share, n) for n in need)


def _need(ctx, seq, region, paired):
    """Elements of ``seq``'s parts that go through this side's ring (a piece
    that is one run goes straight in every part)."""
    total = 0
    for piece, limit in seq.pieces:
        if not _packs(ctx, region, piece, piece.box, paired):
            continue
        if isinstance(piece, Recv) and (piece.combine or paired):
            total += math.prod(piece.box[1])
            continue
        total += sum(math.prod(part[1]) for part in iter_parts(piece.box[1], limit)
                     if not _straight(ctx, region, _shift(piece.box, part)))
    return total


def _packs(ctx, region, piece, box, paired=False):
    """True if the part ``box`` of ``piece`` goes through this side's ring."""
    if isinstance(piece, Recv):
        if piece.own is not None:
            return False
        if piece.combine or paired:
            return True
    return not _straight(ctx, region, box)


def _straight(ctx, region, box):
    """True if the part goes to the transport straight from (or into) its array:
    one run of it, and not a device array staged through host rings."""
    return not ctx.staged and _is_run(region, box)


def _dtype(source, target):
    """The element type of the move (of whichever region this rank has)."""
    for region in (source, target):
        if region.base is not None:
            return region.base.dtype
    return None


def _buffers(ctx, dtype, send_room, recv_room):
    if not send_room + recv_room:
        return None, None
    both = ctx.scratch(send_room + recv_room, dtype)
    return (both[:send_room] if send_room else None,
            both[send_room:] if recv_room else None)


def _part(ctx, peer, region, box, room):
    """A :class:`p2p.Part` for ``box`` of ``region``: its straight bytes, a view to
    pack through the ring, or a Strided box when it does not fit and the
    transport takes one (otherwise always the ring, whose parts are cut to
    fit it)."""
    rel, shape = box
    if _straight(ctx, region, box):
        start = flat_offset(region.base.shape, [a + b for a, b in zip(region.starts, rel)])
        return p2p.Part(peer, spec=region.flat[start:start + math.prod(shape)])
    if math.prod(shape) <= room or not ctx.strided:
        return p2p.Part(peer, view=region.view()[box_index(box)])
    return p2p.Part(peer, spec=Strided(region.base, [a + b for a, b in
                                                     zip(region.starts, rel)], shape))


def _is_run(region, box):
    """True if ``box`` of ``region`` is one run of memory (its base is a view
    of a larger array where the caller passed one: then never)."""
    rel, shape = box
    starts = [a + b for a, b in zip(region.starts, rel)]
    return bool(math.prod(shape)) and c_contiguous(region.base) and \
        contiguous_box(region.base.shape, starts, shape)


def _shift(piece, part):
    """The part's box relative to the piece's array."""
    return tuple(a + b for a, b in zip(piece[0], part[0])), part[1]


class Exchange:
    """One exchange between any two sets of boxes, ready to run many times (local set-up).

    Parameters
    ----------
    ctx : Context
        The owner's context (group, element type, scratch).
    sources, targets : list
        Per communicator rank a :class:`~mpiredist.planning.pieces.Source`
        or :class:`~mpiredist.planning.pieces.Target`, or None; the same on
        every rank (they come from agreed shapes and layouts).
    workspace : int
        W: the rings take at most W (half a side).
    op : str
        How partial classes combine.
    views : bool
        Every rank's ``local`` and ``out`` may be views of larger arrays:
        no piece goes whole (every rank must pass the same).
    segments : Segments, optional
        The entries are not ranks but boxes of ranks' blocks
        (:class:`~mpiredist.planning.pieces.Segments`).

    Memory: the caller's target block, plus rings of at most half of W a
    side, less a margin (a quarter of W, at most ``budget.MARGIN``; more where
    this rank's pieces need it, :func:`mpiredist.runtime.p2p.objects_bytes`)
    for what else the call allocates, which also caps the parts in flight
    (:func:`mpiredist.runtime.p2p.posted_within`).  Nothing here communicates
    but :meth:`run`.
    """

    def __init__(self, ctx, sources, targets, workspace, op="sum", views=False, rank=None,
                 segments=None):
        self.ctx, self.group, self.views = ctx, ctx.group, views
        me = ctx.group.rank if rank is None else rank
        n = len(targets)
        holders = Holders(sources)
        self.workspace = workspace
        self.op = op
        if segments is None:            # an entry per rank, its block one box
            owner, mine = list(range(n)), [me]
            src_at = dst_at = None
            src = sources[me] if me < len(sources) else None
            self.source_shape = None if src is None else box_shape(src.box)
            self.target_shape = None if targets[me] is None else box_shape(targets[me].box)
        else:
            owner, views = segments.owners, True     # blocks of several boxes: none goes whole
            mine = [e for e, r in enumerate(owner) if r == me]
            src_at, dst_at = segments.source_at, segments.target_at
            self.source_shape = segments.source_shapes[me]
            self.target_shape = segments.target_shapes[me]

        def where(entries, at, e, box):         # a global box in entry e's owner's block
            rel = relative(box, entries[e].box)
            return rel if at is None else (tuple(a + b for a, b in zip(at[e], rel[0])), rel[1])

        self.sends = [Send((x.cls, (x.peer - e) % n, x.box), owner[x.peer],
                           where(sources, src_at, e, x.box), x.direct and not views)
                      for e in mine if e < len(sources) and sources[e] is not None
                      for x in send_pieces(e, sources, targets, holders)]
        recvs = [(e, x) for e in mine if targets[e] is not None
                 for x in recv_pieces(e, sources, targets, holders)]
        self.combines = any(not x.first for _, x in recvs)
        self.recvs = [Recv((x.cls, (e - x.peer) % n, x.box), owner[x.peer],
                           where(targets, dst_at, e, x.box), x.direct and not views,
                           not x.first,
                           where(sources, src_at, x.peer, x.box) if owner[x.peer] == me
                           else None)
                      for e, x in recvs]
        limit = part_limit(ctx.itemsize, workspace, (True, True))
        if limit == math.inf:                   # a tiny W: parts of a ring each
            limit = max(1, workspace // 2 // ctx.itemsize)
        self.limit = limit
        # elements of both rings: W less a margin for what else a call allocates
        # (its lists, requests and datatypes; more than the margin where the
        # pieces' objects need it: many peers, a small W), and a part each
        # where combining needs the ring
        margin = min(workspace // 4, MARGIN)
        # the pieces that make pipeline objects: messages, and own pieces combined
        pieces = sum(s.peer != me for s in self.sends) + \
            sum(r.own is None or self.combines for r in self.recvs)
        self.posted = p2p.posted_within(margin, pieces)    # their objects within it
        rings = max(0, workspace - max(margin, p2p.objects_bytes(pieces, self.posted)))
        # staged through host rings, every part packs: room for a part each way
        # (a part as move cuts it: within the count limit too)
        part = part_elements(ctx, limit, ctx.itemsize)
        self.room = max(rings // ctx.itemsize,
                        2 * part if self.combines or ctx.staged else 0)
        self.bytes_sent = sum(math.prod(s.box[1]) for s in self.sends if s.peer != me) \
            * ctx.itemsize
        self.views = views

    def free(self):
        """Drop what its context keeps (local, no communication)."""
        self.ctx.free()

    def fill(self, local, out, device=False, records=None):
        """Run from ``local`` into ``out``, or into a new array of the block's
        library (on the device for ``device``) made here; return it.  A block
        that is not C-contiguous is copied first unless the exchange takes
        views (one block more).  ``records``, if a list, receives one
        ``StepRecord("exchange", ...)``: the bytes this rank sends to other
        ranks, the time and the transport calls that moved data."""
        t0, calls = time.perf_counter(), self.ctx.calls
        if local is not None and not self.views and not local.flags.c_contiguous:
            local = array_module(local).ascontiguousarray(local)
        if out is None and self.target_shape is not None:
            xp = array_module(local) if local is not None else (
                cupy_or_error() if device else np)
            dtype = self.ctx.values
            out = xp.empty(self.target_shape, dtype if xp is np else device_dtype(dtype))
        self.run(local, out)
        if records is not None:
            records.append(StepRecord("exchange", self.bytes_sent, time.perf_counter() - t0,
                                      self.ctx.calls - calls))
        return out

    def run(self, local, out):
        """Fill ``out`` (this rank's target block, or None) from ``local`` (or None);
        collective over the group."""
        ctx = self.ctx
        xp = array_module(out if out is not None else local) if (
            out is not None or local is not None) else None
        source = Region(local) if local is not None else _EMPTY
        target = Region(out) if out is not None else _EMPTY
        if xp is not None and xp is not ctx.xp:
            ctx.use(xp)                 # the run's arrays: host or device
        move(ctx, self.group, self.sends, self.recvs, source, target, self.limit, self.room,
             ctx.combiner(self.op) if self.combines else None, halves=True,
             posted=self.posted)


class _Nothing:
    """The region of a rank without a block (no piece refers to it)."""

    base = None
    starts = ()

    def view(self):
        raise AssertionError("internal error: a piece of a rank without a block")


_EMPTY = _Nothing()

