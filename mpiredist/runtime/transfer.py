"""Transfer: one redistribution, planned and agreed once, run many times.

Modelled on mpi4py-fft's ``Transfer``: the constructor is collective (every
rank of the communicator calls it with the same arguments); it validates
them on every rank and agrees on them in one small collective, plans,
chooses how to run from the plan and the agreed arguments alone
(:func:`mpiredist.planning.budget.choose`), and creates the
sub-communicators the steps run on.  Each run then checks this rank's
arrays, agrees with the other ranks in one small Allreduce on what the
arrays allow (:mod:`mpiredist.runtime.inputs`), and runs.

``mr.Transfer(...)`` is one protocol -- :meth:`~Transfer.run`,
:meth:`~Transfer.explain`, :meth:`~Transfer.free`, a context manager, and
``source_shape``, ``target_shape``, ``plan``, ``executor``, ``mesh``,
``target_mesh`` -- with two classes behind it, as ``pathlib.Path`` gives a
``PosixPath``: :class:`MeshTransfer` runs a collective plan on one mesh (a
refined one between meshes whose axes nest), :class:`CrossTransfer` the
exchange between meshes whose rank orders do not.

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

import enum
import time
import warnings

import numpy as np

from ..core.backend import (Backend, array_module, backend_of, c_contiguous, cupy_or_error,
                            device_dtype, is_gpu)
from ..core.blocks import box_shape, rank_block
from ..core.errors import (BudgetWarning, ClosedError, DonationWarning, MemoryBudgetError,
                           MeshError, MpiredistError, PlanError, ShapeError)
from ..core.mesh import Mesh
from ..core.subaxes import expand, rank_digits
from ..planning import planner
from ..planning.budget import (buffer_bytes, choose, default_workspace,
                               fresh_buffer_fits, reduction_room)
from ..planning.crossmesh import cross_plan, relabel, route
from ..planning.pieces import (exchange_workspace, layout_sources, layout_targets, part_limit,
                               parts, plan_pieces)
from ..planning.plans import _bytes as format_bytes
from . import steps
from .agree import agree, check_together
from .comm import (base_comm, check_size, gpu_support, library_comm, mesh_comm, mpi, node_comm,
                   topology)
from .context import Context
from .exchange import Exchange
from .inputs import (NOT_DONATED, Donation, check_block, check_out, check_workspace,
                     judge_donation, references)
from .failure import guard
from .memory import Fresh, OneBuffer
from .resources import Resources

__all__ = ["Transfer", "MeshTransfer", "CrossTransfer", "Variant", "crossing"]


class Variant(enum.Enum):
    """How a run of a :class:`MeshTransfer` executes, agreed by every rank per run."""

    KEPT = "the source is kept"
    GIVEN = "the donated block is the buffer"
    DEVICE = "device arrays (out of place)"

    # members are singletons: hashed by identity (Enum's own hashes the name in
    # Python, six times a run as dict keys)
    __hash__ = object.__hash__


def crossing(mesh, dst_mesh):
    """True if a call with these meshes takes the between-meshes path: a target
    mesh that differs, or a mesh over only some ranks of its communicator (a
    mesh over all of them in another order runs on one mesh).

    Never raises: a malformed argument takes that path, whose agreement
    then raises on every rank.
    """
    try:
        mesh = mesh if isinstance(mesh, Mesh) else Mesh(mesh)
        if dst_mesh is not None:
            dst_mesh = dst_mesh if isinstance(dst_mesh, Mesh) else Mesh(dst_mesh)
            if dst_mesh != mesh:
                return True
        if mesh.ranks is None:
            return False
        return sorted(mesh.device_ranks()) != list(range(base_comm(mesh).Get_size()))
    except (ValueError, TypeError):
        return True


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
        ``a=2,b=4``), the result is a :class:`MeshTransfer` of the
        collective normal form on one refined mesh, donation included.
        Otherwise a :class:`CrossTransfer`: one exchange of point-to-point
        messages; every rank allocates its target block plus at most W, a
        donation is not honoured (a :class:`~mpiredist.DonationWarning` says
        so) and ``records`` get one ``"exchange"`` record.

    Raises
    ------
    LayoutError, MeshError, ShapeError, PlanError, MismatchError
        On every rank, before anything runs, if any rank's arguments are bad
        or the ranks disagree (the ranks not at fault raise the matching
        :class:`~mpiredist.RemoteError` subclass, with the same message).

    Notes
    -----
    Memory (E = bytes a run newly allocates at its peak, S and T the source
    and target block bytes): ``E <= max(S, T) + W``, or ``max(0, T - S) + W``
    when a donation is honoured.  With ``out=``, the Transfer keeps its
    intermediate and pack buffers between runs, so repeated runs allocate
    nothing beyond W; :meth:`free` releases them.
    """

    def __new__(cls, global_shape, dtype, mesh, src, dst, donate=False, workspace_bytes=None,
                strategy="collectives", checked=True, dst_mesh=None):
        if cls is not Transfer:
            raise TypeError(f"make a {cls.__name__} with mpiredist.Transfer(...)")
        if crossing(mesh, dst_mesh):
            return _between(global_shape, dtype, mesh, src, dst, dst_mesh, donate,
                            workspace_bytes, strategy, checked)
        return MeshTransfer._compile(global_shape, dtype, mesh, src, dst, donate,
                                     workspace_bytes, strategy, checked)

    def __init__(self, *args, **kwargs):
        """Set up by ``__new__`` (collective); nothing more to do."""

    @classmethod
    def from_plan(cls, plan, mesh, donate=False, workspace_bytes=None, checked=True):
        """A :class:`MeshTransfer` that runs ``plan`` (any plan of ``mpiredist.plan``
        or :func:`mpiredist.planning.planner.assemble`) on ``mesh`` (collective:
        the ranks agree on the plan)."""
        def body(mesh, rank):
            check_size(mesh, base_comm(mesh))
            if (mesh.axes != plan.mesh.axes):
                raise MeshError(f"plan on mesh {plan.mesh} given mesh {mesh}")
            w = check_workspace(workspace_bytes)
            _check_options(donate, checked)
            return w, dict(plan=repr(plan.steps), mesh=repr(mesh), shape=plan.global_shape,
                           dtype=plan.dtype, donate=bool(donate), workspace=w)

        mesh, w = check_together("Transfer.from_plan", mesh, body)
        return MeshTransfer._make(mesh, plan, bool(donate), w, bool(checked))

    # ------------------------------------------------------- the protocol

    source_shape = None     # this rank's source block shape (None off the source mesh)
    target_shape = None     # this rank's target block shape (None off the target mesh)

    @property
    def mesh(self):
        """The source layout's mesh (a refined one between nesting meshes)."""
        return self._mesh

    @property
    def target_mesh(self):
        """The target layout's mesh (``dst_mesh`` with its ranks, chosen for ``"auto"``)."""
        return self._target_mesh

    @property
    def donate(self):
        return self._donate

    @property
    def workspace_bytes(self):
        return self._workspace

    @property
    def checked(self):
        return self._checked

    def run(self, local, out=None, records=None, *, forwarded=0):
        """Redistribute this rank's block ``local``; return its target block (collective).

        ``out``, if given, is a C-contiguous array of :attr:`target_shape`
        and the Transfer's dtype that receives the result (and is returned).
        Every rank checks its own arrays; one small Allreduce then raises
        a ``ValueError`` subclass on every rank if any rank's are bad, and
        settles whether the donation is honoured, before any data moves.
        ``records``, if a list, receives one
        :class:`~mpiredist.runtime.steps.StepRecord` per step.
        ``forwarded``: references to ``local`` that the caller holds on the
        user's behalf (a wrapper that passes on a block it was given: one),
        so that they do not count against a donation.
        """
        if not self._checked:
            return self._run_unchecked(local, out, records)
        extra = references(local) - forwarded       # beyond the caller's own name
        error, kind, verdict, fits = None, _HOST, NOT_DONATED, True
        given = out
        try:
            self._open(local)
            kind, local, out = _native(local, out, self._base.Get_rank())
            verdict, fits = self._inputs(local, out, extra)
        except (ValueError, MpiredistError) as exc:
            error = exc
        flags = agree(self._base, "Transfer.run", error, dict(self._identity, **self._kind(kind)),
                      {"donate": verdict.usable, "fits": fits})
        if self._donate and not flags["donate"] and not flags["fits"]:
            raise MemoryBudgetError(
                f"{self!r}: a donation was not honoured on some rank, and the run that "
                "copies instead does not fit the memory of every rank")
        kind = self._agreed_kind(kind, local is not None or out is not None)
        if kind.device and not self._gpu_aware():
            result = self._staged(local, out, records, verdict)
        else:
            result = self._execute(local, out, kind, flags["donate"], verdict, records)
        return given if given is not None else kind.wrap(result, self._dtype_of())

    def _kind(self, kind):
        """The array library in the run's agreement (every rank holds a block here)."""
        return {"kind": str(kind)}

    def _agreed_kind(self, kind, holds):
        return kind

    def _gpu_aware(self):
        return gpu_aware(self._base, repr(self))

    def _staged(self, local, out, records, verdict=NOT_DONATED):
        """A device run on an MPI library that is not CUDA-aware: one exchange
        from the source layout to the target layout (:meth:`_staging`), every
        part through host rings.

        Each part is copied from the device into the host send ring, sent,
        received into the host receive ring and copied (or added) into the
        device result, in the pipeline of :mod:`mpiredist.runtime.p2p`: the
        copies of one part overlap the messages of the others.  Host memory:
        the rings, within W.  Device memory: the block, the result and one
        part (a copy for a strided view or a partial sum).
        """
        ex = self._staging(local)
        if self._donate:
            self._warn_donation(verdict.why)
        return run_exchange(self._base, repr(self), ex, local, out, True, self._dtype_of(),
                            records)

    def _staging(self, local):
        """The staged exchange of :meth:`_staged` (made on the first device run)."""
        raise NotImplementedError

    def _dtype_of(self):
        raise NotImplementedError

    def explain(self):
        """What a run executes: executor, steps, parts, bytes, predicted peak, W."""
        raise NotImplementedError

    def free(self):
        """Release this Transfer's datatypes and kept buffers (local, no communication).

        A run after it raises :class:`~mpiredist.ClosedError` on every rank;
        after ``MPI.Finalize`` it releases only Python objects.
        """
        if not getattr(self, "_freed", False):
            self._freed = True
            if not mpi().Is_finalized():
                self._release()

    def _open(self, local):
        if getattr(self, "_freed", False):
            raise ClosedError(f"rank {self._base.Get_rank()}: {self!r} was freed; make a "
                              "new Transfer")

    def __repr__(self):
        # the arguments never change: made once (runs name the Transfer in
        # their checks, and formatting it took about 0.06 ms a time)
        found = self.__dict__.get("_repr")
        if found is None:
            found = self._repr = self._describe()
        return found

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()


