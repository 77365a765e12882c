"""How a run gets its memory: a fresh array per step, or one buffer reused in place.

The steps of :mod:`mpiredist.runtime.steps` are written once against this
small protocol; a strategy decides where each step's output lives:

- :class:`Fresh` (out of place): every communicating step writes a new
  array (kept between runs when the Transfer pools them, or the caller's
  ``out=`` for the last one) while its input stays alive.  The faster
  strategy, chosen when its peak fits the contract.
- :class:`OneBuffer` (in place): one buffer of the plan's peak, at most
  max(S, T) (the theorem).  Not donated, the buffer is filled by the first
  communicating step, which reads the caller's block as :class:`Fresh`
  would; after that every step rearranges the buffer in place.  Donated,
  the caller's block *is* the buffer, grown or shrunk with ``realloc``
  (``ndarray.resize``), so that only max(0, T - S) bytes are new.

The protocol (what the steps use): ``region`` (the current block as a
:class:`Region`), ``in_place(step)`` (does the step rearrange the buffer,
or write a separate output?), ``room`` (bytes of pack rings beside the
outputs), ``sliced`` (whether the block is a strided part of its base,
from the plan), ``narrow`` (a slice), ``output`` and ``adopt`` (a separate
output, then the new current block), ``unchanged`` (a step that keeps the
block), and ``before``/``after``/``result`` for the loop.
"""

import math

import numpy as np

from ..core.backend import bytes_as, c_contiguous
from ..core.blocks import contiguous_box, flat_offset, rank_block
from ..planning.budget import (MARGIN, buffer_bytes, contract_limit, frame_shape,
                               fresh_buffer_fits, reduction_room)
from .onebuffer import compact

__all__ = ["Region", "Fresh", "OneBuffer", "after_slice"]


class Region:
    """A box (``starts``, ``shape``) of a C-contiguous ``base`` array."""

    __slots__ = ("base", "starts", "shape")

    def __init__(self, base, starts=None, shape=None):
        self.base = base
        self.starts = tuple(starts) if starts is not None else (0,) * base.ndim
        self.shape = tuple(shape) if shape is not None else tuple(base.shape)

    @property
    def whole(self):
        return self.shape == tuple(self.base.shape)

    def view(self):
        """The box as a view of the base (0-d too)."""
        if not self.shape:
            return self.base[...]
        return self.base[tuple(slice(s, s + n) for s, n in zip(self.starts, self.shape))]

    def sub(self, starts, shape):
        """The box at ``starts`` (relative to this one) of ``shape``."""
        return Region(self.base, [a + b for a, b in zip(self.starts, starts)], shape)

    def __repr__(self):
        return f"Region(base{tuple(self.base.shape)}, starts={self.starts}, shape={self.shape})"


def after_slice(sliced, step):
    """Whether the block is a strided part of its base after ``step`` (from the plan).

    A slice of one dim, all dims before it of length 1, keeps rows whole:
    runs that are contiguous in the block stay contiguous in the base.
    """
    if step.op != "slice":
        return False
    dims = set(step.dims)
    first = min(dims, default=0)
    return sliced or len(dims) > 1 or any(n > 1 for n in step.local_shape_before[:first])


def _view_region(ctx, region, starts, shape):
    """``region`` narrowed to the box (an empty box need not lie inside it)."""
    if not math.prod(shape):
        return Region(ctx.xp.empty(shape, dtype=ctx.dtype))
    return region.sub(starts, shape)


