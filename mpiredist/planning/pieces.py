"""Who sends which box to whom: the one piece model of every exchange (pure).

Every exchange -- a plan's ``exchange`` step, a move between two meshes,
``reshape``, slicing and ``concatenate`` -- is described the same way: per
rank of the communicator at most one :class:`Source` (a global box, the
*class* of its values and a *block* key) and at most one :class:`Target` (a
global box, and the class it keeps or None).  Sources with the same block
and class hold the same values (replicas); different classes of one block
are partial results.  A target that keeps a class takes only that class's
values; one with class None takes every class, combined with the
reduction op, classes in ascending order (so replicated results are bitwise
equal).

Holders (:class:`Holders`): for each block and class, the ranks holding it,
in rank order.  Receiver ``q`` takes a piece of block ``b`` from itself
when it holds ``b`` (in that class); otherwise from holder ``rot(q) mod k``
of the ``k`` holders, where ``rot(q)`` is ``q``'s position among the
holders of its own source block plus that block's position among all
blocks (ordered by their first holder), or ``q`` itself when it holds no
source.  This spreads the receivers of one block evenly over its holders.
For the blocks of a layout on a mesh (:func:`layout_sources`, whose block
key is the shard index per dim) the holders of a block differ only in the
digits of the free sub-axes, so ``rot(q)`` is ``q``'s free index plus its
shard index: the rule the planner prices at any scale without enumerating
ranks (:func:`mpiredist.planning.costs.exchange_bytes`).

A piece is *direct* when it is one contiguous stretch of both the sender's
source block and the receiver's target block and is not combined with
other classes: both ends know it from the boxes alone, and it goes whole,
without a buffer.  Pieces are exchanged in parts (:func:`parts`) in the
order of :func:`key` at both ends of every message.
"""

import math
from collections import namedtuple

import numpy as np

from ..core.blocks import block_index, box_size, contiguous_in, overlap, rank_block
from ..core.layout import Layout
from ..core.mesh import Mesh
from ..core.subaxes import SubLayout, expand, rank_digits
from .budget import workspace_for

__all__ = ["Source", "Target", "Piece", "Segments", "Holders", "layout_sources", "layout_targets",
           "plan_pieces",
           "layout_boxes", "box_sources", "recv_pieces", "send_pieces", "parts", "iter_parts", "part_limit",
           "ring_part_limit",
           "exchange_workspace", "simulate", "REDUCERS", "MIN_PART", "DEPTH"]

# How partial classes combine (numpy ufuncs: combining in a fixed order,
# also for dtypes that MPI cannot reduce).
REDUCERS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
MIN_PART = 4096     # bytes: smaller parts cost more in latency than packing saves
DEPTH = 2           # packed parts in flight per side, when parts stay over MIN_PART

Source = namedtuple("Source", "box cls block")
Source.__doc__ = """A rank's source: its global ``box``, the class ``cls`` of its values
(index over the partial axes; 0 without them) and a hashable ``block`` key
that tells blocks apart (the shard indices for a layout, else the box)."""

Target = namedtuple("Target", "box cls")
Target.__doc__ = """A rank's target: its global ``box`` and the class it keeps, or None
when every class is combined into it."""

Piece = namedtuple("Piece", "peer box cls first direct")
Piece.__doc__ = """A piece of one exchange: the other rank (this rank for its own piece),
the global ``box``, the source class, whether it is the ``first`` piece of
its box at the receiver (copied; later ones are combined into it), and
whether it is ``direct`` (contiguous at both ends, not combined: sent whole)."""

Segments = namedtuple("Segments", "owners source_at target_at source_shapes target_shapes")
Segments.__doc__ = """Where the entries of an exchange lie when a rank's block is several
boxes (DTensor's strided shards: its local tensor joins pieces that are
apart in the global array).  The sources and targets are then per *entry*,
one box each, and ``owners[e]`` is the rank that holds entry ``e``;
``source_at[e]`` / ``target_at[e]``: the starts of the entry's box inside
its owner's block (None where it has no such entry); ``source_shapes[r]`` /
``target_shapes[r]``: rank ``r``'s whole block shape (None without one).
The piece model runs over the entries unchanged; only the ends of each
piece are mapped to ranks and block offsets."""


def layout_sources(shape, mesh, layout, comm_size):
    """Per communicator rank: its :class:`Source` in ``layout`` on ``mesh``, or None.

    The class is the index over the layout's partial sub-axes, the block
    key the shard index of each dim.
    """
    sub = _sub(layout, mesh)
    out = [None] * comm_size
    for device, rank in enumerate(mesh.device_ranks()):
        digits = rank_digits(mesh, device)
        out[rank] = Source(rank_block(tuple(shape), sub, digits),
                           block_index(sub.partial, digits),
                           tuple(block_index(g, digits) for g in sub.dims))
    return out


