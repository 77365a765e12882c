"""Run a plan on MPI: one function per step kind, buffers owned in one place.

The local block is tracked as a :class:`Region`: a box of a C-contiguous base
array.  Slices only shrink the box (no copy).  Each communicating step
allocates its output and moves data from the input box into its final place
there.  MPICH moves derived datatypes several times slower than contiguous
bytes, so contiguous blocks and pieces go as plain bytes at an offset, and
strided pieces are packed by numpy within the memory budget
(:mod:`mpiredist.runtime.packing`).

Step -> MPI call:

============== =====================================================
slice          none (the box shrinks)
all_gather     Allgather (Allgatherv if blocks differ) of bytes when
               the result is a concatenation in memory, else
               :func:`mpiredist.runtime.packing.move` on the group
all_to_all     :func:`mpiredist.runtime.packing.move` on the group: rounds of
               Isend/Irecv of contiguous or packed parts
reduce_scatter Reduce_scatter (typed), after packing if needed
all_reduce     Allreduce (typed)
permute        Sendrecv of the whole block (no call if it stays)
exchange       :func:`mpiredist.runtime.packing.move` on the mesh
============== =====================================================

Every peer's piece is ``before(sender) & after(receiver)``: for all-gather
and all-to-all inside a group this is exactly the collective's data; for the
exchange the receivers come from :func:`mpiredist.planning.routing.exchange_sends`.
"""

import itertools
import math
import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..core.backend import array_module, synchronize
from ..core.blocks import overlap, rank_block
from .comm import mpi
from ..planning.budget import MARGIN, assess
from .packing import (contiguous_box, exchange_peers, exchange_sides, flat_offset, group_sides,
                      move)
from ..core.errors import CommunicationError
from ..core.subaxes import rank_digits
from ..planning.routing import (exchange_recvs, exchange_sends, member_digits, permute_dest,
                      permute_source)