class Fresh:
    """Out of place: a new array per communicating step (see the module doc).

    ``local`` is never written; ``out`` (optional) receives the result;
    ``slack`` is the pack room the budget leaves beside the outputs.
    """

    def __init__(self, ctx, local, out=None, slack=0):
        if not c_contiguous(local):
            local = ctx.xp.ascontiguousarray(local)
        self.ctx, self.local, self.out = ctx, local, out
        self.region = Region(local)
        self.sliced = False
        self.room = max(0, slack - MARGIN)
        steps = ctx.plan.steps
        self._last = len(steps) - 1 if steps and steps[-1].op != "slice" else None

    def in_place(self, step):
        return False

    def before(self, index, step):
        pass

    def after(self, index, step):
        self.sliced = after_slice(self.sliced, step)

    def narrow(self, starts, shape):
        self.region = _view_region(self.ctx, self.region, starts, shape)

    def output(self, shape):
        """The array a step writes: ``out`` for the last step, else new (or pooled)."""
        if self.out is not None and self.ctx.current == self._last:
            return self.out
        return self.ctx.new_array(shape)

    def adopt(self, region):
        self.region = region

    def unchanged(self):
        pass

    def result(self):
        region, out = self.region, self.out
        if out is not None:
            if region.base is not out:
                out[...] = region.view()
            return out
        if region.whole and region.base is not self.local:
            return region.base
        return region.view().copy()     # never hand back a view of the caller's buffer


