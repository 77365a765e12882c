"""DistArray: a global array held as one local block per rank.

Nothing here communicates except the documented collective methods
(constructors with validation, :meth:`DistArray.redistribute`,
:meth:`DistArray.gather`); ``repr`` and properties are local.
"""

import warnings

from numpy.lib.mixins import NDArrayOperatorsMixin

from . import heat
from . import ops
from ..planning import planner
from ..runtime.agree import agree_on
from ..core.blocks import rank_block
from ..runtime.comm import check_size, mesh_comm, mpi
from ..core.errors import BudgetWarning, ShapeError
from ..core.backend import is_gpu
from ..planning.budget import choose
from ..runtime.executor import execute
from ..runtime.executor_inplace import execute_inplace
from ..core.layout import Layout
from ..core.mesh import Mesh
from ..core.subaxes import expand, rank_digits

__all__ = ["DistArray", "redistribute"]


def _mesh(mesh):
    return mesh if isinstance(mesh, Mesh) else Mesh(mesh)


def _base_comm(mesh):
    return mesh.comm if mesh.comm is not None else mpi().COMM_WORLD


def _block_shape(shape, mesh, layout, rank):
    box = rank_block(shape, expand(layout, mesh), rank_digits(mesh, rank))
    return tuple(hi - lo for lo, hi in box)


def _check_local(block, shape, dtype, mesh, layout, rank):
    check_size(mesh, _base_comm(mesh))
    planner.validate(shape, dtype, mesh, layout, layout)
    want = _block_shape(shape, mesh, layout, rank)
    if tuple(block.shape) != want:
        raise ShapeError(f"rank {rank}: local block has shape {tuple(block.shape)} but "
                         f"layout {layout} of global shape {tuple(shape)} on mesh {mesh} "
                         f"gives this rank {want}")


def _collective_check(what, mesh, body):
    """Run ``body(mesh, rank) -> (result, values)`` on every rank; raise together.

    Any problem on any rank -- a bad mesh, a ValueError from validation, or
    an argument of the wrong type -- raises on every rank (one small
    collective), so that no rank is left waiting in a later collective.
    Returns ``(mesh, result)``.
    """
    try:
        mesh = _mesh(mesh)
        comm = _base_comm(mesh)
    except ValueError as exc:
        agree_on(mpi().COMM_WORLD, what, exc)
        raise
    rank = comm.Get_rank()
    result, values, error = None, {}, None
    try:
        result, values = body(mesh, rank)
    except ValueError as exc:
        error = exc
    except (TypeError, AttributeError) as exc:
        error = ShapeError(f"rank {rank}: {what}: argument of the wrong type: {exc}")
    agree_on(comm, what, error, **values)
    return mesh, result


def _as_array(x, what, rank):
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise ShapeError(f"rank {rank}: {what} must be a numpy or CuPy array, "
                         f"found {type(x).__name__}")
    return x


def _as_shape(shape, rank):
    try:
        return tuple(int(n) for n in shape)
    except (TypeError, ValueError):
        raise ShapeError(f"rank {rank}: global shape must be a sequence of integers, "
                         f"found {shape!r}") from None


