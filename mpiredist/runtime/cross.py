"""Redistribution between two meshes on one communicator.

:func:`crossing` tells whether a call leaves the single-mesh path: a target
mesh that differs from the source mesh, or a mesh over a subset of ranks.
:func:`agree_cross` validates and agrees on the arguments (every rank of the
communicator calls it) and picks the route from them alone:

- ``"refined"``: both meshes are every rank in order and their axes nest
  (:func:`mpiredist.planning.crossmesh.refine`); the caller runs the
  collective normal form on the refined mesh.
- ``"exchange"``: :class:`CrossExchange`, the point-to-point exchange in
  rounds of :mod:`mpiredist.runtime.exchange`.
"""

import numpy as np

from ..core.backend import array_module, c_contiguous
from ..core.blocks import box_shape
from ..core.errors import MeshError, ShapeError
from ..core.mesh import Mesh
from ..planning import planner
from ..planning.crossmesh import cross_plan, relabel, route
from ..planning.exchange import (exchange_workspace, holders_of, mesh_boxes, recv_pieces,
                                 send_pieces)
from .agree import agree_flags, check_together
from .comm import base_comm, mpi
from .donation import check_block, check_out
from .exchange import Exchange

__all__ = ["crossing", "agree_cross", "CrossExchange"]


def crossing(mesh, dst_mesh):
    """True if a call with these meshes takes the between-meshes path.

    Never raises: a malformed argument takes that path, whose agreement
    then raises on every rank.
    """
    try:
        mesh = mesh if isinstance(mesh, Mesh) else Mesh(mesh)
        if dst_mesh is None:
            return mesh.ranks is not None
        dst_mesh = dst_mesh if isinstance(dst_mesh, Mesh) else Mesh(dst_mesh)
        return dst_mesh != mesh or mesh.ranks is not None
    except (ValueError, TypeError):
        return True


def _same_comm(a, b):
    if a is b:
        return True
    MPI = mpi()
    a = MPI.COMM_WORLD if a is None else a
    b = MPI.COMM_WORLD if b is None else b
    return MPI.Comm.Compare(a, b) == MPI.IDENT


def _route(shape, dtype, mesh, src, dst_mesh, dst, strategy, comm_size):
    """``("refined", mesh, plan)`` or ``("exchange", None, None)`` (pure)."""
    found = route(mesh, src, dst_mesh, dst, comm_size)
    if found is None:
        return "exchange", None, None
    refined, s, d = found
    return "refined", refined, planner.plan(shape, dtype, refined, s, d, strategy)


def agree_cross(global_shape, dtype, mesh, src, dst, dst_mesh, workspace, strategy="collectives",
                extra=None):
    """Validate and agree on a call between meshes (collective); pick its route.

    Returns ``(mesh, dst_mesh, route, refined_mesh, plan, workspace)``.
    Raises on every rank: a target mesh on another communicator, ranks
    repeated or outside it, bad layouts, shapes or dtypes, or ranks that
    disagree.  ``extra(rank)``, if given, runs in the same agreement (a
    caller's own per-rank checks).
    """
    def body(mesh, rank):
        target = mesh if dst_mesh is None else (
            dst_mesh if isinstance(dst_mesh, Mesh) else Mesh(dst_mesh))
        if not _same_comm(mesh.comm, target.comm):
            raise MeshError(f"target mesh {target} is on another communicator than the "
                            f"source mesh {mesh}; both meshes must live on one communicator")
        size = base_comm(mesh).Get_size()
        mesh.check_ranks(size, "source")
        shape, dt, _, s, _ = planner.validate(global_shape, dtype, mesh, src, src)
        _, _, _, d, _ = planner.validate(shape, dt, target, dst, dst)
        if target.auto:
            target = relabel(shape, mesh, s, target, d, size)
        target.check_ranks(size, "target")
        if strategy not in planner.STRATEGIES:
            raise ShapeError(f"strategy {strategy!r} is not one of {planner.STRATEGIES}")
        w = None if workspace is None else int(workspace)
        if w is not None and w < 0:
            raise ShapeError(f"rank {rank}: workspace_bytes must be non-negative, found {w}")
        route = _route(shape, dt, mesh, s, target, d, strategy, size)
        if extra is not None:
            extra(rank)
        return (target, shape, dt, s, d, route, w), dict(
            mesh=repr(mesh), dst_mesh=repr(target), shape=shape, dtype=dt, src=s, dst=d,
            workspace=w, strategy=strategy)

    mesh, (target, shape, dt, s, d, route, w) = check_together("redistribute between meshes",
                                                               mesh, body)
    return mesh, target, shape, dt, s, d, route, w


