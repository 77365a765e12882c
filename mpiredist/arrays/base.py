"""The distributed array itself and :func:`redistribute`, without the analytics.

:class:`DistArrayBase` holds this rank's block and (shape, dtype, layout,
mesh); :class:`mpiredist.DistArray` adds the numpy protocol and the
analytics on top (:mod:`mpiredist.arrays.distarray`), so that ``ops``,
``heat`` and ``fft`` import this module and nothing imports them back.

Nothing here communicates except the documented collective calls
(constructors with validation, ``redistribute``, ``gather``); ``repr`` and
properties are local.  Every redistribution goes through a
:class:`~mpiredist.runtime.transfer.Transfer`, kept in a small cache of the
mesh's communicator and keyed by the agreed arguments.
"""

import numpy as np

from ..core.backend import dtype_of, dtype_text
from ..core.blocks import rank_block
from ..core.caches import recent
from ..core.errors import ShapeError
from ..core.layout import Layout
from ..core.mesh import Mesh
from ..core.subaxes import expand, rank_digits
from ..planning import planner
from ..planning.crossmesh import between
from ..runtime.agree import agree, check_together
from ..runtime.groups import base_group, check_size, kept
from ..runtime.transfer import Transfer

__all__ = ["DistArrayBase", "redistribute", "TRANSFER_CACHE_SIZE"]

# Transfers kept per communicator for redistribute(); each holds its
# routing and datatypes (small), never data buffers.
TRANSFER_CACHE_SIZE = 32


def _block_shape(shape, mesh, layout, rank):
    box = rank_block(shape, expand(layout, mesh), rank_digits(mesh, rank))
    return tuple(hi - lo for lo, hi in box)


def _contiguous():
    import torch
    return torch.contiguous_format


def device_of(mesh, rank):
    """The device index of communicator ``rank`` on ``mesh``, or None off the mesh."""
    if mesh.ranks is None:
        return rank
    return mesh.ranks.index(rank) if rank in mesh.ranks else None


def _check_mesh(mesh):
    """MeshError unless ``mesh`` fits its communicator (all ranks, or listed ones)."""
    if mesh.ranks is None:
        check_size(mesh, base_group(mesh))
    else:
        mesh.check_ranks(base_group(mesh).size)


def _check_local(block, shape, mesh, layout, rank):
    _check_mesh(mesh)
    device = device_of(mesh, rank)
    if device is None:
        if block is not None:
            raise ShapeError(f"rank {rank} is outside mesh {mesh}: its block must be None")
        planner.validate(shape, "u1", mesh, layout, layout)
        return
    rank = device
    if block is None:
        raise ShapeError(f"rank {rank}: no local block (None); a DistArray's block is None "
                         "after it was donated to an earlier redistribution")
    if not (hasattr(block, "shape") and hasattr(block, "dtype")):
        raise ShapeError(f"rank {rank}: local block must be an array (numpy, torch, CuPy, "
                         "DLPack), "
                         f"found {type(block).__name__}")
    planner.validate(shape, dtype_of(block), mesh, layout, layout)
    want = _block_shape(shape, mesh, layout, rank)
    if tuple(block.shape) != want:
        raise ShapeError(f"rank {rank}: local block has shape {tuple(block.shape)} but "
                         f"layout {layout} of global shape {tuple(shape)} on mesh {mesh} "
                         f"gives this rank {want}")


