"""What both executors share: a block as a box of a buffer, step records, and
the per-Transfer :class:`Context` (communicators, element datatype, pack room,
and each step's routing, computed once).

A :class:`Context` belongs to one :class:`~mpiredist.runtime.transfer.Transfer`
and lives as long as it: the routing of a step (which boxes go to which
member, Python over the group or the mesh) is computed on the first run and
reused, instead of living in module-level caches.  :meth:`Context.free`
releases its MPI datatypes; it never communicates.
"""

import math
from dataclasses import dataclass

from ..core.backend import c_contiguous
from ..core.blocks import overlap, rank_block
from ..core.subaxes import rank_digits
from ..planning.routing import exchange_recvs, exchange_sends, member_digits
from .comm import mpi
from .counts import count_limit, message
from .packing import rank0_sides

__all__ = ["Region", "StepRecord", "Context", "relative"]


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


def relative(box, outer):
    """``(starts, shape)`` of global ``box`` relative to the block ``outer``."""
    return (tuple(lo - o for (lo, _), (o, _) in zip(box, outer)),
            tuple(hi - lo for lo, hi in box))


def volume(box):
    return math.prod(hi - lo for lo, hi in box)


class Context:
    """State of one Transfer on this rank, shared by its runs.

    ``slack`` is how many bytes of pack buffer a step may use (set by the
    executor from the plan and the budget, the same on every rank);
    ``sliced`` whether the current block is a strided part of its base (from
    the plan).  Datatypes made during a step go to ``types`` and are freed
    after it (:meth:`free_types`).
    """

    def __init__(self, plan, mc, xp):
        self.plan, self.mc, self.xp = plan, mc, xp
        self.MPI = mpi()
        self.itemsize = plan.dtype.itemsize
        self.elem = self.MPI.BYTE.Create_contiguous(self.itemsize).Commit()
        self.types = []
        self.slack = 0
        self.sliced = False
        self.pool = None        # buffers kept between runs (a dict), or None
        self.current = None     # index of the step running
        self.count_limit = count_limit(self.MPI)
        self.reduce_room = 1 << 62  # bytes a reduction call may carry (set from W)
        self._routes = {}

    # ------------------------------------------------------------ buffers

    def new_array(self, shape):
        """A step's output: new, or the one kept for this step when pooling."""
        if self.pool is None:
            return self.xp.empty(shape, dtype=self.plan.dtype)
        key = (self.current, tuple(shape))
        found = self.pool.get(key)
        if found is None:
            found = self.pool[key] = self.xp.empty(shape, dtype=self.plan.dtype)
        return found

    def scratch(self, count):
        """A pack buffer of ``count`` elements: new, or the kept one when pooling."""
        if self.pool is None:
            return self.xp.empty(count, dtype=self.plan.dtype)
        found = self.pool.get("scratch")
        if found is None or found.size < count:
            found = self.pool["scratch"] = None
            found = self.pool["scratch"] = self.xp.empty(count, dtype=self.plan.dtype)
        return found[:count]

    # ------------------------------------------------------------ routing

    def group_pieces(self, index):
        """``(pieces_out, pieces_in, elements sent)`` of this rank in group step ``index``."""
        key = ("group", index)
        if key not in self._routes:
            self._routes[key] = _group_pieces(self.plan, self.plan.steps[index], self.mc.rank)
        return self._routes[key]

    def exchange_pieces(self, index):
        """``(pieces_out, pieces_in)`` of this rank in exchange step ``index``."""
        key = ("exchange", index)
        if key not in self._routes:
            self._routes[key] = _exchange_pieces(self.plan, self.plan.steps[index], self.mc.rank)
        return self._routes[key]

    def exchange_sides(self, index, whole):
        """``(send, recv)``: whether exchange ``index`` packs its sends, its
        receives (judged on rank 0, see packing)."""
        key = ("sides", index)
        if key not in self._routes:
            self._routes[key] = rank0_sides(self.plan, self.plan.steps[index])
        send, recv = self._routes[key]
        return bool(send or not whole), bool(recv)

    # ---------------------------------------------------------- datatypes

    def subarray(self, region, box=None):
        """``(count, datatype)`` for ``box`` (relative to ``region``) inside it."""
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

    def whole(self, region):
        """Buffer spec of all of ``region``: plain bytes when it is contiguous in memory."""
        view = region.view()
        if c_contiguous(view):
            return message(self, view, view.size * self.itemsize)
        count, t = self.subarray(region)
        return [region.base, count, t]

    def typed(self):
        """The predefined MPI datatype of the plan's dtype (reductions need one).

        ``Datatype.fromcode`` is mpi4py's public map from a numpy type code to
        the predefined datatype; ``mpi4py.util.dtlib.from_numpy_dtype``
        returns a duplicate instead, which MPICH refuses in reductions.
        """
        return self.MPI.Datatype.fromcode(self.plan.dtype.char)

    def free_types(self):
        for t in self.types:
            t.Free()
        self.types.clear()

    def free(self):
        """Free every datatype this context holds (local; no communication)."""
        self.free_types()
        if self.elem is not None:
            self.elem.Free()
            self.elem = None
        self._routes.clear()


def _group_pieces(plan, step, rank):
    shape, digits = plan.global_shape, rank_digits(plan.mesh, rank)
    mine_b, mine_a = rank_block(shape, step.before, digits), rank_block(shape, step.after, digits)
    pieces_out, pieces_in, sent = {}, {}, 0
    for m in range(step.group_size):
        other = member_digits(digits, step.axes, m)
        box = overlap(mine_b, rank_block(shape, step.after, other))
        if box is not None:
            pieces_out[m] = relative(box, mine_b)
            sent += volume(box) if other != digits else 0
        box = overlap(rank_block(shape, step.before, other), mine_a)
        if box is not None:
            pieces_in[m] = relative(box, mine_a)
    return pieces_out, pieces_in, sent


def _exchange_pieces(plan, step, rank):
    mesh, shape = plan.mesh, plan.global_shape
    digits = rank_digits(mesh, rank)
    mine_b, mine_a = rank_block(shape, step.before, digits), rank_block(shape, step.after, digits)
    pieces_out = {r: relative(box, mine_b)
                  for r, box in exchange_sends(mesh, shape, step.before, step.after, digits)}
    pieces_in = {}
    for r, box in exchange_recvs(mesh, shape, step.before, step.after, digits):
        if r == rank:
            pieces_out[r] = relative(box, mine_b)
        pieces_in[r] = relative(box, mine_a)
    return pieces_out, pieces_in
