"""What a rank's own inputs allow, judged locally, before the ranks agree.

Blocks and ``out=`` arrays (:func:`check_block`, :func:`check_out`), the
workspace argument (:func:`check_workspace`), and donation
(:func:`judge_donation`), each checked in one place for every route.

Every property of a caller's array that could change which MPI calls run —
the array library, and for a donated block whether its memory may become
the working buffer — is turned into a few flags here; the Transfer then
agrees on them across ranks in one collective
(:func:`mpiredist.runtime.agree.agree`), so every rank takes the same
path.  Problems with the arrays themselves (wrong shape or dtype, an ``out``
that cannot hold the result) become an exception object, raised on every
rank by the same collective.

A donated block is used as the working buffer only where it is a writeable,
aligned, C-contiguous numpy array, and grown or shrunk in place
(``realloc``) only when nothing else refers to its memory: a view of it, a
memoryview or a second name would be left pointing at freed memory.  A block
large enough for the whole run needs no ``realloc`` and is used in place
whatever refers to it (those references then see undefined values, which is
what donating means).  CPython does not say who holds a reference, only how
many there are, so the public entry points count them (:func:`references`)
and allow exactly the references they know of: the caller's own name for
:func:`mpiredist.redistribute` and :meth:`Transfer.run
<mpiredist.runtime.transfer.Transfer.run>`, none for a
:class:`~mpiredist.DistArray` whose block is handed over.  When any rank's
block cannot be used, every rank runs as not donated (its block is left as
it was).
"""

import functools
import sys
from typing import NamedTuple

import numpy as np

from ..core.backend import c_contiguous, device_dtype, is_gpu
from ..core.errors import ShapeError

__all__ = ["references", "local_references", "resize_in_place", "Donation", "NOT_DONATED",
           "judge_donation", "check_block", "check_out", "check_workspace", "array_kind"]


def references(array):
    """References to ``array`` beyond one name of the caller's caller.

    For a public entry point ``f(local)`` that calls ``references(local)`` in
    a statement of its own: 0 when the user holds ``local`` under exactly one
    name, -1 for a temporary, more for each view, memoryview or other name.
    The count is calibrated once on a probe passed the same way, since
    interpreters differ in how many references a call holds (CPython 3.10
    keeps the caller's argument on its stack, 3.11 moves it into the
    callee's frame).
    """
    return sys.getrefcount(array) - _calibration()[0]


def local_references(array):
    """References to ``array`` beyond the calling function's own name of it.

    For a function that owns ``array`` through a local name (e.g. a block a
    DistArray just handed over): 0 when nothing else refers to it.
    """
    return sys.getrefcount(array) - _calibration()[1]


def _local():
    probe = object()
    return _counted(probe)


def _counted(probe):
    return sys.getrefcount(probe)


@functools.lru_cache(maxsize=1)
def _calibration():
    """``(entry, local)`` reference counts of a probe held by exactly one name,
    passed the way the real calls pass a block (user -> entry point -> count)."""
    probe = object()                    # the user's one name
    return _via_entry(probe), _local()


def _via_entry(local):                  # an entry point, e.g. redistribute(local)
    return _entry_count(local)


def _entry_count(array):                # references(array) inside it
    return sys.getrefcount(array)


def resize_in_place():
    """True if ``ndarray.resize`` reallocates in place (numpy < 2.5).

    numpy 2.5 makes ``resize`` allocate a new buffer and copy, which would
    count the whole block again; donated blocks are then never resized:
    only a block large enough for the run is reused.
    """
    return _RESIZES_IN_PLACE


_RESIZES_IN_PLACE = np.lib.NumpyVersion(np.__version__) < "2.5.0"


class Donation(NamedTuple):
    """This rank's verdict on its donated block (before the ranks agree).

    ``usable``: the run may take the block as its buffer; ``resizable``:
    it may also ``realloc`` it (grow, shrink, release); ``why``: the reason
    when not usable.
    """

    usable: bool
    resizable: bool
    why: str


NOT_DONATED = Donation(False, False, "")


