"""Statistics: var, std (two-pass), argmax, argmin (first occurrence).

All are collective and return arrays without partial axes: the kept dims
keep their sharding, the reduced dims disappear (as NumPy, no keepdims).

``var(a, axis, ddof)``
    Two passes, numerically stable: the mean (partial sums divided by the
    count, all-reduced in the layout of ``a`` with the reduced dims whole),
    then the sum of squared deviations ``|a - mean|**2`` (one temporary block
    of ``a``'s size), reduced.  Divides by ``N - ddof`` as NumPy (``nan`` or
    ``inf`` with a RuntimeWarning when that is not positive).  The dtype
    follows ``numpy.var``: float64 for integers, real for complex.
``std``
    ``sqrt(var)``.
``argmax`` / ``argmin`` (axis int or None)
    Two passes: the extreme value along ``axis`` (partial max/min, reduced),
    then each rank's first index (global) where its block reaches it, and a
    min-reduction of those indices: the first occurrence, as NumPy; a NaN
    counts as the extreme (NumPy returns the first NaN).  One temporary
    bool block.  ``axis=None`` indexes the flattened (C order) array.
    Complex arrays are not supported over a sharded dim.
"""

import numpy as np

from ..core.backend import array_module
from ..core.errors import ShapeError
from ..core.layout import Layout
from . import ops
from .base import DistArrayBase
from .broadcast import array_ufunc, this_block

__all__ = ["var", "std", "argmax", "argmin"]


def _dist(a, what):
    if not isinstance(a, DistArrayBase):
        raise ops.OperandError(f"{what}: expected a DistArray, found {type(a).__name__}")
    return ops.reduce(a) if a.layout.partial else a


def var(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
    """Variance over ``axis`` (collective); see the module docstring."""
    ops._no_out(out, "var")
    a = _dist(a, "var")
    dims = ops._normalise_axes(axis, a.ndim, "var")
    count = 1
    for d in dims:
        count *= a.shape[d]
    m = ops.reduce(ops.mean(a, dims, dtype=dtype, keepdims=True))
    dev = array_ufunc(None, np.subtract, "__call__", a, m)       # same layout: local
    xp = array_module(dev.local)
    loc = dev.local
    if np.dtype(loc.dtype).kind == "c":
        sq = loc.real * loc.real
        sq += loc.imag * loc.imag
    else:
        sq = loc * loc
    del dev, loc
    sq = type(a)(sq, a.shape, a.layout, a.mesh)
    s = ops.reduce(ops.sum(sq, dims, keepdims=keepdims))
    with np.errstate(invalid="ignore", divide="ignore"):
        div = max(count - ddof, 0)
        if div == 0:
            import warnings
            warnings.warn("Degrees of freedom <= 0 for slice", RuntimeWarning, stacklevel=2)
        local = xp.true_divide(s.local, div, dtype=s.local.dtype)
    return type(a)(xp.asarray(local), s.shape, s.layout, s.mesh)


def std(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
    """Standard deviation: ``sqrt(var(a, axis, ddof))`` (collective)."""
    v = var(a, axis, dtype, out, ddof, keepdims)
    xp = array_module(v.local)
    return type(v)(xp.asarray(xp.sqrt(v.local)), v.shape, v.layout, v.mesh)


def argmax(a, axis=None, out=None, keepdims=False):
    """Index of the first maximum along ``axis`` (collective)."""
    _no_keep(out, keepdims, "argmax")
    return _arg(a, axis, "max")


def argmin(a, axis=None, out=None, keepdims=False):
    """Index of the first minimum along ``axis`` (collective)."""
    _no_keep(out, keepdims, "argmin")
    return _arg(a, axis, "min")


def _no_keep(out, keepdims, what):
    ops._no_out(out, what)
    if keepdims:
        raise ops.OperandError(f"{what}(..., keepdims=True) is not supported on a DistArray")


def _arg(a, axis, op):
    what = f"arg{op}"
    a = _dist(a, what)
    if axis is None:
        dims = tuple(range(a.ndim))
    else:
        dims = ops._normalise_axes(axis, a.ndim, what)
    if any(a.shape[d] == 0 for d in dims) or (axis is None and 0 in a.shape):
        raise ShapeError(f"{what}: attempt to get {what} of an empty sequence "
                         f"(shape {a.shape}, axis {axis})")
    sharded = any(a.layout.dims[d] for d in dims)
    if sharded and np.dtype(a.dtype).kind == "c":
        raise ShapeError(f"{what}: complex dtype {a.dtype} over a sharded dim "
                         f"(layout {a.layout}) is not supported")
    xp = array_module(a.local)
    local = a.local
    box = this_block(a.shape, a.layout, a.mesh)
    ext = ops.reduce(ops._reduce(a, dims, op, True, None, what))   # kept dims stay sharded
    e = ext.local
    hit = local == e
    if np.dtype(local.dtype).kind in "fc":
        # MPI's max/min drop NaNs: find the NaNs with a max of their own
        isnan = xp.isnan(local)
        nans = type(a)(isnan, a.shape, a.layout, a.mesh)
        nan_ext = ops.reduce(ops._reduce(nans, dims, "max", True, None, what)).local
        hit = xp.where(nan_ext, isnan, hit)
        del nans, isnan
    big = np.iinfo(np.int64).max
    if axis is None:
        if hit.size and hit.any():
            first = np.unravel_index(int(xp.argmax(hit.ravel())), hit.shape)
            idx = np.ravel_multi_index(tuple(int(f) + lo for f, (lo, _) in zip(first, box)),
                                       a.shape)
        else:
            idx = big
        cand = xp.asarray(np.int64(idx))
        shape, kept = (), Layout(())
    else:
        d = dims[0]
        if hit.shape[d]:
            first = xp.argmax(hit, axis=d).astype(np.int64) + box[d][0]
            cand = xp.where(hit.any(axis=d), first, big).astype(np.int64)
        else:           # an empty block along d: no candidate
            cand = xp.full(hit.shape[:d] + hit.shape[d + 1:], big, dtype=np.int64)
        shape = tuple(n for k, n in enumerate(a.shape) if k != d)
        kept = Layout(tuple(g for k, g in enumerate(a.layout.dims) if k != d))
    partial = tuple(x for d in dims for x in a.layout.dims[d])
    lay = Layout(kept.dims, partial, "min") if partial else kept
    out = type(a)(xp.asarray(cand), shape, lay, a.mesh)
    out = ops.reduce(out) if partial else out
    return type(a)(out.local.astype(np.intp, copy=False), out.shape, out.layout, out.mesh)
