"""Which byte ranges of the saved files a target block needs (pure).

For a target block (a box of the global array) and the saved pieces of the
array, :func:`segments` lists the reads: for every piece that overlaps the
block and every panel of it that does, one contiguous run of the piece's
file -- the rows the block needs, widened to whole tiles where the piece
has checksums, so that every byte read is verified.  A run goes straight
into the block where its bytes are one contiguous run of the block too
(the panel spans the block's extent in every dim after the first, and no
row was added for a tile), else through a read buffer.  :func:`split`
cuts runs that do not fit the buffer at tile boundaries;
:func:`batches` groups adjacent runs of one file into single reads.
"""

import math

from ..core.blocks import contiguous_box, flat_offset
from .grid import cell_span

__all__ = ["Target", "Segment", "segments", "split", "batches", "MAX_IOV", "MAX_READ"]

MAX_IOV = 1024          # buffers of one preadv (Linux's IOV_MAX)
MAX_READ = 1 << 30      # bytes of one read (Linux caps one read at 2 GiB - 4 KiB)


class Target:
    """A block to fill: the array's name, its global box and its memory.

    ``array`` is a numpy array of the box's shape (``box`` of a 0-d array
    is ``((0, 1),)`` and ``array`` a 1-element view); ``straight`` is True
    where runs may be read into its memory directly (it is C-contiguous).
    """

    __slots__ = ("name", "box", "array", "itemsize", "straight", "flat")

    def __init__(self, name, box, array):
        self.name, self.box, self.array = name, box, array
        self.itemsize = array.dtype.itemsize
        self.straight = bool(array.flags.c_contiguous)
        self.flat = None

    def bytes_view(self):
        """The block's bytes, a flat uint8 view (straight targets only)."""
        if self.flat is None:
            self.flat = self.array.reshape(-1).view("u1")
        return self.flat


class Segment:
    """One contiguous run of a file, and where its bytes go.

    ``rows`` ``(ra, rb)`` is the range of the first dim read from panel
    ``panel`` of ``piece``; the target takes the part of the read box
    (:attr:`read_box`) inside its own (:attr:`need`).  ``straight``: read
    into the target's memory at byte ``at``.  Small: a plan holds many.
    """

    __slots__ = ("file", "offset", "nbytes", "target", "piece", "panel", "rows", "straight",
                 "at")

    def __init__(self, file, offset, nbytes, target, piece, panel, rows, straight, at):
        self.file, self.offset, self.nbytes = file, offset, nbytes
        self.target, self.piece, self.panel, self.rows = target, piece, panel, rows
        self.straight, self.at = straight, at

    @property
    def read_box(self):
        return (self.rows,) + self.piece.geometry.ranges(self.panel)

    @property
    def need(self):
        return _clip(self.read_box, self.target.box)

    @property
    def needed_bytes(self):
        return math.prod(b - a for a, b in self.need) * self.target.itemsize

    def __repr__(self):
        return (f"Segment({self.target.name!r}, offset={self.offset}, nbytes={self.nbytes}, "
                f"rows={self.rows}, straight={self.straight})")


def _clip(a, b):
    return tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))


def segments(target, pieces):
    """The reads that fill ``target`` (a :class:`Target`) from ``pieces``, in the
    pieces' order."""
    out = []
    tbox = target.box
    for piece in pieces:
        g = piece.geometry
        over = _clip(g.box, tbox)
        if any(lo >= hi for lo, hi in over):
            continue
        a, b = over[0]
        if piece.checked:
            ra, rb = cell_span(g.shape[0], g.parts[0], *g.box[0], a, b)
        else:
            ra, rb = a, b
        if piece.whole:
            ra, rb = g.box[0]
        for panel, ranges in g.panels_in(over[1:]):
            if piece.whole:
                ranges = g.box[1:]
            need = ((a, b),) + _clip(ranges, over[1:])
            offset, nbytes = g.run(panel, ra, rb)
            straight, at = False, 0
            if target.straight and (ra, rb) == (a, b) and not piece.whole \
                    and need[1:] == ranges:
                starts = tuple(lo - t for (lo, _), (t, _) in zip(need, tbox))
                shape = tuple(hi - lo for lo, hi in need)
                full = tuple(hi - lo for lo, hi in tbox)
                if contiguous_box(full, starts, shape):
                    straight, at = True, flat_offset(full, starts) * target.itemsize
            out.append(Segment(piece.file, piece.offset + offset, nbytes, target, piece,
                               panel, (ra, rb), straight, at))
            if piece.whole:
                break
    return out


def split(segment, limit):
    """``segment`` cut into runs of at most ``limit`` bytes (at least one tile or
    row each), at tile boundaries where the piece has checksums."""
    if segment.straight or segment.nbytes <= limit or segment.piece.whole:
        return [segment]
    g, piece = segment.piece.geometry, segment.piece
    row = g.row_bytes(segment.panel)
    ra, rb = segment.rows
    c = max(1, -(-g.shape[0] // g.parts[0])) if piece.checked else 1
    step = max(c, (limit // max(row, 1)) // c * c)
    a, b = segment.target.box[0]
    out, start = [], ra
    while start < rb:
        stop = min(rb, (start + step) // c * c)
        offset, nbytes = g.run(segment.panel, start, stop)
        if max(a, start) < min(b, stop):
            out.append(Segment(segment.file, piece.offset + offset, nbytes, segment.target,
                               piece, segment.panel, (start, stop), False, 0))
        start = stop
    return out


def batches(runs, limit):
    """Group ``runs`` (segments of one file, sorted by offset) into single reads:
    adjacent in the file, at most ``limit`` buffered bytes, :data:`MAX_IOV`
    buffers and :data:`MAX_READ` bytes each."""
    out, batch, end, buffered, total = [], [], None, 0, 0
    for s in runs:
        extra = 0 if s.straight else s.nbytes
        if batch and (s.offset != end or buffered + extra > limit or len(batch) >= MAX_IOV
                      or total + s.nbytes > MAX_READ):
            out.append(batch)
            batch, buffered, total = [], 0, 0
        batch.append(s)
        end = s.offset + s.nbytes
        buffered += extra
        total += s.nbytes
    if batch:
        out.append(batch)
    return out
