"""PyTorch DTensor in, DTensor out: ``mr.torch.redistribute``, moved by mpiredist.

    import torch.distributed as dist, mpiredist as mr
    y = mr.torch.redistribute(x, [Shard(1), Replicate()])              # as x.redistribute
    z = mr.torch.redistribute(x, [Shard(0)], device_mesh=inference)     # between meshes

DTensor's ``redistribute`` refuses moves between device meshes, goes
through ``Replicate`` for many shard-to-shard moves, and has returned wrong
shapes on uneven shards.  Here the source and target boxes come from
DTensor's own block rule (:func:`mpiredist.core.placements.dtensor_boxes`,
checked against DTensor's computation), and one exchange of mpiredist
(:class:`~mpiredist.runtime.exchange.Exchange`: every piece straight from a
rank that holds it to the rank that needs it, in pipelined parts, partial
sums combined in a fixed order) moves them on MPI's ``COMM_WORLD``, within
max(S, T) + W per rank.  ``torch.distributed`` must span the same ranks in
the same order (e.g. gloo initialised under ``mpirun`` with the MPI rank
and size).  DTensors on the CPU or on CUDA devices: the local tensors of
CUDA DTensors move by the device path of :class:`mpiredist.Transfer` (to
MPI directly where it is CUDA-aware, else staged through host rings within
W; bfloat16 as its int16 bits), and the result is a CUDA DTensor.  The
exchanges are cached per (shape, dtype, placements, meshes, device,
staged).

Every rank of ``COMM_WORLD`` calls; a rank outside the source mesh passes
None (it learns the shape, dtype and placements from the others), one
outside the target mesh gets None.  Bad input raises on every rank before
any data moves.
"""

import math

import numpy as np

from ..core.backend import Backend, as_dtype, backend_of, dtype_text
from ..core.caches import PerObject, recent
from ..core.errors import MpiredistError, ShapeError
from ..core.layout import REDUCE_OPS
from ..core.placements import dtensor_boxes, placement_kinds
from ..planning.pieces import Source, Target
from ..runtime.agree import agree
from ..runtime.between import BoxExchange
from ..runtime.groups import kept, library_group, world_group
from ..runtime.run import run

__all__ = ["redistribute"]

_CACHE_SIZE = 32    # exchanges kept per communicator, and DeviceMeshes read


def _mesh_info(mesh):
    """``(ranks in mesh order, mesh shape, dim names)`` of a DeviceMesh (kept per
    mesh object: reading the torch mesh costs about 0.4 ms, as much as the rest
    of a cached call)."""
    return _MESHES.get(mesh, _read_mesh)


def _read_mesh(mesh):
    grid = mesh.mesh
    return (tuple(int(r) for r in grid.reshape(-1).tolist()), tuple(grid.shape),
            tuple(mesh.mesh_dim_names or ()))


_MESHES = PerObject(_CACHE_SIZE)


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
    DTensor (collective over ``COMM_WORLD``; see the module doc).

    One agreement when every rank holds a DTensor (the cached path: one
    small Allreduce, then the exchange); when some rank passes None, two more
    collectives teach it the source (an allgather and a second agreement).
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    group = world_group()
    library_group(group)            # collective on first use: before any rank may fail
    rank, size = group.rank, group.size
    holds = dtensor is not None
    error, mine, call = None, None, None
    try:
        if not dist.is_initialized() or dist.get_world_size() != size \
                or dist.get_rank() != rank:
            raise ShapeError(f"rank {rank}: torch.distributed must be initialised over the "
                             "same ranks as MPI's COMM_WORLD, in the same order")
        if holds:
            if not isinstance(dtensor, DTensor):
                raise ShapeError(f"rank {rank}: expected a DTensor or None, found "
                                 f"{type(dtensor).__name__}")
            if dtensor.requires_grad:
                raise ShapeError(f"rank {rank}: the DTensor requires grad; mpiredist moves "
                                 "values, not the autograd graph: pass x.detach()")
            tensor = dtensor.to_local()
            mine = (tuple(dtensor.shape), dtype_text(dtensor.dtype),
                    _mesh_info(dtensor.device_mesh), placement_kinds(dtensor.placements),
                    backend_of(tensor).device)
            call = _Call(rank, mine, dtensor, placements, device_mesh, workspace_bytes)
    except (ValueError, MpiredistError) as exc:
        error = exc
    flags = agree(group, "mr.torch.redistribute", error,
                  call.same if call is not None else None, {"every rank holds": holds},
                  knows=holds)
    if not flags["every rank holds"]:             # learn the source from the others
        found = [x for x in group.allgather_object(mine) if x is not None]
        error, call = None, None
        try:
            if not found:
                raise ShapeError("mr.torch.redistribute: no rank passed a DTensor")
            call = _Call(rank, found[0], dtensor, placements, device_mesh, workspace_bytes)
        except (ValueError, MpiredistError) as exc:
            error = exc
        agree(group, "mr.torch.redistribute (arguments)", error,
              call.same if call is not None else None)
    # agreed, the library included: the job runs the rest of the run path
    (result,) = run(_job(call, group), (tensor if holds else None,), (None,),
                    agreed=Backend("torch", call.device))
    if result is None:
        return None
    return _as_dtensor(result, call)


