"""How a run gets its memory: the protocol of the memory strategies, and :class:`Fresh`.

The steps of :mod:`mpiredist.runtime.steps` are written once against this
small protocol; a strategy decides where each step's output lives:

- :class:`Fresh` (out of place, here): every communicating step writes a
  new array (kept between runs when the Transfer pools them, or the
  caller's ``out=`` for the last one) while its input stays alive.  The
  faster strategy, chosen when its peak fits the contract.
- :class:`~mpiredist.runtime.onebuffer.OneBuffer` (in place): one buffer of
  the plan's peak, at most max(S, T) (the theorem), rearranged in place by
  every step; donated, the caller's block *is* the buffer.

The protocol (what the steps use):

================== ==========================================================
``region``         the current block, a :class:`Region`
``sliced``         the block is a strided part of its base (from the plan)
``room``           bytes of pack rings beside the outputs
``rearranges``     the strategy may rearrange a buffer in place: then
``in_place(step)`` says whether this step does (else it writes a separate
                   ``output``)
``narrow``         a slice: the block becomes a box of itself
``output(shape)``  the array a step writes (out of place)
``adopt(region)``  the step's result is the new current block
``unchanged()``    the step kept the block as it was
``before``         what the loop calls before each step (or None), and the
``result``         target block at the end
================== ==========================================================

A strategy that ``rearranges`` also offers the in-place half of each step
kind (``place``, ``whole``, ``all_to_all``, ``reduce_scatter``,
``permute``): :class:`~mpiredist.runtime.onebuffer.OneBuffer` keeps them
beside its buffer and kernels, and the steps call them and nothing else of
it.
"""

import math

from ..planning.budget import MARGIN

__all__ = ["Region", "Fresh", "after_slice", "view_region"]


class Region:
    """A box (``starts``, ``shape``) of a C-contiguous ``base`` array."""

    __slots__ = ("base", "starts", "shape", "whole", "_flat")

    def __init__(self, base, starts=None, shape=None):
        self.base = base
        if starts is None:
            self.starts, self.shape, self.whole = (0,) * base.ndim, base.shape, True
        else:
            self.starts, self.shape = tuple(starts), tuple(shape)
            self.whole = self.shape == base.shape
        self._flat = None

    @property
    def flat(self):
        """The base as a flat array of its elements (a view, made once)."""
        found = self._flat
        if found is None:
            found = self._flat = self.base.reshape(-1)
        return found

    def view(self):
        """The box as a view of the base (0-d too)."""
        if self.whole or not self.shape:
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


def view_region(ctx, region, starts, shape):
    """``region`` narrowed to the box (an empty box need not lie inside it)."""
    if not math.prod(shape):
        return Region(ctx.xp.empty(shape, dtype=ctx.dtype))
    return region.sub(starts, shape)


class Fresh:
    """Out of place: a new array per communicating step (see the module doc).

    ``local`` is never written; ``out`` (optional) receives the result;
    ``slack`` is the pack room the budget leaves beside the outputs.
    """

    rearranges = False
    before = None           # nothing to do before a step

    def __init__(self, ctx, local, out=None, slack=0):
        if not local.flags.c_contiguous:
            local = ctx.xp.ascontiguousarray(local)
        self.ctx, self.local, self.out = ctx, local, out
        ctx.keep_scratch = True
        self.region = Region(local)
        self.sliced = False
        self.room = max(0, slack - MARGIN)
        steps = ctx.plan.steps
        self._last = len(steps) - 1 if steps and steps[-1].op != "slice" else None

    def narrow(self, starts, shape, sliced):
        self.region = view_region(self.ctx, self.region, starts, shape)
        self.sliced = sliced

    def output(self, shape):
        """The array a step writes: ``out`` for the last step, else new (or pooled)."""
        ctx = self.ctx
        if self.out is not None and ctx.current == self._last:
            return self.out
        if ctx.pool is None:
            return ctx.xp.empty(shape, dtype=ctx.dtype)
        return ctx.new_array(shape)

    def adopt(self, region):
        self.region = region
        self.sliced = False

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


