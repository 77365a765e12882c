"""DistArray: the distributed array of the public API.

:class:`DistArray` is :class:`~mpiredist.arrays.base.DistArrayBase` (the
block, its layout and mesh, ``redistribute``, ``gather``) plus the numpy
protocol and the analytics of :mod:`~mpiredist.arrays.ops`,
:mod:`~mpiredist.arrays.heat` and :mod:`~mpiredist.arrays.hdf5`.  Those
modules import the base class, never this one, so the layer has no cycle.
"""

from numpy.lib.mixins import NDArrayOperatorsMixin

from ..core.layout import Layout
from ..core.mesh import Mesh
from . import heat, ops
from .base import DistArrayBase, redistribute

__all__ = ["DistArray", "redistribute"]


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


# Arithmetic operators through __array_ufunc__ (no ==/!= so DistArray stays
# hashable, no in-place operators since ``out=`` is not supported).
for _name in ops.OPERATORS:
    setattr(DistArray, _name, getattr(NDArrayOperatorsMixin, _name))
del _name
