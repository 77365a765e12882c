"""Reading the planned runs into the targets, verifying every tile (no MPI).

:func:`fill` takes the targets and their pieces, plans the runs
(:mod:`mpiredist.checkpoint.plan`), and for each file in turn issues its
reads in file order: adjacent runs go in one ``os.preadv`` whose buffers
are the targets' own memory (runs contiguous there) and slices of a read
buffer (the others), two of at most half of ``buffer_bytes``: a helper
thread reads the next batch while this one checks every tile of the last
against its CRC-32 and copies the buffered runs into place.

A tile whose checksum does not match is reported, not raised: the caller
(a collective load) must first let every rank finish, then raise together.
What it leaves: a run read straight into a target holds the bad bytes; a
buffered run is not copied (that part of the target keeps its old
values).  Either way the target is *failed*: the load names it.
"""

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..core.errors import CheckpointError
from .plan import batches, segments, split

__all__ = ["fill", "Stats", "read_exactly"]


class Stats:
    """What a fill did: bytes read and needed, reads issued, tiles checked."""

    __slots__ = ("read", "needed", "calls", "tiles", "straight")

    def __init__(self):
        self.read = self.needed = self.calls = self.tiles = self.straight = 0

    def __repr__(self):
        return (f"Stats(read={self.read}, needed={self.needed}, calls={self.calls}, "
                f"tiles={self.tiles}, straight={self.straight})")


def read_exactly(fd, views, offset, file):
    """``os.preadv`` until every view is full; CheckpointError at the end of the file."""
    views = list(views)
    want = sum(len(v) for v in views)
    got = 0
    while views:
        n = os.preadv(fd, views, offset)
        if n == 0:
            raise CheckpointError(f"file {file!r} is truncated: {want} bytes wanted at offset "
                                  f"{offset - got}, the file ends after {got}")
        got += n
        offset += n
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if n:
            views[0] = views[0][n:]
    return got


def _check(seg, memory, failures, stats):
    """Verify the tiles of ``seg`` held in ``memory`` (bytes of the read box)."""
    piece = seg.piece
    if not piece.checked:
        return True
    crcs = piece.crcs
    g = piece.geometry
    row = g.row_bytes(seg.panel)
    ra, rb = seg.rows
    i, j = g.slab_range(ra, rb)
    first, words = crcs[seg.panel]
    found = g.crcs_of(memory, row, ra, rb)
    if found != words[i - first:j - first].tolist():
        bad = next(k for k, (x, y) in enumerate(zip(found, words[i - first:j - first]))
                   if x != y)
        a, b = g.slab_rows(i + bad)
        failures.append((seg.target.name, seg.file,
                         f"checksum mismatch in the tile of rows {a}:{b} of panel "
                         f"{seg.panel} of the box {list(piece.box)} at byte "
                         f"{seg.offset + (a - ra) * row}"))
        return False
    stats.tiles += j - i
    return True


def _copy(seg, memory):
    """Copy the needed part of a buffered run into its target."""
    t = seg.target
    dtype = t.array.dtype
    box = seg.read_box
    if seg.piece.whole and seg.piece.strides is not None:
        flat = np.frombuffer(memory, dtype=dtype)
        src = np.lib.stride_tricks.as_strided(
            flat, tuple(hi - lo for lo, hi in box),
            tuple(s * dtype.itemsize for s in seg.piece.strides), writeable=False)
    else:
        src = np.frombuffer(memory, dtype=dtype).reshape(tuple(hi - lo for lo, hi in box))
    src = src[tuple(slice(a - lo, b - lo) for (a, b), (lo, _) in zip(seg.need, box))]
    dst = t.array[tuple(slice(a - lo, b - lo) for (a, b), (lo, _) in zip(seg.need, t.box))]
    np.copyto(dst, src)