class DistArray:
    """A distributed array: this rank's block plus (shape, dtype, layout, mesh).

    Create with :meth:`from_global` or :meth:`from_local` (collective: all
    ranks of the mesh call them together).  Examples need as many ranks as
    the mesh has devices, e.g. ``mpirun -n 8`` for ``x=2,y=4``.

    Examples
    --------
    >>> mesh = Mesh({"x": 2, "y": 4})                       # doctest: +SKIP
    >>> a = DistArray.from_global(g, mesh, "[{x,y}, {}]")    # doctest: +SKIP
    >>> b = a.redistribute("[{}, {x,y}]")                    # doctest: +SKIP
    """

    __slots__ = ("_local", "_shape", "_layout", "_mesh")

    def __init__(self, local, shape, layout, mesh):
        # Unchecked; use from_local / from_global.
        self._local, self._shape = local, tuple(shape)
        self._layout, self._mesh = layout, mesh

    @classmethod
    def from_local(cls, block, mesh, layout, shape):
        """Wrap this rank's ``block`` of a global array of ``shape`` (collective).

        Every rank checks its block's shape against ``layout``; all ranks
        agree on (mesh, shape, dtype, layout); any problem raises on every
        rank before any data moves.
        """
        def body(mesh, rank):
            lay, arr = Layout.parse(layout), _as_array(block, "local block", rank)
            full = _as_shape(shape, rank)
            _check_local(arr, full, arr.dtype, mesh, lay, rank)
            return (full, lay), dict(mesh=mesh, shape=full, dtype=arr.dtype, layout=lay)

        mesh, (full, lay) = _collective_check("DistArray.from_local", mesh, body)
        return cls(block, full, lay, mesh)

    @classmethod
    def from_global(cls, array, mesh, layout):
        """Take this rank's block of ``array``, the same full array on every rank."""
        def body(mesh, rank):
            lay, arr = Layout.parse(layout), _as_array(array, "global array", rank)
            shape = tuple(arr.shape)
            check_size(mesh, _base_comm(mesh))
            planner.validate(shape, arr.dtype, mesh, lay, lay)
            if lay.partial:
                raise ShapeError(f"from_global: layout {lay} has partial axes; a full "
                                 "array cannot be split into partial sums")
            return (shape, lay), dict(mesh=mesh, shape=shape, dtype=arr.dtype, layout=lay)

        mesh, (shape, lay) = _collective_check("DistArray.from_global", mesh, body)
        box = rank_block(shape, expand(lay, mesh), rank_digits(mesh, _base_comm(mesh).Get_rank()))
        block = array[tuple(slice(lo, hi) for lo, hi in box)].copy()
        return cls(block, shape, lay, mesh)

    @property
    def local(self):
        """This rank's block (numpy or CuPy array)."""
        return self._local

    @property
    def shape(self):
        """The global shape."""
        return self._shape

    @property
    def dtype(self):
        return self._local.dtype

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
        """The plan :meth:`redistribute` would run (no communication).

        A call that runs in place (donated, or over its memory budget out of
        place) uses the plan with ``allow_exchange=False`` when this one has an
        exchange that cannot run in place (:func:`mpiredist.planning.budget.choose`).
        """
        return planner.plan(self._shape, self.dtype, self._mesh, self._layout, dst, strategy,
                            allow_exchange)

    def redistribute(self, dst, donate=False, strategy="collectives", records=None,
                     workspace_bytes=None):
        """Return this array in layout ``dst`` (collective).

        Parameters
        ----------
        dst : Layout or str
        donate : bool
            If True the caller gives up this array's block: its buffer may be
            reused and its contents are undefined afterwards.
        strategy : {"collectives", "replicate", "direct"}
        records : list, optional
            Receives one :class:`~mpiredist.runtime.executor.StepRecord` per step.
        workspace_bytes : int, optional
            Budget W for temporary buffers (see :func:`redistribute`).
        """
        out = redistribute(self._local, self._shape, self._mesh, self._layout, dst,
                           donate=donate, strategy=strategy, records=records,
                           workspace_bytes=workspace_bytes)
        return DistArray(out, self._shape, Layout.parse(dst), self._mesh)

    def redistribute_(self, dst, **kwargs):
        """In-place form: donate this block and take the result (collective)."""
        new = self.redistribute(dst, donate=True, **kwargs)
        self._local, self._layout = new._local, new._layout
        return self

    def gather(self):
        """The full global array on every rank (collective)."""
        return self.redistribute(Layout.replicated(self.ndim)).local

    @classmethod
    def load_hdf5(cls, path, dataset, mesh, layout, comm=None):
        """Read ``dataset`` of the HDF5 file ``path``, each rank only its block (collective).

        See :func:`mpiredist.arrays.hdf5.read_block` for the errors raised on every rank.
        """
        from .hdf5 import read_block
        mesh, layout = _mesh(mesh), Layout.parse(layout)
        if comm is not None and mesh.comm is None:
            mesh = mesh.with_comm(comm)
        block, shape, _ = read_block(path, dataset, mesh, layout, comm)
        return cls(block, shape, layout, mesh)

    def save_hdf5(self, path, dataset, overwrite=False):
        """Write the global array to ``dataset`` of ``path`` (collective).

        A new file appears atomically; replicas are written once.  See
        :func:`mpiredist.arrays.hdf5.write_blocks`.
        """
        from .hdf5 import write_blocks
        write_blocks(path, dataset, self._local, self._shape, self._mesh, self._layout,
                     self._mesh.comm, overwrite=overwrite)

    # numpy protocol and analytics (mpiredist.arrays.ops, mpiredist.arrays.heat)
    __array_ufunc__ = ops.array_ufunc
    sum = ops.sum
    mean = ops.mean
    min = ops.min
    max = ops.max
    resplit = heat.resplit
    resplit_ = heat.resplit_
    split = property(heat.split)

    def __repr__(self):
        return (f"DistArray(shape={self._shape}, dtype={self.dtype}, "
                f"layout={str(self._layout)!r}, mesh={self._mesh!r})")


