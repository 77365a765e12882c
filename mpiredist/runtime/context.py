"""What a compiled run keeps on this rank between runs: :class:`Context` and :class:`Keep`.

A :class:`Context` belongs to one compiled redistribution (a Transfer's
variant, an :class:`~mpiredist.runtime.exchange.Exchange`) and lives as
long as it: the group its messages use, the element type, the pooled
buffers of repeated runs, and each step's geometry (which boxes go to which
member), computed on the first run and reused instead of living in
module-level caches.  It holds no resource of a transport (the transport
frees what a call needs itself), so :meth:`Context.free` only drops
references.

:class:`Keep` is the one store of what a compiled redistribution keeps
between runs (its contexts, staged exchanges, pooled and scratch buffers),
by key, released together by :meth:`Keep.free`.
"""

import numpy as np

from ..core.backend import combiner, device_dtype
from ..planning.pieces import REDUCERS
from .failure import fault

__all__ = ["Context", "Keep"]


class Context:
    """State of one compiled run on this rank, shared by its runs.

    Parameters
    ----------
    group : Group
        The group the run's point-to-point messages use.
    dtype : numpy dtype
        The dtype of the values (``values``).  The arrays hold it as
        :attr:`dtype`: the same, but for device values, which hold bfloat16
        as its int16 bits (:func:`~mpiredist.core.backend.device_dtype`).
    xp : module
        ``numpy`` or ``cupy``: the library of the arrays (an exchange's run
        sets it to its arrays' library).
    plan : Plan, optional
    groups : MeshGroups, optional
        The plan's mesh groups (the sub-groups its steps run on).
    staged : bool
        Device values whose every part goes through host rings (the
        transport does not take device buffers).
    """

    def __init__(self, group, dtype, xp=np, plan=None, groups=None, staged=False):
        self.group, self.plan, self.groups = group, plan, groups
        self.values = np.dtype(dtype)
        self._held = device_dtype(dtype)        # on the device
        self.itemsize = self.values.itemsize
        self.pool = None        # step outputs kept between runs (a dict: runs into out=), or None
        self._scratch = None    # the pack buffer, kept between runs (at most W)
        self.keep_scratch = True    # out of place: keep it; the one-buffer strategy: not
        self.staged = staged    # device arrays, rings on the host
        # messages may be boxes of larger arrays (the transport's datatypes)
        self.strided = group.strided and not staged
        self.current = None     # index of the step running
        self.count_limit = group.count_limit
        self.reduce_room = 1 << 62  # bytes a reduction call may carry (set from W)
        self.routes = {}        # per-step geometry, computed on the first run
        self.calls = 0          # transport calls that moved data (see StepRecord)
        self.fault = fault(group.rank)          # tests only (runtime.failure)
        self.use(xp)

    def __repr__(self):
        return f"Context({self.dtype}, plan={self.plan is not None}, routes={len(self.routes)})"

    def route(self, key, make):
        """``routes[key]``, made by ``make()`` on the first run (per-step geometry
        from the plan and this rank's digits alone)."""
        found = self.routes.get(key)
        if found is None:
            found = self.routes[key] = make()
        return found

    def use(self, xp):
        """Run on arrays of library ``xp`` (numpy or CuPy): sets ``xp``, ``device``
        (device values: CuPy arrays, or a staged run's host rings) and
        ``dtype`` (what the arrays hold: device bfloat16 as int16)."""
        self.xp = xp
        self.device = self.staged or xp is not np
        self.dtype = self._held if self.device else self.values

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
        """A pack buffer of ``count`` elements of ``dtype`` (default the run's).

        The kept-buffer policy of the package: a run out of place keeps its
        pack buffer (at most W) between runs, grown when a run needs more,
        until the owner is freed, and its step outputs too when runs pass
        ``out=``; a run in one buffer (``keep_scratch`` False) keeps nothing,
        since every temporary there shares half of W with the kernels'.
        """
        dtype = self.dtype if dtype is None else np.dtype(dtype)
        xp = np if self.staged else self.xp
        if not self.keep_scratch:
            return xp.empty(count, dtype=dtype)
        nbytes = count * dtype.itemsize
        found = self._scratch
        if found is None or found.size < nbytes or not isinstance(found, xp.ndarray):
            found = self._scratch = None
            found = self._scratch = xp.empty(nbytes, dtype=np.uint8)
        return found[:nbytes].view(dtype)

    def free_scratch(self):
        """Drop the kept pack buffer."""
        self._scratch = None

    @property
    def kept_bytes(self):
        """Bytes this context keeps between runs: its scratch and pooled outputs."""
        pooled = sum(a.nbytes for a in (self.pool or {}).values())
        return pooled + (0 if self._scratch is None else self._scratch.nbytes)

    def free(self):
        """Drop the kept geometry and buffers (local; no communication)."""
        self.routes.clear()
        self.pool = self._scratch = None


class Keep:
    """What a compiled redistribution keeps between runs, by key (see the module doc)."""

    __slots__ = ("_found",)

    def __init__(self):
        self._found = {}

    def get(self, key, make):
        """``self[key]``, made by ``make()`` when missing."""
        found = self._found.get(key)
        if found is None:
            found = self._found[key] = make()
        return found

    def __contains__(self, key):
        return key in self._found

    def __getitem__(self, key):
        return self._found[key]

    def __setitem__(self, key, value):
        self._found[key] = value

    def pop(self, key, default=None):
        return self._found.pop(key, default)

    def values(self):
        return list(self._found.values())

    def free(self):
        """Release everything kept (each object's ``free()`` where it has one)."""
        found, self._found = self._found, {}
        for obj in found.values():
            if hasattr(obj, "free"):
                obj.free()

    def __repr__(self):
        return f"Keep({sorted(map(str, self._found))})"