class OneBuffer:
    """One buffer, rearranged in place (see the module doc).

    ``donate`` True means the caller's block may become the buffer: every
    rank has agreed that it can (:mod:`mpiredist.runtime.inputs`);
    ``resizable`` (this rank's own verdict) that it may also be
    reallocated.  ``buffer``, if given, is a byte array of at least the
    plan's capacity kept by the Transfer between runs (not donated only);
    ``out``, if given, receives the result.  ``workspace`` is W: every
    temporary takes at most half of it (``chunk``).
    """

    def __init__(self, ctx, local, donate, workspace, buffer=None, resizable=False, out=None):
        plan = ctx.plan
        self.ctx, self.plan, self.out = ctx, plan, out
        self.itemsize = plan.dtype.itemsize
        self.chunk = max(self.itemsize, workspace // 2)
        self.workspace = workspace
        self.capacity = buffer_bytes(plan)
        self.limit = contract_limit(plan, donate, workspace)
        fresh = donate and fresh_buffer_fits(plan, workspace)
        self.resizable = donate and resizable
        self.owner = local if donate and not fresh else None
        self.in_block = self.owner is not None      # the same on every rank (from the plan)
        self.shape = tuple(local.shape)
        self.offset = 0             # bytes before the block in the buffer (after a slice)
        self.pretransposed = False  # the fill laid out a reduce-scatter's parts already
        self.sliced = False
        self.room = workspace // 2
        ctx.reduce_room = reduction_room(workspace)
        self._kept, self._local = buffer, local
        self._release = fresh and self.resizable   # give a donated block back once filled
        if self.owner is not None:
            self.filling, self.view = False, None
            if self.resizable:
                local.shape = (local.size,)         # grown when a step needs it (reserve)
                self.buf = local.view(np.uint8)
            else:                                   # large enough: used as it is
                self.buf = local.reshape(-1).view(np.uint8)
        else:
            self.filling, self.buf = True, None
            self.view = Region(np.ascontiguousarray(local))

    # ----------------------------------------------------------- protocol

    @property
    def region(self):
        """The current block: the caller's (narrowed) while filling, else the buffer's."""
        if self.filling:
            return self.view
        return Region(self.typed_at(self.shape))

    def in_place(self, step):
        """Every step but an exchange rearranges the buffer once it is filled."""
        return not self.filling and step.op != "exchange"

    def before(self, index, step):
        """Fill the buffer at the first communicating step; grow a donated one."""
        if self.filling:
            if step.op == "slice":
                return
            size = self._allocate(index)
            if _reads_caller(self.plan.steps, index):   # the step writes the buffer
                self.room = max(0, self.limit - MARGIN - size)
                return
            self._copy_in(step)
        self.reserve(step)
        if step.op not in ("slice", "permute"):
            self.to_front()

    def after(self, index, step):
        if self.filling:
            self.sliced = after_slice(self.sliced, step)

    def narrow(self, starts, shape):
        """A slice: a view while filling, else the box moved to the front (or an offset)."""
        if self.filling:
            self.view = _view_region(self.ctx, self.view, starts, shape)
            return
        if contiguous_box(self.shape, starts, shape):
            if math.prod(shape):
                self.offset += flat_offset(self.shape, starts) * self.itemsize
        else:
            self.to_front()
            compact(self.buf, self.shape, starts, shape, self.itemsize, self.chunk)
        self.shape = tuple(shape)

    def output(self, shape):
        """The filling step's output (the buffer's front), or an exchange's new array."""
        if self.filling:
            return self.typed(shape)
        return self.ctx.xp.empty(shape, dtype=self.plan.dtype)

    def adopt(self, region):
        """``region`` is the new block: in the buffer already, or copied in."""
        data = region.view()
        if self.filling:
            self._filled(tuple(data.shape))
            return
        self.shape = tuple(data.shape)
        np.copyto(self.typed(self.shape), data)

    def unchanged(self):
        """A step kept the block as it is (a permute to itself)."""
        if self.filling:
            self._copy_in(None)

    def result(self):
        """The target block: copied into ``out`` if given, else the buffer itself,
        shrunk to the block with ``realloc`` (no copy)."""
        if self.filling:
            self._allocate(len(self.plan.steps))
            self._copy_in(None)
        self.to_front()
        n = math.prod(self.shape) * self.itemsize
        out = self.out
        if out is not None:
            out[...] = self.typed(self.shape)
            self.buf = None
            return out
        if self.owner is not None and self.resizable:
            self.buf = None
            self.owner.resize(n // self.itemsize, refcheck=False)
            return self.owner.reshape(self.shape)
        if self.owner is not None:              # a view of the donated memory
            buf, self.buf = self.buf, None
            return bytes_as(buf, 0, self.plan.dtype, self.shape)
        buf, self.buf = self.buf, None
        if buf.base is not None:            # a buffer kept by the Transfer: never resized
            return bytes_as(buf, 0, self.plan.dtype, self.shape).copy()
        buf.resize(n, refcheck=False)      # realloc: shrinks without a copy
        return buf.view(self.plan.dtype).reshape(self.shape)

    # ------------------------------------------------------- the buffer

    def typed(self, shape):
        """The front ``prod(shape)`` elements of the buffer as an array of ``shape``."""
        return bytes_as(self.buf, 0, self.plan.dtype, shape)

    def typed_at(self, shape):
        """The block at the current offset as an array of ``shape``."""
        return bytes_as(self.buf, self.offset, self.plan.dtype, shape)

    def block(self, layout, digits=None):
        return rank_block(self.plan.step_shape, layout, digits or self.ctx.mc.digits)

    def to_front(self):
        """Move the block to the front of the buffer (in chunks), if it is not there."""
        if self.offset:
            n = math.prod(self.shape) * self.itemsize
            compact(self.buf, (self.offset + n,), (self.offset,), (n,), 1, self.chunk)
            self.offset = 0

    def pad(self, step):
        """Pad the block to the step's frame (uneven shards); return the true shape."""
        from .onebuffer import expand
        frame = frame_shape(self.plan, step)
        true = self.shape
        if frame != true:
            expand(self.buf, true, (0,) * len(true), frame, self.itemsize, self.chunk)
            self.shape = frame
        return true

    def unpad(self, true_after):
        if self.shape != true_after:
            compact(self.buf, self.shape, (0,) * len(true_after), true_after, self.itemsize,
                    self.chunk)
            self.shape = true_after

    def reserve(self, step):
        """Grow a donated buffer to the plan's capacity before a step that needs more.

        The donated block is first shrunk to the live data (``realloc``
        shrinks in place); then, if the contract has room for it, a new
        buffer takes the live data (one copy of it, no zero fill) and the
        donated memory is released, else the block grows with
        ``ndarray.resize`` (which zero-fills the growth).
        """
        if self.owner is None or _need(self.plan, step) <= self.buf.size:
            return
        if not self.resizable:
            raise AssertionError("internal error: a donated block that may not be resized "
                                 "is too small for the run (the ranks agreed it was not)")
        self.to_front()
        live = math.prod(self.shape)
        owner, self.buf = self.owner, None
        owner.resize(live, refcheck=False)
        # the copy's peak (old live data and new buffer), then the new buffer with
        # the temporaries of later steps (at most half the workspace)
        if self._fits(self.capacity - self.plan.src_local_bytes
                      + max(live * self.itemsize, self.workspace // 2)):
            self.buf = np.empty(self.capacity, dtype=np.uint8)
            self.buf[:live * self.itemsize] = owner.view(np.uint8)
            owner.resize(0, refcheck=False)
            self.owner = None
        else:
            owner.resize(-(-self.capacity // self.itemsize), refcheck=False)
            self.buf = owner.view(np.uint8)

    def _fits(self, new_bytes):
        """True if ``new_bytes`` newly allocated at the peak keep the call within its limit.

        Used to take a new buffer instead of growing a donated block with
        ``ndarray.resize``, which zero-fills the growth and may copy the block
        (measured: 8 -> 64 MiB took 118 ms at 8 ranks, a new 64 MiB buffer
        filled by the first step 36 ms).
        """
        return new_bytes <= self.limit - MARGIN

    # ---------------------------------------------------------- filling

    def _allocate(self, k):
        """The buffer, for step ``k`` (the first communicating one) and the later
        ones: what they need (:func:`_need`), so that a result smaller than the
        source needs no shrinking copy.  Every size comes from the plan (the
        largest block over ranks), so all ranks pack alike.  Returns its size."""
        steps = self.plan.steps
        reads = k < len(steps) and _reads_caller(steps, k)
        first = math.prod(steps[k].local_shape_after if reads else
                          steps[k - 1].local_shape_after if k else steps[0].local_shape_before
                          if steps else self.shape)
        size = max([first * self.itemsize] + [_need(self.plan, st) for st in steps[k + reads:]])
        self.buf = self._kept[:size] if self._kept is not None else np.empty(size, np.uint8)
        return size

    def _copy_in(self, step):
        """Copy the (narrowed) caller's block into the buffer; a reduce-scatter along
        an inner dim gets each member's part contiguous by the same copy."""
        view = self.view.view()
        shape = tuple(view.shape)
        if step is not None and _even_scatter(self.plan, step, shape):
            (j,) = step.dims
            g = step.group_size
            outer = math.prod(shape[:j])
            part = shape[j] // g * math.prod(shape[j + 1:])
            self.typed((g, outer, part))[...] = view.reshape(outer, g, part).transpose(1, 0, 2)
            self.pretransposed = True
        else:
            np.copyto(self.typed(shape), view)
        self._filled(shape)

    def _filled(self, shape):
        self.filling, self.view, self.sliced = False, None, False
        self.shape = shape
        self.room = self.workspace // 2
        if self._release:
            self._local.resize(0, refcheck=False)     # donated: give its memory back now
            self._release = False


def _even_scatter(plan, step, shape):
    """True for a reduce-scatter along an inner dim whose parts are all equal."""
    if step.op != "reduce_scatter":
        return False
    (j,) = step.dims
    return math.prod(shape[:j]) > 1 and frame_shape(plan, step) == tuple(shape)


def _need(plan, step):
    """Bytes of buffer ``step`` needs: its block before and after, or its padded frame."""
    frame = frame_shape(plan, step)
    return max(math.prod(step.local_shape_before), math.prod(step.local_shape_after),
               math.prod(frame) if frame is not None else 0) * plan.dtype.itemsize


def _reads_caller(steps, k):
    """True if step ``k`` can read the caller's block and write the buffer directly.

    From the plan alone (every rank must run the step the same way): a
    reduce-scatter or all-reduce only when no slice came before it and, for
    a reduce-scatter, the parts are contiguous (every dim before the
    scattered one has length one in the largest block).
    """
    step = steps[k]
    if step.op in ("all_gather", "all_to_all", "exchange", "permute"):
        return True
    if step.op == "reduce_scatter":
        return k == 0 and all(n == 1 for n in step.local_shape_before[:step.dims[0]])
    return step.op == "all_reduce" and k == 0
