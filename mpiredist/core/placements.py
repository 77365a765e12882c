"""Layouts from and to other libraries' types: DTensor placements and JAX PartitionSpecs (pure).

PyTorch DTensor describes a layout per *mesh dim*: ``Shard(d)`` (this mesh
dim splits tensor dim d), ``Replicate()``, ``Partial(op)``; several mesh dims
sharding one tensor dim nest in mesh-dim order (the first is outermost).
JAX describes it per *array dim*: a ``PartitionSpec`` entry is None, an axis
name, or a tuple of names, major first.  mpiredist's :class:`Layout` is per
array dim, major first, like JAX.

The block rule: one mesh dim (or axis) of k devices on a dim of length N
gives device p the indices ``[p c, min((p + 1) c, N))`` with ``c =
ceil(N / k)``, in all three (checked against DTensor's own computation in
``tests/test_peers.py``).  Where several mesh dims shard one tensor dim,
mpiredist applies the rule once over all of them (mixed radix), DTensor
once per mesh dim, nested: the two agree when the lengths divide evenly,
and differ otherwise (N = 5 over 2 x 2: mpiredist 2, 2, 1, 0; DTensor 2,
1, 1, 1).  :func:`dtensor_boxes` gives DTensor's own boxes, which is what
``mr.torch.redistribute`` moves from and to, so it is exact in every case.

torch and JAX are imported only inside the functions that build their
objects; reading them needs neither.
"""

from .errors import LayoutError

__all__ = ["from_placements", "to_placements", "from_partition_spec", "to_partition_spec",
           "dtensor_boxes", "placement_kinds", "shard_interval"]


def _kind(placement):
    """``("shard", dim)``, ``("replicate", None)``, ``("partial", op)`` or a LayoutError."""
    name = type(placement).__name__
    if name == "_StridedShard":
        raise LayoutError(f"{placement!r}: DTensor's strided shards (FSDP2 over tensor "
                          "parallelism) have no mpiredist layout: redistribute to plain "
                          "Shard placements first")
    if name == "Shard" or (hasattr(placement, "dim") and hasattr(placement, "is_shard")
                           and placement.is_shard()):
        return "shard", int(placement.dim)
    if name == "Replicate":
        return "replicate", None
    if name in ("Partial", "_Partial"):
        return "partial", str(getattr(placement, "reduce_op", "sum"))
    raise LayoutError(f"{placement!r} is not a DTensor placement (Shard, Replicate, Partial)")


def placement_kinds(placements):
    """``(kind, value)`` per placement: ``("shard", dim)``, ``("replicate", None)``
    or ``("partial", op)`` (pairs pass through): a plain value ranks can exchange."""
    return tuple(p if isinstance(p, tuple) else _kind(p) for p in placements)


def from_placements(placements, mesh_dim_names, ndim):
    """``(dims, partial, op)`` of DTensor ``placements`` on a mesh whose dims are
    named ``mesh_dim_names``, for a tensor of ``ndim`` dims (what
    :meth:`Layout.from_placements <mpiredist.Layout.from_placements>` makes a
    layout of, checking the op)."""
    placements, names = list(placements), list(mesh_dim_names)
    if len(placements) != len(names):
        raise LayoutError(f"{len(placements)} placements for a mesh of {len(names)} dims "
                          f"{tuple(names)}")
    if any(not n for n in names):
        raise LayoutError(f"mesh dim names {tuple(names)}: every mesh dim needs a name")
    dims, partial, ops = [[] for _ in range(ndim)], [], set()
    for name, placement in zip(names, placements):
        kind, value = _kind(placement)
        if kind == "shard":
            d = value + ndim if value < 0 else value
            if not 0 <= d < ndim:
                raise LayoutError(f"{placement!r}: a {ndim}-dim tensor has no dim {value}")
            dims[d].append(name)
        elif kind == "partial":
            partial.append(name)
            ops.add(value)
    if len(ops) > 1:
        raise LayoutError(f"placements {placements}: partial sums of different ops {ops}")
    return dims, partial, ops.pop() if ops else "sum"


