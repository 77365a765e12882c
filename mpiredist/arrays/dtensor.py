"""PyTorch DTensor in, DTensor out: ``mr.torch``, moved by mpiredist.

    import mpiredist as mr
    y = mr.torch.redistribute(x, [Shard(1), Replicate()])              # as x.redistribute
    z = mr.torch.redistribute(x, [Shard(0)], device_mesh=inference)     # between meshes
    mesh = mr.torch.mesh(device_mesh)            # an mpiredist Mesh of a DeviceMesh

It runs wherever DTensor runs: under ``torchrun`` over torch.distributed
(gloo on CPU tensors, NCCL on CUDA tensors; no MPI needed,
:class:`~mpiredist.runtime.torchdist.TorchGroup`), or under ``mpiexec``
over MPI when torch.distributed spans the same ranks in the same order
(:func:`mpiredist.runtime.groups.world_group` chooses).

DTensor's ``redistribute`` refuses moves between device meshes and goes
through ``Replicate`` for many shard-to-shard moves (on the CPU it gathers
the whole tensor for an all-to-all).  Here the source and target blocks
come from DTensor's own rule (:func:`mpiredist.core.placements.dtensor_ranges`,
checked against DTensor's computation, strided shards included) and one
exchange of mpiredist (:class:`~mpiredist.runtime.exchange.Exchange`:
every piece straight from a rank that holds it to the rank that needs it,
in pipelined parts, partial sums combined in a fixed order) moves them
within max(S, T) + W per rank.  CUDA DTensors move by the device path of
:class:`mpiredist.Transfer` (to the transport directly where it takes
device buffers, else staged through host rings within W), and the result
is a CUDA DTensor.  The exchanges are kept per (shape, dtype, placements,
meshes, device).

A drop-in for ``DTensor.redistribute``: differentiable (the backward
moves the gradient back to the source placements, with DTensor's rules
for gradients of Partial sources), ``forward_dtype`` / ``backward_dtype``,
``Partial("avg")`` (summed, then divided by the sizes of the averaged mesh
dims; floats only), ``_StridedShard`` (FSDP2 over tensor parallelism) as
source or target, and Partial targets that keep a partial mesh dim of the
source.  Where DTensor refuses (a target that creates or moves a partial,
no placements), the error is a :class:`~mpiredist.PlacementError`, the
``RuntimeError`` DTensor raises there.

Every rank of the job calls; a rank outside the source mesh passes None
(it learns the shape, dtype and placements from the others), one outside
the target mesh gets None.  Bad input raises on every rank before any data
moves.
"""

import itertools
import math

import numpy as np

from ..core.backend import Backend, as_dtype, backend_of, dtype_text
from ..core.caches import PerObject, recent
from ..core.errors import MpiredistError, PlacementError, ShapeError
from ..core.layout import REDUCE_OPS
from ..core.mesh import Mesh
from ..core.placements import dtensor_ranges, placement_kinds
from ..planning.pieces import Segments, Source, Target
from ..runtime.agree import agree
from ..runtime.between import BoxExchange
from ..runtime.groups import kept, library_group, world_group
from ..runtime.run import run

__all__ = ["redistribute", "mesh"]

_CACHE_SIZE = 32    # exchanges kept per group, and DeviceMeshes read


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


def mesh(device_mesh):
    """The :class:`~mpiredist.Mesh` of a torch ``DeviceMesh``: its dims as axes
    (named as the DeviceMesh names them, else ``d0``, ``d1``, ...), its ranks
    in its order, on the job's group (torch.distributed under torchrun, so
    that :class:`~mpiredist.Transfer`, :class:`~mpiredist.TransferGroup`,
    :class:`~mpiredist.DistArray` and :func:`~mpiredist.redistribute` run
    over it with torch tensors).  Under torchrun the DeviceMesh's own process
    groups serve the mesh axes they match, so none is made twice.  Local:
    no communication."""
    ranks, shape, names = _mesh_info(device_mesh)
    names = names or tuple(f"d{i}" for i in range(len(shape)))
    group = world_group()
    known = getattr(group, "known", None)
    if known is not None and group.rank in ranks:   # a TorchGroup: reuse the mesh's groups
        import torch.distributed as dist
        for dim in range(len(shape)):
            pg = device_mesh.get_group(dim)
            known.setdefault(tuple(dist.get_process_group_ranks(pg)), pg)
    whole = ranks == tuple(range(group.size))
    return Mesh(dict(zip(names, shape)), ranks=None if whole else list(ranks))


