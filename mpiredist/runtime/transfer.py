"""Transfer: one redistribution, planned and agreed once, run many times.

Modelled on mpi4py-fft's ``Transfer``: the constructor is collective (every
rank of the mesh calls it with the same arguments); it validates them on
every rank and agrees on them in one small collective, plans, chooses the
executor from the plan and the agreed arguments alone
(:func:`mpiredist.planning.budget.choose`), and creates the
sub-communicators the steps run on.  Each run then checks this rank's block,
agrees with the other ranks in one small Allreduce on what the blocks allow
(:mod:`mpiredist.runtime.donation`), and runs the executor; the routing of
each step is computed on the first run and kept
(:class:`~mpiredist.runtime.context.Context`).

Every decision that shapes the sequence of MPI calls is a function of the
plan and of agreed values, never of one rank's own array.

Examples
--------
Run with 8 ranks (``mpirun -n 8``)::

    with mr.Transfer((4096, 4096), "float32", mr.Mesh({"x": 8}),
                     "[{x}, {}]", "[{}, {x}]") as t:
        print(t.explain())
        out = np.empty(t.target_shape, np.float32)
        for _ in range(100):
            t.run(block, out=out)          # no allocation beyond W
"""

import warnings

import numpy as np

from ..core.backend import array_module
from ..core.blocks import box_shape, rank_block
from ..core.errors import BudgetWarning, DonationWarning, PlanError, ShapeError
from ..core.subaxes import expand, rank_digits
from ..planning import planner
from ..planning.budget import (Choice, assess, buffer_bytes, choose, default_workspace,
                                fresh_buffer_fits, in_place_plan, reduction_room)
from ..planning.plans import _bytes as format_bytes
from .agree import agree_flags, check_together
from .comm import base_comm, check_size, mesh_comm
from .context import Context
from .cross import CrossExchange, agree_cross, crossing
from .donation import Donation, array_kind, check_block, check_out, judge_donation, references
from .executor import execute
from .packing import group_sides, part_limit, parts

__all__ = ["Transfer", "judge", "donated_choice", "check_workspace"]

NOT_DONATED = Donation(False, False, "")
_VARIANTS = {"kept": "the source is kept", "given": "the donated block is the buffer",
             "gpu": "CuPy arrays (out of place)"}