def _identity(**values):
    """What a Transfer's runs agree on (as its construction did), as text: a rank
    with another Transfer, or still constructing one, disagrees by name."""
    return {k: str(v) for k, v in values.items()}


def _check_options(donate, checked):
    if donate and not checked:
        raise PlanError("Transfer(donate=True, checked=False): whether a block can be "
                        "donated is agreed by every rank on each run; donation needs "
                        "checked runs")


_HOST = backend_of(np.empty(0))
# the backends a rank without arrays can take by name (between meshes)
_BY_NAME = {str(b): b for b in (Backend("torch", False), Backend("torch", True),
                                Backend("cupy", True), Backend("cuda", True))}


def _native(local, out, rank):
    """``(backend, local, out)``: the caller's arrays as numpy or CuPy views of the
    same memory (:mod:`mpiredist.core.backend`); ShapeError for arrays of no
    library, a tensor that requires grad, or ``out`` of another library."""
    if type(local) is np.ndarray and (out is None or type(out) is np.ndarray):
        return _HOST, local, out                    # numpy arrays as they are, at once
    kind = None if local is None else backend_of(local, f"rank {rank}: local block")
    if out is not None:
        theirs = backend_of(out, f"rank {rank}: out")
        if kind is not None and theirs != kind:
            raise ShapeError(f"rank {rank}: out is a {theirs} array but the block is a "
                             f"{kind} array")
        kind, out = kind or theirs, theirs.native(out, f"rank {rank}: out")
    if local is not None:
        local = kind.native(local, f"rank {rank}: local block")
    return kind or _HOST, local, out