__all__ = ["execute", "Region", "StepRecord"]


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one step did on this rank: bytes sent to other ranks, time."""

    op: str
    bytes_sent: int
    seconds: float


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
        return self.base[tuple(slice(s, s + n) for s, n in zip(self.starts, self.shape))]

    def sub(self, starts, shape):
        """The box at ``starts`` (relative to this one) of ``shape``."""
        return Region(self.base, [a + b for a, b in zip(self.starts, starts)], shape)

    def __repr__(self):
        return f"Region(base{tuple(self.base.shape)}, starts={self.starts}, shape={self.shape})"


class _Context:
    """Per-call state: communicators, element datatype, counters."""

    def __init__(self, plan, mc, xp):
        self.plan, self.mc, self.xp = plan, mc, xp
        self.MPI = mpi()
        self.itemsize = plan.dtype.itemsize
        self.elem = self.MPI.BYTE.Create_contiguous(self.itemsize).Commit()
        self.types = []
        self.reserved = None    # callable shape -> array for the next output
        self.slack = 0          # bytes the budget leaves for pack buffers
        self.sliced = False     # the block is a strided slice of a larger one (from the plan)

    def subarray(self, region, box=None):
        """``(count, datatype)`` for ``box`` (global coords) inside ``region``."""
        if box is None:
            rel, shape = (0,) * len(region.shape), region.shape
        else:
            rel, shape = box
        if math.prod(shape) == 0:
            return 0, self.elem
        if not region.base.ndim:
            return 1, self.elem
        starts = [a + b for a, b in zip(region.starts, rel)]
        t = self.elem.Create_subarray(list(region.base.shape), list(shape), starts).Commit()
        self.types.append(t)
        return 1, t

    def piece(self, region, box):
        """``(count, byte displacement, datatype)`` of ``box`` inside ``region``.

        A box that is one contiguous run of the base array goes as plain
        bytes at an offset (fast in MPICH); any other as a subarray type.
        """
        rel, shape = box
        starts = [a + b for a, b in zip(region.starts, rel)]
        full = region.base.shape
        if math.prod(shape) and contiguous_box(full, starts, shape):
            offset = flat_offset(full, starts) * self.itemsize
            return math.prod(shape) * self.itemsize, offset, self.MPI.BYTE
        count, t = self.subarray(region, box)
        return count, 0, t

    def whole(self, region):
        """Buffer spec of all of ``region``: plain bytes when it is contiguous in memory.

        MPICH moves a subarray datatype much slower than the same bytes
        given as a contiguous buffer, even when the subarray is contiguous.
        """
        view = region.view()
        if _c_contiguous(view):
            return [view, view.size * self.itemsize, self.MPI.BYTE]
        count, t = self.subarray(region)
        return [region.base, count, t]

    def free_types(self):
        for t in self.types:
            t.Free()
        self.types.clear()

    def free(self):
        self.free_types()
        self.elem.Free()


def execute(plan, local, mc, records=None, slack=None):
    """Run ``plan`` on this rank's block ``local``; return the target block.

    ``local`` is never written.  ``mc`` is the mesh's
    :class:`~mpiredist.runtime.comm.MeshComm`.  ``slack`` is how many bytes of pack
    buffer the memory budget allows on top of the outputs (default: what the
    default workspace leaves, see :mod:`mpiredist.planning.budget`).  If ``records`` is a list, one
    :class:`StepRecord` per step is appended to it.
    """
    xp = array_module(local)
    if not _c_contiguous(local):
        local = xp.ascontiguousarray(local)
    region = Region(local)
    ctx = _Context(plan, mc, xp)
    if slack is None:
        fits = assess(plan)
        slack = fits.limit - fits.out_of_place_peak
    ctx.slack = max(0, slack - MARGIN)
    try:
        for step in plan.steps:
            t0 = time.perf_counter()
            try:
                region, sent = _RUN[step.op](ctx, step, region)
                ctx.sliced = after_slice(ctx.sliced, step)
            except ctx.MPI.Exception as exc:
                raise CommunicationError(f"MPI failed in step {step}: {exc}") from exc
            finally:
                ctx.free_types()
            if records is not None:
                records.append(StepRecord(step.op, int(sent), time.perf_counter() - t0))
    finally:
        ctx.free()
    if region.whole and region.base is not local:
        return region.base
    return region.view().copy()     # never hand back a view of the caller's buffer


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


def _c_contiguous(a):
    return a.flags["C_CONTIGUOUS"] if hasattr(a.flags, "__getitem__") else a.flags.c_contiguous


def _block(ctx, layout, digits):
    return rank_block(ctx.plan.global_shape, layout, digits)


def _rel(box, outer):
    """``(starts, shape)`` of global ``box`` relative to the block ``outer``."""
    return (tuple(lo - o for (lo, _), (o, _) in zip(box, outer)),
            tuple(hi - lo for lo, hi in box))


def _volume(box):
    return math.prod(hi - lo for lo, hi in box)


def _empty(ctx, block):
    """A new output block, or the buffer the in-place executor reserved for it."""
    return _new(ctx, tuple(hi - lo for lo, hi in block))


def _new(ctx, shape):
    if ctx.reserved is not None:
        out, ctx.reserved = ctx.reserved(shape), None
        return out
    return ctx.xp.empty(shape, dtype=ctx.plan.dtype)


def _slice(ctx, step, region):
    digits = ctx.mc.digits
    before, after = _block(ctx, step.before, digits), _block(ctx, step.after, digits)
    starts, shape = _rel(after, before)
    if not math.prod(shape):            # an empty block need not lie inside the old one
        return Region(_empty(ctx, after)), 0
    return region.sub(starts, shape), 0


def _group_move(ctx, step, region):
    """All-gather or all-to-all in the group: each member gets before & after."""
    comm = ctx.mc.sub(step.axes)
    out = Region(_empty(ctx, _block(ctx, step.after, ctx.mc.digits)))
    pieces_out, pieces_in, sent = _group_pieces(ctx.plan, step, ctx.mc.rank)
    if step.op == "all_gather" and _gather_is_concat(ctx, step, region, out):
        _allgatherv(ctx, comm, region, out, pieces_in)
    else:
        move(ctx, comm, region, out, pieces_out, pieces_in, comm.Get_size() - 1,
             group_sides(step, not ctx.sliced))
    return out, sent * ctx.itemsize


def _gather_is_concat(ctx, step, region, out):
    """True if the gathered blocks lie one after another in ``out``.

    Decided from the plan alone, so that all members take the same path.
    """
    (d,) = step.dims
    return all(n == 1 for n in step.local_shape_after[:d])


def _allgatherv(ctx, comm, region, out, pieces_in):
    """Allgather when all blocks are equal (MPICH's Allgatherv is much slower).

    ``pieces_in[m]`` is member ``m``'s block in ``out`` (absent if empty).
    """
    counts = [math.prod(pieces_in[m][1]) * ctx.itemsize if m in pieces_in else 0
              for m in range(comm.Get_size())]
    send = ctx.whole(region)
    synchronize(region.base)
    if len(set(counts)) == 1:
        comm.Allgather(send, [out.base, counts[0], ctx.MPI.BYTE])
        return
    displs = [0, *itertools.accumulate(counts)][:-1]
    comm.Allgatherv(send, [out.base, counts, displs, ctx.MPI.BYTE])


def _mpi_op(ctx):
    op, MPI = ctx.plan.src.op, ctx.MPI
    if ctx.plan.dtype == np.bool_:
        return {"sum": MPI.LOR, "max": MPI.LOR, "min": MPI.LAND, "prod": MPI.LAND}[op]
    return {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}[op]


def _typed(ctx):
    """The predefined MPI datatype of the plan's dtype (reductions need one)."""
    return ctx.MPI._typedict[ctx.plan.dtype.char]


def _contiguous(ctx, region):
    return region.base if region.whole else ctx.xp.ascontiguousarray(region.view())


def _reduce_scatter(ctx, step, region):
    comm, digits = ctx.mc.sub(step.axes), ctx.mc.digits
    (j,) = step.dims
    mine_b = _block(ctx, step.before, digits)
    src = region.view()
    parts, counts = [], []
    for m in range(comm.Get_size()):
        box = _block(ctx, step.after, member_digits(digits, step.axes, m))
        starts, shape = _rel(box, mine_b)
        index = tuple(slice(s, s + n) for s, n in zip(starts, shape))
        parts.append(src[index])
        counts.append(math.prod(shape))
    outer = all(n == 1 for n in region.shape[:j])
    if outer and region.whole:
        packed = region.base
    else:                                   # one pack buffer, each part copied once
        packed = ctx.xp.empty(sum(counts), dtype=ctx.plan.dtype)
        offset = 0
        for part, n in zip(parts, counts):
            packed[offset:offset + n].reshape(part.shape)[...] = part
            offset += n
    out = _empty(ctx, _block(ctx, step.after, digits))
    synchronize(packed)
    typed = _typed(ctx)
    comm.Reduce_scatter([packed, typed], [out, typed], counts, _mpi_op(ctx))
    me = comm.Get_rank()
    sent = sum(c for m, c in enumerate(counts) if m != me)
    return Region(out), sent * ctx.itemsize


def _all_reduce(ctx, step, region):
    comm = ctx.mc.sub(step.axes)
    src = _contiguous(ctx, region)
    out = _new(ctx, src.shape)
    synchronize(src)
    typed = _typed(ctx)
    comm.Allreduce([src, typed], [out, typed], _mpi_op(ctx))
    g = comm.Get_size()
    return Region(out), 2 * out.size * (g - 1) // g * ctx.itemsize


def _permute(ctx, step, region):
    mc, plan = ctx.mc, ctx.plan
    dest = permute_dest(plan.mesh, step.before, step.after, mc.digits)
    source = permute_source(plan.mesh, step.before, step.after, mc.digits)
    if dest == mc.rank and source == mc.rank:
        return region, 0
    out = Region(_empty(ctx, _block(ctx, step.after, mc.digits)))
    send = ctx.whole(region)
    synchronize(region.base)
    mc.comm.Sendrecv(send, dest,
                     recvbuf=[out.base, out.base.size * ctx.itemsize, ctx.MPI.BYTE],
                     source=source)
    sent = _volume(_block(ctx, step.before, mc.digits)) if dest != mc.rank else 0
    return out, sent * ctx.itemsize


def _exchange(ctx, step, region):
    mc, plan = ctx.mc, ctx.plan
    out = Region(_empty(ctx, _block(ctx, step.after, mc.digits)))
    pieces_out, pieces_in = _exchange_pieces(plan, step, mc.rank)
    sent = sum(math.prod(s) for r, (_, s) in pieces_out.items() if r != mc.rank)
    move(ctx, mc.comm, region, out, pieces_out, pieces_in, exchange_peers(plan, step),
         exchange_sides(plan, step, not ctx.sliced))
    return out, sent * ctx.itemsize


@lru_cache(maxsize=64)
def _group_pieces(plan, step, rank):
    """``(pieces_out, pieces_in, elements sent)`` of ``rank`` in a group step,
    keyed by member index; cached like :func:`_exchange_pieces`."""
    shape, digits = plan.global_shape, rank_digits(plan.mesh, rank)
    mine_b, mine_a = rank_block(shape, step.before, digits), rank_block(shape, step.after, digits)
    pieces_out, pieces_in, sent = {}, {}, 0
    for m in range(step.group_size):
        other = member_digits(digits, step.axes, m)
        box = overlap(mine_b, rank_block(shape, step.after, other))
        if box is not None:
            pieces_out[m] = _rel(box, mine_b)
            sent += _volume(box) if other != digits else 0
        box = overlap(rank_block(shape, step.before, other), mine_a)
        if box is not None:
            pieces_in[m] = _rel(box, mine_a)
    return pieces_out, pieces_in, sent


@lru_cache(maxsize=64)
def _exchange_pieces(plan, step, rank):
    """``(pieces_out, pieces_in)`` of ``rank`` in an exchange step, relative boxes.

    Cached: the routing is Python over the mesh (150 ms for an all-to-all
    shaped exchange at 4096 ranks), and a plan usually runs many times.
    """
    mesh, shape = plan.mesh, plan.global_shape
    digits = rank_digits(mesh, rank)
    mine_b, mine_a = rank_block(shape, step.before, digits), rank_block(shape, step.after, digits)
    pieces_out = {r: _rel(box, mine_b)
                  for r, box in exchange_sends(mesh, shape, step.before, step.after, digits)}
    pieces_in = {}
    for r, box in exchange_recvs(mesh, shape, step.before, step.after, digits):
        if r == rank:
            pieces_out[r] = _rel(box, mine_b)
        pieces_in[r] = _rel(box, mine_a)
    return pieces_out, pieces_in


_RUN = {"slice": _slice, "all_gather": _group_move, "all_to_all": _group_move,
        "reduce_scatter": _reduce_scatter, "all_reduce": _all_reduce,
        "permute": _permute, "exchange": _exchange}