def judge_donation(array, extra_references, capacity, fresh):
    """What this rank's donated ``array`` allows (see the module doc).

    ``capacity`` is the one-buffer executor's buffer size (from the plan);
    ``fresh`` True when the plan takes a new buffer within the donated bound
    anyway (then the block is only read, and released if resizable).  A
    block that holds ``capacity`` bytes is used in place whatever refers to
    it (no ``realloc``: views then see undefined values, as donation
    means); a smaller one must grow, which only an exclusive, owning block
    may (``extra_references`` counts the references beyond those the entry
    point allows).
    """
    resizable = (isinstance(array, np.ndarray) and array.base is None and array.flags.owndata
                 and array.flags.writeable and array.flags.c_contiguous
                 and array.flags.aligned and extra_references <= 0 and resize_in_place())
    if fresh:
        return Donation(True, resizable, "")
    why = _unwritable(array)
    if why:
        return Donation(False, False, why)
    if array.nbytes >= capacity or resizable:
        return Donation(True, resizable, "")
    if array.base is not None or not array.flags.owndata:
        return Donation(False, False, "it must grow, and it is a view of another array's memory")
    if not resize_in_place():
        return Donation(False, False, f"it must grow, and numpy {np.__version__} cannot resize "
                                      "an array in place")
    return Donation(False, False, f"it must grow, and {extra_references} other reference(s) "
                                  "to it exist (a view, a memoryview or a second name)")


def _unwritable(array):
    if not isinstance(array, np.ndarray):
        return f"it is a {type(array).__name__}, not a numpy array"
    if not array.flags.writeable:
        return "it is read-only"
    if not (array.flags.c_contiguous and array.flags.aligned):
        return "it is not an aligned C-contiguous array"
    return ""


def array_kind(array):
    """``"cupy"`` for CUDA arrays, else ``"numpy"``."""
    return "cupy" if is_gpu(array) else "numpy"


def check_block(local, shape, dtype, rank, what="local block"):
    """ShapeError unless ``local`` is an array of ``shape`` and ``dtype`` (a
    device array of bfloat16 holds its bits as int16: :func:`device_dtype
    <mpiredist.core.backend.device_dtype>`)."""
    if type(local) is np.ndarray and local.shape == tuple(shape) and local.dtype == dtype:
        return                                      # a host block as it should be, at once
    if not (hasattr(local, "shape") and hasattr(local, "dtype")):
        raise ShapeError(f"rank {rank}: {what} must be a numpy or CuPy array, "
                         f"found {type(local).__name__}")
    if tuple(local.shape) != tuple(shape):
        raise ShapeError(f"rank {rank}: {what} has shape {tuple(local.shape)}, but this "
                         f"rank's block has shape {tuple(shape)}")
    expected = device_dtype(dtype) if is_gpu(local) else dtype     # bfloat16: int16 bits
    if np.dtype(local.dtype) != expected:
        held = "" if expected == dtype else f" (on the device: its bits as {expected})"
        raise ShapeError(f"rank {rank}: {what} has dtype {np.dtype(local.dtype)}, "
                         f"expected {dtype}{held}")


def check_out(out, local, shape, dtype, rank, views=False):
    """ShapeError unless ``out`` can receive the target block (``views``: it may be
    a strided view of a larger array)."""
    check_block(out, shape, dtype, rank, "out")
    if type(out) is np.ndarray and type(local) is np.ndarray:      # host arrays, at once
        flags = out.flags
        if flags.c_contiguous and flags.writeable and not (
                out.size and local.size and np.shares_memory(out, local)):
            return
    if local is not None and array_kind(out) != array_kind(local):
        raise ShapeError(f"rank {rank}: out is a {array_kind(out)} array but the block is "
                         f"a {array_kind(local)} array")
    if not views and not c_contiguous(out):
        raise ShapeError(f"rank {rank}: out must be C-contiguous")
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise ShapeError(f"rank {rank}: out is read-only")
    if isinstance(out, np.ndarray) and isinstance(local, np.ndarray) \
            and out.size and local.size and np.shares_memory(out, local):
        raise ShapeError(f"rank {rank}: out shares memory with the source block")


def check_workspace(value):
    """``workspace_bytes`` as a non-negative int (None stays None), else ShapeError.

    The same argument on every rank, so the message names no rank.
    """
    if value is None:
        return None
    try:
        w = int(value)
    except (TypeError, ValueError):
        raise ShapeError(f"workspace_bytes must be an integer, found {value!r}") from None
    if w < 0:
        raise ShapeError(f"workspace_bytes must be non-negative, found {w}")
    return w
