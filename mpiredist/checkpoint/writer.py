"""Writing one rank's boxes, and publishing a generation (no MPI).

Each rank writes the boxes given to it (:mod:`mpiredist.checkpoint.entries`
decides which) into its own file of the new generation directory, in the
panel order of :class:`~mpiredist.checkpoint.grid.Geometry`: a panel whose
rows are one contiguous run of the rank's block is written straight from
it, the others are packed into one of two buffers of half of
``buffer_bytes`` while a helper thread writes the other; every tile's
CRC-32 is computed from the bytes written.  The file is fsynced
before the rank reports.

Rank 0 then writes the index and replaces the pointer (:func:`publish`),
and removes older generations.  Nothing here raises past the caller's
control: :func:`write_boxes` returns an error instead, for the ranks to
agree on.
"""

import os
from concurrent.futures import ThreadPoolExecutor
import shutil

import numpy as np

from ..core.blocks import contiguous_box
from .grid import Geometry
from .index import INDEX, POINTER, FORMAT, VERSION, fsync_dir, write_durably

__all__ = ["Box", "write_boxes", "publish", "file_name", "ALIGN", "remove_generation"]

ALIGN = 64      # each saved box starts at a multiple of this in its file


def file_name(rank):
    """The data file of ``rank`` in a generation directory."""
    return f"r{rank:05d}.bin"


class Box:
    """A box to write: ``key`` of the array, its ``grid``, this rank's ``block``
    (numpy, holding global box ``held``) and the ``box`` to save from it."""

    __slots__ = ("key", "shape", "grid", "block", "held", "box")

    def __init__(self, key, shape, grid, block, held, box):
        self.key, self.shape, self.grid = key, shape, grid
        self.block, self.held, self.box = block, held, box


class _Out:
    """A file written in order through two buffers: a helper thread writes one
    (``os.pwrite`` releases the GIL) while the caller fills the other."""

    def __init__(self, fd, size, pool):
        self.fd, self.at, self.pool = fd, 0, pool
        self.views = [memoryview(np.empty(size, dtype=np.uint8)) for _ in range(2)]
        self.pending = [None, None]     # the write of each buffer in flight
        self.current, self.used = 0, 0

    @property
    def size(self):
        return len(self.views[0])

    def _write(self, data, offset):
        view = memoryview(data).cast("B")
        while view:
            n = os.pwrite(self.fd, view, offset)
            if n <= 0:
                raise OSError(f"pwrite wrote {n} bytes")
            view, offset = view[n:], offset + n

    def _submit(self, data, offset):
        return self.pool.submit(self._write, data, offset)

    def flush(self):
        """Hand the current buffer to the writer and take the other (once free)."""
        if self.used:
            k = self.current
            self.pending[k] = self._submit(self.views[k][:self.used], self.at - self.used)
            self.current = 1 - k
            self.used = 0
            if self.pending[self.current] is not None:
                self.pending[self.current].result()
                self.pending[self.current] = None

    def finish(self):
        """Every write done (raises the first write's error)."""
        self.flush()
        for k, job in enumerate(self.pending):
            if job is not None:
                self.pending[k] = None
                job.result()

    def skip_to(self, offset):
        """Leave a gap up to ``offset`` (alignment)."""
        if offset != self.at:
            self.flush()
            self.at = offset

    def straight(self, memory):
        """Write ``memory`` (the caller's, left alone until :meth:`finish`)."""
        self.flush()
        self._write(memory, self.at)
        self.at += len(memory)

    def room(self, nbytes):
        """A buffer slice of ``nbytes`` to fill (flushing first when full)."""
        if self.used + nbytes > self.size:
            self.flush()
        view = self.views[self.current]
        out = view[self.used:self.used + nbytes]
        self.used += nbytes
        self.at += nbytes
        return out


