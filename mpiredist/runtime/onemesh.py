"""OneMesh: a collective plan on one mesh, compiled -- how a :class:`~mpiredist.Transfer` runs there.

A run goes through the one run path (:func:`mpiredist.runtime.run.run`);
this module holds what is particular to a plan on one mesh: the agreed
*variant* of a run (the source kept, the donated block as the buffer, or
device arrays), its memory strategy (a fresh array per step, or one
buffer), the steps' loop (:func:`mpiredist.runtime.steps.run`), and the
views of plans that split a dim at a node boundary.
"""

import enum
import warnings

import numpy as np

from ..core.backend import array_module, is_gpu
from ..core.blocks import box_shape, rank_block
from ..core.errors import BudgetWarning, DonationWarning
from ..core.subaxes import expand, rank_digits
from ..planning import planner
from ..planning.budget import (buffer_bytes, choose, default_workspace, fresh_buffer_fits,
                               reduction_room)
from ..planning.pieces import plan_pieces
from ..planning.plans import format_bytes
from . import steps
from .context import Context, Keep
from .devices import staged_exchange
from .explain import explain_choice
from .groups import base_group, mesh_groups, node_ranks, topology
from .inputs import NOT_DONATED, Donation, judge_donation
from .memory import Fresh
from .onebuffer import OneBuffer
from .resources import Resources
from .run import KEPT as KEPT_FITS
from .run import Item, Verdict

__all__ = ["OneMesh", "Variant"]


class Variant(enum.Enum):
    """How a run of a :class:`OneMesh` executes, agreed by every rank per run."""

    KEPT = "the source is kept"
    GIVEN = "the donated block is the buffer"
    DEVICE = "device arrays (out of place)"

    # members are singletons: hashed by identity (Enum's own hashes the name in
    # Python, six times a run as dict keys)
    __hash__ = object.__hash__