def _load_crcs(fd, runs, file, stats):
    """Read the checksums the runs of one file need into ``piece.crcs`` (panel ->
    ``(first slab, values)``): per piece one read, from its first to its last
    panel read.  For a row band of a piece with many panels that reads the
    checksums of every tile of those panels (4 bytes per tile of at least
    2 KiB: 0.2% of the piece), which costs less here than a read per panel."""
    need = {}
    for s in runs:
        if s.piece.checked:
            lo, hi = need.get(id(s.piece), (s.panel, s.panel, None))[:2]
            need[id(s.piece)] = (min(lo, s.panel), max(hi, s.panel), s.piece)
    for lo, hi, piece in need.values():
        g = piece.geometry
        have = piece.crcs if piece.crcs is not None else {}
        if all(p in have and have[p][0] == 0 for p in range(lo, hi + 1)):
            continue
        words = np.empty((hi - lo + 1) * g.slab_count, dtype="<u4")
        stats.read += read_exactly(fd, [memoryview(words.view(np.uint8))],
                                   piece.crc_at + 4 * lo * g.slab_count, file)
        for p in range(lo, hi + 1):
            have[p] = (0, words[(p - lo) * g.slab_count:(p - lo + 1) * g.slab_count])
        piece.crcs = have


def plan_all(items, buffer_bytes):
    """Every run of ``items`` (pairs of a Target and its pieces), cut to fit the
    buffer, grouped by file and sorted by offset."""
    by_file = {}
    for target, pieces in items:
        for seg in segments(target, pieces):
            for part in split(seg, buffer_bytes):
                by_file.setdefault(part.file, []).append(part)
    for runs in by_file.values():
        runs.sort(key=lambda s: s.offset)
    return by_file


def fill(items, buffer_bytes, stats=None):
    """Fill every target of ``items`` from its pieces; the list of failures
    ``(name, file, what)`` (checksum mismatches; I/O errors raise).

    Reads run one batch ahead in a helper thread (``os.preadv`` releases the
    GIL) while this thread verifies and copies the batch before, in two
    buffers of at most half of ``buffer_bytes`` each.
    """
    stats = Stats() if stats is None else stats
    half = max(1, buffer_bytes // 2)
    by_file = plan_all(items, half)
    largest = max((s.nbytes for runs in by_file.values() for s in runs if not s.straight),
                  default=0)            # split() kept runs within half, or one tile
    views = [memoryview(np.empty(largest, dtype=np.uint8)) for _ in range(2)]
    failures = []
    fds = {}
    try:
        for file, runs in by_file.items():
            try:
                fds[file] = os.open(file, os.O_RDONLY)
            except OSError as exc:
                raise CheckpointError(f"cannot open {file!r} (array "
                                      f"{runs[0].target.name!r}): {exc.strerror}") from None
            _load_crcs(fds[file], runs, file, stats)
        work = [(file, batch) for file, runs in by_file.items()
                for batch in batches(runs, largest)]
        with ThreadPoolExecutor(1) as pool:
            ahead = pool.submit(_read_batch, fds, work[0], views[0]) if work else None
            for k, (file, batch) in enumerate(work):
                places, nbytes = ahead.result()
                stats.read += nbytes
                stats.calls += 1
                if k + 1 < len(work):
                    ahead = pool.submit(_read_batch, fds, work[k + 1], views[(k + 1) % 2])
                for seg, memory in zip(batch, places):
                    stats.needed += seg.needed_bytes
                    if not _check(seg, memory, failures, stats):
                        continue
                    if seg.straight:
                        stats.straight += 1
                    else:
                        _copy(seg, memory)
    finally:
        for fd in fds.values():
            os.close(fd)
    return failures


def _read_batch(fds, work, view):
    """One batch's ``preadv``: the places its runs landed, and the bytes read."""
    file, batch = work
    places, at = [], 0
    for s in batch:
        if s.straight:
            places.append(s.target.bytes_view()[s.at:s.at + s.nbytes].data)
        else:
            places.append(view[at:at + s.nbytes])
            at += s.nbytes
    try:
        return places, read_exactly(fds[file], places, batch[0].offset, file)
    except CheckpointError as exc:
        raise CheckpointError(f"array {batch[0].target.name!r}: {exc}") from None
