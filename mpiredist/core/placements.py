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
           "dtensor_boxes", "dtensor_ranges", "placement_kinds", "shard_interval"]


def _kind(placement):
    """``("shard", dim)``, ``("strided", (dim, split_factor))``, ``("replicate",
    None)``, ``("partial", op)`` or a LayoutError."""
    name = type(placement).__name__
    if name == "_StridedShard":
        return "strided", (int(placement.dim), int(placement.split_factor))
    if name == "Shard" or (hasattr(placement, "dim") and hasattr(placement, "is_shard")
                           and placement.is_shard()):
        return "shard", int(placement.dim)
    if name == "Replicate":
        return "replicate", None
    if name in ("Partial", "_Partial"):
        return "partial", str(getattr(placement, "reduce_op", "sum"))
    raise LayoutError(f"{placement!r} is not a DTensor placement (Shard, _StridedShard, "
                      "Replicate, Partial)")


def placement_kinds(placements):
    """``(kind, value)`` per placement: ``("shard", dim)``, ``("strided", (dim,
    split_factor))``, ``("replicate", None)`` or ``("partial", op)`` (pairs pass
    through): a plain value ranks can exchange."""
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
        if kind == "strided":
            raise LayoutError(f"{placement!r}: DTensor's strided shards (FSDP2 over tensor "
                              "parallelism) hold pieces of a dim that are apart, which no "
                              "layout does; mr.torch.redistribute moves them")
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


def dtensor_ranges(shape, mesh_shape, placements, coordinate):
    """Per tensor dim, the global ``(lo, hi)`` ranges that the device at mesh
    ``coordinate`` holds, in the order its local tensor joins them, under
    DTensor's own rule; and its coordinates on the Partial mesh dims.

    Mesh dims apply left to right to what the dims to their left left this
    device (its local length L of the tensor dim): ``Shard`` on a mesh dim
    of n devices keeps chunk k of n of it (:func:`shard_interval`, torch's
    ``chunk``); ``_StridedShard(dim, split_factor=f)`` cuts it into f
    chunks first and keeps chunk k of n of each, joined in order (FSDP2
    over tensor parallelism: f is the TP size), so that a device holds
    pieces of the dim that are apart.
    """
    ranges = [[(0, n)] for n in shape]
    partial = []
    for m, (kind, value) in enumerate(placement_kinds(placements)):
        n, k = mesh_shape[m], coordinate[m]
        if kind == "partial":
            partial.append(k)
        if kind not in ("shard", "strided"):
            continue
        d, factor = (value, 1) if kind == "shard" else value
        d = d + len(shape) if d < 0 else d
        length = sum(hi - lo for lo, hi in ranges[d])
        kept = []
        for j in range(factor):
            lo, hi = shard_interval(length, factor, j)
            a, b = shard_interval(hi - lo, n, k)
            kept.append((lo + a, lo + b))
        ranges[d] = _within(ranges[d], kept)
    return ranges, tuple(partial)


def _within(segments, local):
    """The global ranges of the ``local`` ranges of the join of ``segments``
    (adjacent ones merged; an empty range where nothing is kept)."""
    out, starts, at = [], [], 0
    for lo, hi in segments:
        starts.append(at)
        at += hi - lo
    for a, b in local:
        for (lo, hi), s in zip(segments, starts):
            x, y = max(a, s), min(b, s + hi - lo)
            if x < y:
                g = (lo + x - s, lo + y - s)
                if out and out[-1][1] == g[0]:
                    out[-1] = (out[-1][0], g[1])
                else:
                    out.append(g)
    return out or [(0, 0)]


def dtensor_boxes(shape, mesh_shape, placements, coordinates):
    """Per mesh coordinate: ``(box, partial class)`` under DTensor's own rule.

    ``box``: ``((lo, hi), ...)`` per tensor dim, shards nested in mesh-dim
    order; the class: the index over the Partial mesh dims (0 without).
    ``placements``: DTensor placements, or their ``(kind, value)`` pairs
    (:func:`placement_kinds`).  LayoutError where a device holds pieces
    that are apart (strided shards: :func:`dtensor_ranges`).
    """
    partial_sizes = [n for n, (kind, _) in zip(mesh_shape, placement_kinds(placements))
                     if kind == "partial"]
    out = []
    for coord in coordinates:
        ranges, partial = dtensor_ranges(shape, mesh_shape, placements, coord)
        if any(len(r) > 1 for r in ranges):
            raise LayoutError(f"placements {list(placements)}: a device holds pieces of "
                              "the tensor that are apart (strided shards), not one box")
        cls = 0
        for n, k in zip(partial_sizes, partial):
            cls = cls * n + k
        out.append((tuple(r[0] for r in ranges), cls))
    return out
