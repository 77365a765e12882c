"""A direct exchange between any two sets of blocks, in rounds within a budget (pure).

Used where the collective normal form does not apply: between meshes whose
rank orders do not nest, or between shapes (``reshape``).  Every rank of the
communicator has at most one source box and one target box (global
``(start, stop)`` per dim), or ``None``; source boxes of different ranks are
identical or disjoint, as blocks of a layout are.  Source ranks with the same
box and the same *class* (index over the partial axes) hold the same values;
different classes of a box are partial results to combine with ``op``.

Who sends what (:func:`recv_pieces`, :func:`send_pieces`), decided from the
boxes alone, so every rank derives the same answer:

- a target rank that holds the data itself copies it locally;
- otherwise, for a non-partial source, the piece is split along its longest
  dim among all ranks that hold it, part ``i`` from holder ``(i + q) mod k``
  (the load of a replicated source is spread over its holders);
- for a partial source, each class sends its whole piece, from holder
  ``q mod k`` of that class, so the parts of all classes coincide and the
  target combines them in class order (the same order on every target, so
  replicated results are bitwise equal).

Rounds (:func:`segment_items`): every piece is cut into segments of ``s``
items, in C order; round ``r`` moves segment ``r`` of every piece.  With
``s = B // (itemsize * peers)`` (``peers`` the most remote pieces any rank
sends or receives), no rank packs more than ``B`` bytes to send or receives
more than ``B`` in a round: with ``B = W // 2`` an exchange allocates the
target block plus at most ``W``.
"""

from collections import namedtuple

import numpy as np

from ..core.blocks import (block_index, box_size, flat_range_boxes, interval, overlap,
                           rank_block, sub_index)
from ..core.layout import Layout
from ..core.subaxes import expand, rank_digits
from .budget import workspace_for

__all__ = ["mesh_boxes", "Piece", "recv_pieces", "send_pieces", "segment_items", "rounds",
           "contiguous", "buffered_peers", "plan_rounds", "exchange_workspace",
           "segment_boxes", "simulate", "holders_of", "REDUCERS"]

REDUCERS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}

Piece = namedtuple("Piece", "peer box cls direct")
Piece.__doc__ = """A piece of one exchange: the other rank, the global box, the source
class, and whether it is *direct*: one contiguous stretch of both the sender's
source block and the receiver's target block, of a source without partial
classes (or this rank's own piece of such a source).  A direct piece needs no
buffer and goes whole (within the count limit); both ends know it from the
boxes alone."""


def mesh_boxes(shape, mesh, layout, comm_size, partial=False):
    """Per communicator rank: its box of ``layout`` on ``mesh``, or None off the mesh.

    With ``partial`` each entry is ``(box, class)``, the class being the
    rank's index over the layout's partial axes (a source entry).
    """
    sub = expand(Layout.parse(layout), mesh)
    out = [None] * comm_size
    for device, rank in enumerate(mesh.device_ranks()):
        digits = rank_digits(mesh, device)
        box = rank_block(tuple(shape), sub, digits)
        out[rank] = (box, block_index(sub.partial, digits)) if partial else box
    return out


def exchange_workspace(src, dst, itemsize):
    """The default W of an exchange: that of its largest source or target block."""
    most = max([box_size(e[0]) for e in src if e is not None and e[0] is not None] +
               [box_size(b) for b in dst if b is not None] + [0])
    return workspace_for(most * itemsize)


def holders_of(src):
    """``{box: {class: sorted ranks}}`` of the source entries ``(box, class)``."""
    out = {}
    for rank, entry in enumerate(src):
        if entry is not None and entry[0] is not None:
            box, cls = entry
            out.setdefault(box, {}).setdefault(cls, []).append(rank)
    return out


def _split(box, k, i):
    """Part ``i`` of ``k`` of ``box``, cut along its longest dim (None if empty)."""
    if not box:
        return box if i == 0 else None
    d = max(range(len(box)), key=lambda j: (box[j][1] - box[j][0], -j))
    lo, hi = box[d]
    a, b = interval(hi - lo, k, i)
    if a >= b:
        return None
    return box[:d] + ((lo + a, lo + b),) + box[d + 1:]


def _parts(q, piece, classes):
    """``[(holder, part, class)]`` that target ``q`` receives for one source box."""
    out = []
    partial = len(classes) > 1
    for cls in sorted(classes):
        ranks = classes[cls]
        k = len(ranks)
        if q in ranks:
            out.append((q, piece, cls))
        elif partial:
            out.append((ranks[q % k], piece, cls))
        else:
            for i in range(k):
                part = _split(piece, k, i)
                if part is not None:
                    out.append((ranks[(i + q) % k], part, cls))
    return out


def contiguous(sub, box):
    """True if ``sub`` is one contiguous stretch of a C-order block holding ``box``."""
    ext = [b - a for a, b in sub]
    k = next((i for i, n in enumerate(ext) if n > 1), len(ext))
    return all(ext[j] == box[j][1] - box[j][0] for j in range(k + 1, len(ext)))


def _direct(p, q, part, sbox, tbox, classes):
    if len(classes) > 1:
        return False
    return p == q or (contiguous(part, sbox) and contiguous(part, tbox))


