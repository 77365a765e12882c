"""PyTorch DTensor in, DTensor out: ``mr.torch.redistribute``, moved by mpiredist.

    import torch.distributed as dist, mpiredist as mr
    y = mr.torch.redistribute(x, [Shard(1), Replicate()])              # as x.redistribute
    z = mr.torch.redistribute(x, [Shard(0)], device_mesh=inference)     # between meshes

DTensor's ``redistribute`` refuses moves between device meshes, goes
through ``Replicate`` for many shard-to-shard moves, and has returned wrong
shapes on uneven shards.  Here the source and target boxes come from
DTensor's own block rule (:func:`mpiredist.core.peers.dtensor_boxes`,
checked against DTensor's computation), and one exchange of mpiredist
(:class:`~mpiredist.runtime.exchange.Exchange`: every piece straight from a
rank that holds it to the rank that needs it, in pipelined parts, partial
sums combined in a fixed order) moves them on MPI's ``COMM_WORLD``, within
max(S, T) + W per rank.  ``torch.distributed`` must span the same ranks in
the same order (e.g. gloo initialised under ``mpirun`` with the MPI rank
and size); DTensors on the CPU.  The exchanges are cached per (shape,
dtype, placements, meshes).

Every rank of ``COMM_WORLD`` calls; a rank outside the source mesh passes
None (it learns the shape, dtype and placements from the others), one
outside the target mesh gets None.  Bad input raises on every rank before
any data moves.
"""

import numpy as np

from ..core.backend import as_dtype, backend_of
from ..core.errors import MpiredistError, ShapeError
from ..core.layout import REDUCE_OPS
from ..core.peers import dtensor_boxes, placement_kinds
from ..planning.pieces import Source, Target, exchange_workspace
from ..runtime.agree import agree, fingerprint
from ..runtime.comm import library_comm, mpi
from ..runtime.context import Context
from ..runtime.exchange import Exchange

__all__ = ["redistribute"]

_CACHE = {}         # key -> (Exchange, its Context); at most _CACHE_SIZE
_CACHE_SIZE = 32


def _mesh_info(mesh):
    """``(ranks in mesh order, mesh shape, dim names)`` of a DeviceMesh."""
    grid = mesh.mesh
    return (tuple(int(r) for r in grid.reshape(-1).tolist()), tuple(grid.shape),
            tuple(mesh.mesh_dim_names or ()))


def _coords(shape):
    return list(np.ndindex(*shape)) if shape else [()]


def _entries(shape, info, placements, size, target, keep):
    """Per communicator rank: a Source or Target under DTensor's block rule."""
    ranks, mesh_shape, _ = info
    out = [None] * size
    for (box, cls), rank in zip(dtensor_boxes(shape, mesh_shape, placements,
                                              _coords(mesh_shape)), ranks):
        if target:
            out[rank] = Target(box, cls if keep else None)
        else:
            out[rank] = Source(box, cls, box)
    return out