class MeshTransfer(Transfer):
    """A collective plan on one mesh, compiled (see :class:`Transfer`)."""

    @classmethod
    def _compile(cls, global_shape, dtype, mesh, src, dst, donate, workspace, strategy,
                 checked):
        def body(mesh, rank):
            plan = planner.plan(global_shape, dtype, mesh, src, dst, strategy)
            w = check_workspace(workspace)
            check_size(mesh, base_comm(mesh))
            _check_options(donate, checked)
            values = dict(mesh=mesh, shape=plan.global_shape, dtype=plan.dtype, src=plan.src,
                          dst=plan.dst, strategy=strategy, donate=bool(donate),
                          workspace=w, checked=bool(checked))
            return (plan, w), values

        mesh, (plan, w) = check_together("Transfer", mesh, body)
        return cls._make(mesh, plan, bool(donate), w, bool(checked), replan=True)

    @classmethod
    def _make(cls, mesh, plan, donate, workspace, checked, target_mesh=None, replan=False):
        """Set up a Transfer of agreed arguments (collective: sub-communicators,
        and the communicator's topology on first use).

        A mesh without a topology takes its communicator's; on more than
        one node, a plan of the planner (``replan``) is made again with it,
        alike on every rank (the topology is agreed by an allgather), so
        that its steps know their across-node bytes and a two-level profile
        prices them.
        """
        if mesh.topology is None:
            nodes = topology(base_comm(mesh)).devices(mesh.device_ranks())
            if nodes.count > 1:
                mesh = mesh.with_topology(nodes)
                if replan:
                    plan = planner.plan(plan.global_shape, plan.dtype, mesh, plan.src,
                                        plan.dst, plan.strategy)
        self = object.__new__(cls)
        self._mesh, self._target_mesh = mesh, target_mesh or mesh
        self._plan, self._donate, self._checked = plan, donate, checked
        self._workspace = default_workspace(plan) if workspace is None else workspace
        self._mc = mesh_comm(mesh)
        self._comm, self._base = self._mc.comm, base_comm(mesh)
        digits = rank_digits(mesh, self._mc.rank)
        shape = plan.global_shape
        self.source_shape = box_shape(rank_block(shape, expand(plan.src, mesh), digits))
        self.target_shape = box_shape(rank_block(shape, expand(plan.dst, mesh), digits))
        self._choices = {Variant.KEPT: choose(plan, False, self._workspace, False,
                                              _replanner(plan))}
        if donate:
            self._choices[Variant.GIVEN] = choose(plan, True, self._workspace, False,
                                                  _replanner(plan))
        self._largest = max(c.budget.limit for c in self._choices.values())
        self._contexts, self._kept = {}, {}
        self._resources = Resources(node_comm(self._base).Get_size())
        self._identity = _identity(mesh=mesh, shape=plan.global_shape, dtype=plan.dtype,
                                   src=plan.src, dst=plan.dst, strategy=plan.strategy,
                                   donate=donate, workspace=workspace, checked=checked)
        for choice in [plan] + [c.plan for c in self._choices.values()]:
            for step in choice.steps:                   # collective: create them now
                if step.axes and step.op not in ("slice", "permute", "exchange"):
                    self._mc.sub(step.axes)
        return self

    @property
    def plan(self):
        """The plan a run executes (with ``donate``: when the donation is honoured)."""
        return self._choice().plan

    @property
    def executor(self):
        """``"out of place"`` or ``"in place"`` (with ``donate``: when honoured)."""
        return self._choice().executor

    def _choice(self):
        return self._choices[Variant.GIVEN if self._donate else Variant.KEPT]

    def _describe(self):
        p = self._plan
        return (f"Transfer({list(p.global_shape)}, {str(p.dtype)!r}, {self._mesh!r}, "
                f"{str(p.src)!r}, {str(p.dst)!r}, donate={self._donate}, "
                f"workspace_bytes={self._workspace}, strategy={p.strategy!r}, "
                f"checked={self._checked})")

    # ----------------------------------------------------------- running

    def _inputs(self, local, out, extra):
        """This rank's ``(donation verdict, fits its memory)``; ValueError for bad arrays."""
        rank = self._mc.rank
        self._arrays(local, out)
        verdict = NOT_DONATED
        kept = self._choices[Variant.KEPT].budget.limit
        found = self._resources.available(self._largest)
        fits = Resources.fits(kept, found)
        if self._donate and is_gpu(local):
            verdict = Donation(False, False, "device arrays run out of place (the one-buffer "
                                             "strategy works on host memory)")
        elif self._donate:
            given = self._choices[Variant.GIVEN]
            verdict = judge_donation(local, extra, buffer_bytes(given.plan),
                                     fresh_buffer_fits(given.plan, self._workspace))
        if verdict.usable:
            self._resources.check(given.budget.limit, rank, f"{self!r} (donated)", found)
        else:
            self._resources.check(kept, rank, repr(self), found)
        return verdict, fits

    def _arrays(self, local, out):
        """ShapeError unless ``local`` (and ``out``) are this rank's blocks."""
        check_block(local, self.source_shape, self._plan.dtype, self._mc.rank)
        if out is not None:
            check_out(out, local, self.target_shape, self._plan.dtype, self._mc.rank)

    def _run_unchecked(self, local, out, records):
        """A run without the agreement (``checked=False``).

        A rank whose arrays are wrong still takes part, with zeros of the
        right shape, so that no rank waits for it; then it raises.  The
        other ranks cannot know: their results are undefined then.  The
        memory pre-check is the agreement's (a rank short of memory would
        take part all the same, with zeros as large as its block).
        """
        given = out
        try:
            self._open(local)
            kind, local, out = _native(local, out, self._mc.rank)
            self._arrays(local, out)
            if kind.device:     # the path must not depend on this rank's array
                raise ShapeError(f"rank {self._mc.rank}: checked=False runs take host "
                                 f"arrays, found a {kind} array")
        except (ValueError, MpiredistError) as exc:
            if not getattr(self, "_freed", False):
                self._execute(np.zeros(self.source_shape, self._plan.dtype), None, _HOST,
                              False, NOT_DONATED, None)
            raise exc
        result = self._execute(local, out, _HOST, False, NOT_DONATED, records)
        return given if given is not None else kind.wrap(result, self._dtype_of())

    def _execute(self, local, out, kind, donate_ok, verdict, records):
        variant = (Variant.DEVICE if kind.device else
                   Variant.GIVEN if self._donate and donate_ok else Variant.KEPT)
        if self._donate and variant is not Variant.GIVEN:
            self._warn_donation(verdict.why)
        choice, ctx = self._program(variant, local)
        view = choice.plan.view_shape

        def run():                          # data moves from here: a failure aborts
            nonlocal local, out
            if view is not None:            # the steps' view: one dim split in two, no copy
                local, out = split_views(ctx, local, out,
                                         variant is Variant.GIVEN and verdict.resizable)
            if not choice.inplace:
                ctx.pool = self._kept.setdefault(variant, {}) if out is not None else None
                mem = Fresh(ctx, local, out, choice.slack)
            else:
                buffer = None
                if out is not None and variant is Variant.KEPT:
                    buffer = self._kept.get("buffer")
                    if buffer is None:
                        buffer = self._kept["buffer"] = np.empty(buffer_bytes(choice.plan),
                                                                 dtype=np.uint8)
                mem = OneBuffer(ctx, local, variant is Variant.GIVEN, choice.budget.workspace,
                                buffer, verdict.resizable, out)
            return steps.run(ctx, mem, records)
        result = guard(self._base, repr(self), run)
        if view is not None:
            result = merged(ctx, result)
        return result

    def _program(self, variant, local):
        """``(choice, context)`` of ``variant``, made on its first run."""
        if variant not in self._choices:               # device arrays: out of place
            self._choices[variant] = choose(self._plan, False, self._workspace, True)
            self._largest = max(c.budget.limit for c in self._choices.values())
        choice = self._choices[variant]
        if variant not in self._contexts:
            ctx = self._contexts[variant] = Context(self._comm, self._plan.dtype,
                                                    array_module(local), choice.plan, self._mc)
            ctx.reduce_room = reduction_room(choice.budget.workspace)
            fits = choice.budget
            if choice.inplace and fits.inplace_peak > fits.limit:
                warnings.warn(BudgetWarning(f"Transfer {self._plan.src} -> {self._plan.dst}: "
                                            f"{fits}"), stacklevel=5)
            elif variant is Variant.DEVICE and fits.out_of_place_peak > fits.limit:
                warnings.warn(BudgetWarning(
                    f"Transfer {self._plan.src} -> {self._plan.dst}: device arrays run out "
                    f"of place (the one-buffer strategy works on host memory): predicted "
                    f"peak {format_bytes(fits.out_of_place_peak)} exceeds the limit "
                    f"{format_bytes(fits.limit)} by "
                    f"{format_bytes(fits.out_of_place_peak - fits.limit)}"), stacklevel=5)
        return choice, self._contexts[variant]

    def _warn_donation(self, why):
        reason = (f"this rank's block cannot be donated: {why}" if why else
                  "another rank's block cannot be donated")
        warnings.warn(DonationWarning(
            f"Transfer {self._plan.src} -> {self._plan.dst}: donation not honoured on any "
            f"rank ({reason}); ran as not donated, the block is unchanged"), stacklevel=4)

    def _staging(self, local):
        found = self._kept.get(Variant.DEVICE, {}).get("staged")
        if found is None:
            self._program(Variant.DEVICE, local)    # its BudgetWarning, before data moves
            plan = self._plan
            sources, targets = plan_pieces(plan, plan.src, plan.dst,
                                           keep_classes=bool(plan.dst.partial),
                                           shape=plan.global_shape)
            found = Exchange(Context(self._comm, plan.dtype, staged=True),
                             sources, targets, self._workspace, plan.src.op, views=True)
            self._kept.setdefault(Variant.DEVICE, {})["staged"] = found
        return found

    def _dtype_of(self):
        return self._plan.dtype

    def _release(self):
        """Datatypes and kept buffers; sub-communicators belong to the mesh's
        communicator and are freed with it."""
        for ctx in self._contexts.values():
            ctx.free()
        staged = self._kept.get(Variant.DEVICE, {}).get("staged")
        if staged is not None:
            staged.free()
        self._contexts.clear()
        self._kept.clear()

    # ---------------------------------------------------------- explain

    def explain(self):
        """What a run executes: executor, steps, parts, bytes, predicted peak, W."""
        p = self._plan
        lines = [f"Transfer {p.src} -> {p.dst} on mesh {self._mesh}: "
                 f"{list(p.global_shape)} {p.dtype}, donate={self._donate}, "
                 f"checked={self._checked}, W = {format_bytes(self._workspace)}"]
        for variant, choice in self._choices.items():
            lines += _explain_choice(variant, choice)
        return "\n".join(lines)


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
        digits = ctx.mc.digits
        return (box_shape(rank_block(plan.step_shape, plan.steps[0].before, digits)),
                box_shape(rank_block(plan.step_shape, plan.steps[-1].after, digits)),
                box_shape(rank_block(plan.global_shape, expand(plan.dst, plan.mesh), digits)))
    return ctx.route(("view",), make)


