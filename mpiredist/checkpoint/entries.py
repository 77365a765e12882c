"""What a state dict holds, and which boxes this rank writes or fills (no MPI).

A state (and a load's targets) is a dict, nested dicts allowed, of names to
distributed arrays (:class:`~mpiredist.DistArray`, DTensor), replicated
arrays (numpy arrays, torch tensors, numpy scalars: the same values on
every rank) and small values (int, float, bool, str, None and lists of
them), kept in the index.  :func:`flatten` turns it into :class:`Entry`
values sorted by key path, alike on every rank.

Who writes what: replicated data is written once.  A box held by ``R``
replicas (the ranks that differ only on the mesh axes a layout leaves out)
is cut into ``R`` runs of whole slabs of its first dim, one per replica
(the block rule over the slabs); a box under :data:`SPLIT` bytes is written
whole by replica ``k mod R``, ``k`` the entry's place in the sorted list.
Both from agreed values only: every rank knows every other's share.
"""

import math
import sys

import numpy as np

from ..arrays.base import DistArrayBase, device_of
from ..core.backend import backend_of, dtype_of, dtype_text
from ..core.blocks import interval, rank_block
from ..core.errors import CheckpointError, LayoutError, ShapeError
from ..core.layout import Layout
from ..core.mesh import Mesh
from ..core.placements import dtensor_boxes, placement_kinds
from ..core.subaxes import expand, rank_digits
from .grid import Geometry, grid
from .index import name_of

__all__ = ["Entry", "flatten", "unflatten", "share", "SPLIT", "is_value", "json_value"]

SPLIT = 1 << 20         # boxes smaller than this are written whole by one replica


def _is_dtensor(x):
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    tensor = sys.modules.get("torch.distributed.tensor")
    return tensor is not None and isinstance(x, tensor.DTensor)