def _write_box(out, item, buffer_bytes):
    """Write one box; returns its offset and CRCs (panel-major)."""
    block, held = item.block, item.held
    itemsize = block.dtype.itemsize
    g = Geometry(item.shape, item.grid, item.box, itemsize)
    offset = -(-out.at // ALIGN) * ALIGN
    out.skip_to(offset)
    crcs = []
    lo, hi = g.box[0]
    full = tuple(b - a for a, b in held)
    for panel in range(g.panels):
        region = ((lo, hi),) + g.ranges(panel)
        index = tuple(slice(a - h, b - h) for (a, b), (h, _) in zip(region, held))
        src = block[index]
        row = g.row_bytes(panel)
        starts = tuple(a - h for (a, _), (h, _) in zip(region, held))
        shape = tuple(b - a for a, b in region)
        if block.flags.c_contiguous and contiguous_box(full, starts, shape) and src.size:
            memory = memoryview(src.reshape(-1).view(np.uint8))
            crcs += g.crcs_of(memory, row, lo, hi)
            out.straight(memory)
            continue
        # through the buffer, in parts of whole tiles
        c = g.slab
        step = max(c, (buffer_bytes // max(row, 1)) // c * c)
        a = lo
        while a < hi:
            b = min(hi, (a + step) // c * c)
            room = out.room((b - a) * row)
            part = np.frombuffer(room, dtype=block.dtype).reshape((b - a,) + shape[1:])
            np.copyto(part, src[a - lo:b - lo])
            crcs += g.crcs_of(room, row, a, b)
            a = b
    words = np.asarray(crcs, dtype="<u4")       # the checksums follow the box's bytes
    at = out.at
    room = out.room(words.nbytes)
    room[:] = memoryview(words.view(np.uint8))
    return offset, at


def write_boxes(folder, rank, items, buffer_bytes):
    """Write ``items`` (:class:`Box`) to this rank's file in ``folder``.

    Returns ``(records, size, error)``: per item ``(key, box, file, offset,
    offset of its checksums)``, the file's size, and None or the OSError
    (text) that stopped it.  Nothing is written (no file made) when ``items`` is empty.
    """
    items = [it for it in items if all(a < b for a, b in it.box) or not it.box]
    if not items:
        return [], {}, None
    name = file_name(rank)
    path = os.path.join(folder, name)
    records = []
    try:
        os.makedirs(folder, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            largest = max(_largest_tile(it) for it in items)
            with ThreadPoolExecutor(1) as pool:
                out = _Out(fd, max(buffer_bytes // 2, largest), pool)
                try:
                    for it in items:
                        offset, crc_at = _write_box(out, it, out.size)
                        records.append((list(it.key), [list(r) for r in it.box[:len(it.shape)]],
                                        name, offset, crc_at))
                finally:
                    out.finish()
            os.fsync(fd)
            size = out.at
        finally:
            os.close(fd)
    except OSError as exc:
        return [], {}, f"rank {rank} could not write {path!r}: {exc.strerror or exc}"
    return records, {name: size}, None


def _largest_tile(item):
    g = Geometry(item.shape, item.grid, item.box, item.block.dtype.itemsize)
    rows = -(-g.shape[0] // g.parts[0])
    widest = max((g.row_bytes(p) for p in range(g.panels)), default=0)
    return max(widest * rows, 4 * g.tiles)


def publish(path, gen, doc):
    """Rank 0's last step: the index into ``path/gen``, then the pointer
    replaced atomically, each fsynced; then older generations removed.
    Returns None or an error text."""
    folder = os.path.join(path, gen)
    try:
        write_durably(os.path.join(folder, INDEX), doc)
        fsync_dir(folder)
        write_durably(os.path.join(path, POINTER),
                      {"format": FORMAT, "version": VERSION, "generation": gen})
    except OSError as exc:
        return f"rank 0 could not publish the checkpoint {path!r}: {exc.strerror or exc}"
    try:
        for entry in os.listdir(path):
            if entry.startswith("gen-") and entry != gen:
                remove_generation(os.path.join(path, entry))
        listed = set(doc["files"]) | {INDEX}
        for entry in os.listdir(folder):        # files left by an earlier, killed save
            if entry not in listed:
                _remove(os.path.join(folder, entry))
    except OSError:
        pass                                    # the checkpoint is published: best effort
    return None


def _remove(path):
    try:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)
    except OSError:
        pass


def remove_generation(folder):
    """Remove a generation directory, ignoring errors (best effort)."""
    shutil.rmtree(folder, ignore_errors=True)