def _explain_choice(variant, choice):
    fits = choice.budget
    head = (f"\n[{variant.name.lower()}: {variant.value}] executor {choice.executor}; "
            f"limit {format_bytes(fits.limit)}, predicted peak "
            f"{format_bytes(fits.inplace_peak if choice.inplace else fits.out_of_place_peak)}")
    if not choice.inplace:
        head += f", pack room {format_bytes(choice.slack)}"
    rows = [f"  step {i}: {step} sends {format_bytes(step.bytes_sent_per_rank)}/rank, "
            f"{_parts(choice, step)}" for i, step in enumerate(choice.plan.steps)]
    return [head, *rows] if rows else [head, "  (no steps)"]


def _parts(choice, step):
    """Message parts of a step (from the plan, the same on every rank)."""
    if step.op == "slice":
        return "local"
    if step.op in ("all_to_all", "all_gather") and not choice.inplace:
        itemsize = choice.plan.dtype.itemsize
        limit = part_limit(itemsize, max(0, choice.slack), steps.group_sides(step, True))
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
                            "collectives", allow_exchange=False, topology=plan.topology)
    return replan


# ------------------------------------------------------------ between meshes

def _same_comm(a, b):
    if a is b:
        return True
    MPI = mpi()
    a = MPI.COMM_WORLD if a is None else a
    b = MPI.COMM_WORLD if b is None else b
    return MPI.Comm.Compare(a, b) == MPI.IDENT