class Transfer:
    """A redistribution of one array from ``src`` to ``dst``, compiled (collective).

    Parameters
    ----------
    global_shape : sequence of int
    dtype : numpy dtype or anything ``numpy.dtype`` accepts
    mesh : Mesh, dict or str
        Its communicator (``mesh.comm``, default ``MPI.COMM_WORLD``) must
        have ``mesh.size`` ranks, unless the mesh lists its ``ranks``.
    src, dst : Layout or str
    donate : bool
        Runs may reuse the block passed to :meth:`run` as their working
        buffer (its contents are then undefined).  Honoured only where every
        rank's block allows it (a numpy array that owns a writeable, aligned,
        C-contiguous buffer with no other reference than the caller's name);
        otherwise that run copies on every rank alike, leaves the block as it
        was and warns with :class:`~mpiredist.DonationWarning`.
    workspace_bytes : int, optional
        W, the budget for temporary buffers (default ``max(S, T) // 4 + 1 MiB``).
    strategy : {"collectives", "replicate", "direct"}
    checked : bool
        True (the default): every run checks this rank's arrays and agrees
        with the other ranks in one small Allreduce before any data moves,
        so bad input raises on every rank.  False: runs skip the agreement
        (one collective latency less: on small blocks about half the time);
        every rank must then pass numpy blocks of the right shape and dtype,
        as a previous checked run showed.  A rank whose block is wrong still
        takes part with zeros, so nobody waits for it, and raises; the other
        ranks' results are then undefined and they are not told.  Cannot be
        combined with ``donate``.
    dst_mesh : Mesh, optional
        The mesh of the target layout, on the same communicator (default:
        ``mesh``).  Every rank of the communicator constructs the Transfer
        and calls :meth:`run`; a rank outside the source mesh passes
        ``None``, a rank outside the target mesh gets ``None``.  When both
        meshes are every rank in order and their axes nest (``x=8`` and
        ``a=2,b=4``), the run is the collective normal form on one refined
        mesh, donation included.  Otherwise it is a point-to-point exchange
        in rounds (:mod:`mpiredist.runtime.exchange`): every rank allocates
        its target block plus at most W; a donation is not honoured there
        (a :class:`~mpiredist.DonationWarning` says so) and ``records``
        stay empty.

    Raises
    ------
    LayoutError, MeshError, ShapeError, PlanError, MismatchError, RemoteError
        On every rank, before anything runs, if any rank's arguments are bad
        or the ranks disagree.

    Notes
    -----
    Memory (E = bytes a run newly allocates at its peak, S and T the source
    and target block bytes): ``E <= max(S, T) + W``, or ``max(0, T - S) + W``
    when a donation is honoured.  With ``out=``, the Transfer keeps its
    intermediate and pack buffers between runs, so repeated runs allocate
    nothing beyond W; :meth:`free` releases them.
    """

    def __init__(self, global_shape, dtype, mesh, src, dst, donate=False,
                 workspace_bytes=None, strategy="collectives", checked=True, dst_mesh=None):
        self._cross = None
        if crossing(mesh, dst_mesh):
            self._init_cross(global_shape, dtype, mesh, src, dst, dst_mesh, donate,
                             workspace_bytes, strategy, checked)
            return

        def body(mesh, rank):
            plan = planner.plan(global_shape, dtype, mesh, src, dst, strategy)
            workspace = check_workspace(workspace_bytes, rank)
            check_size(mesh, base_comm(mesh))
            if donate and not checked:
                raise PlanError("Transfer(donate=True, checked=False): whether a block can "
                                "be donated is agreed by every rank on each run; donation "
                                "needs checked runs")
            values = dict(mesh=mesh, shape=plan.global_shape, dtype=plan.dtype, src=plan.src,
                          dst=plan.dst, strategy=strategy, donate=bool(donate),
                          workspace=workspace, checked=bool(checked))
            return (plan, workspace), values

        mesh, (plan, workspace) = check_together("Transfer", mesh, body)
        self._setup(mesh, plan, bool(donate), workspace)
        self._checked = bool(checked)

    def _init_cross(self, global_shape, dtype, mesh, src, dst, dst_mesh, donate, workspace,
                    strategy, checked):
        """Between meshes: the refined mesh's plan, or an exchange (collective)."""
        def extra(rank):
            if donate and not checked:
                raise PlanError("Transfer(donate=True, checked=False): donation needs "
                                "checked runs")
        mesh, target, shape, dt, s, d, route, w = agree_cross(
            global_shape, dtype, mesh, src, dst, dst_mesh, workspace, strategy, extra)
        kind, refined, plan = route
        if kind == "refined":
            self._setup(refined, plan, bool(donate), w)
            self._target_mesh = target
        else:
            self._cross = CrossExchange(mesh, target, shape, dt, s, d, w)
            self._mesh, self._donate, self._workspace = mesh, False, self._cross.workspace
            self.source_shape = self._cross.source_shape
            self.target_shape = self._cross.target_shape
            if donate:
                warnings.warn(DonationWarning(
                    f"Transfer between meshes {mesh} and {target}: the exchange reads the "
                    "source block in place, so a donation is not honoured on this route"),
                    stacklevel=3)
        self._checked = bool(checked)

    @classmethod
    def agreed(cls, mesh, plan, donate, workspace_bytes, one_buffer=False):
        """A Transfer of ``plan`` whose arguments the ranks have already agreed on.

        For callers that agreed in their own collective (``redistribute``,
        the benchmark); still collective (it may create sub-communicators).
        ``one_buffer`` runs a kept source in one buffer even where out of
        place would fit (the benchmark's ``inplace`` strategy).
        """
        self = cls.__new__(cls)
        self._cross = None
        self._setup(mesh, plan, bool(donate), workspace_bytes, one_buffer)
        return self

    def _setup(self, mesh, plan, donate, workspace, one_buffer=False):
        self._mesh, self._plan, self._donate = mesh, plan, donate
        self._checked = True
        self._workspace = default_workspace(plan) if workspace is None else workspace
        self._mc = mesh_comm(mesh)
        rank = self._mc.rank
        digits = rank_digits(mesh, rank)
        shape = plan.global_shape
        self.source_shape = box_shape(rank_block(shape, expand(plan.src, mesh), digits))
        self.target_shape = box_shape(rank_block(shape, expand(plan.dst, mesh), digits))
        kept = choose(plan, False, self._workspace, False, _replanner(plan))
        if one_buffer and not kept.inplace:
            kept = Choice(*in_place_plan(plan, assess(plan, False, self._workspace), False,
                                         self._workspace, _replanner(plan)))
        self._choices = {"kept": kept}
        if donate:
            self._choices["given"] = donated_choice(plan, self._workspace)
        self._contexts, self._buffers, self._warned = {}, {}, set()
        plans = [plan] + [c.plan for c in self._choices.values()]
        for p in plans:                                 # collective: create them now
            for step in p.steps:
                if step.axes and step.op not in ("slice", "permute", "exchange"):
                    self._mc.sub(step.axes)

    # ------------------------------------------------------------ public

    @property
    def plan(self):
        """The plan a run executes when the source is kept (see :meth:`explain`).

        Between meshes whose ranks do not nest: the
        :class:`~mpiredist.planning.crossmesh.CrossPlan` of the exchange.
        """
        if self._cross is not None:
            return self._cross.plan()
        return self._choices["kept"].plan

    @property
    def mesh(self):
        return self._mesh

    @property
    def target_mesh(self):
        """The target layout's mesh (``dst_mesh`` with its ranks, chosen for ``"auto"``)."""
        if self._cross is not None:
            return self._cross.dst_mesh
        return getattr(self, "_target_mesh", None) or self._mesh

    @property
    def donate(self):
        return self._donate

    @property
    def workspace_bytes(self):
        return self._workspace

    @property
    def executor(self):
        """``"out of place"``, ``"in place"`` or ``"exchange"`` (between meshes)."""
        if self._cross is not None:
            return "exchange"
        return self._choices["given" if self._donate else "kept"].executor

    def run(self, local, out=None, records=None):
        """Redistribute this rank's block ``local``; return its target block (collective).

        ``out``, if given, is a C-contiguous array of :attr:`target_shape`
        and the Transfer's dtype that receives the result (and is returned).
        Every rank checks its own arrays; one small Allreduce then raises
        a ``ValueError`` subclass on every rank if any rank's are bad, and
        settles whether the donation is honoured, before any data moves.
        ``records``, if a list, receives one
        :class:`~mpiredist.runtime.context.StepRecord` per step.
        """
        if self._cross is not None:
            return self._cross.run(local, out, self._checked)
        extra = references(local)          # beyond the caller's own name
        return self._run(local, out, extra, records)

    def explain(self):
        """What a run executes: executor, steps, rounds, bytes, predicted peak, W."""
        if self._cross is not None:
            return self._cross.explain()
        lines = [f"Transfer {self._plan.src} -> {self._plan.dst} on mesh {self._mesh}: "
                 f"{list(self._plan.global_shape)} {self._plan.dtype}, "
                 f"donate={self._donate}, checked={self._checked}, "
                 f"W = {format_bytes(self._workspace)}"]
        for name, choice in self._choices.items():
            lines += self._explain_choice(name, choice)
        return "\n".join(lines)

    def free(self):
        """Release this Transfer's datatypes and kept buffers (local, no communication).

        Sub-communicators belong to the mesh's communicator and are freed with it.
        """
        if self._cross is not None:
            self._cross.free()
            return
        for ctx in self._contexts.values():
            ctx.free()
        self._contexts.clear()
        self._buffers.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def __repr__(self):
        if self._cross is not None:
            c = self._cross
            return (f"Transfer({list(c.shape)}, {str(c.dtype)!r}, {c.mesh!r}, {str(c.src)!r}, "
                    f"{str(c.dst)!r}, dst_mesh={c.dst_mesh!r}, workspace_bytes={c.workspace})")
        return (f"Transfer({list(self._plan.global_shape)}, {str(self._plan.dtype)!r}, "
                f"{self._mesh!r}, {str(self._plan.src)!r}, {str(self._plan.dst)!r}, "
                f"donate={self._donate}, workspace_bytes={self._workspace}, "
                f"strategy={self._plan.strategy!r}, checked={self._checked})")

    # ----------------------------------------------------------- running

    def _run(self, local, out, extra_refs, records=None):
        if not self._checked:
            return self._run_unchecked(local, out, records)
        kind, verdict, error = "numpy", NOT_DONATED, None
        try:
            check_block(local, self.source_shape, self._plan.dtype, self._mc.rank)
            if out is not None:
                check_out(out, local, self.target_shape, self._plan.dtype, self._mc.rank)
            kind = array_kind(local)
            verdict = self.judge(local, extra_refs)
        except ValueError as exc:
            error = exc
        flags = agree_flags(self._mc.comm, "Transfer.run", error, {"kind": kind},
                            {"donate": verdict.usable})
        return self.run_agreed(local, out, kind, flags["donate"], verdict, records)

    def _run_unchecked(self, local, out, records):
        """A run without the agreement (``checked=False``).

        A rank whose arrays are wrong still takes part, with zeros of the
        right shape, so that no rank waits for it; then it raises.  The
        other ranks cannot know: their results are undefined then.
        """
        try:
            check_block(local, self.source_shape, self._plan.dtype, self._mc.rank)
            if out is not None:
                check_out(out, local, self.target_shape, self._plan.dtype, self._mc.rank)
            if array_kind(local) != "numpy":    # the path must not depend on this rank's array
                raise ShapeError(f"rank {self._mc.rank}: checked=False runs take numpy "
                                 f"blocks, found a {array_kind(local)} array")
        except ValueError as exc:
            self.run_agreed(np.zeros(self.source_shape, self._plan.dtype), None, "numpy", False)
            raise exc
        return self.run_agreed(local, out, "numpy", False, NOT_DONATED, records)

    def judge(self, local, extra_refs):
        """This rank's :class:`~mpiredist.runtime.donation.Donation` for ``local``
        (from the donated choice made once, at set-up)."""
        if not self._donate:
            return NOT_DONATED
        return judge_given(self._choices["given"].plan, self._workspace, local, extra_refs)

    def run_agreed(self, local, out, kind, donate_ok, verdict=None, records=None):
        """Run with the per-run facts already agreed by every rank (no check).

        ``kind`` is the array library of every rank's block, ``donate_ok``
        whether every rank's block may be donated, ``verdict`` this rank's
        own :class:`~mpiredist.runtime.donation.Donation`.  For callers
        that agreed in their own collective.
        """
        verdict = verdict or NOT_DONATED
        variant = "gpu" if kind == "cupy" else "given" if self._donate and donate_ok else "kept"
        if self._donate and variant != "given":
            self._warn_donation(verdict.why)
        choice, ctx = self._program(variant, local)
        if not choice.inplace:
            ctx.pool = self._buffers.setdefault(variant, {}) if out is not None else None
            return execute(choice.plan, local, self._mc, records, choice.slack, ctx, out)
        buffer = None
        if out is not None and variant == "kept":
            buffer = self._buffers.get("kept-buffer")
            if buffer is None:
                buffer = self._buffers["kept-buffer"] = np.empty(buffer_bytes(choice.plan),
                                                                  dtype=np.uint8)
        from .executor_inplace import execute_inplace   # imported when first needed
        return execute_inplace(ctx, local, variant == "given", choice.budget.workspace,
                               records, out, buffer, verdict.resizable)

    def _program(self, variant, local):
        """``(choice, context)`` of ``variant``, made on its first run."""
        if variant == "gpu" and "gpu" not in self._choices:
            self._choices["gpu"] = choose(self._plan, False, self._workspace, True)
        choice = self._choices[variant]
        if variant not in self._contexts:
            ctx = self._contexts[variant] = Context(choice.plan, self._mc, array_module(local))
            ctx.reduce_room = reduction_room(choice.budget.workspace)
            fits = choice.budget
            if choice.inplace and fits.inplace_peak > fits.limit:
                warnings.warn(BudgetWarning(f"Transfer {self._plan.src} -> {self._plan.dst}: "
                                            f"{fits}"), stacklevel=4)
        return choice, self._contexts[variant]

    def _warn_donation(self, why):
        reason = (f"this rank's block cannot be donated: {why}" if why else
                  "another rank's block cannot be donated")
        warnings.warn(DonationWarning(
            f"Transfer {self._plan.src} -> {self._plan.dst}: donation not honoured on any "
            f"rank ({reason}); ran as not donated, the block is unchanged"), stacklevel=4)

    # ---------------------------------------------------------- explain

    def _explain_choice(self, name, choice):
        fits = choice.budget
        head = (f"\n[{name}: {_VARIANTS[name]}] executor {choice.executor}; "
                f"limit {format_bytes(fits.limit)}, predicted peak "
                f"{format_bytes(fits.inplace_peak if choice.inplace else fits.out_of_place_peak)}")
        if not choice.inplace:
            head += f", pack room {format_bytes(choice.slack)}"
        rows = [f"  step {i}: {step} sends {format_bytes(step.bytes_sent_per_rank)}/rank, "
                f"{self._rounds(choice, step)}" for i, step in enumerate(choice.plan.steps)]
        return [head, *rows] if rows else [head, "  (no steps)"]

    def _rounds(self, choice, step):
        """Message rounds of a step (from the plan, the same on every rank)."""
        if step.op == "slice":
            return "local"
        if step.op in ("all_to_all", "all_gather") and not choice.inplace:
            ctx = _Sizes(choice.plan, max(0, choice.slack))
            limit = part_limit(ctx, group_sides(step, True))
            piece = tuple(-(-n // step.group_size) if k == step.dims[-1] else n
                          for k, n in enumerate(step.local_shape_before))
            return f"{len(parts(piece, limit))} part(s) per piece, pipelined"
        return "1 round"


def _replanner(plan):
    """The plan without exchange steps, for a one-buffer run (collectives only)."""
    if plan.strategy != "collectives":
        return None

    def replan():
        return planner.plan(plan.global_shape, plan.dtype, plan.mesh, plan.src, plan.dst,
                            "collectives", allow_exchange=False)
    return replan


def donated_choice(plan, workspace):
    """How a run with an honoured donation executes ``plan`` (pure)."""
    return choose(plan, True, workspace, False, _replanner(plan))


def judge(plan, donate, workspace, local, extra_refs):
    """This rank's :class:`~mpiredist.runtime.donation.Donation` of ``local`` for a
    Transfer of ``plan`` (pure: no communication; ``workspace`` None is the default)."""
    if not donate:
        return NOT_DONATED
    w = default_workspace(plan) if workspace is None else workspace
    return judge_given(donated_choice(plan, w).plan, w, local, extra_refs)


def judge_given(given, workspace, local, extra_refs):
    """:func:`judge` when the donated run's plan ``given`` is already chosen."""
    return judge_donation(local, extra_refs, buffer_bytes(given),
                          fresh_buffer_fits(given, workspace))


class _Sizes:
    """The two fields :func:`~mpiredist.runtime.packing.part_limit` reads."""

    def __init__(self, plan, slack):
        self.slack, self.itemsize = slack, plan.dtype.itemsize


def check_workspace(value, rank=None):
    """``workspace_bytes`` as a non-negative int (None stays None), else ShapeError."""
    if value is None:
        return None
    where = "" if rank is None else f"rank {rank}: "
    try:
        w = int(value)
    except (TypeError, ValueError):
        raise ShapeError(f"{where}workspace_bytes must be an integer, "
                         f"found {value!r}") from None
    if w < 0:
        raise ShapeError(f"{where}workspace_bytes must be non-negative, found {w}")
    return w