def _is_tensor(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def is_value(x):
    """True for the small values an index keeps (JSON: numbers, text, lists)."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return not isinstance(x, np.generic)
    if isinstance(x, (list, tuple)):
        return all(is_value(v) for v in x)
    return False


def json_value(x):
    """``x`` as JSON keeps it (tuples become lists)."""
    if isinstance(x, (list, tuple)):
        return [json_value(v) for v in x]
    return x


class Entry:
    """One leaf of a state dict or of a load's targets.

    ``kind`` is ``"dist"`` (DistArray), ``"dtensor"``, ``"new"`` (a (mesh,
    layout) target), ``"array"`` (replicated numpy or torch) or ``"value"``.
    For arrays: ``shape``, ``dtype``, ``block`` (this rank's native numpy
    block or None), ``held`` (its global box) and ``replicas``, ``replica``
    (how many ranks hold the same box, and which of them this one is).
    """

    __slots__ = ("key", "kind", "obj", "shape", "dtype", "block", "held", "replicas",
                 "replica", "mesh", "layout", "describe")

    def __init__(self, key, kind, obj):
        self.key, self.kind, self.obj = key, kind, obj
        self.shape = self.dtype = self.block = self.held = self.mesh = self.layout = None
        self.replicas, self.replica, self.describe = 1, 0, kind

    @property
    def name(self):
        return name_of(self.key)

    def signature(self):
        """What every rank must agree on about this entry."""
        if self.kind == "value":
            return (self.key, "value")
        known = self.dtype is not None and not (self.kind == "dist" and self.mesh.ranks)
        return (self.key, self.kind if self.kind != "new" else "dist", self.shape,
                dtype_text(self.dtype) if known else None, self.describe)


def flatten(tree, what):
    """The leaves of ``tree`` (a dict, nested dicts allowed) as ``(key path, leaf)``,
    sorted by key path."""
    if not isinstance(tree, dict):
        raise CheckpointError(f"{what}: expected a dict of names to arrays or values, found "
                              f"{type(tree).__name__}")
    out = []

    def walk(node, prefix):
        for k, v in node.items():
            if not isinstance(k, str):
                raise CheckpointError(f"{what}: key {k!r} under {name_of(prefix) or 'the top'} "
                                      "is not a string")
            if isinstance(v, dict):
                walk(v, prefix + (k,))
            else:
                out.append((prefix + (k,), v))
    walk(tree, ())
    out.sort(key=lambda kv: kv[0])
    return out


def unflatten(pairs):
    """The nested dict of ``(key path, value)`` pairs."""
    root = {}
    for key, value in pairs:
        node = root
        for k in key[:-1]:
            node = node.setdefault(k, {})
        node[key[-1]] = value
    return root


def _native(array, name):
    backend = backend_of(array, f"array {name!r}")
    if backend.device:
        raise ShapeError(f"array {name!r} is in device memory; mr.save and mr.load take "
                         "host arrays (numpy, CPU torch)")
    return backend.native(array, f"array {name!r}")


def _box_rows(box):
    return box if box else ((0, 1),)


def entry(key, leaf, rank, comm_size, target=False):
    """The :class:`Entry` of one leaf on this rank (``rank`` of the call's
    communicator); ShapeError or LayoutError for what cannot be saved or filled."""
    e = Entry(key, None, leaf)
    name = e.name
    if isinstance(leaf, DistArrayBase):
        e.kind, e.mesh, e.layout = "dist", leaf.mesh, leaf.layout
        e.shape, e.describe = tuple(leaf.shape), f"{leaf.layout} on {leaf.mesh}"
        device = device_of(leaf.mesh, rank)
        if device is not None:
            if leaf.local is None:
                raise ShapeError(f"array {name!r}: its DistArray has no block (donated)")
            e.block = _native(leaf.local, name)
            e.dtype = e.block.dtype
            sub = expand(leaf.layout, leaf.mesh)
            e.held = rank_block(e.shape, sub, rank_digits(leaf.mesh, device))
            if target and leaf.layout.partial:
                raise LayoutError(f"array {name!r}: cannot load into layout {leaf.layout} "
                                  "with partial axes")
            _replicas(e, leaf.mesh, leaf.layout, device)
    elif _is_dtensor(leaf):
        _dtensor(e, leaf, rank, target)
    elif isinstance(leaf, tuple) and len(leaf) == 2 and isinstance(leaf[0], Mesh):
        if not target:
            raise ShapeError(f"{name!r}: a (mesh, layout) pair is a load target, not state")
        mesh, layout = leaf[0], Layout.parse(leaf[1])
        if layout.partial:
            raise LayoutError(f"array {name!r}: cannot load into layout {layout} with "
                              "partial axes")
        e.kind, e.mesh, e.layout = "new", mesh, layout
        e.describe = f"{layout} on {mesh}"
    elif isinstance(leaf, (np.ndarray, np.generic)) or _is_tensor(leaf):
        e.kind = "array"
        e.block = _native(leaf.detach() if _is_tensor(leaf) else leaf, name)
        if isinstance(e.block, np.generic):
            e.block = np.asarray(e.block)
        e.shape, e.dtype = tuple(e.block.shape), e.block.dtype
        e.held = tuple((0, n) for n in e.shape)
        e.replicas, e.replica = comm_size, rank
        e.describe = "replicated"
    elif is_value(leaf) or (target and leaf is None):
        e.kind = "value"
    else:
        raise ShapeError(f"{name!r}: cannot save a {type(leaf).__name__}; a state holds "
                         "DistArrays, DTensors, numpy arrays, torch tensors and small values "
                         "(numbers, text, lists of them)")
    if e.block is not None and e.dtype is not None and (e.dtype.hasobject
                                                        or e.dtype.itemsize == 0):
        raise ShapeError(f"array {name!r}: dtype {e.dtype} has no fixed size")
    return e


def _replicas(e, mesh, layout, device):
    used = set(layout.axes_used()) | set(layout.partial)
    coords = mesh.coords(device)
    r, i = 1, 0
    for (axis, size), c in zip(mesh.axes, coords):
        if axis not in used:
            r, i = r * size, i * size + c
    e.replicas, e.replica = r, i


def _dtensor(e, leaf, rank, target):
    name = e.name
    mesh = leaf.device_mesh
    kinds = placement_kinds(leaf.placements)
    if any(k == "partial" for k, _ in kinds) and target:
        raise LayoutError(f"array {name!r}: cannot load into a DTensor with Partial placements")
    e.kind, e.shape = "dtensor", tuple(leaf.shape)
    grid_shape = tuple(mesh.mesh.shape)
    e.describe = f"DTensor {list(kinds)} on mesh {grid_shape}"
    e.dtype = dtype_of(leaf)
    coord = mesh.get_coordinate()
    if coord is None:
        return
    local = leaf.to_local()
    if local.requires_grad:
        local = local.detach()
    e.block = _native(local, name)
    (box, _), = dtensor_boxes(e.shape, grid_shape, kinds, [tuple(coord)])
    e.held = box
    r, i = 1, 0
    for (kind, _), size, c in zip(kinds, grid_shape, coord):
        if kind == "replicate":
            r, i = r * size, i * size + c
    e.replicas, e.replica = r, i


def share(e, k):
    """The box this rank writes of entry ``e`` (the ``k``-th of the sorted list),
    or None: see the module doc."""
    held = _box_rows(e.held)
    if e.block is None or any(a >= b for a, b in held):
        return None
    if e.replicas == 1:
        return held
    nbytes = math.prod(b - a for a, b in held) * e.dtype.itemsize
    if nbytes < SPLIT:
        return held if e.replica == k % e.replicas else None
    g = Geometry(e.shape, grid(e.shape, e.dtype.itemsize), held, e.dtype.itemsize)
    i, j = interval(g.slab_count, e.replicas, e.replica)
    if i >= j:
        return None
    return ((g.slab_rows(i)[0], g.slab_rows(j - 1)[1]),) + held[1:]