def _between(global_shape, dtype, mesh, src, dst, dst_mesh, donate, workspace, strategy,
             checked):
    """Validate and agree on a Transfer between meshes; its route's Transfer.

    ``refined``: both meshes are every rank in order and their axes nest
    (:func:`mpiredist.planning.crossmesh.refine`): a :class:`MeshTransfer`
    on the refined mesh.  Otherwise a :class:`CrossTransfer`.
    """
    def body(mesh, rank):
        target = mesh if dst_mesh is None else (
            dst_mesh if isinstance(dst_mesh, Mesh) else Mesh(dst_mesh))
        if not _same_comm(mesh.comm, target.comm):
            raise MeshError(f"target mesh {target} is on another communicator than the "
                            f"source mesh {mesh}; both meshes must live on one communicator")
        size = base_comm(mesh).Get_size()
        mesh.check_ranks(size, "source")
        if strategy not in planner.STRATEGIES:
            raise PlanError(f"strategy {strategy!r} is not one of {planner.STRATEGIES}")
        shape, dt, _, s, _ = planner.validate(global_shape, dtype, mesh, src, src)
        _, _, _, d, _ = planner.validate(shape, dt, target, dst, dst)
        if target.auto:         # ordered after the agreement, by the nodes (collective)
            relabel(shape, mesh, s, target, d, size)        # raises as it will then
        else:
            target.check_ranks(size, "target")
        w = check_workspace(workspace)
        _check_options(donate, checked)
        found = None if target.auto else _route(shape, dt, mesh, s, target, d, size, strategy)
        return (target, shape, dt, s, d, found, w), dict(
            mesh=repr(mesh), dst_mesh=repr(target), shape=shape, dtype=dt, src=s, dst=d,
            workspace=w, strategy=strategy, donate=bool(donate), checked=bool(checked))

    mesh, (target, shape, dt, s, d, found, w) = check_together("Transfer between meshes",
                                                               mesh, body)
    if target.auto:             # alike on every rank: agreed values, the agreed nodes
        size = base_comm(mesh).Get_size()
        target = relabel(shape, mesh, s, target, d, size, topology(base_comm(mesh)))
        found = _route(shape, dt, mesh, s, target, d, size, strategy)
    if found is not None:
        refined, plan = found
        return MeshTransfer._make(refined, plan, bool(donate), w, bool(checked), target,
                                  replan=True)
    if donate:
        warnings.warn(DonationWarning(
            f"Transfer between meshes {mesh} and {target}: the exchange reads the source "
            "block in place, so a donation is not honoured on this route"), stacklevel=3)
    return CrossTransfer._make(mesh, target, shape, dt, s, d, w, bool(checked))