def layout_boxes(shape, mesh, layout, comm_size):
    """Per communicator rank: its box in ``layout`` on ``mesh``, or None off the mesh."""
    return [None if s is None else s.box for s in layout_sources(shape, mesh, layout, comm_size)]


def layout_targets(shape, mesh, layout, comm_size, keep_classes=False):
    """Per communicator rank: its :class:`Target` in ``layout`` on ``mesh``, or None.

    With ``keep_classes`` each target keeps its own class (an exchange
    between layouts with the same partial axes); else classes combine.
    """
    sub = _sub(layout, mesh)
    out = [None] * comm_size
    for device, rank in enumerate(mesh.device_ranks()):
        digits = rank_digits(mesh, device)
        cls = block_index(sub.partial, digits) if keep_classes else None
        out[rank] = Target(rank_block(tuple(shape), sub, digits), cls)
    return out


def plan_pieces(plan, before, after, keep_classes, shape=None):
    """``(sources, targets)`` of a move from layout ``before`` to ``after`` of
    ``plan`` on its mesh's own communicator, whose rank is the device (a
    plan's exchange step, a staged device run), whatever ranks the mesh names.
    ``shape``: the global shape the layouts are of (default the steps',
    :attr:`Plan.step_shape <mpiredist.planning.plans.Plan.step_shape>`)."""
    devices, n = Mesh(plan.mesh.axes), plan.mesh.size
    shape = plan.step_shape if shape is None else shape
    return (layout_sources(shape, devices, before, n),
            layout_targets(shape, devices, after, n, keep_classes=keep_classes))


def _sub(layout, mesh):
    """``layout`` (a Layout, its text, or a SubLayout already) over sub-axes."""
    return layout if isinstance(layout, SubLayout) else expand(Layout.parse(layout), mesh)


def box_sources(entries):
    """:class:`Source` entries from ``(box, class)`` pairs (or None): the box is the key."""
    return [None if e is None or e[0] is None else Source(e[0], e[1], e[0]) for e in entries]


class Holders:
    """The source entries of every rank, grouped by block and class (pure).

    ``groups[(block, cls)]`` lists the holders in rank order, ``blocks``
    the blocks in the order of their first holder, ``box[block]`` its box
    and ``classes[block]`` its classes in ascending order.
    """

    __slots__ = ("sources", "groups", "blocks", "box", "classes", "_position", "_index")

    def __init__(self, sources):
        self.sources = list(sources)
        self.groups, self.box, classes = {}, {}, {}
        for rank, s in enumerate(self.sources):
            if s is None:
                continue
            self.groups.setdefault((s.block, s.cls), []).append(rank)
            if s.block not in self.box:
                self.box[s.block] = s.box
            classes.setdefault(s.block, set()).add(s.cls)
        self.blocks = list(self.box)                # first holders come in rank order
        self.classes = {b: sorted(c) for b, c in classes.items()}
        self._index = {b: i for i, b in enumerate(self.blocks)}
        self._position = {}
        for ranks in self.groups.values():
            for i, r in enumerate(ranks):
                self._position[r] = i

    def __repr__(self):
        return f"Holders({len(self.blocks)} blocks, {len(self.groups)} groups)"

    def rotation(self, q):
        """``rot(q)`` of the module doc: which holder receiver ``q`` takes."""
        s = self.sources[q] if q < len(self.sources) else None
        if s is None:
            return q
        return self._position[q] + self._index[s.block]

    def holder(self, q, block, cls):
        """The rank that sends receiver ``q`` its piece of ``block`` in class ``cls``."""
        ranks = self.groups[(block, cls)]
        s = self.sources[q] if q < len(self.sources) else None
        if s is not None and s.block == block and s.cls == cls:
            return q
        return ranks[self.rotation(q) % len(ranks)]


def _classes(holders, block, target):
    """Classes of ``block`` that ``target`` takes (all, or the one it keeps)."""
    found = holders.classes[block]
    if target.cls is None:
        return found
    return [target.cls] if target.cls in found else []


def _direct(piece, sbox, tbox, combined):
    return not combined and contiguous_in(piece, sbox) and contiguous_in(piece, tbox)


def recv_pieces(q, sources, targets, holders=None):
    """The pieces rank ``q`` receives (its own included), ordered by (box, class)."""
    t = targets[q] if q < len(targets) else None
    if t is None:
        return []
    holders = Holders(sources) if holders is None else holders
    out = []
    for block in holders.blocks:
        sbox = holders.box[block]
        piece = overlap(sbox, t.box) if t.box else ()
        if piece is None or box_size(piece) == 0:
            continue
        classes = _classes(holders, block, t)
        for n, cls in enumerate(classes):
            out.append(Piece(holders.holder(q, block, cls), piece, cls, n == 0,
                             _direct(piece, sbox, t.box, len(classes) > 1)))
    return sorted(out, key=lambda x: (x.box, x.cls))


