"""DistArray: the distributed array of the public API.

:class:`DistArray` is :class:`~mpiredist.arrays.base.DistArrayBase` (the
block, its layout and mesh, ``redistribute``, ``gather``) plus the numpy
protocol and the analytics of :mod:`~mpiredist.arrays.ops`,
:mod:`~mpiredist.arrays.heat` and :mod:`~mpiredist.arrays.hdf5`.  Those
modules import the base class, never this one, so the layer has no cycle.
"""

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from ..core.layout import Layout
from ..core.mesh import Mesh
from . import broadcast, heat, indexing, linalg, ops, shape, stats
from .base import DistArrayBase, redistribute

__all__ = ["DistArray", "redistribute", "matmul", "concatenate"]

matmul = linalg.matmul
concatenate = shape.concatenate


class DistArray(DistArrayBase):
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

    __slots__ = ()

    @classmethod
    def load_hdf5(cls, path, dataset, mesh, layout, comm=None):
        """Read ``dataset`` of the HDF5 file ``path``, each rank only its block (collective).

        See :func:`mpiredist.arrays.hdf5.read_block` for the errors raised on every rank.
        """
        from .hdf5 import read_block
        mesh, layout = (mesh if isinstance(mesh, Mesh) else Mesh(mesh)), Layout.parse(layout)
        if comm is not None and mesh.comm is None:
            mesh = mesh.with_comm(comm)
        block, shape, _ = read_block(path, dataset, mesh, layout, comm)
        return cls(block, shape, layout, mesh)

    @classmethod
    def from_jax(cls, array, mesh=None, spec=None):
        """A DistArray of a global (multi-process) ``jax.Array`` with a
        ``NamedSharding``, one device per process (collective over COMM_WORLD).

        The block is this process's shard, no copy; ``mesh`` defaults to the
        JAX mesh's axes with its processes as ranks, ``spec`` to the
        sharding's.  See :mod:`mpiredist.arrays.jaxarray`.
        """
        from .jaxarray import from_jax
        return from_jax(cls, array, mesh, spec)

    def to_jax(self):
        """The global ``jax.Array`` of this array, ``NamedSharding`` of its layout
        (collective over COMM_WORLD; JAX shards evenly only).  See
        :mod:`mpiredist.arrays.jaxarray`."""
        from .jaxarray import to_jax
        return to_jax(self)

    def save_hdf5(self, path, dataset, overwrite=False):
        """Write the global array to ``dataset`` of ``path`` (collective).

        A new file appears atomically; replicas are written once.  See
        :func:`mpiredist.arrays.hdf5.write_blocks`.
        """
        from .hdf5 import write_blocks
        write_blocks(path, dataset, self._local, self._shape, self._mesh, self._layout,
                     self._mesh.comm, overwrite=overwrite)

    # numpy protocol and analytics (mpiredist.arrays.ops, broadcast, heat,
    # shape, indexing, linalg, stats).  Ufuncs broadcast and line up mixed
    # layouts (broadcast.array_ufunc); ops.array_ufunc is the strict local one.
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if ufunc is np.matmul and method == "__call__" and len(inputs) == 2 and not kwargs:
            return linalg.matmul(*(_operand(x, self) for x in inputs))
        return broadcast.array_ufunc(self, ufunc, method, *inputs, **kwargs)

    __getitem__ = indexing.getitem
    T = property(shape.T)
    transpose = shape.transpose
    reshape = shape.reshape
    astype = shape.astype
    copy = shape.copy
    var = stats.var
    std = stats.std
    argmax = stats.argmax
    argmin = stats.argmin
    sum = ops.sum
    mean = ops.mean
    min = ops.min
    max = ops.max
    resplit = heat.resplit
    resplit_ = heat.resplit_
    split = property(heat.split)

    def __matmul__(self, other):
        return linalg.matmul(self, _operand(other, self))

    def __rmatmul__(self, other):
        return linalg.matmul(_operand(other, self), self)


def _operand(x, like):
    """A numpy array operand of matmul (the same on every rank) as a replicated
    DistArray on ``like``'s mesh (collective: agreed by ``from_global``)."""
    if isinstance(x, DistArrayBase):
        return x
    if isinstance(x, np.ndarray):
        return DistArray.from_global(x, like.mesh, Layout.replicated(x.ndim))
    raise ops.OperandError(f"matmul: operand of type {type(x).__name__} is neither a "
                           "DistArray nor a numpy array")


# Arithmetic operators through __array_ufunc__ (no ==/!= so DistArray stays
# hashable, no in-place operators since ``out=`` is not supported).
for _name in ops.OPERATORS:
    setattr(DistArray, _name, getattr(NDArrayOperatorsMixin, _name))
del _name
