"""Many arrays at once: :func:`redistribute_many` (blocks by name) and
:func:`redistribute_tree` (a dict of DistArrays), through one
:class:`~mpiredist.TransferGroup` each call.

For the same arrays moved again and again (a weight sync every step), make
the :class:`~mpiredist.TransferGroup` once and call its ``run``: the group's
pieces and buckets are computed when it is made.
"""

from ..core.backend import dtype_of, dtype_text
from ..core.errors import ShapeError
from ..core.layout import Layout
from ..runtime.agree import check_together
from ..runtime.groups import base_group
from ..runtime.group import TransferGroup

__all__ = ["redistribute_many", "redistribute_tree"]


def _per_name(value, names, what):
    """``value`` per name: a dict by name, or one value for every name."""
    if isinstance(value, dict):
        missing = [n for n in names if n not in value]
        if missing:
            raise ShapeError(f"{what} has no entry for {missing[:4]}")
        return {n: value[n] for n in names}
    return {n: value for n in names}


def redistribute_many(blocks, shapes, mesh, src, dst, dst_mesh=None, workspace_bytes=None):
    """Redistribute a dict of blocks by name together (collective).

    ``shapes``: the global shape per name (a dict); ``src`` and ``dst``: one
    layout for every array, or a dict by name; ``dst_mesh`` as for
    :func:`mpiredist.redistribute`.  A rank outside the source mesh passes
    ``blocks=None`` (it learns the dtypes from the others: one allgather).
    Returns this rank's target blocks by name.  Memory: within sum over
    arrays of max(S_i, T_i) + W (see :class:`~mpiredist.TransferGroup`).
    """
    names = list(shapes)

    def body(mesh, rank):
        if blocks is not None and not isinstance(blocks, dict):
            raise ShapeError(f"rank {rank}: blocks must be a dict by name (or None), found "
                             f"{type(blocks).__name__}")
        return None, dict(names=names)

    mesh, _ = check_together("redistribute_many", mesh, body)
    mine = {} if blocks is None else {n: dtype_text(dtype_of(b)) for n, b in blocks.items()
                                      if b is not None and n in shapes}
    dtypes = {}
    for theirs in base_group(mesh).allgather_object(mine):
        dtypes.update({n: d for n, d in theirs.items() if n not in dtypes})
    srcs, dsts = _per_name(src, names, "src"), _per_name(dst, names, "dst")
    items = {n: (shapes[n], dtypes.get(n, "u1"), srcs[n], dsts[n]) for n in names}
    with TransferGroup(items, mesh, dst_mesh, workspace_bytes) as group:
        return group.run(blocks)


def redistribute_tree(arrays, dst, mesh=None, workspace_bytes=None):
    """A dict of :class:`~mpiredist.DistArray` in new layouts, moved together (collective).

    ``dst``: one layout for every array or a dict by name; ``mesh``: the
    target mesh (default: the arrays' own, which must be one mesh).
    Returns a dict of DistArrays by name.
    """
    from .distarray import DistArray
    names = list(arrays)
    meshes = {a.mesh for a in arrays.values()}
    if len(meshes) > 1:
        raise ShapeError(f"redistribute_tree: the arrays are on {len(meshes)} meshes; "
                         "move each mesh's arrays separately")
    source = meshes.pop() if meshes else mesh
    target = source if mesh is None else mesh
    dsts = _per_name(dst, names, "dst")
    blocks = {n: a.local for n, a in arrays.items()}
    out = redistribute_many(blocks, {n: a.shape for n, a in arrays.items()}, source,
                            {n: a.layout for n, a in arrays.items()}, dsts, target,
                            workspace_bytes)
    return {n: DistArray(out[n], arrays[n].shape, Layout.parse(dsts[n]), target)
            for n in names}