def recv_pieces(q, src, dst, holders=None):
    """Pieces that rank ``q`` receives, ordered by (part, class): combine in this order."""
    box = dst[q]
    if box is None:
        return []
    holders = holders_of(src) if holders is None else holders
    out = []
    for sbox, classes in holders.items():
        piece = overlap(sbox, box) if box else ()
        if piece is None or box_size(piece) == 0:
            continue
        out.extend(Piece(p, part, cls, _direct(p, q, part, sbox, box, classes))
                   for p, part, cls in _parts(q, piece, classes))
    return sorted(out, key=lambda x: (x.box, x.cls))


def send_pieces(p, src, dst, holders=None):
    """Pieces that rank ``p`` sends (its own target included), ordered by target."""
    if src[p] is None or src[p][0] is None:
        return []
    sbox, cls = src[p]
    holders = holders_of(src) if holders is None else holders
    classes = holders[sbox]
    out = []
    for q, box in enumerate(dst):
        if box is None:
            continue
        piece = overlap(sbox, box) if box else ()
        if piece is None or box_size(piece) == 0:
            continue
        out.extend(Piece(q, part, cls, _direct(p, q, part, sbox, box, classes))
                   for h, part, c in _parts(q, piece, classes) if h == p and c == cls)
    return out


def segment_items(budget, itemsize, peers, limit_bytes=None):
    """Items per segment: ``budget // (itemsize * peers)``, at least 1, within ``limit_bytes``."""
    s = budget // (itemsize * max(1, peers))
    if limit_bytes is not None:
        s = min(s, limit_bytes // itemsize)
    return max(1, s)


def rounds(items, s):
    """Rounds to move ``items`` in segments of ``s``."""
    return -(-items // s)


def buffered_peers(pieces, rank):
    """Pieces of ``pieces`` that go through a buffer: remote and not direct."""
    return sum(x.peer != rank and not x.direct for x in pieces)


def plan_rounds(sends, recvs, rank, budget, itemsize, limit_bytes=None):
    """This rank's ``(buffered peers, largest buffered piece, rounds of its direct
    pieces)``: the figures whose maxima over ranks fix the segments and rounds."""
    pieces = [x for x in sends + recvs if x.peer != rank]
    direct = max(1, (limit_bytes // itemsize) if limit_bytes else 1 << 62)
    return (max(buffered_peers(sends, rank), buffered_peers(recvs, rank)),
            max([box_size(x.box) for x in pieces if not x.direct] + [0]),
            max([rounds(box_size(x.box), direct) for x in pieces if x.direct] + [0]))


def segment_boxes(box, r, s):
    """Global boxes of segment ``r`` (items ``[r*s, (r+1)*s)``) of ``box``, C order."""
    n = box_size(box)
    lo, hi = r * s, min((r + 1) * s, n)
    if lo >= hi:
        return []
    shape = tuple(b - a for a, b in box)
    return [tuple((a + x, a + y) for (a, _), (x, y) in zip(box, sub))
            for sub in flat_range_boxes(shape, lo, hi)]


def simulate(array, src, dst, op="sum", budget=1 << 20, itemsize=None):
    """Every rank's target block, moving ``array``'s source blocks by the rounds above.

    ``array`` is the global array per class: a list of arrays (one per class)
    or one array for a non-partial source.  Returns ``(blocks, stats)``,
    ``stats`` holding the rounds and the most bytes any rank packed or
    received in one round.  No MPI: for tests of the piece rules.
    """
    arrays = array if isinstance(array, list) else [array]
    itemsize = arrays[0].itemsize if itemsize is None else itemsize
    holders = holders_of(src)
    recvs = [recv_pieces(q, src, dst, holders) for q in range(len(dst))]
    sends = [send_pieces(p, src, dst, holders) for p in range(len(src))]
    figures = [plan_rounds(sends[r], recvs[r] if r < len(recvs) else [], r, budget, itemsize)
               for r in range(len(src))]
    peers = max([f[0] for f in figures] + [1])
    s = segment_items(budget, itemsize, peers)
    total = max([rounds(f[1], s) for f in figures] + [f[2] for f in figures] + [0])
    total = max([total] + [rounds(box_size(x.box), s) if not x.direct else 1
                           for q, pieces in enumerate(recvs) for x in pieces if x.peer == q])
    out = [None if b is None else np.empty(tuple(hi - lo for lo, hi in b), arrays[0].dtype)
           for b in dst]
    most = 0
    for r in range(total):
        for q, pieces in enumerate(recvs):
            got = _apply(out[q], dst[q], pieces, arrays, r, s, REDUCERS[op], q)
            most = max(most, got * itemsize)
        for p, pieces in enumerate(sends):
            n = sum(box_size(b) for x in pieces if x.peer != p and not x.direct
                    for b in segment_boxes(x.box, r, s))
            most = max(most, n * itemsize)
    return out, dict(rounds=total, segment=s, peers=peers, most_bytes=most)


def _apply(block, box, pieces, arrays, r, s, reducer, q):
    """Combine segment ``r`` of ``pieces`` into ``block``; items received from others."""
    received, first = 0, set()
    for x in pieces:
        for sub in segment_boxes(x.box, r, box_size(x.box) if x.direct else s):
            value = arrays[x.cls][tuple(slice(a, b) for a, b in sub)]
            target = block[sub_index(box, sub)]
            if sub in first:
                reducer(target, value, out=target)
            else:
                target[...] = value
                first.add(sub)
            if x.peer != q and not x.direct:
                received += box_size(sub)
    return received