def redistribute(local, global_shape, mesh, src, dst, donate=False,
                 strategy="collectives", records=None, workspace_bytes=None):
    """Redistribute this rank's block ``local`` from ``src`` to ``dst`` (collective).

    Returns this rank's block of the target layout.  Every rank validates its
    own arguments and all ranks agree on (mesh, shape, dtype, src, dst) with
    one small collective before any data moves; a problem on any rank raises
    a ``ValueError`` subclass on every rank.  ``local`` is not written unless
    ``donate`` is True.

    Memory (DESIGN.md section 3): with S and T the source and target block
    bytes and W = ``workspace_bytes`` (default ``max(S, T) // 4 + 1 MiB``),
    the call allocates at most ``max(S, T) + W`` bytes, or
    ``max(0, T - S) + W`` when ``donate`` is True.  The fast out-of-place
    executor runs when it fits; otherwise the plan runs inside one buffer
    (:mod:`mpiredist.runtime.executor_inplace`).  If some step cannot run in place, a
    :class:`~mpiredist.core.errors.BudgetWarning` says so before anything runs.
    """
    def body(mesh, rank):
        s, d = Layout.parse(src), Layout.parse(dst)
        arr, shape = _as_array(local, "local block", rank), _as_shape(global_shape, rank)
        _check_local(arr, shape, arr.dtype, mesh, s, rank)
        p = planner.plan(shape, arr.dtype, mesh, s, d, strategy)
        return (p, shape, s, d), dict(mesh=mesh, shape=shape, dtype=arr.dtype, src=s, dst=d,
                                      strategy=strategy, donate=bool(donate),
                                      workspace=workspace_bytes)

    mesh, (plan, shape, src, dst) = _collective_check("redistribute", mesh, body)
    mc = mesh_comm(mesh)
    choice = choose(plan, donate, workspace_bytes, is_gpu(local),
                    (lambda: planner.plan(shape, local.dtype, mesh, src, dst, strategy,
                                          allow_exchange=False))
                    if strategy == "collectives" else None)
    if not choice.inplace:
        return execute(plan, local, mc, records, choice.slack)
    fits = choice.budget
    if fits.inplace_peak > fits.limit:
        warnings.warn(BudgetWarning(f"redistribute {src} -> {dst}: {fits}"), stacklevel=2)
    return execute_inplace(choice.plan, local, mc, donate, fits.workspace, records)




# Arithmetic operators through __array_ufunc__ (no ==/!= so DistArray stays
# hashable, no in-place operators since ``out=`` is not supported).
for _name in ops.OPERATORS:
    setattr(DistArray, _name, getattr(NDArrayOperatorsMixin, _name))
del _name
