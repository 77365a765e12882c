"""The tile grid of a saved array, where each tile's bytes lie, and their checksums.

Every saved array has a *grid*: a power of two of parts per dim, cut by the
block rule (part ``i`` of ``k`` on a dim of length ``n`` is ``[i c, min((i +
1) c, n))``, ``c = ceil(n / k)``, as a layout cuts it), so that the blocks
of the common target layouts -- a dim split over 2, 4, 8 or 16 ranks --
start and end on grid lines.  A saved box (a sub-box of the array, written
by one rank) is stored as *panels*: the grid's cells of the dims after the
first, in C order, each holding every row of the box (its whole range of
the first dim) in C order.  A panel's rows are cut by the grid of the first
dim into *tiles*, and each tile has a checksum; a tile is one contiguous
run of the file.

So a target block that takes rows ``[a, b)`` of a panel reads one
contiguous run (the tiles that cover ``[a, b)``), and one that takes a
column strip reads whole panels, consecutive in the file: few reads, each
verified, and over-read only where a target's edge falls inside a tile.
The grid is chosen by :func:`grid` from the shape and the item size alone.

A 0-d array is stored as one element (the geometry of shape ``(1,)``).
"""

import math
import zlib

from ..core.blocks import interval

__all__ = ["grid", "cells", "cell_span", "Geometry", "PANEL_PARTS", "PANEL_ROW", "PANELS",
           "TILE", "TILE_MAX", "SLABS"]

PANEL_PARTS = 16        # most parts of a dim after the first
PANEL_ROW = 256         # least bytes of a panel's row (numpy copied 128-byte rows at 0.3 GB/s, 256 at 0.7)
PANELS = 256            # most panels of an array
TILE = 2048             # least bytes of a tile, where the first dim allows
TILE_MAX = 1 << 20      # a panel's row is split further until a tile fits this
SLABS = 1 << 16         # most parts of the first dim


def _shape(shape):
    """The geometry's shape: a 0-d array is one element."""
    return tuple(shape) if len(shape) else (1,)