def to_placements(layout, mesh_dim_names):
    """DTensor placements (a list, one per mesh dim) of ``layout`` (a Layout).

    LayoutError where DTensor cannot say it: a dim sharded by mesh dims in
    another order than the mesh's (that is a ``_StridedShard``), a sub-axis,
    an axis that is not a mesh dim.
    """
    from torch.distributed.tensor import Partial, Replicate, Shard
    names = list(mesh_dim_names)
    unknown = [a for a in layout.axes_used() if a not in names]
    if unknown:
        raise LayoutError(f"layout {layout}: {unknown} are not dims of the mesh {tuple(names)}")
    out = []
    for d, axes in enumerate(layout.dims):
        if list(axes) != sorted(axes, key=names.index):
            raise LayoutError(f"layout {layout}: dim {d} is sharded by {axes} major first, "
                              f"but DTensor nests shards in mesh-dim order {tuple(names)}")
    for name in names:
        dim = next((d for d, axes in enumerate(layout.dims) if name in axes), None)
        if dim is not None:
            out.append(Shard(dim))
        elif name in layout.partial:
            out.append(Partial(layout.op))
        else:
            out.append(Replicate())
    return out


def from_partition_spec(spec, ndim=None):
    """The layout dims of a JAX ``PartitionSpec`` (or a tuple of its entries:
    None, an axis name, or a tuple of names), padded with replicated dims to
    ``ndim`` if given."""
    entries = list(spec)
    dims = []
    for k, entry in enumerate(entries):
        if entry is None:
            dims.append(())
        elif isinstance(entry, str):
            dims.append((entry,))
        elif isinstance(entry, (tuple, list)) and all(isinstance(a, str) for a in entry):
            dims.append(tuple(entry))
        else:
            raise LayoutError(f"PartitionSpec entry {k} is {entry!r}: mpiredist takes None, "
                              "an axis name or a tuple of names (not UNCONSTRAINED)")
    if ndim is not None:
        if len(dims) > ndim:
            raise LayoutError(f"PartitionSpec {tuple(entries)} has {len(dims)} entries for "
                              f"{ndim} dims")
        dims += [()] * (ndim - len(dims))
    return dims


def to_partition_spec(layout):
    """A ``jax.sharding.PartitionSpec`` of ``layout`` (a Layout; no partial sums)."""
    from jax.sharding import PartitionSpec
    if layout.partial:
        raise LayoutError(f"layout {layout} holds partial sums; a PartitionSpec cannot say so")
    return PartitionSpec(*[None if not axes else axes[0] if len(axes) == 1 else tuple(axes)
                           for axes in layout.dims])


def shard_interval(n, k, p):
    """DTensor's (and mpiredist's) ``[lo, hi)`` of device ``p`` of ``k`` on length ``n``."""
    c = -(-n // k) if k else 0
    lo = min(n, p * c)
    return lo, min(n, lo + c)


def dtensor_boxes(shape, mesh_shape, placements, coordinates):
    """Per mesh coordinate: ``(box, partial class)`` under DTensor's own rule.

    ``box``: ``((lo, hi), ...)`` per tensor dim, shards nested in mesh-dim
    order; the class: the index over the Partial mesh dims (0 without).
    ``placements``: DTensor placements, or their ``(kind, value)`` pairs
    (:func:`placement_kinds`).
    """
    kinds = placement_kinds(placements)
    out = []
    for coord in coordinates:
        box = [(0, n) for n in shape]
        cls = 0
        for m, (kind, value) in enumerate(kinds):
            if kind == "shard":
                d = value + len(shape) if value < 0 else value
                lo, hi = box[d]
                a, b = shard_interval(hi - lo, mesh_shape[m], coord[m])
                box[d] = (lo + a, lo + b)
            elif kind == "partial":
                cls = cls * mesh_shape[m] + coord[m]
        out.append((tuple(box), cls))
    return out