class CrossExchange:
    """The exchange between two meshes, agreed and ready to run (collective).

    Every rank of the communicator constructs it and calls :meth:`run`.  A
    rank outside the source mesh passes ``None``; a rank outside the target
    mesh gets ``None``.  Memory: the target block plus at most W
    (``workspace``, default a quarter of the largest block of any rank plus
    1 MiB), on every rank; the source block is read in place, so a donation
    is not honoured on this route.  A block that is not C-contiguous is
    copied first (one block more): pieces that are one contiguous stretch at
    both ends go whole, straight from the source into the target.
    """

    def __init__(self, mesh, dst_mesh, shape, dtype, src, dst, workspace=None):
        comm = base_comm(mesh)
        size, rank = comm.Get_size(), comm.Get_rank()
        self.mesh, self.dst_mesh, self.shape, self.dtype = mesh, dst_mesh, shape, dtype
        self.src, self.dst, self.comm_size = src, dst, size
        sboxes = mesh_boxes(shape, mesh, src, size, partial=True)
        tboxes = mesh_boxes(shape, dst_mesh, dst, size)
        self.workspace = exchange_workspace(sboxes, tboxes, dtype.itemsize) \
            if workspace is None else workspace
        holders = holders_of(sboxes)
        mine = sboxes[rank]
        self.src_box = None if mine is None else mine[0]
        self.dst_box = tboxes[rank]
        self.source_shape = None if mine is None else box_shape(self.src_box)
        self.target_shape = None if self.dst_box is None else box_shape(self.dst_box)
        self.rank = rank
        self._exchange = Exchange(comm, dtype, self.src_box, self.dst_box,
                                  send_pieces(rank, sboxes, tboxes, holders),
                                  recv_pieces(rank, sboxes, tboxes, holders), self.workspace, src.op)
        self._comm = comm

    @property
    def rounds(self):
        return self._exchange.rounds

    @property
    def bytes_sent(self):
        """Bytes this rank sends to other ranks per run."""
        return self._exchange.bytes_sent

    def check(self, local, out):
        """ShapeError unless this rank's ``local`` and ``out`` fit its place (local)."""
        rank = self.rank
        if self.source_shape is None:
            if local is not None:
                raise ShapeError(f"rank {rank} is outside the source mesh {self.mesh}: "
                                 "pass local=None")
        elif local is None:
            raise ShapeError(f"rank {rank} is in the source mesh {self.mesh} but passed "
                             "local=None")
        else:
            check_block(local, self.source_shape, self.dtype, rank)
        if out is not None:
            if self.target_shape is None:
                raise ShapeError(f"rank {rank} is outside the target mesh {self.dst_mesh}: "
                                 "pass out=None")
            check_out(out, local, self.target_shape,
                      self.dtype, rank)

    def run(self, local, out=None, checked=True):
        """This rank's target block (or None off the target mesh), collective."""
        error = None
        if checked:
            try:
                self.check(local, out)
            except ValueError as exc:
                error = exc
            agree_flags(self._comm, "Transfer.run", error)
        if local is not None and not c_contiguous(local):
            local = array_module(local).ascontiguousarray(local)   # one block more (docs)
        if out is None and self.target_shape is not None:
            xp = np if local is None else array_module(local)
            out = xp.empty(self.target_shape, self.dtype)
        self._exchange.run(local, out)
        return out

    def plan(self):
        """The :class:`~mpiredist.planning.crossmesh.CrossPlan` (all ranks' pieces)."""
        return cross_plan(self.shape, self.dtype, self.mesh, self.src, self.dst_mesh,
                          self.dst, self.comm_size, self.workspace)

    def explain(self):
        return self.plan().explain()

    def free(self):
        self._exchange.free()