def redistribute(dtensor, placements=None, device_mesh=None, workspace_bytes=None, *,
                 async_op=False, forward_dtype=None, backward_dtype=None):
    """``dtensor`` with ``placements`` (on ``device_mesh``, default its own), a new
    DTensor (collective over the job; see the module doc).

    Differentiable where ``dtensor`` requires grad.  ``forward_dtype``: the
    local tensor is cast before it moves, and the result has that dtype;
    ``backward_dtype``: the gradient moves in it (default the source's
    dtype) and returns in the source's dtype.  ``async_op`` is accepted for
    DTensor's signature; the move completes before the call returns.

    One agreement when every rank holds a DTensor (the cached path: one
    small all-reduce, then the exchange); when some rank passes None, two
    more collectives teach it the source (an all-gather and a second
    agreement).
    """
    del async_op
    if dtensor is not None and dtensor.requires_grad:
        import torch
        if torch.is_grad_enabled():
            return _function().apply(dtensor, placements, device_mesh, workspace_bytes,
                                     forward_dtype, backward_dtype)
    return _move(dtensor, placements, device_mesh, workspace_bytes, forward_dtype, False)


_FUNCTION = []


def _function():
    """The autograd Function of a differentiable move (made on first use: torch
    is imported only by calls that use it)."""
    if _FUNCTION:
        return _FUNCTION[0]
    import torch

    class Redistribute(torch.autograd.Function):
        """Forward: the move; backward: the gradient moved back to the source's
        placements, in ``backward_dtype``, returned in the source's dtype."""

        @staticmethod
        def forward(ctx, x, placements, device_mesh, workspace, forward_dtype, backward_dtype):
            ctx.source = (x.device_mesh, tuple(x.placements), x.dtype)
            ctx.workspace, ctx.backward_dtype = workspace, backward_dtype
            return _move(x, placements, device_mesh, workspace, forward_dtype, True)

        @staticmethod
        def backward(ctx, grad):
            src_mesh, src_placements, dtype = ctx.source
            out = _move(grad, _grad_target(src_mesh, src_placements, grad), src_mesh,
                        ctx.workspace, ctx.backward_dtype or dtype, True)
            if out is not None and out.dtype != dtype:
                out = out.to(dtype)
            return out, None, None, None, None, None

    _FUNCTION.append(Redistribute)
    return Redistribute


def _grad_target(src_mesh, src_placements, grad):
    """The placements a gradient moves to: the source's, except that a Partial
    source mesh dim takes Replicate, or the gradient's own Partial there on the
    same mesh (DTensor's rule)."""
    from torch.distributed.tensor import Replicate

    same = _mesh_info(grad.device_mesh) == _mesh_info(src_mesh)
    out = []
    for i, p in enumerate(src_placements):
        if p.is_partial():
            g = grad.placements[i] if same else None
            out.append(g if g is not None and g.is_partial() else Replicate())
        else:
            out.append(p)
    return out


