"""The one-buffer memory strategy: :class:`OneBuffer`, with the in-place half of each step.

One buffer of the plan's peak, at most max(S, T) (the theorem), rearranged
in place by every step.  Not donated, the buffer is filled by the first
communicating step, which reads the caller's block as
:class:`~mpiredist.runtime.memory.Fresh` would; after that every step
rearranges the buffer in place.  Donated, the caller's block *is* the
buffer, grown or shrunk with ``realloc`` (``ndarray.resize``), so that
only max(0, T - S) bytes are new.

Besides the protocol of :mod:`mpiredist.runtime.memory`, the strategy
offers the in-place half of each step kind, which the steps of
:mod:`mpiredist.runtime.steps` call when ``in_place(step)`` is true:

============== ==============================================================
``place``      all-gather: the own block expanded to its slot of the output
``whole``      all-reduce: the block, reduced where it is
``all_to_all`` a block transpose so each member's piece is one slot, slots
               swapped pairwise, placed
``reduce_scatter`` parts made contiguous by a transpose, then reduced into
               this member's part, moved to the front
``permute``    the block sent whole beside itself when both fit, else in
               parts through a ring, in order
============== ==============================================================

Every temporary is at most half the workspace (``chunk``): the kernels of
:mod:`mpiredist.runtime.kernels` and the rings of the exchange engine.
"""

import math

import numpy as np

from ..core.backend import bytes_as
from ..core.blocks import contiguous_box, flat_offset, rank_block
from ..planning.budget import (MARGIN, buffer_bytes, contract_limit, frame_shape,
                               fresh_buffer_fits, reduction_room)
from ..planning.pieces import ring_part_limit
from ..planning.routing import member_digits
from .exchange import Recv, Send, move
from .kernels import compact, expand, transpose
from .memory import Region, view_region
from .reductions import reduce_by_parts, reduce_limit, reduction_rings