class OneMesh:
    """A collective plan on one mesh, compiled (see :class:`~mpiredist.Transfer`)."""

    every_holds = True

    def __init__(self, mesh, plan, donate, workspace, checked, target_mesh=None, replan=False,
                 in_place=False, dst_layout=None):
        """Set up the runs of agreed arguments (collective: sub-groups, and the
        group's topology on first use).

        A mesh without a topology takes its group's; on more than one node, a
        plan of the planner (``replan``) is made again with it, alike on every
        rank (the topology is agreed by an allgather), so that its steps know
        their across-node bytes and a two-level profile prices them.
        """
        groups = mesh_groups(mesh)
        base = base_group(mesh)
        if mesh.topology is None:
            nodes = topology(base).devices(mesh.device_ranks())
            if nodes.count > 1:
                mesh = mesh.with_topology(nodes)
                if replan:
                    plan = planner.plan(plan.global_shape, plan.dtype, mesh, plan.src,
                                        plan.dst, plan.strategy)
        self.mesh, self.target_mesh = mesh, target_mesh or mesh
        self.dst_layout = plan.dst if dst_layout is None else dst_layout
        self._plan, self.donate, self.checked = plan, donate, checked
        self.workspace = self._workspace = default_workspace(plan) if workspace is None \
            else workspace
        self._groups, self.group = groups, base
        digits = rank_digits(mesh, groups.rank)
        shape = plan.global_shape
        self.source_shape = box_shape(rank_block(shape, expand(plan.src, mesh), digits))
        self.target_shape = box_shape(rank_block(shape, expand(plan.dst, mesh), digits))
        self.items = (Item(self.source_shape, self.target_shape, plan.dtype),)
        replanner = _replanner(plan)
        self._choices = {Variant.KEPT: choose(plan, False, self._workspace, False, replanner,
                                              in_place)}
        if donate:
            self._choices[Variant.GIVEN] = choose(plan, True, self._workspace, False, replanner)
        self._largest = max(c.budget.limit for c in self._choices.values())
        self._kept_limit = self._choices[Variant.KEPT].budget.limit
        self._keep = Keep()
        self._programs = {}     # variant -> (choice, context), made on its first run
        self._resources = Resources(node_ranks(base))
        self.identity = dict(mesh=mesh, shape=plan.global_shape, dtype=plan.dtype, src=plan.src,
                             dst=plan.dst, strategy=plan.strategy, donate=donate,
                             workspace=workspace, checked=checked)
        self.name = (f"Transfer({list(plan.global_shape)}, {str(plan.dtype)!r}, {mesh!r}, "
                     f"{str(plan.src)!r}, {str(plan.dst)!r}, donate={donate}, "
                     f"workspace_bytes={self._workspace}, strategy={plan.strategy!r}, "
                     f"checked={checked})")
        for choice in [plan] + [c.plan for c in self._choices.values()]:
            for step in choice.steps:                   # collective: create them now
                if step.axes and step.op not in ("slice", "permute", "exchange"):
                    groups.sub(step.axes)

    @property
    def plan(self):
        """The plan a run executes (with ``donate``: when the donation is honoured)."""
        return self._choice().plan

    @property
    def executor(self):
        """``"out of place"`` or ``"in place"`` (with ``donate``: when honoured)."""
        return self._choice().executor

    def _choice(self):
        return self._choices[Variant.GIVEN if self.donate else Variant.KEPT]

    # ----------------------------------------------------------- running

    def judge(self, natives, outs, extra):
        """This rank's donation verdict, and whether the kept run fits its memory;
        MemoryBudgetError when the run it will take does not."""
        if not self.donate:
            self._resources.check(self._kept_limit, self._groups.rank, self.name)
            return KEPT_FITS
        (local,) = natives
        verdict = NOT_DONATED
        kept = self._choices[Variant.KEPT].budget.limit
        found = self._resources.available(self._largest)
        fits = Resources.fits(kept, found)
        if self.donate and is_gpu(local):
            verdict = Donation(False, False, "device arrays run out of place (the one-buffer "
                                             "strategy works on host memory)")
        elif self.donate:
            given = self._choices[Variant.GIVEN]
            verdict = judge_donation(local, extra, buffer_bytes(given.plan),
                                     fresh_buffer_fits(given.plan, self._workspace))
        if verdict.usable:
            self._resources.check(given.budget.limit, self._groups.rank,
                                  f"{self.name} (donated)", found)
        else:
            self._resources.check(kept, self._groups.rank, self.name, found)
        return Verdict(verdict, fits)

    def execute(self, natives, outs, kind, aware, flags, records, verdict):
        """Run the agreed variant (guarded by the run path)."""
        (local,), (out,) = natives, outs
        donation = verdict.donation
        if kind.device and not aware:
            return [self._staged(local, out, records, donation.why)]
        if kind.device:
            variant = Variant.DEVICE
        elif self.donate and flags["donate"]:
            variant = Variant.GIVEN
        else:
            variant = Variant.KEPT
        if self.donate and variant is not Variant.GIVEN:
            self._warn_donation(donation.why)
        resizable = variant is Variant.GIVEN and donation.resizable
        choice, ctx = self._program(variant, local)
        if choice.plan.view_shape is not None:  # one dim split in two, no copy
            local, out = split_views(ctx, local, out, resizable)
        if not choice.inplace:
            ctx.pool = self._keep.get(("pool", variant), dict) if out is not None else None
            mem = Fresh(ctx, local, out, choice.slack)
        else:
            buffer = None
            if out is not None and variant is Variant.KEPT:
                buffer = self._keep.get(("buffer",), lambda: np.empty(
                    buffer_bytes(choice.plan), dtype=np.uint8))
            mem = OneBuffer(ctx, local, variant is Variant.GIVEN, choice.budget.workspace,
                            buffer, resizable, out)
        result = steps.run(ctx, mem, records)
        if choice.plan.view_shape is not None:
            result = merged(ctx, result)
        return [result]

    def _program(self, variant, local):
        """``(choice, context)`` of ``variant``, made on its first run."""
        found = self._programs.get(variant)
        if found is not None:
            return found
        if variant not in self._choices:               # device arrays: out of place
            self._choices[variant] = choose(self._plan, False, self._workspace, True)
            self._largest = max(c.budget.limit for c in self._choices.values())
        choice = self._choices[variant]
        key = ("context", variant)
        if key not in self._keep:
            ctx = self._keep[key] = Context(self._groups.group, self._plan.dtype,
                                            array_module(local), choice.plan, self._groups)
            ctx.reduce_room = reduction_room(choice.budget.workspace)
            fits = choice.budget
            if choice.inplace and fits.inplace_peak > fits.limit:
                warnings.warn(BudgetWarning(f"Transfer {self._plan.src} -> {self._plan.dst}: "
                                            f"{fits}"), stacklevel=6)
            elif variant is Variant.DEVICE and fits.out_of_place_peak > fits.limit:
                warnings.warn(BudgetWarning(
                    f"Transfer {self._plan.src} -> {self._plan.dst}: device arrays run out "
                    f"of place (the one-buffer strategy works on host memory): predicted "
                    f"peak {format_bytes(fits.out_of_place_peak)} exceeds the limit "
                    f"{format_bytes(fits.limit)} by "
                    f"{format_bytes(fits.out_of_place_peak - fits.limit)}"), stacklevel=6)
        found = self._programs[variant] = (choice, self._keep[key])
        return found

    def _warn_donation(self, why):
        reason = (f"this rank's block cannot be donated: {why}" if why else
                  "another rank's block cannot be donated")
        warnings.warn(DonationWarning(
            f"Transfer {self._plan.src} -> {self._plan.dst}: donation not honoured on any "
            f"rank ({reason}); ran as not donated, the block is unchanged"), stacklevel=5)

    def _staged(self, local, out, records, why):
        """A device run on a transport that takes no device buffers: one exchange
        from the source layout to the target layout, every part staged through
        host rings (:func:`~mpiredist.runtime.devices.staged_exchange`)."""
        if self.donate:
            self._warn_donation(why)

        def make():
            self._program(Variant.DEVICE, local)    # its BudgetWarning, before data moves
            plan = self._plan
            sources, targets = plan_pieces(plan, plan.src, plan.dst,
                                           keep_classes=bool(plan.dst.partial),
                                           shape=plan.global_shape)
            return staged_exchange(self._groups.group, plan.dtype, sources, targets,
                                   self._workspace, plan.src.op)
        return self._keep.get(("staged",), make).fill(local, out, True, records)

    def free(self):
        """Release what the runs keep (local)."""
        self._programs.clear()
        self._keep.free()

    def kept_bytes(self):
        total = 0
        for value in self._keep.values():
            if isinstance(value, Context):
                total += value.kept_bytes
            elif isinstance(value, np.ndarray):
                total += value.nbytes
            elif isinstance(value, dict):
                total += sum(a.nbytes for a in value.values())
            elif hasattr(value, "ctx"):
                total += value.ctx.kept_bytes
        return total

    # ---------------------------------------------------------- explain

    def explain(self):
        """What a run executes: executor, steps, parts, bytes, predicted peak, W."""
        p = self._plan
        lines = [f"Transfer {p.src} -> {p.dst} on mesh {self.mesh}: "
                 f"{list(p.global_shape)} {p.dtype}, donate={self.donate}, "
                 f"checked={self.checked}, W = {format_bytes(self._workspace)}"]
        for variant, choice in self._choices.items():
            lines += explain_choice(variant, choice)
        return "\n".join(lines)


