"""Measured peak memory of a call: bytes newly allocated at its peak (E).

``E`` is the memory contract's figure (docs/semantics.md): with :mod:`tracemalloc`
tracing (numpy reports its buffers to it), reset the peak, note the memory
currently traced, run the call; ``E = peak - current before``.  Whatever the
call returns and keeps alive counts, buffers it frees before returning count
only while they lived.  MPI's own internal buffers are invisible to
tracemalloc.

Start tracing before the blocks a measured call gets are allocated
(:func:`tracing`), and keep it running until the last measurement: numpy
reports each buffer to tracemalloc when it allocates, frees or reallocates
it, and tracemalloc knows only the buffers allocated while it was tracing
(``tracemalloc.stop`` forgets them all).  A donated block that the call grows
with ``realloc`` (``ndarray.resize``) but that was allocated before tracing
began is unknown to it, so the reallocated block is counted at its full new
size T instead of the growth T - S, and E is overstated by S.
:func:`traced_peak` starts tracemalloc itself only when nothing else did,
which is right only for calls that reallocate nothing they were given.

Examples
--------
>>> import numpy as np
>>> with traced_peak() as e:
...     a = np.ones(1 << 20, dtype=np.uint8)
>>> e.bytes >= 1 << 20
True
"""

import ctypes
import ctypes.util
import functools
import gc
import tracemalloc
from contextlib import contextmanager

__all__ = ["Peak", "traced_peak", "tracing", "rss_peak", "rss_supported", "RSS_ENVIRONMENT",
           "rss_environment_missing", "settled", "trim_heap"]


class Peak:
    """The result of :func:`traced_peak`: ``bytes`` is None until the block exits."""

    __slots__ = ("bytes",)

    def __init__(self):
        self.bytes = None

    def __repr__(self):
        return f"Peak(bytes={self.bytes!r})"


@contextmanager
def tracing():
    """Keep :mod:`tracemalloc` tracing for the ``with`` block.

    Enter it before allocating the blocks that measured calls will get (see
    the module doc).  Starts tracemalloc if it is not running and stops it on
    exit; if it was already running it is left running.

    Examples
    --------
    >>> import numpy as np
    >>> with tracing():
    ...     block = np.ones(1 << 20, dtype=np.uint8)
    ...     with traced_peak() as e:
    ...         block.resize(3 << 20, refcheck=False)
    >>> (2 << 20) <= e.bytes < (3 << 20)
    True
    """
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        yield
    finally:
        if started:
            tracemalloc.stop()


@contextmanager
def traced_peak():
    """Measure the bytes newly allocated at the peak of the ``with`` block.

    Starts :mod:`tracemalloc` if it is not running (and stops it again on
    exit); if it was running, it is left running and only its peak is reset.
    Not re-entrant: an inner block resets the peak of an outer one.

    Yields
    ------
    Peak
        Its ``bytes`` is set when the block exits (also on an exception).
    """
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    result = Peak()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        try:
            yield result
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            result.bytes = max(0, peak - before)
    finally:
        if started:
            tracemalloc.stop()


def rss_supported():
    """True where the peak resident set can be reset and read (Linux /proc)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii"):
            pass
        return _status("VmHWM") is not None
    except OSError:
        return False


def _status(key):
    """A ``/proc/self/status`` figure in bytes (``VmRSS``, ``VmHWM``), or None."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None (looked up once: ``find_library`` runs
    ``ldconfig`` in a subprocess)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None


def trim_heap():
    """Give freed heap memory back to the system (glibc ``malloc_trim``), if there is one."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@contextmanager
def settled():
    """Collect the garbage once and freeze what is left for the ``with`` block.

    A measurement collects the garbage first (``gc.collect``), so that no cycle
    left by an earlier run is freed inside it; a full collection walks every
    object of the process, and in a process that holds a large heap (a test
    session: at 8 ranks on 2 cores, 60 % of the quick suite's time went to
    ``gc.collect``) that costs more than the runs measured.  Objects that
    existed before the block are not the runs' garbage: frozen
    (:func:`gc.freeze`), collections inside the block skip them.  They are
    unfrozen on exit.  A process that froze objects itself (``gc.freeze`` at
    start-up, as forking servers do) is left as it was: its objects stay
    frozen, and nothing else is frozen.
    """
    gc.collect()
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextmanager
def rss_peak():
    """Measure the growth of the peak resident set during the ``with`` block.

    What the operating system sees, so it includes what the MPI library
    allocates inside a call (tracemalloc does not): free heap memory is
    given back (``malloc_trim``), the peak is reset (``5`` written to
    ``/proc/self/clear_refs``), and the result is ``VmHWM`` after the block
    minus ``VmRSS`` before it.  Run the measured call once before (a
    warm-up), and measure with tracemalloc off: its own records count here.
    ``bytes`` stays None where /proc is missing.

    Yields
    ------
    Peak
    """
    result = Peak()
    if not rss_supported():
        yield result
        return
    trim_heap()
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")
    before = _status("VmRSS")
    try:
        yield result
    finally:
        result.bytes = max(0, _status("VmHWM") - before)



# What the resident set needs to show the call, not the allocator's history:
# glibc raises its mmap threshold each time a large block is freed, so later
# large blocks come from the heap, where freed blocks stay resident and a
# grown block is copied (the RSS figure then depends on what ran before: at
# 8 ranks, after an uneven case, 2.3 MiB more for the same call); numpy
# advises transparent huge pages for arrays of 4 MiB and more, and the kernel
# then copies a block that realloc grows.  Both are process-wide and must hold
# from the start: environment variables, not calls.
RSS_ENVIRONMENT = {"MALLOC_MMAP_THRESHOLD_": "131072", "NUMPY_MADVISE_HUGEPAGE": "0"}


def rss_environment_missing():
    """The settings of :data:`RSS_ENVIRONMENT` this process lacks, as ``NAME=VALUE``.

    Empty when the resident set can be measured meaningfully; the settings
    are read by glibc and numpy when the process starts (scripts/test.sh
    exports them for the MPI tests).
    """
    import os
    return [f"{k}={v}" for k, v in RSS_ENVIRONMENT.items() if os.environ.get(k) != v]