def send_pieces(p, sources, targets, holders=None):
    """The pieces rank ``p`` sends (its own included), ordered by receiver."""
    s = sources[p] if p < len(sources) else None
    if s is None:
        return []
    holders = Holders(sources) if holders is None else holders
    out = []
    for q, t in enumerate(targets):
        if t is None:
            continue
        piece = overlap(s.box, t.box) if t.box else ()
        if piece is None or box_size(piece) == 0:
            continue
        classes = _classes(holders, s.block, t)
        if s.cls not in classes or holders.holder(q, s.block, s.cls) != p:
            continue
        out.append(Piece(q, piece, s.cls, classes[0] == s.cls,
                         _direct(piece, s.box, t.box, len(classes) > 1)))
    return out


def exchange_workspace(sources, targets, itemsize, segments=None):
    """The default W of an exchange: that of its largest source or target block
    (of the ranks' blocks, with ``segments``)."""
    if segments is not None:
        most = max([math.prod(s) for s in segments.source_shapes + segments.target_shapes
                    if s is not None] + [0])
        return workspace_for(most * itemsize)
    most = max([box_size(s.box) for s in sources if s is not None] +
               [box_size(t.box) for t in targets if t is not None] + [0])
    return workspace_for(most * itemsize)


def part_limit(itemsize, room, sides):
    """Elements per part from the ring room and which ``sides`` pack (agreed values).

    ``sides`` is ``(send, recv)``.  The room (bytes) is shared by the packing
    sides; a part is a ``DEPTH``-th of its side's share, so that several
    parts are in flight while the next is packed, or the whole share if that
    part would be under ``MIN_PART`` bytes.  No limit (parts that do not fit
    go as datatypes) when nothing packs or the share itself is under
    ``MIN_PART``.
    """
    packing = sum(map(bool, sides))
    if not packing:
        return math.inf
    share = room // packing // itemsize
    for depth in (DEPTH, 1):
        if share // depth * itemsize >= MIN_PART:
            return share // depth
    return math.inf


def ring_part_limit(itemsize, room, sides):
    """Elements per part of a move whose parts must all fit their ring (in place):
    :func:`part_limit`, or where that is unbounded the whole share of a side
    (at least one element)."""
    limit = part_limit(itemsize, room, sides)
    if limit != math.inf:
        return limit
    return max(1, room // max(1, sum(map(bool, sides))) // itemsize)


def parts(shape, limit):
    """Boxes ``(starts, shape)`` that cut ``shape`` into parts of at most ``limit``
    elements (along the first dims longer than 1, in C order; any count if
    ``limit`` is infinite).  Both ends of a message cut its piece so; a box
    that is one run of its array stays one in every part."""
    return list(iter_parts(shape, limit))


def iter_parts(shape, limit):
    """:func:`parts`, one at a time (a piece of many parts holds no list of them)."""
    ndim = len(shape)
    if math.prod(shape) <= limit or not ndim:
        yield (0,) * ndim, tuple(shape)
        return
    d = next(k for k, n in enumerate(shape) if n > 1)
    inner = math.prod(shape[d + 1:])
    zeros = (0,) * ndim
    if inner <= limit:
        rows = limit // inner
        for lo in range(0, shape[d], rows):
            yield (zeros[:d] + (lo,) + zeros[d + 1:],
                   shape[:d] + (min(rows, shape[d] - lo),) + shape[d + 1:])
        return
    below = shape[:d] + (1,) + shape[d + 1:]
    for lo in range(shape[d]):
        for starts, box in iter_parts(below, limit):
            yield starts[:d] + (lo,) + starts[d + 1:], box


def simulate(arrays, sources, targets, op="sum"):
    """Every rank's target block, moved by the pieces above (no MPI; for tests).

    ``arrays`` is the global array of each class (a list, or one array
    without classes).  Checks that every piece a rank receives is one its
    holder sends, and returns the target blocks (None off the targets).
    """
    arrays = arrays if isinstance(arrays, list) else [arrays]
    holders = Holders(sources)
    sent = {(p, x.peer, x.box, x.cls) for p in range(len(sources))
            for x in send_pieces(p, sources, targets, holders)}
    reducer = REDUCERS[op]
    out = []
    for q, t in enumerate(targets):
        if t is None:
            out.append(None)
            continue
        block = np.empty(tuple(hi - lo for lo, hi in t.box), arrays[0].dtype)
        for x in recv_pieces(q, sources, targets, holders):
            if (x.peer, q, x.box, x.cls) not in sent:
                raise AssertionError(f"rank {q} expects {x} that rank {x.peer} does not send")
            value = arrays[x.cls][tuple(slice(a, b) for a, b in x.box)]
            where = block[tuple(slice(a - lo, b - lo) for (a, b), (lo, _) in zip(x.box, t.box))]
            if x.first:
                where[...] = value
            else:
                reducer(where, value, out=where)
        out.append(block)
    return out
