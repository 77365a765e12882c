"""What a Transfer keeps on this rank between runs: :class:`Context`.

A :class:`Context` belongs to one :class:`~mpiredist.runtime.transfer.Transfer`
(or :class:`~mpiredist.runtime.exchange.Exchange` owner) and lives as long
as it: the communicator, the element datatype, the count limit, the
pooled buffers of repeated runs, the datatypes a step makes (freed after
it), and each step's geometry (which boxes go to which member, Python over
the group or the mesh), computed on the first run and reused instead of
living in module-level caches.  :meth:`Context.free` releases its MPI
datatypes; it never communicates.
"""

import math

import numpy as np

from ..core.backend import c_contiguous, combiner, device_dtype
from ..planning.pieces import REDUCERS
from .comm import mpi
from .collectives import count_limit
from .failure import fault

__all__ = ["Context"]


class Context:
    """State of one Transfer on this rank, shared by its runs.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        The communicator the run's point-to-point messages use.
    dtype : numpy dtype
        The dtype of the values (``values``).  The arrays hold it as
        :attr:`dtype`: the same, but for device values, which hold bfloat16
        as its int16 bits (:func:`~mpiredist.core.backend.device_dtype`).
    xp : module
        ``numpy`` or ``cupy``: the library of the arrays (an exchange's run
        sets it to its arrays' library).
    plan : Plan, optional
    mc : MeshComm, optional
        The plan's mesh communicators (sub-communicators of its steps).
    staged : bool
        Device values whose every part goes through host rings (the MPI
        library is not CUDA-aware).
    """

    def __init__(self, comm, dtype, xp=np, plan=None, mc=None, staged=False):
        self.MPI = mpi()
        self.comm, self.plan, self.mc, self.xp = comm, plan, mc, xp
        self.values = np.dtype(dtype)
        self._held = device_dtype(dtype)        # on the device
        self.itemsize = self.values.itemsize
        self.elem = self.MPI.BYTE.Create_contiguous(self.itemsize).Commit()
        self.types = []
        self.pool = None        # buffers kept between runs (a dict), or None
        self.staged = staged    # device arrays, rings on the host (MPI not CUDA-aware)
        self.current = None     # index of the step running
        self.count_limit = count_limit(self.MPI)
        self.reduce_room = 1 << 62  # bytes a reduction call may carry (set from W)
        self.routes = {}        # per-step geometry, computed on the first run
        self.calls = 0          # MPI calls that moved data (see StepRecord)
        self.fault = fault(comm.Get_rank())     # tests only (runtime.failure)

    def __repr__(self):
        return f"Context({self.dtype}, plan={self.plan is not None}, routes={len(self.routes)})"

    def route(self, key, make):
        """``routes[key]``, made by ``make()`` on the first run (per-step geometry
        from the plan and this rank's digits alone)."""
        found = self.routes.get(key)
        if found is None:
            found = self.routes[key] = make()
        return found

    @property
    def device(self):
        """True for device values: CuPy arrays, or a staged run's host rings."""
        return self.staged or self.xp is not np

    @property
    def dtype(self):
        """The dtype the arrays hold (device bfloat16: int16)."""
        return self._held if self.device else self.values

    def combiner(self, op):
        """The function that combines partial values by partial op ``op``
        (``f(acc, part, out=acc)``: :func:`~mpiredist.core.backend.combiner`)
        in this context's arrays."""
        return combiner(REDUCERS[op], self.values, self.device)

    # ------------------------------------------------------------ buffers

    def new_array(self, shape):
        """A step's output: new, or the one kept for this step when pooling."""
        if self.pool is None:
            return self.xp.empty(shape, dtype=self.dtype)
        key = (self.current, tuple(shape))
        found = self.pool.get(key)
        if found is None:
            found = self.pool[key] = self.xp.empty(shape, dtype=self.dtype)
        return found

    def scratch(self, count, dtype=None):
        """A pack buffer of ``count`` elements of ``dtype`` (default the Transfer's):
        new, or a view of the kept one when pooling."""
        dtype = self.dtype if dtype is None else np.dtype(dtype)
        xp = np if self.staged else self.xp
        if self.pool is None:
            return xp.empty(count, dtype=dtype)
        nbytes = count * dtype.itemsize
        found = self.pool.get("scratch")
        if found is None or found.size < nbytes:
            found = self.pool["scratch"] = None
            found = self.pool["scratch"] = xp.empty(nbytes, dtype=np.uint8)
        return found[:nbytes].view(dtype)

    # ---------------------------------------------------------- datatypes

    def keep(self, datatype):
        """``datatype`` (committed), freed after the running step."""
        self.types.append(datatype)
        return datatype

    def subarray(self, region, box=None):
        """``(count, datatype)`` for ``box`` (relative to ``region``) inside its base."""
        if box is None:
            rel, shape = (0,) * len(region.shape), region.shape
        else:
            rel, shape = box
        if math.prod(shape) == 0:
            return 0, self.elem
        if not region.base.ndim:
            return 1, self.elem
        starts = [a + b for a, b in zip(region.starts, rel)]
        return 1, self.keep(self.elem.Create_subarray(list(region.base.shape), list(shape),
                                                      starts).Commit())

    def whole(self, region):
        """Buffer spec of all of ``region``: plain bytes when it is contiguous in memory."""
        from .collectives import message
        view = region.view()
        if c_contiguous(view):
            return message(self, view, view.size * self.itemsize)
        return [region.base, *self.subarray(region)]

    def free_types(self):
        for t in self.types:
            t.Free()
        self.types.clear()

    def free(self):
        """Free every datatype this context holds (local; no communication)."""
        self.free_types()
        if self.elem is not None:
            self.elem.Free()
            self.elem = None
        self.routes.clear()