def _route(shape, dtype, mesh, src, target, dst, size, strategy):
    """``(refined mesh, its Plan)`` if the meshes nest (see :func:`_between`), else None."""
    found = route(mesh, src, target, dst, size)
    if found is None:
        return None
    return found[0], planner.plan(shape, dtype, found[0], found[1], found[2], strategy)


class CrossTransfer(Transfer):
    """The exchange between two meshes, agreed and ready to run (see :class:`Transfer`).

    Every rank of the communicator constructs it and calls :meth:`run`.  A
    rank outside the source mesh passes ``None``; a rank outside the target
    mesh gets ``None``.  Memory: the target block plus at most W
    (``workspace_bytes``, default a quarter of the largest block of any rank
    plus 1 MiB), on every rank; the source block is read in place, so a
    donation is not honoured on this route.  A block that is not
    C-contiguous is copied first (one block more): pieces that are one
    contiguous stretch at both ends go whole, straight from the source into
    the target.
    """

    executor = "exchange"

    @classmethod
    def _make(cls, mesh, dst_mesh, shape, dtype, src, dst, workspace, checked):
        self = object.__new__(cls)
        comm = base_comm(mesh)
        size = comm.Get_size()
        self._mesh, self._target_mesh, self._shape, self._dtype = mesh, dst_mesh, shape, dtype
        self._src, self._dst, self._size = src, dst, size
        self._donate, self._checked = False, checked
        self._comm, self._base = library_comm(comm), comm
        sources = layout_sources(shape, mesh, src, size)
        targets = layout_targets(shape, dst_mesh, dst, size)
        self._workspace = exchange_workspace(sources, targets, dtype.itemsize) \
            if workspace is None else workspace
        self._ctx = Context(self._comm, dtype)
        self._exchange = Exchange(self._ctx, sources, targets, self._workspace, src.op)
        self._pieces, self._staged_exchange = (sources, targets), None
        self.source_shape = self._exchange.source_shape
        self.target_shape = self._exchange.target_shape
        size_of = (lambda shape: 0 if shape is None else int(np.prod(shape)) * dtype.itemsize)
        self._bound = max(size_of(self.source_shape), size_of(self.target_shape)) \
            + self._workspace
        self._resources = Resources(node_comm(comm).Get_size())
        self._identity = _identity(mesh=repr(mesh), dst_mesh=repr(dst_mesh), shape=shape,
                                   dtype=dtype, src=src, dst=dst, workspace=workspace,
                                   checked=checked)
        return self

    @property
    def plan(self):
        """The :class:`~mpiredist.planning.crossmesh.CrossPlan` (all ranks' pieces)."""
        return cross_plan(self._shape, self._dtype, self._mesh, self._src, self._target_mesh,
                          self._dst, self._size, self._workspace)

    @property
    def bytes_sent(self):
        """Bytes this rank sends to other ranks per run."""
        return self._exchange.bytes_sent

    def _describe(self):
        return (f"Transfer({list(self._shape)}, {str(self._dtype)!r}, {self._mesh!r}, "
                f"{str(self._src)!r}, {str(self._dst)!r}, dst_mesh={self._target_mesh!r}, "
                f"workspace_bytes={self._workspace}, checked={self._checked})")

    def _inputs(self, local, out, extra):
        rank = self._comm.Get_rank()
        self._resources.check(self._bound, rank, repr(self))
        if self.source_shape is None:
            if local is not None:
                raise ShapeError(f"rank {rank} is outside the source mesh {self._mesh}: "
                                 "pass local=None")
        elif local is None:
            raise ShapeError(f"rank {rank} is in the source mesh {self._mesh} but passed "
                             "local=None")
        else:
            check_block(local, self.source_shape, self._dtype, rank)
        if out is not None:
            if self.target_shape is None:
                raise ShapeError(f"rank {rank} is outside the target mesh "
                                 f"{self._target_mesh}: pass out=None")
            check_out(out, local, self.target_shape, self._dtype, rank)
        return NOT_DONATED, True

    def _kind(self, kind):
        """Ranks outside the source mesh hold no block: the library is gathered
        after the agreement instead (:meth:`_agreed_kind`)."""
        return {}

    def _agreed_kind(self, kind, holds):
        return agreed_kind(self._base, repr(self), kind, holds)

    def _run_unchecked(self, local, out, records):
        given = out
        kind, local, out = _native(local, out, self._comm.Get_rank())
        result = self._execute(local, out, kind, False, NOT_DONATED, records)
        return given if given is not None else kind.wrap(result, self._dtype_of())

    def _execute(self, local, out, kind, donate_ok, verdict, records):
        return run_exchange(self._base, repr(self), self._exchange, local, out, kind.device,
                            self._dtype, records)

    def _staging(self, local):
        if self._staged_exchange is None:
            sources, targets = self._pieces
            self._staged_exchange = Exchange(
                Context(self._comm, self._dtype, staged=True), sources, targets,
                self._workspace, self._src.op, views=True)
        return self._staged_exchange

    def _dtype_of(self):
        return self._dtype

    def explain(self):
        return self.plan.explain()

    def _release(self):
        self._ctx.free()
        if self._staged_exchange is not None:
            self._staged_exchange.free()


