"""BoxExchange: one exchange between two sets of boxes, compiled.

Between meshes whose rank orders do not nest, a redistribution is one
exchange of the piece model (:mod:`mpiredist.planning.pieces`): every piece
straight from a rank that holds it to the rank that needs it, in pipelined
parts (:class:`~mpiredist.runtime.exchange.Exchange`): how a
:class:`~mpiredist.Transfer` between such meshes runs.  The same job moves
any two sets of boxes -- the array operations (``reshape``, slicing,
``concatenate``), DTensor's and HeAT's blocks -- made with
:meth:`BoxExchange.from_boxes`; every one of them runs the one run path
(:func:`mpiredist.runtime.run.run`).

Every rank of the group constructs it and runs it.  A rank outside the
source mesh passes ``None``; a rank outside the target mesh gets ``None``.
Memory: the target block plus at most W (default a quarter of the largest
block of any rank plus 1 MiB), on every rank; the source block is read in
place, so a donation is not honoured on this route.  A block that is not
C-contiguous is copied first (one block more).
"""

import numpy as np

from ..core.errors import ShapeError
from ..planning.crossmesh import cross_plan
from ..planning.pieces import exchange_workspace, layout_sources, layout_targets
from .context import Context, Keep
from .devices import staged_exchange
from .exchange import Exchange
from .groups import base_group, library_group, node_ranks
from .resources import Resources
from .run import KEPT, Item, Job

__all__ = ["BoxExchange"]


class BoxExchange(Job):
    """The exchange between two meshes, or two sets of boxes, ready to run (see
    the module doc and :class:`~mpiredist.Transfer`)."""

    executor = "exchange"
    every_holds = False
    what = "Transfer.run"

    @classmethod
    def between_meshes(cls, mesh, dst_mesh, shape, dtype, src, dst, workspace, checked):
        """The exchange between ``src`` on ``mesh`` and ``dst`` on ``dst_mesh``
        (agreed arguments; collective on first use of the group's duplicate)."""
        base = base_group(mesh)
        sources = layout_sources(shape, mesh, src, base.size)
        targets = layout_targets(shape, dst_mesh, dst, base.size)
        name = (f"Transfer({list(shape)}, {str(dtype)!r}, {mesh!r}, {str(src)!r}, "
                f"{str(dst)!r}, dst_mesh={dst_mesh!r}, workspace_bytes={workspace}, "
                f"checked={checked})")
        identity = dict(mesh=repr(mesh), dst_mesh=repr(dst_mesh), shape=shape, dtype=dtype,
                        src=src, dst=dst, workspace=workspace, checked=checked)
        self = cls.from_boxes(base, sources, targets, dtype, src.op, workspace, name=name,
                              identity=identity, checked=checked)
        self.mesh, self.target_mesh, self._shape = mesh, dst_mesh, shape
        self._src, self._dst = src, dst
        self.dst_layout = dst
        self._resources = Resources(node_ranks(base))
        return self

    @classmethod
    def from_boxes(cls, group, sources, targets, dtype, op="sum", workspace=None,
                   name="an exchange", identity=None, checked=False, views=False,
                   segments=None):
        """The exchange from ``sources`` to ``targets`` (per rank of ``group``: a
        :class:`~mpiredist.planning.pieces.Source` or
        :class:`~mpiredist.planning.pieces.Target`, or None; alike on every
        rank) on the group's duplicate (local once it exists).  ``views``:
        every rank's blocks may be views of larger arrays; ``segments``: the
        entries are boxes of ranks' blocks
        (:class:`~mpiredist.planning.pieces.Segments`).  ``checked``
        False: runs make no agreement of their own (the caller agreed)."""
        self = object.__new__(cls)
        self.group = group
        self._dtype = np.dtype(dtype)
        if workspace is None:
            workspace = exchange_workspace(sources, targets, self._dtype.itemsize, segments)
        self.workspace = self._workspace = workspace
        self._pieces, self._op = (sources, targets, segments), op
        self._exchange = Exchange(Context(library_group(group), self._dtype), sources,
                                  targets, self._workspace, op, views=views, segments=segments)
        self._keep = Keep()
        self._keep[("exchange",)] = self._exchange
        self.source_shape = self._exchange.source_shape
        self.target_shape = self._exchange.target_shape
        self.items = (Item(self.source_shape, self.target_shape, self._dtype),)
        self.views = views          # outs may be views of larger arrays too
        self.donate, self.checked = False, checked
        self.name = name
        self.identity = identity if identity is not None else {"exchange": name}
        size_of = (lambda shape: 0 if shape is None else int(np.prod(shape)) * self._dtype.itemsize)
        self._bound = max(size_of(self.source_shape), size_of(self.target_shape)) \
            + self._workspace
        self._resources = None
        self.mesh = self.target_mesh = self.dst_layout = None
        return self

    @property
    def plan(self):
        """The :class:`~mpiredist.planning.crossmesh.CrossPlan` (all ranks' pieces)."""
        if self.mesh is None:
            raise ShapeError(f"{self.name} moves boxes, not layouts: it has no plan")
        return cross_plan(self._shape, self._dtype, self.mesh, self._src, self.target_mesh,
                          self._dst, self.group.size, self._workspace)

    @property
    def bytes_sent(self):
        """Bytes this rank sends to other ranks per run."""
        return self._exchange.bytes_sent

    def judge(self, natives, outs, extra):
        """The bound fits this rank's memory (MemoryBudgetError if not)."""
        if self._resources is not None:
            self._resources.check(self._bound, self.group.rank, self.name)
        return KEPT

    def execute(self, natives, outs, kind, aware, flags, records, verdict):
        """The exchange (staged through host rings for device arrays on a
        transport that takes none)."""
        (local,), (out,) = natives, outs
        ex = self._exchange
        if kind.device and not aware:
            sources, targets, segments = self._pieces
            ex = self._keep.get(("staged",), lambda: staged_exchange(
                library_group(self.group), self._dtype, sources, targets, self._workspace,
                self._op, segments))
        return [ex.fill(local, out, kind.device, records)]

    def kept_bytes(self):
        """Bytes this rank keeps between runs (the exchanges' pack buffers)."""
        return sum(v.ctx.kept_bytes for v in self._keep.values())

    def free(self):
        """Release what the runs keep (local); a later run raises ClosedError."""
        self.freed = True
        self._keep.free()

    def explain(self):
        """The exchange's plan, as text."""
        return self.plan.explain()
