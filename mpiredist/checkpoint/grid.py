"""The tile grid of a saved array, and where each tile's bytes lie (pure).

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

from ..core.blocks import interval

__all__ = ["grid", "cells", "cell_span", "Geometry", "PANEL_PARTS", "PANEL_ROW", "PANELS",
           "TILE", "TILE_MAX", "SLABS"]

PANEL_PARTS = 16        # most parts of a dim after the first
PANEL_ROW = 128         # least bytes of a panel's row (narrower copies get slow)
PANELS = 256            # most panels of an array
TILE = 1024             # least bytes of a tile, where the first dim allows
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

    Parameters
    ----------
    shape : tuple of int
        The array's global shape.
    parts : tuple of int
        Its grid (:func:`grid`); the first dim's parts may be the length
        itself (every row a tile: storage without checksums, such as DCP's).
    box : tuple of (int, int)
        The saved box, global indices, per dim (a 0-d array: ``()``).
    itemsize : int
    """

    __slots__ = ("shape", "parts", "box", "itemsize", "per_dim", "panels", "panel_offsets",
                 "row_bytes", "first_slab", "slab_count", "nbytes")

    def __init__(self, shape, parts, box, itemsize):
        self.shape, self.itemsize = _shape(shape), itemsize
        self.parts = tuple(parts) if len(parts) else (1,)
        self.box = tuple(tuple(b) for b in box) if len(box) else ((0, 1),)
        self.per_dim = [cells(n, k, lo, hi)[1] for n, k, (lo, hi) in
                        zip(self.shape[1:], self.parts[1:], self.box[1:])]
        self.panels = _product(self.per_dim)
        rows = self.box[0][1] - self.box[0][0]
        self.row_bytes, self.panel_offsets, at = [], [], 0
        for p in self.panels:
            rb = itemsize * math.prod(b - a for a, b in p)
            self.row_bytes.append(rb)
            self.panel_offsets.append(at)
            at += rows * rb
        self.nbytes = at
        c = -(-self.shape[0] // self.parts[0])
        lo, hi = self.box[0]
        self.first_slab = lo // c
        self.slab_count = (-(-hi // c) - self.first_slab) if hi > lo else 0

    @property
    def tiles(self):
        """Number of tiles (checksums): panels times slabs, panel-major."""
        return len(self.panels) * self.slab_count

    def panels_in(self, ranges):
        """``(index, ranges of the panel)`` of the panels that overlap ``ranges``
        (per dim after the first), in file order."""
        picked = []
        for cells_d, (lo, hi) in zip(self.per_dim, ranges):
            picked.append([(i, c) for i, c in enumerate(cells_d) if c[0] < hi and lo < c[1]])
        counts = [len(c) for c in self.per_dim]
        out = [(0, ())]
        for d, choices in enumerate(picked):
            out = [(k * counts[d] + i, r + (c,)) for k, r in out for i, c in choices]
        return out

    def run(self, panel, a, b):
        """``(offset, nbytes)`` of rows ``[a, b)`` of ``panel`` (global rows)."""
        lo = self.box[0][0]
        rb = self.row_bytes[panel]
        return self.panel_offsets[panel] + (a - lo) * rb, (b - a) * rb

    def slab_range(self, a, b):
        """Indices ``[i, j)`` of the slabs that cover rows ``[a, b)``."""
        n, k = self.shape[0], self.parts[0]
        c = -(-n // k)
        first = self.box[0][0] // c
        return a // c - first, -(-b // c) - first

    def slab_rows(self, s):
        """Rows ``(start, stop)`` of slab ``s`` (counted from the box's first), clipped
        to the box."""
        a, b = interval(self.shape[0], self.parts[0], self.first_slab + s)
        lo, hi = self.box[0]
        return max(a, lo), min(b, hi)


def _product(per_dim):
    out = [()]
    for choices in per_dim:
        out = [p + (c,) for p in out for c in choices]
    return out
