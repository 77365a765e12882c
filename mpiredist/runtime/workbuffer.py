"""The in-place executor's working buffer: allocated, filled, grown, returned.

One buffer per call holds the current block C-contiguous at ``offset``
(usually 0, the front).  Not donated, it is allocated for what the steps
need and filled by the first communicating step, which reads the caller's
block.  Donated, the caller's own block is the buffer; it grows only when a
step needs more (:meth:`WorkBuffer.reserve`) and is shrunk to the result at
the end with ``realloc``.
"""

import math

import numpy as np

from ..core.blocks import rank_block
from ..planning.budget import (MARGIN, buffer_bytes, contract_limit, frame_shape,
                               fresh_buffer_fits, reduction_room)
from .context import Region, StepRecord
from .executor import run_step
from .inplace import compact

__all__ = ["WorkBuffer", "can_resize"]


def can_resize(array):
    """True if ``array`` owns a writeable C-contiguous numpy buffer that ``resize`` may grow.

    Only the array itself is judged here; whether other references to its
    memory exist is the caller's part (:mod:`mpiredist.runtime.donation`).
    """
    return (isinstance(array, np.ndarray) and array.flags.owndata and array.base is None
            and array.flags.c_contiguous and array.flags.writeable and array.flags.aligned)


class WorkBuffer:
    """State of one in-place run: the buffer, the current shape, MPI helpers."""

    def __init__(self, ctx, local, donate, workspace, buffer=None, resizable=False):
        """``donate`` True means the caller's block may become the buffer: every
        rank has agreed that it can (:mod:`mpiredist.runtime.donation`);
        ``resizable`` (this rank's own verdict) that it may also be
        reallocated.  ``buffer``, if given, is a byte array of at least the
        plan's capacity kept by the Transfer between runs (not donated only).
        """
        plan = ctx.plan
        self.plan, self.mc, self.ctx = plan, ctx.mc, ctx
        self.MPI = ctx.MPI
        self.itemsize = plan.dtype.itemsize
        self.chunk = max(self.itemsize, workspace // 2)
        self.shape = tuple(local.shape)
        self.offset = 0         # bytes before the block in the buffer (after a slice)
        self.pretransposed = False  # the fill already laid out a reduce-scatter's parts
        capacity = buffer_bytes(plan)
        self.capacity, self.workspace = capacity, workspace
        self.limit = contract_limit(plan, donate, workspace)
        fresh = donate and fresh_buffer_fits(plan, workspace)
        self.resizable = donate and resizable
        self.owner = local if donate and not fresh else None
        self.in_block = self.owner is not None      # the same on every rank (from the plan)
        ctx.slack, ctx.sliced = workspace // 2, False     # pack buffers of a later exchange
        ctx.reduce_room = reduction_room(workspace)       # a reduction's rounds
        self.filled = []        # records of the steps run while filling the buffer
        if self.owner is not None and self.resizable:
            local.shape = (local.size,)         # grown when a step needs it (reserve)
            self.buf = local.view(np.uint8)
        elif self.owner is not None:            # large enough: used as it is, never resized
            self.buf = local.reshape(-1).view(np.uint8)
        else:
            self._fill(local, buffer)
            if fresh and self.resizable:
                local.resize(0, refcheck=False)     # donated: give its memory back now

    def _fill(self, local, buffer=None):
        """Allocate the buffer and fill it from the caller's block without copying it whole.

        Leading slices only narrow a view of ``local``; the first
        communicating step then reads from that view and writes its output
        straight into the buffer, with pack buffers of what the contract
        leaves beside it.  Only when that step cannot (a reduce-scatter that
        needs packing) is the view copied in.  The buffer holds what that
        step and the later ones need (:func:`_need`), so a result smaller
        than the source needs no shrinking copy.  Every size here comes from
        the plan (the largest block over ranks), so all ranks pack alike.
        """
        ctx, steps, k = self.ctx, self.plan.steps, 0
        region = Region(np.ascontiguousarray(local))
        while k < len(steps) and steps[k].op == "slice":
            region, _ = run_step(ctx, k, region)
            self.filled.append(StepRecord("slice", 0, 0.0))
            k += 1
        reads = k < len(steps) and _reads_caller(steps, k)
        first = math.prod(steps[k].local_shape_after if reads else
                          steps[k - 1].local_shape_after if k else steps[0].local_shape_before
                          if steps else self.shape)
        size = max([first * self.itemsize] + [_need(self.plan, st) for st in steps[k + reads:]])
        self.buf = buffer[:size] if buffer is not None else np.empty(size, dtype=np.uint8)
        if reads:
            ctx.slack = max(0, self.limit - MARGIN - size)
            region, sent = run_step(ctx, k, region, self.typed)
            self.filled.append(StepRecord(steps[k].op, int(sent), 0.0))
        ctx.sliced = False
        ctx.slack = self.workspace // 2
        self.shape = region.shape
        if region.base is not None and not _aliases(region.base, self.buf):
            if k < len(steps) and _even_scatter(self.plan, steps[k], region.shape):
                self._copy_scattered(steps[k], region.view())
            else:
                np.copyto(self.typed(self.shape), region.view())

    def _copy_scattered(self, step, view):
        """Copy the caller's block in, each member's part already contiguous.

        A reduce-scatter along an inner dim needs the block transposed to
        ``(g, outer, part)``; the copy into the buffer does it for free.
        """
        (j,) = step.dims
        g = step.group_size
        outer, part = math.prod(view.shape[:j]), view.shape[j] // g * math.prod(view.shape[j + 1:])
        dst = self.typed((g, outer, part))
        dst[...] = view.reshape(outer, g, part).transpose(1, 0, 2)
        self.pretransposed = True

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

    def to_front(self):
        """Move the block to the front of the buffer (in chunks), if it is not there."""
        if self.offset:
            n = math.prod(self.shape) * self.itemsize
            compact(self.buf, (self.offset + n,), (self.offset,), (n,), 1, self.chunk)
            self.offset = 0

    def typed(self, shape):
        n = math.prod(shape) * self.itemsize
        return self.buf[:n].view(self.plan.dtype).reshape(shape)

    def block(self, layout, digits=None):
        return rank_block(self.plan.global_shape, layout, digits or self.mc.digits)

    def result(self, out=None):
        """The target block: copied into ``out`` if given, else the buffer itself,
        shrunk to the block with ``realloc`` (no copy)."""
        self.to_front()
        n = math.prod(self.shape) * self.itemsize
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
            return buf[:n].view(self.plan.dtype).reshape(self.shape)
        buf, self.buf = self.buf, None
        if buf.base is not None:            # a buffer kept by the Transfer: never resized
            return buf[:n].view(self.plan.dtype).reshape(self.shape).copy()
        buf.resize(n, refcheck=False)      # realloc: shrinks without a copy
        return buf.view(self.plan.dtype).reshape(self.shape)


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


def _aliases(a, buf):
    return np.shares_memory(a, buf) if a.size and buf.size else False
