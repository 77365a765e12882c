"""Transfer: one redistribution, planned and agreed once, run many times.

Modelled on mpi4py-fft's ``Transfer``: the constructor is collective (every
rank of the group calls it with the same arguments); it validates them on
every rank and agrees on them in one small collective, plans, chooses how
to run from the plan and the agreed arguments alone
(:func:`mpiredist.planning.budget.choose`), and creates the sub-groups the
steps run on.  Each run goes through the one run path
(:func:`mpiredist.runtime.run.run`): this rank's arrays are checked, the
ranks agree in one small collective on what the arrays allow, and the data
moves.

``mr.Transfer(...)`` is one protocol -- :meth:`~Transfer.run`,
:meth:`~Transfer.explain`, :meth:`~Transfer.free`, a context manager, and
``source_shape``, ``target_shape``, ``plan``, ``executor``, ``mesh``,
``target_mesh`` -- over one of two ways of moving the data, chosen when it
is made (:mod:`mpiredist.runtime.compile`):
:class:`~mpiredist.runtime.onemesh.OneMesh` runs a collective plan on one
mesh (a refined one between meshes whose axes nest),
:class:`~mpiredist.runtime.between.BoxExchange` the exchange between meshes
whose rank orders do not.

Every decision that shapes the sequence of calls is a function of the plan
and of agreed values, never of one rank's own array.

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

from .compile import compile_transfer, transfer_of_plan
from .inputs import references
from .run import Job, run

__all__ = ["Transfer"]


class Transfer(Job):
    """A redistribution of one array from ``src`` to ``dst``, compiled (collective).

    Parameters
    ----------
    global_shape : sequence of int
    dtype : numpy dtype or anything ``numpy.dtype`` accepts
    mesh : Mesh, dict or str
        Its communicator (``mesh.comm``, default the world: MPI's
        ``COMM_WORLD``) must have ``mesh.size`` ranks, unless the mesh lists
        its ``ranks``.
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
        with the other ranks in one small collective before any data moves,
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
        ``a=2,b=4``), it runs the collective normal form on one refined
        mesh (:class:`~mpiredist.runtime.onemesh.OneMesh`), donation
        included.  Otherwise one exchange of point-to-point messages
        (:class:`~mpiredist.runtime.between.BoxExchange`): every rank allocates its target block plus
        at most W, a donation is not honoured (a
        :class:`~mpiredist.DonationWarning` says so) and ``records`` get one
        ``"exchange"`` record.

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
    when a donation is honoured.  Kept between runs (:attr:`kept_bytes`,
    released by :meth:`free`): the pack buffer, at most W, and, for runs
    into ``out=``, the intermediate blocks, so that repeated runs allocate
    nothing beyond W.
    """

    what = "Transfer.run"

    def __init__(self, global_shape, dtype, mesh, src, dst, donate=False, workspace_bytes=None,
                 strategy="collectives", checked=True, dst_mesh=None):
        self._adopt(compile_transfer(global_shape, dtype, mesh, src, dst, donate,
                                     workspace_bytes, strategy, checked, dst_mesh))

    @classmethod
    def from_plan(cls, plan, mesh, donate=False, workspace_bytes=None, checked=True,
                  executor=None):
        """A Transfer that runs ``plan`` (any plan of ``mpiredist.plan`` or
        :func:`mpiredist.planning.planner.assemble`) on ``mesh`` (collective:
        the ranks agree on the plan).  ``executor``: ``"in place"`` runs it
        in one buffer even where out of place fits (a benchmark's choice;
        default: the contract decides)."""
        self = object.__new__(cls)
        self._adopt(transfer_of_plan(plan, mesh, donate, workspace_bytes, checked, executor))
        return self

    def _adopt(self, way):
        """Run by ``way`` (a :class:`~mpiredist.runtime.onemesh.OneMesh` or a
        :class:`~mpiredist.runtime.between.BoxExchange`): its job's values are
        copied, so that a run reads plain attributes."""
        self._way = way
        for name in ("group", "items", "name", "identity", "every_holds", "donate", "checked",
                     "source_shape", "target_shape", "judge", "execute"):
            setattr(self, name, getattr(way, name))   # the run path reads plain attributes

    # ------------------------------------------------------- the protocol

    @property
    def mesh(self):
        """The source layout's mesh (a refined one between nesting meshes)."""
        return self._way.mesh

    @property
    def target_mesh(self):
        """The target layout's mesh (``dst_mesh`` with its ranks, chosen for ``"auto"``)."""
        return self._way.target_mesh

    @property
    def dst_layout(self):
        """The target layout, on :attr:`target_mesh`."""
        return self._way.dst_layout

    @property
    def workspace_bytes(self):
        return self._way.workspace

    @property
    def plan(self):
        """The plan a run executes (with ``donate``: when the donation is honoured;
        between meshes that do not nest, the exchange's
        :class:`~mpiredist.planning.crossmesh.CrossPlan`)."""
        return self._way.plan

    @property
    def executor(self):
        """``"out of place"``, ``"in place"`` or ``"exchange"``."""
        return self._way.executor


    def run(self, local, out=None, records=None, *, forwarded=0):
        """Redistribute this rank's block ``local``; return its target block (collective).

        ``out``, if given, is a C-contiguous array of :attr:`target_shape`
        and the Transfer's dtype that receives the result (and is returned).
        Every rank checks its own arrays; one small collective then raises
        a ``ValueError`` subclass on every rank if any rank's are bad, and
        settles whether the donation is honoured, before any data moves.
        ``records``, if a list, receives one
        :class:`~mpiredist.runtime.steps.StepRecord` per step.
        ``forwarded``: references to ``local`` that the caller holds on the
        user's behalf (a wrapper that passes on a block it was given: one),
        so that they do not count against a donation.
        """
        extra = references(local) - forwarded if self.donate else 0
        return run(self, (local,), (out,), records, extra)[0]

    def explain(self):
        """What a run executes: executor, steps, parts, bytes, predicted peak, W."""
        return self._way.explain()

    @property
    def kept_bytes(self):
        """Bytes this rank keeps between runs (released by :meth:`free`)."""
        return self._way.kept_bytes()

    def free(self):
        """Release what this Transfer keeps between runs (local, no communication).

        A run after it raises :class:`~mpiredist.ClosedError` on every rank.
        """
        if not self.freed:
            self.freed = True
            self._way.free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def __repr__(self):
        return self.name