def _as_dtensor(local, call):
    """A DTensor of this rank's result ``local`` with the call's target mesh,
    placements and global shape (C strides).

    Made from a DTensorSpec kept per target mesh and (placements, shape,
    dtype), as DTensor's own ``redistribute`` makes its result:
    ``DTensor.from_local`` runs an autograd function and builds the spec
    anew, about 170 us of a call's CPU against 8 us (torch 2.13, one
    process); where that constructor is not there (another torch), by
    ``from_local``.
    """
    import torch
    from torch.distributed.tensor import DTensor

    shape = call.shape
    stride = tuple(math.prod(shape[k + 1:]) for k in range(len(shape)))
    specs = _SPECS.get(call.dst_mesh, lambda mesh: {})
    key = (call.dst_key, shape, local.dtype)
    spec = specs.get(key)
    if spec is None:
        try:
            from torch.distributed.tensor import Shard
            from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
            # DTensorSpec wants shard dims normalised (from_local does it itself)
            placements = tuple(Shard(p.dim + len(shape)) if type(p) is Shard and p.dim < 0
                               else p for p in call.placements)
            spec = DTensorSpec(call.dst_mesh, placements,
                               TensorMeta(torch.Size(shape), stride, local.dtype))
        except Exception:       # noqa: BLE001  (data has moved: never fail here)
            spec = False
        if len(specs) >= _CACHE_SIZE:
            specs.clear()
        specs[key] = spec
    if spec is not False:
        try:
            return DTensor(local, spec, requires_grad=False)
        except Exception:       # noqa: BLE001  (another torch: its public way below)
            specs[key] = False
    return DTensor.from_local(local, call.dst_mesh, call.placements, run_check=False,
                              shape=torch.Size(shape), stride=stride)


_SPECS = PerObject(_CACHE_SIZE)     # per target DeviceMesh: its DTensorSpecs by placements


class _Call:
    """One call's arguments, checked on one rank: the source as ``(shape, dtype
    name, mesh info, placement kinds)`` (its own or another rank's), the target
    from the arguments; ``same`` is what every rank must agree on."""

    def __init__(self, rank, source, dtensor, placements, device_mesh, workspace):
        shape, dtype_name, src_info, src_key, device = source
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
        if len(ops) > 1:
            raise ShapeError(f"Partial({sorted(ops)}): one reduction op per tensor")
        if not ops <= set(REDUCE_OPS):
            raise ShapeError(f"Partial({sorted(ops)}): mpiredist combines partial sums with "
                             f"{REDUCE_OPS} (an average is a sum divided afterwards)")
        keep = any(k == "partial" for k, _ in dst_key)
        if keep and (dst_key != src_key or dst_info != src_info):
            raise ShapeError("a target with Partial placements must keep the source's "
                             "partial mesh dims on the same mesh")
        if dtensor is not None and rank not in src_info[0]:
            raise ShapeError(f"rank {rank} is outside the source mesh: pass None")
        self.shape, self.dst_mesh, self.placements = shape, dst_mesh, placements
        self.dtype = as_dtype(dtype_name)
        self.src_info, self.src_key, self.dst_info, self.dst_key = (src_info, src_key,
                                                                    dst_info, dst_key)
        self.keep, self.op = keep, ops.pop() if ops else "sum"
        self.workspace, self.device = workspace, device
        self.key = (shape, dtype_text(self.dtype), src_info, src_key, dst_info, dst_key, workspace,
                    device)
        self.same = {"shape": shape, "dtype": dtype_name, "source mesh": src_info,
                     "source placements": src_key, "target mesh": dst_info,
                     "target placements": dst_key, "workspace_bytes": workspace,
                     "on a device": device}


def _job(call, group):
    """The exchange of DTensor's source blocks into its target blocks, kept per
    group and call (a job of the one run path, agreed by the entry point)."""
    def make():
        size = group.size
        sources = _entries(call.shape, call.src_info, call.src_key, size, False, call.keep)
        targets = _entries(call.shape, call.dst_info, call.dst_key, size, True, call.keep)
        return BoxExchange.from_boxes(group, sources, targets, call.dtype, call.op,
                                        None if call.workspace is None else int(call.workspace),
                                        name="mr.torch.redistribute")

    return recent(kept(group, "dtensor exchanges"), call.key, make, _CACHE_SIZE)