class DistArrayBase:
    """A distributed array: this rank's block plus (shape, dtype, layout, mesh).

    Create with :meth:`from_global` or :meth:`from_local` (collective: all
    ranks of the mesh call them together).  Examples need as many ranks as
    the mesh has devices, e.g. ``mpirun -n 8`` for ``x=2,y=4``.
    """

    __slots__ = ("_local", "_shape", "_layout", "_mesh", "_dtype", "_group")

    def __init__(self, local, shape, layout, mesh):
        # Unchecked; use from_local / from_global.
        self._local, self._shape = local, tuple(shape)
        self._layout, self._mesh = layout, mesh
        self._dtype = None if local is None else dtype_of(local)
        self._group = None      # the mesh's group, found on the first redistribution

    @classmethod
    def from_local(cls, block, mesh, layout, shape):
        """Wrap this rank's ``block`` of a global array of ``shape`` (collective).

        Every rank checks its block's shape against ``layout``; all ranks
        agree on (mesh, shape, dtype, layout); any problem raises on every
        rank before any data moves.
        """
        def body(mesh, rank):
            lay, full = Layout.parse(layout), planner.shape_of(shape)
            _check_local(block, full, mesh, lay, rank)
            values = dict(mesh=repr(mesh), shape=full, layout=lay)
            if mesh.ranks is None:          # every rank holds a block: agree on its dtype
                values["dtype"] = dtype_of(block)
            return (full, lay), values

        mesh, (full, lay) = check_together("DistArray.from_local", mesh, body)
        return cls(block, full, lay, mesh)

    @classmethod
    def from_global(cls, array, mesh, layout):
        """Take this rank's block of ``array``, the same full array on every rank."""
        def body(mesh, rank):
            lay = Layout.parse(layout)
            if not (hasattr(array, "shape") and hasattr(array, "dtype")):
                raise ShapeError(f"rank {rank}: global array must be an array "
                                 f"(numpy, torch, CuPy, DLPack), found {type(array).__name__}")
            shape = tuple(array.shape)
            _check_mesh(mesh)
            planner.validate(shape, dtype_of(array), mesh, lay, lay)
            if lay.partial:
                raise ShapeError(f"from_global: layout {lay} has partial axes; a full "
                                 "array cannot be split into partial sums")
            return (shape, lay), dict(mesh=mesh, shape=shape, dtype=dtype_of(array), layout=lay)

        mesh, (shape, lay) = check_together("DistArray.from_global", mesh, body)
        device = device_of(mesh, base_group(mesh).rank)
        if device is None:
            return cls(None, shape, lay, mesh)
        box = rank_block(shape, expand(lay, mesh), rank_digits(mesh, device))
        part = array[tuple(slice(lo, hi) for lo, hi in box)]
        clone = getattr(part, "clone", None)        # torch's copy; numpy, CuPy, JAX: copy
        block = clone(memory_format=_contiguous()) if clone is not None else part.copy()
        return cls(block, shape, lay, mesh)

    @property
    def local(self):
        """This rank's block (an array of the library it was given in); None once
        donated away."""
        return self._local

    @property
    def shape(self):
        """The global shape."""
        return self._shape

    @property
    def dtype(self):
        return self._dtype

    @property
    def ndim(self):
        return len(self._shape)

    @property
    def layout(self):
        return self._layout

    @property
    def mesh(self):
        return self._mesh

    def plan(self, dst, strategy="collectives", allow_exchange=True):
        """The plan of a redistribution to ``dst`` (no communication).

        What actually runs, executor included, is what
        ``mr.Transfer(...).explain()`` prints for the same arguments.
        """
        return planner.plan(self._shape, self.dtype, self._mesh, self._layout, dst, strategy,
                            allow_exchange)

    def redistribute(self, dst, donate=False, strategy="collectives", records=None,
                     workspace_bytes=None, mesh=None):
        """Return this array in layout ``dst`` (collective).

        Parameters
        ----------
        dst : Layout or str
        mesh : Mesh, optional
            The target mesh (default: this array's), on the same
            communicator; every rank of the communicator calls this.  A rank
            outside the target mesh gets an array whose ``local`` is None.
            See :func:`redistribute` (``dst_mesh``).
        donate : bool
            If True this array gives up its block, which the call may reuse as
            its working buffer: afterwards this array has no block
            (``local`` is None) unless the call raised.  Whether the block's
            memory is really reused is agreed by every rank (see
            :func:`redistribute`).
        strategy : {"collectives", "replicate", "direct"}
        records : list, optional
            Receives one :class:`~mpiredist.runtime.steps.StepRecord` per step.
        workspace_bytes : int, optional
            Budget W for temporary buffers (see :func:`redistribute`).
        """
        block = self._local
        if donate:
            self._local = None          # hand the block over: no reference is left here
        try:
            group = self._group
            if group is None:
                group = self._group = base_group(self._mesh)
            t, crossing = _transfer(self._mesh, self._shape, block, self._layout, dst, donate,
                                    strategy, workspace_bytes, mesh, group)
            out = t.run(block, records=records)     # block: the only name left
        except BaseException:
            if donate:
                self._local = block
            raise
        return type(self)(out, self._shape, t.dst_layout,
                          t.target_mesh if crossing else self._mesh)

    def redistribute_(self, dst, **kwargs):
        """In-place form: donate this block and take the result (collective)."""
        new = self.redistribute(dst, donate=True, **kwargs)
        self._local, self._layout, self._dtype = new._local, new._layout, new._dtype
        self._mesh = new._mesh          # the target's, between meshes
        return self

    def gather(self):
        """The full global array on every rank (collective)."""
        return self.redistribute(Layout.replicated(self.ndim)).local

    def __repr__(self):
        return (f"{type(self).__name__}(shape={self._shape}, dtype={self.dtype}, "
                f"layout={str(self._layout)!r}, mesh={self._mesh!r})")