__all__ = ["OneBuffer"]


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
        ctx.keep_scratch = False        # temporaries share half of W: none is kept
        ctx.free_scratch()
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

    rearranges = True

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

    def narrow(self, starts, shape, sliced):
        """A slice: a view while filling, else the box moved to the front (or an offset)."""
        if self.filling:
            self.view = view_region(self.ctx, self.view, starts, shape)
            self.sliced = sliced
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

    # ------------------------------------------------- in-place step halves

    def place(self, shape, dim, start):
        """All-gather: the block expanded to ``start`` of ``dim`` in a block of
        ``shape`` (its slot of the gathered output); the output in place."""
        place = [0] * len(shape)
        place[dim] = start
        expand(self.buf, self.shape, place, shape, self.itemsize, self.chunk)
        self.shape = shape
        return self.typed(shape)

    def whole(self):
        """All-reduce: the block itself, reduced in place."""
        return self.typed(self.shape)

    def all_to_all(self, ctx, step, group):
        """Pieces made contiguous slots, swapped pairwise in place, then placed.

        With ``i < j`` a block transpose first makes each member's piece one
        slot of ``(A, g, L)`` (``A`` = lengths before ``i``), and the received
        pieces land already in target order; with ``i > j`` the slots exist
        as they are and a block transpose after the swap puts the pieces in
        place.  Uneven shards are padded to the step's frame first (as XLA
        does).  Returns the bytes this rank sent.
        """
        i, j = step.dims
        true_before = self.pad(step)
        g, shape, size = group.size, list(self.shape), self.itemsize
        cj = shape[j] // g
        inner = math.prod(shape[j + 1:]) * size
        if math.prod(shape) and g > 1:
            if i < j:
                a, rows = math.prod(shape[:i]), shape[i] * math.prod(shape[i + 1:j])
                transpose(self.buf, a, rows, g, cj * inner, self.chunk)
                self._swap(ctx, group, a, rows * cj * inner)
            else:
                self._swap(ctx, group, math.prod(shape[:j]), cj * inner)
                transpose(self.buf, math.prod(shape[:j]), g, cj * math.prod(shape[j + 1:i]),
                          shape[i] * math.prod(shape[i + 1:]) * size, self.chunk)
        shape[i], shape[j] = shape[i] * g, cj
        self.shape = tuple(shape)
        after = self.block(step.after)
        self.unpad(tuple(hi - lo for lo, hi in after))
        kept = math.prod(min(b1, a1) - max(b0, a0) if min(b1, a1) > max(b0, a0) else 0
                         for (b0, b1), (a0, a1) in zip(self.block(step.before), after))
        return (math.prod(true_before) - kept) * size

    def _swap(self, ctx, group, a, length):
        """In-place all-to-all of the slots of the front ``(a, g, length)`` bytes.

        Slot ``m`` (``[:, m, :]``) goes to member ``m`` and is replaced by
        what ``m`` sends: a symmetric pairing (this member swaps with
        ``(k - me) mod g`` at place k, every pair once), in parts, paired in
        the engine: a contiguous part (``a == 1``) is sent straight from its
        slot, a strided one packed into the send ring; what arrives waits in
        the receive ring until its place is released, then is copied in.
        Unlike ``MPI_IN_PLACE`` collectives, all the memory used is visible
        and bounded: the rings take at most ``chunk`` bytes.
        """
        g, me = group.size, group.rank
        slots = Region(self.buf[:a * g * length].reshape(a, g, length))
        sends, recvs = [], []
        for k in range(g):
            p = (k - me) % g
            if p == me:
                continue
            box = ((0, p, 0), (a, 1, length))
            sends.append(Send((k,), p, box, False))
            recvs.append(Recv((k,), p, box, False, False, None))
        room = min(self.chunk, 2 * (g - 1) * a * length)
        move(ctx, group, sends, recvs, slots, slots,
             ring_part_limit(1, self.chunk, (a > 1, True)), room, paired=True)

    def reduce_scatter(self, ctx, step, group, op, reducer):
        """This member's part of the group's reduction, in the buffer: the parts
        made contiguous (a transpose, or already by the fill), reduced by one
        call within the reduction room or by parts, moved to the front.
        Returns the bytes this rank sent."""
        (j,) = step.dims
        g, me = group.size, group.rank
        outer = math.prod(step.local_shape_before[:j])      # from the plan: alike everywhere
        if outer > 1:
            self.pad(step)
            outer = math.prod(self.shape[:j])
        shape = self.shape
        inner = math.prod(shape[j + 1:])
        if outer > 1:
            if not self.pretransposed:
                transpose(self.buf, 1, outer, g, shape[j] // g * inner * self.itemsize,
                          self.chunk)
            self.pretransposed = False
            counts = [outer * (shape[j] // g) * inner] * g
        else:
            lengths = [self.block(step.after, member_digits(ctx.groups.digits, step.axes, m))[j]
                       for m in range(g)]
            rows = math.prod(shape[:j])     # 0 or 1 here: alike on the group's members
            counts = [(hi - lo) * inner * rows for lo, hi in lengths]
        flat = self.typed((sum(counts),))
        offsets = [sum(counts[:m]) for m in range(g)]
        boxes = {m: ((offsets[m],), (c,)) for m, c in enumerate(counts)}
        if sum(counts) <= reduce_limit(ctx, group):
            ctx.calls += 1
            group.reduce_scatter(flat, None, counts, op)
        else:
            reduce_by_parts(ctx, group, Region(flat), boxes, Region(flat, *boxes[me]), reducer,
                            False, reduction_rings(ctx, self.room))
            size = self.itemsize
            compact(self.buf, (sum(counts) * size,), (offsets[me] * size,),
                    (counts[me] * size,), 1, self.chunk)
        self.shape = tuple(counts[me] // max(1, outer * inner) if k == j else n
                           for k, n in enumerate(shape))
        self.unpad(tuple(hi - lo for lo, hi in self.block(step.after)))
        return (sum(counts) - counts[me]) * self.itemsize

    def permute(self, ctx, step, group, dest, source, after):
        """Send the block whole to ``dest``, receive ``source``'s, in the buffer.

        Both ends of a message must agree on its size, so the choice between
        one message and parts comes from the plan: straight into free space
        of the buffer when the largest blocks before and after fit beside
        each other in a buffer whose size is the same on every rank (not a
        donated block's own memory, whose size differs); otherwise in parts,
        paired in the engine: every part is sent straight from the block,
        and part k of the incoming block waits in a receive ring of at most
        half the workspace until send k has finished, then is copied to the
        front (it overwrites only what parts 0..k held: the block starts at
        or after the front).
        """
        nbytes = math.prod(self.shape) * self.itemsize
        recv = math.prod(after) * self.itemsize
        most = (math.prod(step.local_shape_before) + math.prod(step.local_shape_after)) \
            * self.itemsize
        if not self.in_block and most <= self.buf.size:
            self.to_front()
            ctx.calls += 1
            group.sendrecv(self.buf[:nbytes], dest, self.buf[nbytes:nbytes + recv], source)
            self.offset, self.shape = nbytes, after
            return
        o = self.offset
        source_bytes = Region(self.buf[o:o + nbytes])
        target_bytes = Region(self.buf[:recv])
        move(ctx, group, [Send((0,), dest, ((0,), (nbytes,)), False)],
             [Recv((0,), source, ((0,), (recv,)), False, False, None)], source_bytes,
             target_bytes, ring_part_limit(1, self.chunk, (False, True)),
             min(self.chunk, max(recv, 1)), paired=True)
        self.offset, self.shape = 0, after

    # ------------------------------------------------------- the buffer

    def typed(self, shape):
        """The front ``prod(shape)`` elements of the buffer as an array of ``shape``."""
        return bytes_as(self.buf, 0, self.plan.dtype, shape)

    def typed_at(self, shape):
        """The block at the current offset as an array of ``shape``."""
        return bytes_as(self.buf, self.offset, self.plan.dtype, shape)

    def block(self, layout, digits=None):
        return rank_block(self.plan.step_shape, layout, digits or self.ctx.groups.digits)

    def to_front(self):
        """Move the block to the front of the buffer (in chunks), if it is not there."""
        if self.offset:
            n = math.prod(self.shape) * self.itemsize
            compact(self.buf, (self.offset + n,), (self.offset,), (n,), 1, self.chunk)
            self.offset = 0

    def pad(self, step):
        """Pad the block to the step's frame (uneven shards); return the true shape."""
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