def _replanner(plan):
    """The plan without exchange steps, for a one-buffer run (collectives only)."""
    if plan.strategy != "collectives":
        return None

    def replan():
        return planner.plan(plan.global_shape, plan.dtype, plan.mesh, plan.src, plan.dst,
                            "collectives", allow_exchange=False, topology=plan.topology)
    return replan


# ------------------------------------------------------------------ views

def split_views(ctx, local, out, resizable):
    """``local`` and ``out`` as this rank's blocks of the view that the plan's
    steps run on (:attr:`Plan.view_shape
    <mpiredist.planning.plans.Plan.view_shape>`): one dim split in two, which
    is a view of any strided array (no copy).  A donated block that may be
    reallocated keeps its identity (its shape is set in place, as the
    one-buffer strategy sets it anyway)."""
    before, after, _ = _view_shapes(ctx)
    if resizable:
        local.shape = before
    else:
        local = _no_copy(local, before)
    if out is not None:
        out = _no_copy(out, after)
    return local, out


def _no_copy(array, shape):
    """``array`` with ``shape`` as a view (a numpy array raises rather than copy;
    CuPy's reshape of a split dim, or of a C-contiguous block, is a view).
    A numpy matrix, which has two dims whatever its shape, is viewed as a
    plain array."""
    if isinstance(array, np.ndarray):
        view = array.view(np.ndarray if isinstance(array, np.matrix) else type(array))
        view.shape = shape
        return view
    return array.reshape(shape)


def merged(ctx, result):
    """The result of a run on the plan's view, in this rank's target block shape."""
    shape = _view_shapes(ctx)[2]
    return _no_copy(result, shape) if tuple(result.shape) != shape else result


def _view_shapes(ctx):
    """This rank's source and target block shapes on the plan's view, and its
    target block shape (kept in the context's routes)."""
    plan = ctx.plan

    def make():
        digits = ctx.groups.digits
        return (box_shape(rank_block(plan.step_shape, plan.steps[0].before, digits)),
                box_shape(rank_block(plan.step_shape, plan.steps[-1].after, digits)),
                box_shape(rank_block(plan.global_shape, expand(plan.dst, plan.mesh), digits)))
    return ctx.route(("view",), make)