def redistribute(local, global_shape, mesh, src, dst, donate=False,
                 strategy="collectives", records=None, workspace_bytes=None, dst_mesh=None):
    """Redistribute this rank's block ``local`` from ``src`` to ``dst`` (collective).

    Returns this rank's block of the target layout.  Every rank validates its
    own arguments and all ranks agree on (mesh, shape, dtype, src, dst, the
    array library) with one small collective before any data moves; a
    problem on any rank raises a ``ValueError`` subclass on every rank.
    ``local`` is not written unless ``donate`` is True.

    Runs through a cached :class:`~mpiredist.Transfer` of the same
    arguments: for many calls with the same arguments, make one Transfer and
    call its ``run`` instead (no cache look-up per call).

    Memory: with S and T the source and target block bytes and W =
    ``workspace_bytes`` (default ``max(S, T) // 4 + 1 MiB``), the call
    allocates at most ``max(S, T) + W`` bytes, or ``max(0, T - S) + W`` when
    the donation is honoured.  A donation is honoured only if every rank's
    block is a numpy array that owns a writeable, aligned, C-contiguous
    buffer to which nothing but the caller's own name refers (no view, no
    second name); otherwise every rank runs as not donated, ``local`` is left
    unchanged, and a :class:`~mpiredist.DonationWarning` says why.  The block
    is resized (``realloc``) only after every rank has agreed, so a call
    that raises leaves it as it was.  If some step cannot run within the
    bound, a :class:`~mpiredist.BudgetWarning` says so before anything runs.

    Between meshes: ``dst_mesh`` (default ``mesh``) is the target layout's
    mesh, on the same communicator; either mesh may cover some ranks only
    (``Mesh(..., ranks=...)``).  Every rank of the communicator calls; a
    rank outside the source mesh passes ``local=None`` and one outside the
    target mesh gets ``None``.  The route, a collective plan on one refined
    mesh or a point-to-point exchange, is that of :class:`~mpiredist.Transfer`
    with ``dst_mesh``; the memory bound is the same, with S = 0 off the
    source mesh and T = 0 off the target mesh, and the exchange does not
    honour a donation (it warns).
    """
    t, _ = _transfer(mesh, global_shape, local, src, dst, donate, strategy, workspace_bytes,
                     dst_mesh)
    return t.run(local, records=records, forwarded=1)


def _transfer(mesh, global_shape, local, src, dst, donate, strategy, workspace, dst_mesh,
              group=None):
    """``(Transfer, between meshes)`` of these arguments: the Transfer kept in a
    small cache of the group, or made (collective).

    The key is this rank's own arguments, as plain values (a layout's or a
    mesh's ``key``); a rank whose key differs from the others' (a miss where
    they hit, or another Transfer) reaches a different agreement from
    theirs, and every agreement has one size, so all ranks raise
    :class:`~mpiredist.MismatchError` instead of hanging.  Between meshes
    (:func:`~mpiredist.planning.crossmesh.between`) a rank may hold no block:
    the ranks first agree on the dtype (one allgather) and the Transfer is
    made for the call alone.
    """
    if type(local) is np.ndarray:
        dtype = local.dtype
    elif local is None or hasattr(local, "shape") and hasattr(local, "dtype"):
        dtype = None if local is None else dtype_of(local)
    else:
        return _refused(mesh, local)
    cache = None
    try:
        if group is None:
            mesh = mesh if isinstance(mesh, Mesh) else Mesh(mesh)
            group = base_group(mesh)
        key = (mesh.key, tuple(global_shape), dtype, src if type(src) is str else src.key,
               dst if type(dst) is str else dst.key, strategy, donate, workspace,
               None if dst_mesh is None else dst_mesh.key)
        cache = group.kept.get("transfers")
        found = None if cache is None else cache.get(key)
        if found is not None:
            cache[key] = cache.pop(key)         # the most recently used
            return found, False
        crossing = between(mesh, dst_mesh, group.size)
        cache = None if crossing else kept(group, "transfers")
    except (ValueError, TypeError, AttributeError):
        crossing = False                        # the agreement names the problem
    if crossing:
        return _Once(_between(local, global_shape, mesh, src, dst, dst_mesh, donate, strategy,
                              workspace)), True

    def make():
        return Transfer(global_shape, "u1" if dtype is None else dtype, mesh, src, dst, donate,
                        workspace, strategy)

    return (make() if cache is None else recent(cache, key, make, TRANSFER_CACHE_SIZE)), False


def _refused(mesh, local):
    """ShapeError on every rank: ``local`` is not an array (one agreement, which
    meets the agreement the other ranks make next, whatever it is)."""
    group = base_group(mesh if isinstance(mesh, Mesh) else Mesh(mesh))
    agree(group, "redistribute", ShapeError(
        f"rank {group.rank}: local block must be an array (numpy, torch, CuPy, DLPack), "
        f"found {type(local).__name__}"))
    raise AssertionError("unreachable: the agreement raised")


class _Once:
    """A Transfer made for one call (between meshes): freed after its run."""

    def __init__(self, transfer):
        self.transfer = transfer
        self.target_mesh = transfer.target_mesh
        self.dst_layout = transfer.dst_layout

    def run(self, local, records=None, forwarded=0):
        try:
            return self.transfer.run(local, records=records, forwarded=forwarded + 1)
        finally:
            self.transfer.free()


def _between(local, global_shape, mesh, src, dst, dst_mesh, donate, strategy, workspace):
    """The Transfer of a call between meshes: the ranks agree on the dtype first
    (a rank without a block learns it: one allgather)."""
    group = base_group(mesh)
    agree(group, "redistribute between meshes")
    # by dtype_text: bfloat16's str is '<V2', which numpy reads as plain void
    dtypes = [d for d in group.allgather_object(
        None if local is None else dtype_text(dtype_of(local))) if d is not None]
    dtype = dtypes[0] if dtypes else "u1"    # no block anywhere: Transfer names the rank
    return Transfer(global_shape, dtype, mesh, src, dst, donate, workspace, strategy,
                    dst_mesh=mesh if dst_mesh is None else dst_mesh)