def redistribute(dtensor, placements, device_mesh=None, workspace_bytes=None):
    """``dtensor`` with ``placements`` (on ``device_mesh``, default its own), a new
    DTensor (collective over ``COMM_WORLD``; see the module doc)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    MPI = mpi()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    error, mine = None, None
    try:
        if not dist.is_initialized() or dist.get_world_size() != size \
                or dist.get_rank() != rank:
            raise ShapeError(f"rank {rank}: torch.distributed must be initialised over the "
                             "same ranks as MPI's COMM_WORLD, in the same order")
        if dtensor is not None:
            if not isinstance(dtensor, DTensor):
                raise ShapeError(f"rank {rank}: expected a DTensor or None, found "
                                 f"{type(dtensor).__name__}")
            if dtensor.requires_grad:
                raise ShapeError(f"rank {rank}: the DTensor requires grad; mpiredist moves "
                                 "values, not the autograd graph: pass x.detach()")
            mine = (tuple(dtensor.shape), str(as_dtype(dtensor.dtype)),
                    _mesh_info(dtensor.device_mesh), placement_kinds(dtensor.placements))
    except (ValueError, MpiredistError) as exc:
        error = exc
    agree(comm, "mr.torch.redistribute", error)
    found = [x for x in comm.allgather(mine) if x is not None]
    error = None
    try:
        if not found:
            raise ShapeError("mr.torch.redistribute: no rank passed a DTensor")
        if any(x != found[0] for x in found):
            raise ShapeError(f"rank {rank}: ranks pass DTensors of different shapes, dtypes, "
                             "meshes or placements")
        shape, dtype_name, src_info, src_key = found[0]
        dst_mesh = device_mesh if device_mesh is not None else (
            dtensor.device_mesh if dtensor is not None else None)
        if dst_mesh is None:
            raise ShapeError(f"rank {rank}: outside the source mesh, pass device_mesh=")
        dst_info = _mesh_info(dst_mesh)
        placements = list(placements)
        if len(placements) != len(dst_info[1]):
            raise ShapeError(f"{len(placements)} placements for a mesh of {len(dst_info[1])} "
                             "dims")
        dst_key = placement_kinds(placements)
        ops = {v for k, v in src_key if k == "partial"}
        if not ops <= set(REDUCE_OPS):
            raise ShapeError(f"Partial({sorted(ops)}): mpiredist combines partial sums with "
                             f"{REDUCE_OPS} (an average is a sum divided afterwards)")
        keep = any(k == "partial" for k, _ in dst_key)
        if keep and (dst_key != src_key or dst_info != src_info):
            raise ShapeError("a target with Partial placements must keep the source's "
                             "partial mesh dims on the same mesh")
        if dtensor is not None and rank not in src_info[0]:
            raise ShapeError(f"rank {rank} is outside the source mesh: pass None")
        if dtensor is not None and dtensor.device_mesh.device_type != "cpu":
            raise ShapeError("mr.torch.redistribute moves CPU DTensors (gloo); CUDA "
                             "DTensors: not yet")
        dtype = as_dtype(torch.bfloat16) if dtype_name == "bfloat16" else np.dtype(dtype_name)
        key = (shape, dtype.str, src_info, src_key, dst_info, dst_key, workspace_bytes)
    except (ValueError, MpiredistError) as exc:
        error, key = exc, None
    agree(comm, "mr.torch.redistribute (arguments)", error,
          {"key": fingerprint(key)})
    ex = _exchange(key, comm, shape, dtype, src_info, src_key, dst_info, dst_key, keep, ops,
                   workspace_bytes)
    local = None
    if dtensor is not None:
        tensor = dtensor.to_local()
        local = np.ascontiguousarray(backend_of(tensor).native(tensor))
    out = None if ex.target_shape is None else np.empty(ex.target_shape, dtype)
    ex.run(local, out)
    if out is None:
        return None
    result = backend_of(torch.empty(0)).wrap(out)
    stride = tuple(int(np.prod(shape[k + 1:])) for k in range(len(shape)))
    return DTensor.from_local(result, dst_mesh, placements, run_check=False,
                              shape=torch.Size(shape), stride=stride)


def _exchange(key, comm, shape, dtype, src_info, src_key, dst_info, dst_key, keep, ops,
              workspace):
    found = _CACHE.pop(key, None)
    if found is None:
        size = comm.Get_size()
        sources = _entries(shape, src_info, src_key, size, False, keep)
        targets = _entries(shape, dst_info, dst_key, size, True, keep)
        w = exchange_workspace(sources, targets, dtype.itemsize) if workspace is None \
            else int(workspace)
        ctx = Context(library_comm(comm), dtype)
        op = ops.pop() if ops else "sum"
        found = Exchange(ctx, sources, targets, w, op)
    _CACHE[key] = found
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE))).ctx.free()
    return found
