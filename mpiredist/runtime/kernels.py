"""In-place byte kernels: local moves inside one byte buffer, in bounded chunks.

The in-place executor keeps the current local block C-contiguous at the
front of one working buffer.  These helpers rearrange it without a second
full-size array: every temporary is at most ``chunk`` bytes (numpy copies an
overlapping piece through a temporary of the piece's size).

- :func:`compact` moves a box of the block to the front (a slice); each
  element moves to a lower or equal offset, so pieces go front to back.
- :func:`expand` is the inverse (an element moves up): pieces go back to
  front.
- :func:`transpose` swaps the two middle axes of an ``(A, R, C, E)`` array:
  blocks of rows that fit the chunk are transposed by numpy through a
  temporary, then the grid of blocks by following the cycles of the
  permutation (in-place transposition as in Catanzaro, Keller and Garland,
  PPoPP 2014, without their decomposition): one saved unit per cycle, moves
  batched over ``A`` and ``E`` within the chunk.  Blocking makes the units
  large (at 8 ranks, 8 MiB of 2 KiB units: 23 ms by cycles, 5.4 ms blocked).
"""

import math

import numpy as np

__all__ = ["as_array", "compact", "expand", "transpose", "pieces"]


def as_array(buf, shape, itemsize):
    """The first ``prod(shape)`` elements of byte buffer ``buf`` as (*shape, itemsize)."""
    n = math.prod(shape) * itemsize
    return buf[:n].reshape(tuple(shape) + (itemsize,))


def pieces(shape, limit):
    """Index tuples covering ``shape`` in C order, each piece ``<= limit`` elements."""
    limit = max(1, limit)
    if not shape:
        yield ()
        return
    tail = math.prod(shape[1:])
    if tail <= limit or len(shape) == 1:
        step = max(1, limit // max(tail, 1)) if len(shape) > 1 else limit
        for a in range(0, shape[0], step):
            yield (slice(a, min(a + step, shape[0])),)
        return
    for a in range(shape[0]):
        for rest in pieces(shape[1:], limit):
            yield (a,) + rest


def compact(buf, shape, starts, box, itemsize, chunk):
    """Move the ``box`` at ``starts`` of the front block of ``shape`` to the front."""
    _move(buf, shape, starts, box, itemsize, chunk, to_front=True)


def expand(buf, box, starts, shape, itemsize, chunk):
    """Move the front block of ``box`` to position ``starts`` of a block of ``shape``."""
    _move(buf, shape, starts, box, itemsize, chunk, to_front=False)


def _move(buf, shape, starts, box, itemsize, chunk, to_front):
    """Copy between the box of the front ``shape`` block and a front ``box`` block.

    Toward the front every element moves down, so pieces go in C order;
    away from it every element moves up, so they go in reverse.
    """
    if tuple(box) == tuple(shape) or math.prod(box) == 0:
        return
    inner = as_array(buf, shape, itemsize)[tuple(slice(s, s + n) for s, n in zip(starts, box))]
    front = as_array(buf, box, itemsize)
    src, dst = (inner, front) if to_front else (front, inner)
    order = list(pieces(tuple(box), chunk // itemsize))
    for index in (order if to_front else reversed(order)):
        dst[index] = src[index]


def _cycles(rows, cols):
    """Cycles of the transposition of a rows x cols matrix (length > 1).

    Position ``j`` of the result takes the element at ``(j % rows) * cols + j // rows``.
    """
    n = rows * cols
    seen = np.zeros(n, dtype=bool)
    for start in range(1, n - 1):
        if seen[start]:
            continue
        cycle, j = [], start
        while not seen[j]:
            seen[j] = True
            cycle.append(j)
            j = (j % rows) * cols + j // rows
        if len(cycle) > 1:
            yield cycle


def transpose(buf, a, rows, cols, e, chunk):
    """In place, turn the front ``(a, rows, cols, e)`` bytes into ``(a, cols, rows, e)``.

    Blocked when a block of rows fits the chunk: each run of ``rb`` rows
    (``rb`` a divisor of ``rows``) is transposed through a temporary by
    numpy, then the ``(rows / rb, cols)`` grid of ``rb * e``-byte units by
    cycle following, so Python touches few, large units.  Else blocked the
    other way when a block of columns fits: the ``(rows, cols / cb)`` grid of
    ``cb * e``-byte units first, then each ``(rows, cb)`` block through the
    temporary (8 ranks on 2 cores at once, a 4 x 512 grid of 4 KiB units
    with a 1.5 MiB chunk: 4.9-6.4 ms by cycles, 1.7-1.8 ms so).  Otherwise
    cycle following on ``e``-byte units
    (:func:`_cycle_transpose`).
    """
    if rows <= 1 or cols <= 1 or a * e == 0:
        return
    rb = _block_rows(rows, cols * e, chunk)
    if rb is not None:
        q = rows // rb
        _blocks(buf, a * q, rb, cols, e, chunk)
        _cycle_transpose(buf, a, q, cols, rb * e, chunk)
        return
    cb = _block_rows(cols, rows * e, chunk)
    if cb is not None:
        q = cols // cb
        _cycle_transpose(buf, a, rows, q, cb * e, chunk)
        _blocks(buf, a * q, rows, cb, e, chunk)
        return
    _cycle_transpose(buf, a, rows, cols, e, chunk)


def _blocks(buf, count, rows, cols, e, chunk):
    """Transpose each of the ``count`` front ``(rows, cols, e)`` blocks to
    ``(cols, rows, e)`` through one temporary of at most ``chunk`` bytes
    (at least one block)."""
    block = rows * cols * e
    per = max(1, chunk // block)                    # blocks through the temporary at once
    tmp = np.empty(min(per, count) * block, dtype=np.uint8)
    blocks = buf[:count * block].reshape(count, rows, cols, e)
    for k in range(0, count, per):
        part = blocks[k:k + per]
        t = tmp[:part.size].reshape(part.shape[0], cols, rows, e)
        t[...] = part.transpose(0, 2, 1, 3)
        part.reshape(-1)[...] = tmp[:part.size]


def _block_rows(rows, row_bytes, chunk):
    """The largest divisor of ``rows`` whose rows fit ``chunk``, if it is > 1."""
    best = None
    for d in range(2, rows + 1):
        if d * row_bytes > chunk:
            break
        if rows % d == 0:
            best = d
    return best


def _cycle_transpose(buf, a, rows, cols, e, chunk):
    """Cycle following: one saved unit per cycle, batched over ``a`` and ``e``.

    The saved unit is one temporary of at most ``chunk`` bytes for the whole
    call, not a fresh copy per cycle: a copy of 128 KiB or more is a fresh
    ``mmap`` (page faults on every cycle) whenever the heap has no free room
    of that size, which made a donated 8-rank transpose 1.3x slower."""
    if rows <= 1 or cols <= 1 or a * e == 0:
        return
    x = buf[:a * rows * cols * e].reshape(a, rows * cols, e)
    e_step = max(1, min(e, chunk))
    a_step = max(1, chunk // e_step)
    unit = np.empty(min(a, a_step) * min(e, e_step), dtype=np.uint8)
    for a0 in range(0, a, a_step):
        for e0 in range(0, e, e_step):
            part = x[a0:a0 + a_step, :, e0:e0 + e_step]
            saved = unit[:part.shape[0] * part.shape[2]].reshape(part.shape[0], part.shape[2])
            for cycle in _cycles(rows, cols):
                saved[...] = part[:, cycle[0]]
                for j, src in zip(cycle, cycle[1:]):
                    part[:, j] = part[:, src]
                part[:, cycle[-1]] = saved