def agreed_kind(base, what, kind, holds):
    """Between meshes: the one library of the ranks that hold arrays (an
    allgather of its name, after the agreement, collective); ShapeError on
    every rank when they differ.  A rank with no array (``holds`` False)
    takes that library (a host DLPack library: numpy)."""
    names = base.allgather(str(kind) if holds else None)
    found = sorted({n for n in names if n is not None})
    if len(found) > 1:
        first = {n: names.index(n) for n in found}
        raise ShapeError(f"{what}: ranks pass arrays of different libraries: "
                         + ", ".join(f"rank {r}: {n}" for n, r in sorted(
                             first.items(), key=lambda x: x[1])))
    if not holds and found:
        kind = _BY_NAME.get(found[0], kind)
    return kind


def gpu_aware(base, what):
    """Whether device buffers go to MPI directly on ``base`` (agreed once per
    communicator, collective on the first device run); raises on every rank
    when they cannot run at all (not CUDA-aware, and staging forbidden)."""
    aware, staging = gpu_support(base)
    if not aware and not staging:
        raise ShapeError(f"{what}: device arrays, but the MPI library is not "
                         "CUDA-aware (MPIX_Query_cuda_support, or MPIREDIST_GPU_AWARE=0) "
                         "and MPIREDIST_GPU_STAGING=0 forbids staging through host "
                         "memory")
    return aware


def run_exchange(base, name, ex, local, out, device, dtype, records=None):
    """Run Exchange ``ex`` from ``local`` into ``out`` (or a new array of its
    library, on the device for ``device``); a failure aborts the job.
    ``records``, if a list, receives one ``StepRecord("exchange", ...)`` when
    the run succeeds: the bytes this rank sends to other ranks, the time and
    the MPI calls that moved data."""
    t0, calls = time.perf_counter(), ex.ctx.calls

    def run():                          # data moves from here: a failure aborts
        block, into = local, out
        if block is not None and not c_contiguous(block):
            block = array_module(block).ascontiguousarray(block)   # one block more (docs)
        if into is None and ex.target_shape is not None:
            xp = array_module(block) if block is not None else (
                cupy_or_error() if device else np)
            into = xp.empty(ex.target_shape, dtype if xp is np else device_dtype(dtype))
        ex.run(block, into)
        return into
    result = guard(base, name, run)
    if records is not None:
        records.append(steps.StepRecord("exchange", ex.bytes_sent, time.perf_counter() - t0,
                                        ex.ctx.calls - calls))
    return result