def grid(shape, itemsize):
    """Parts per dim (powers of two) of an array of ``shape`` and ``itemsize`` bytes.

    The dims after the first are halved, the longest part first, while a
    panel's row keeps at least :data:`PANEL_ROW` bytes, each dim at most
    :data:`PANEL_PARTS` parts and the array at most :data:`PANELS` panels
    (and further while a row exceeds :data:`TILE_MAX`); the first dim is
    halved while a tile keeps at least :data:`TILE` bytes.
    """
    shape = _shape(shape)
    parts = [1] * len(shape)

    def row_bytes(p):
        return itemsize * math.prod(-(-n // k) for n, k in zip(shape[1:], p[1:]))

    def splittable(d):
        return 2 * parts[d] <= shape[d]

    while True:                     # panels
        dims = [d for d in range(1, len(shape)) if splittable(d)]
        if not dims:
            break
        d = max(dims, key=lambda d: -(-shape[d] // parts[d]))
        trial = parts[:d] + [2 * parts[d]] + parts[d + 1:]
        wide = row_bytes(parts) > TILE_MAX
        if not wide and (parts[d] >= PANEL_PARTS or math.prod(trial[1:]) > PANELS
                         or row_bytes(trial) < PANEL_ROW):
            break
        parts = trial
    row = row_bytes(parts)
    while (splittable(0) and parts[0] < SLABS
           and -(-shape[0] // (2 * parts[0])) * row >= TILE):
        parts[0] *= 2
    return tuple(parts)


def cells(n, parts, lo, hi):
    """The grid's cells of a dim of length ``n`` in ``parts`` inside ``[lo, hi)``:
    ``(first index, [(start, stop), ...])``, clipped to ``[lo, hi)``, none empty."""
    if hi <= lo:
        return 0, []
    c = -(-n // parts)
    first, last = lo // c, (hi - 1) // c
    out = []
    for i in range(first, last + 1):
        a, b = interval(n, parts, i)
        out.append((max(a, lo), min(b, hi)))
    return first, out


def cell_span(n, parts, lo, hi, a, b):
    """The rows of the cells of ``[lo, hi)`` that cover ``[a, b)``: ``(start, stop)``."""
    c = -(-n // parts)
    return max(lo, (a // c) * c), min(hi, -(-b // c) * c)


class Geometry:
    """Where the bytes of one saved box lie, relative to the box's offset.

    Computed from the grid on demand, and kept for the panels asked about (a
    few hundred bytes per box and panel read, whatever its number of tiles).

    Parameters
    ----------
    shape : tuple of int
        The array's global shape.
    parts : tuple of int
        Its grid (:func:`grid`); all ones for storage in plain C order
        (DCP's), whose first dim then has no tiles to check.
    box : tuple of (int, int)
        The saved box, global indices, per dim (a 0-d array: ``()``).
    itemsize : int
    """

    __slots__ = ("shape", "parts", "box", "itemsize", "cells", "counts", "widths", "panels",
                 "first_slab", "slab_count", "nbytes", "_known")

    def __init__(self, shape, parts, box, itemsize):
        self.shape, self.itemsize = _shape(shape), itemsize
        self.parts = tuple(parts) if len(parts) else (1,)
        self.box = tuple(tuple(b) for b in box) if len(box) else ((0, 1),)
        self.cells, self.counts, self.widths = [], [], []
        for n, k, (lo, hi) in zip(self.shape[1:], self.parts[1:], self.box[1:]):
            c = max(1, -(-n // k))
            first = lo // c
            self.cells.append((c, first))
            self.counts.append((-(-hi // c) - first) if hi > lo else 0)
            self.widths.append(hi - lo)
        self.panels = math.prod(self.counts)
        rows = self.box[0][1] - self.box[0][0]
        self.nbytes = rows * itemsize * math.prod(self.widths)
        c = max(1, -(-self.shape[0] // self.parts[0]))
        lo, hi = self.box[0]
        self.first_slab = lo // c
        self.slab_count = (-(-hi // c) - self.first_slab) if hi > lo else 0
        self._known = {}        # panel -> (ranges, row bytes, offset), as asked for

    def _panel(self, panel):
        found = self._known.get(panel)
        if found is None:
            digits = self._digits(panel)
            cells = [self._cell(d, i) for d, i in enumerate(digits)]
            elems = 0
            for d, (a, _) in enumerate(cells):
                inner = math.prod(hi - lo for lo, hi in cells[:d])
                elems += (a - self.box[d + 1][0]) * inner * math.prod(self.widths[d + 1:])
            row = self.itemsize * math.prod(b - a for a, b in cells)
            found = self._known[panel] = (tuple(cells), row, elems * (
                self.box[0][1] - self.box[0][0]) * self.itemsize)
        return found

    @property
    def tiles(self):
        """Number of tiles (checksums): panels times slabs, panel-major."""
        return self.panels * self.slab_count

    def _digits(self, panel):
        out = []
        for count in reversed(self.counts):
            panel, i = divmod(panel, count)
            out.append(i)
        return out[::-1]

    def _cell(self, d, i):
        """Range of cell ``i`` (counted from the box's first) of dim ``d + 1``."""
        c, first = self.cells[d]
        lo, hi = self.box[d + 1]
        return max(lo, (first + i) * c), min(hi, (first + i + 1) * c)

    def ranges(self, panel):
        """The ranges of ``panel`` in the dims after the first."""
        return self._panel(panel)[0]

    def row_bytes(self, panel):
        """Bytes of one row of ``panel``."""
        return self._panel(panel)[1]

    def panel_offset(self, panel):
        """Bytes before ``panel``: C order over the panels, each holding every row."""
        return self._panel(panel)[2]

    def panels_in(self, ranges):
        """``(index, ranges)`` of the panels that overlap ``ranges`` (per dim after
        the first), in file order."""
        out = [(0, ())]
        for d, (lo, hi) in enumerate(ranges):
            c, first = self.cells[d]
            a = max(lo // c - first, 0)
            b = min(-(-hi // c) - first, self.counts[d])
            cells = [(i, self._cell(d, i)) for i in range(a, b)]
            cells = [(i, cell) for i, cell in cells if cell[0] < hi and lo < cell[1]]
            out = [(k * self.counts[d] + i, r + (cell,)) for k, r in out for i, cell in cells]
        return out

    def run(self, panel, a, b):
        """``(offset, nbytes)`` of rows ``[a, b)`` of ``panel`` (global rows)."""
        _, rb, at = self._panel(panel)
        return at + (a - self.box[0][0]) * rb, (b - a) * rb

    def slab_range(self, a, b):
        """Indices ``[i, j)`` of the slabs that cover rows ``[a, b)``."""
        c = max(1, -(-self.shape[0] // self.parts[0]))
        return a // c - self.first_slab, -(-b // c) - self.first_slab

    @property
    def slab(self):
        """Rows of a slab of the first dim's grid (the first and last of a box may
        be shorter)."""
        return max(1, -(-self.shape[0] // self.parts[0]))

    def tile_edges(self, a, b):
        """The rows where tiles start in ``[a, b)``, and ``b``: ``[a, ..., b]``
        (``a`` and ``b`` on tile boundaries or the box's edges)."""
        c = self.slab
        return [a] + list(range((a // c + 1) * c, b, c)) + [b]

    def crcs_of(self, memory, row, a, b):
        """CRC-32 of each tile of rows ``[a, b)`` held in ``memory`` (``row`` bytes
        a row)."""
        crc = zlib.crc32
        offsets = [(e - a) * row for e in self.tile_edges(a, b)]
        return [crc(memory[x:y]) for x, y in zip(offsets, offsets[1:])]

    def slab_rows(self, s):
        """Rows ``(start, stop)`` of slab ``s`` (counted from the box's first), clipped
        to the box."""
        a, b = interval(self.shape[0], self.parts[0], self.first_slab + s)
        lo, hi = self.box[0]
        return max(a, lo), min(b, hi)
