"""mpiredist.runtime.kernels: local moves inside one byte buffer, against numpy."""

import numpy as np
from hypothesis import given, settings, strategies as st

from mpiredist.runtime.kernels import compact, expand, transpose

small = st.integers(0, 9)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 4), small, small, st.integers(0, 12), st.integers(1, 2000),
       st.integers(0, 50))
def test_transpose_matches_numpy(a, rows, cols, e, chunk, spare):
    n = a * rows * cols * e
    buf = np.random.default_rng(n).integers(0, 256, size=n + spare, dtype=np.uint8)
    want = buf[:n].reshape(a, rows, cols, e).transpose(0, 2, 1, 3).copy()
    tail = buf[n:].copy()
    transpose(buf, a, rows, cols, e, chunk)
    assert np.array_equal(buf[:n].reshape(a, cols, rows, e), want)
    assert np.array_equal(buf[n:], tail)            # nothing beyond the block is touched


def test_transpose_blocked_and_cycle_paths_agree():
    rng = np.random.default_rng(0)
    for rows, cols, e, chunk in [(512, 8, 16, 4096), (97, 8, 4, 64), (64, 3, 5, 1 << 20),
                                 (60, 7, 3, 7 * 3 * 4),          # rows blocked
                                 (4, 512, 16, 4096), (3, 60, 5, 3 * 5 * 4),
                                 (5, 21, 3, 5 * 3 * 7)]:          # columns blocked
        buf = rng.integers(0, 256, size=2 * rows * cols * e, dtype=np.uint8)
        want = buf.reshape(2, rows, cols, e).transpose(0, 2, 1, 3).copy()
        transpose(buf, 2, rows, cols, e, chunk)
        assert np.array_equal(buf.reshape(2, cols, rows, e), want), (rows, cols, e, chunk)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=3), st.data(), st.integers(1, 64))
def test_compact_and_expand_are_inverse_slices(shape, data, chunk):
    starts = [data.draw(st.integers(0, n - 1)) for n in shape]
    box = [data.draw(st.integers(1, n - s)) for n, s in zip(shape, starts)]
    size = int(np.prod(shape))
    block = np.arange(size, dtype=np.int32).reshape(shape)
    buf = block.view(np.uint8).reshape(-1).copy()
    index = tuple(slice(s, s + n) for s, n in zip(starts, box))
    compact(buf, shape, starts, box, 4, chunk)
    front = buf[:int(np.prod(box)) * 4].view(np.int32).reshape(box)
    assert np.array_equal(front, block[index])
    expand(buf, box, starts, shape, 4, chunk)
    assert np.array_equal(buf.view(np.int32).reshape(shape)[index], block[index])


def _allocations_during(fn):
    """Names of numpy's allocating calls (``empty``, ``copy``) made while ``fn`` runs."""
    import sys
    seen = []

    def hook(frame, event, arg):
        if event == "c_call" and getattr(arg, "__name__", "") in ("empty", "copy"):
            seen.append(arg.__name__)

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def test_transpose_makes_its_temporaries_once_per_call_not_per_cycle():
    # (1, 8, 8, 128 KiB) is the donated 8-rank transpose of c01: 8 cycles of 128 KiB
    # units.  A fresh copy per cycle is a fresh mmap of 128 KiB (page faults each time)
    # under MALLOC_MMAP_THRESHOLD_=131072 whenever the heap has no free room: 1.3x slower.
    rows = cols = 8
    e = 1 << 14
    buf = np.random.default_rng(1).integers(0, 256, size=rows * cols * e, dtype=np.uint8)
    want = buf.reshape(rows, cols, e).transpose(1, 0, 2).copy()
    seen = _allocations_during(lambda: transpose(buf, 1, rows, cols, e, 3 * rows * e))
    assert np.array_equal(buf.reshape(cols, rows, e), want)
    assert len(seen) <= 2, seen