def _move(dtensor, placements, device_mesh, workspace, cast, differentiable):
    """The move itself (every rank): check, agree, exchange, wrap."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    group = world_group()
    library_group(group)            # collective on first use: before any rank may fail
    rank, size = group.rank, group.size
    holds = dtensor is not None
    error, mine, call, tensor = None, None, None, None
    try:
        if not dist.is_initialized() or dist.get_world_size() != size \
                or dist.get_rank() != rank:
            raise ShapeError(f"rank {rank}: torch.distributed must be initialised over the "
                             f"same ranks as {group.name}'s world, in the same order")
        if holds:
            if not isinstance(dtensor, DTensor):
                raise ShapeError(f"rank {rank}: expected a DTensor or None, found "
                                 f"{type(dtensor).__name__}")
            tensor = dtensor.to_local().detach()      # the graph is the Function's
            if cast is not None and tensor.dtype != cast:
                tensor = tensor.to(cast)
            mine = (tuple(dtensor.shape), dtype_text(tensor.dtype),
                    _mesh_info(dtensor.device_mesh), placement_kinds(dtensor.placements),
                    backend_of(tensor).device)
            call = _Call(rank, mine, dtensor, placements, device_mesh, workspace,
                         differentiable)
    except (ValueError, RuntimeError, MpiredistError) as exc:
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
            call = _Call(rank, found[0], dtensor, placements, device_mesh, workspace,
                         differentiable)
        except (ValueError, RuntimeError, MpiredistError) as exc:
            error = exc
        agree(group, "mr.torch.redistribute (arguments)", error,
              call.same if call is not None else None)
    # agreed, the library included: the job runs the rest of the run path
    job = _job(call, group)
    local = None if tensor is None else tensor.reshape(job.source_shape)
    (result,) = run(job, (local,), (None,), agreed=Backend("torch", call.device))
    if result is None:
        return None
    result = result.reshape(result.shape[1:])       # the leading dim of kept classes
    if call.scale != 1:
        result /= call.scale
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
            from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
            spec = DTensorSpec(call.dst_mesh, tuple(_normalised(call.placements, len(shape))),
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


def _normalised(placements, ndim):
    """``placements`` with negative shard dims made positive (DTensorSpec wants
    them so; ``from_local`` does it itself)."""
    from torch.distributed.tensor import Shard
    out = []
    for p in placements:
        name = type(p).__name__
        if name == "Shard" and p.dim < 0:
            p = Shard(p.dim + ndim)
        elif name == "_StridedShard" and p.dim < 0:
            p = type(p)(p.dim + ndim, split_factor=p.split_factor)
        out.append(p)
    return out


def _text(kind):
    """A placement as DTensor prints it: ``S(0)``, ``R``, ``P(sum)``, ``_S(0, 2)``."""
    name, value = kind
    if name == "shard":
        return f"S({value})"
    if name == "strided":
        return f"_S({value[0]}, {value[1]})"
    return "R" if name == "replicate" else f"P({value})"


class _Call:
    """One call's arguments, checked on one rank: the source as ``(shape, dtype
    name, mesh info, placement kinds, device)`` (its own or another rank's), the
    target from the arguments; ``same`` is what every rank must agree on."""

    def __init__(self, rank, source, dtensor, placements, device_mesh, workspace,
                 differentiable):
        shape, dtype_name, src_info, src_key, device = source
        if placements is None:
            raise PlacementError("placements is needed for redistribute!")
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
        for kind, value in dst_key + src_key:
            d = value[0] if kind == "strided" else value
            if kind in ("shard", "strided") and not -len(shape) <= d < len(shape):
                raise ShapeError(f"{_text((kind, value))}: a {len(shape)}-dim tensor has no "
                                 f"dim {d}")
        same_mesh = dst_info == src_info
        for i, (kind, value) in enumerate(dst_key):
            if kind == "partial" and not (same_mesh and src_key[i] == (kind, value)):
                was = _text(src_key[i]) if i < len(src_key) else "another mesh"
                raise PlacementError(f"Can not redistribute from {was} to "
                                     f"{_text((kind, value))}, redistributing to Partial "
                                     "is for internal use only!")
        kept_dims = [i for i, (kind, _) in enumerate(dst_key) if kind == "partial"]
        reduced = [i for i, (kind, _) in enumerate(src_key)
                   if kind == "partial" and i not in kept_dims]
        ops = {src_key[i][1] for i in reduced}
        if not ops <= set(REDUCE_OPS) | {"avg"}:
            raise ShapeError(f"Partial({sorted(ops)}): mpiredist combines partial values "
                             f"with {REDUCE_OPS + ('avg',)}")
        if len(ops) > 1 and ops != {"sum", "avg"}:
            raise ShapeError(f"Mixed Partial reduce types are not supported in the same "
                             f"placement list. Found reduce ops: {sorted(ops)}")
        self.dtype = as_dtype(dtype_name)
        scale = math.prod(src_info[1][i] for i in reduced if src_key[i][1] == "avg")
        if scale != 1 and self.dtype.kind not in "fc" and dtype_name != "bfloat16":
            raise PlacementError(f"Partial(avg) of {dtype_name} values: an average of "
                                 "integers is no integer (DTensor refuses it too)")
        if dtensor is not None and rank not in src_info[0]:
            raise ShapeError(f"rank {rank} is outside the source mesh: pass None")
        if differentiable and set(src_info[0]) != set(dst_info[0]):
            raise PlacementError("a move between device meshes of other ranks is not "
                                 "differentiable: its gradient would not reach the ranks "
                                 "outside the target mesh; pass x.detach()")
        self.shape, self.dst_mesh, self.placements = shape, dst_mesh, placements
        self.src_info, self.src_key, self.dst_info, self.dst_key = (src_info, src_key,
                                                                    dst_info, dst_key)
        self.kept_dims, self.scale = tuple(kept_dims), scale
        self.op = "sum" if ops <= {"sum", "avg"} else ops.pop()
        self.workspace, self.device = workspace, device
        self.key = (shape, dtype_text(self.dtype), src_info, src_key, dst_info, dst_key,
                    workspace, device)
        self.same = {"shape": shape, "dtype": dtype_name, "source mesh": src_info,
                     "source placements": src_key, "target mesh": dst_info,
                     "target placements": dst_key, "workspace_bytes": workspace,
                     "on a device": device, "differentiable": differentiable}


def _blocks(call, info, key):
    """Per rank of the mesh ``info``: ``(rank, ranges per dim, reduced class,
    kept class)`` under DTensor's rule for placements ``key``."""
    ranks, mesh_shape, _ = info
    partial = [i for i, (kind, _) in enumerate(key) if kind == "partial"]
    coords = list(np.ndindex(*mesh_shape)) if mesh_shape else [()]
    for rank, coord in zip(ranks, coords):
        ranges, _ = dtensor_ranges(call.shape, mesh_shape, key, coord)
        cls = kept = 0
        for i in partial:
            if i in call.kept_dims:
                kept = kept * mesh_shape[i] + coord[i]
            else:
                cls = cls * mesh_shape[i] + coord[i]
        yield rank, ranges, cls, kept


def _pieces(call, size):
    """``(sources, targets, segments)`` of the call's exchange over ``size`` ranks.

    Every box has a leading dim for the classes the target keeps (the
    partial mesh dims it keeps: each kept class is its own slice of it, so
    that only the other classes combine); the local tensors are viewed with
    it (length 1).  Where every block is one box, an entry per rank and
    ``segments`` None; else (strided shards) an entry per box of a block
    (:class:`~mpiredist.planning.pieces.Segments`).
    """
    src = list(_blocks(call, call.src_info, call.src_key))
    dst = list(_blocks(call, call.dst_info, call.dst_key))
    if all(len(r) == 1 for _, ranges, _, _ in src + dst for r in ranges):
        sources, targets = [None] * size, [None] * size
        for rank, ranges, cls, k in src:
            box = ((k, k + 1),) + tuple(r[0] for r in ranges)
            sources[rank] = Source(box, cls, box)
        for rank, ranges, _, k in dst:
            targets[rank] = Target(((k, k + 1),) + tuple(r[0] for r in ranges), None)
        return sources, targets, None
    sources, targets, owners, src_at, dst_at = [], [], [], [], []
    shapes = {"source": [None] * size, "target": [None] * size}
    for side, blocks in (("source", src), ("target", dst)):
        for rank, ranges, cls, k in blocks:
            shapes[side][rank] = (1,) + tuple(sum(b - a for a, b in r) for r in ranges)
            starts = [list(itertools.accumulate((b - a for a, b in r[:-1]), initial=0))
                      for r in ranges]
            for choice in itertools.product(*(range(len(r)) for r in ranges)):
                box = ((k, k + 1),) + tuple(r[c] for r, c in zip(ranges, choice))
                at = (0,) + tuple(s[c] for s, c in zip(starts, choice))
                owners.append(rank)
                if side == "source":
                    sources.append(Source(box, cls, box))
                    targets.append(None)
                    src_at.append(at)
                    dst_at.append(None)
                else:
                    sources.append(None)
                    targets.append(Target(box, None))
                    src_at.append(None)
                    dst_at.append(at)
    return sources, targets, Segments(owners, src_at, dst_at, shapes["source"],
                                      shapes["target"])


def _job(call, group):
    """The exchange of DTensor's source blocks into its target blocks, kept per
    group and call (a job of the one run path, agreed by the entry point)."""
    def make():
        sources, targets, segments = _pieces(call, group.size)
        return BoxExchange.from_boxes(group, sources, targets, call.dtype, call.op,
                                      None if call.workspace is None else int(call.workspace),
                                      name="mr.torch.redistribute", segments=segments)

    return recent(kept(group, "dtensor exchanges"), call.key, make, _CACHE_SIZE)
