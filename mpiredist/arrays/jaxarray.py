"""Multi-process JAX arrays in and out of DistArrays: ``DistArray.from_jax`` / ``to_jax``.

    jax.distributed.initialize("127.0.0.1:PORT", num_processes=size, process_id=rank)
    a = mr.DistArray.from_jax(x)                  # x: a jax.Array over every process
    b = a.redistribute("[{}, {x}]")               # moved by mpiredist, within max(S, T) + W
    y = b.to_jax()                                # a jax.Array again, NamedSharding of b's layout

JAX runs several processes on the CPU (its collectives through gloo) when
``jax.distributed.initialize`` is given the MPI rank as ``process_id`` and
the MPI size as ``num_processes``; a global ``jax.Array`` then holds on each
process the shards of its devices.  A DistArray is one block per rank, so
the JAX mesh must hold **one device per process** (the usual CPU set-up; a
process with several devices on the mesh is refused), and the JAX mesh's
device at each coordinate is the mpiredist mesh's rank there.  The block
rule is the same (the shard at a device is the layout's block of its rank,
checked), and JAX shards only evenly: :meth:`to_jax` of a layout whose
sharded lengths do not divide raises on every rank.  No data moves in
either direction: the block is the process's shard (a JAX array on its
device, so a redistribute returns JAX blocks), and :meth:`to_jax` puts the
blocks together with ``jax.make_array_from_single_device_arrays``.

Both are collective over ``COMM_WORLD``: every rank checks, one agreement
raises on every rank before anything is built.
"""

import math

import numpy as np

from ..core.errors import LayoutError, MpiredistError, ShapeError
from ..core.layout import Layout
from ..core.mesh import Mesh
from ..planning.pieces import layout_boxes
from ..runtime.agree import agree
from ..runtime.groups import base_group, world_group

__all__ = ["from_jax", "to_jax"]


def from_jax(cls, array, mesh=None, spec=None):
    """``cls`` (a DistArray class) of the global JAX ``array``; see the module doc."""
    group = world_group()
    rank = group.rank
    error, made = None, None
    try:
        made = _read(array, mesh, spec, rank, group.size)
    except (ValueError, MpiredistError, TypeError, AttributeError) as exc:
        error = exc if isinstance(exc, (ValueError, MpiredistError)) else ShapeError(
            f"rank {rank}: DistArray.from_jax: {exc}")
    same = None if made is None else dict(mesh=repr(made[1]), shape=made[2], layout=made[3],
                                          dtype=str(made[0].dtype))
    agree(group, "DistArray.from_jax", error, same)
    block, mesh, shape, layout = made
    return cls(block, shape, layout, mesh)


def _read(array, mesh, spec, rank, size):
    import jax
    from jax.sharding import NamedSharding
    if not isinstance(array, jax.Array):
        raise ShapeError(f"rank {rank}: DistArray.from_jax takes a jax.Array, found "
                         f"{type(array).__name__}")
    _check_process(jax, rank, size)
    sharding = array.sharding
    if not isinstance(sharding, NamedSharding):
        raise ShapeError(f"rank {rank}: DistArray.from_jax needs a NamedSharding, found "
                         f"{type(sharding).__name__}")
    jmesh = sharding.mesh
    names, sizes = tuple(jmesh.axis_names), tuple(jmesh.devices.shape)
    owners = [d.process_index for d in jmesh.devices.flat]
    if len(set(owners)) != len(owners):
        raise ShapeError(f"rank {rank}: the JAX mesh holds several devices of one process; "
                         "a DistArray is one block per rank: one device per process")
    if mesh is None:
        mesh = Mesh(dict(zip(names, sizes)),
                    ranks=None if owners == list(range(size)) else owners)
    mesh = mesh if isinstance(mesh, Mesh) else Mesh(mesh)
    ranks = list(mesh.ranks) if mesh.ranks is not None else list(range(mesh.size))
    if mesh.names != names or mesh.sizes != sizes or ranks != owners:
        raise ShapeError(f"rank {rank}: the mesh {mesh} is not the JAX mesh "
                         f"{dict(zip(names, sizes))} with process {owners} at its devices")
    layout = Layout.from_partition_spec(sharding.spec if spec is None else spec, array.ndim)
    shape = tuple(array.shape)
    want = layout_boxes(shape, mesh, layout, size)[rank]
    shards = array.addressable_shards
    if want is None:
        if shards:
            raise ShapeError(f"rank {rank}: outside the mesh, but holds shards of the array")
        return None, mesh, shape, layout
    if len(shards) != 1:
        raise ShapeError(f"rank {rank}: {len(shards)} shards on this process; one device "
                         "per process")
    got = tuple(s.indices(n)[:2] for s, n in zip(shards[0].index, shape))
    if got != tuple(tuple(b) for b in want):
        raise LayoutError(f"rank {rank}: the process's shard is {got}, but layout {layout} "
                          f"gives its rank {tuple(tuple(b) for b in want)} (pass the array's own spec)")
    return shards[0].data, mesh, shape, layout


def _check_process(jax, rank, size):
    if jax.process_count() != size or jax.process_index() != rank:
        raise ShapeError(f"rank {rank}: JAX process {jax.process_index()} of "
                         f"{jax.process_count()}; initialise jax.distributed with "
                         "process_id=the MPI rank and num_processes=the MPI size")


def to_jax(dist):
    """The global ``jax.Array`` of DistArray ``dist`` (collective; see the module doc)."""
    group = world_group()
    rank = group.rank
    error, made = None, None
    try:
        made = _build(dist, rank, group.size)
    except (ValueError, MpiredistError, TypeError, AttributeError) as exc:
        error = exc if isinstance(exc, (ValueError, MpiredistError)) else ShapeError(
            f"rank {rank}: DistArray.to_jax: {exc}")
    agree(group, "DistArray.to_jax", error)
    return made


def _build(dist, rank, size):
    import jax
    from jax.sharding import Mesh as JaxMesh
    from jax.sharding import NamedSharding
    _check_process(jax, rank, size)
    mesh, layout, shape = dist.mesh, dist.layout, dist.shape
    if base_group(mesh).size != size or mesh.size != size:
        raise ShapeError(f"rank {rank}: to_jax needs a mesh of every rank of COMM_WORLD "
                         "(JAX's processes), one device each")
    spec = layout.to_partition_spec()
    for d, axes in enumerate(layout.dims):
        k = math.prod(dict(mesh.axes)[a] for a in axes)
        if shape[d] % k:
            raise ShapeError(f"to_jax: JAX shards evenly only, and dim {d} of length "
                             f"{shape[d]} is split {k} ways by {layout}; redistribute to a "
                             "layout that divides, or pad")
    ranks = list(mesh.ranks) if mesh.ranks is not None else list(range(mesh.size))
    first = {}
    for d in jax.devices():
        first.setdefault(d.process_index, d)
    jmesh = JaxMesh(np.array([first[r] for r in ranks], dtype=object).reshape(mesh.sizes),
                    mesh.names)
    mine = [d for d in jmesh.devices.flat if d.process_index == rank]
    local = dist.local
    blocks = []
    if mine:
        block = local if isinstance(local, jax.Array) else np.asarray(local)
        blocks = [jax.device_put(block, mine[0])]
    return jax.make_array_from_single_device_arrays(tuple(shape), NamedSharding(jmesh, spec),
                                                    blocks)
