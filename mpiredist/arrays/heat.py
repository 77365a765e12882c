"""HeAT-style split axes on a 1-D mesh, and ``resplit``.

HeAT describes a distributed array by one integer, ``split``: the array
dimension cut into contiguous chunks over all processes (``None``: every
process holds the whole array).  On a mesh with a single axis ``x`` that is
exactly a layout: ``split=d`` is ``x`` on dim ``d`` and nothing elsewhere::

    split=None, ndim=2   <->  [{}, {}]
    split=0,    ndim=2   <->  [{x}, {}]
    split=-1,   ndim=3   <->  [{}, {}, {x}]

The conversions are pure (no MPI); only :func:`resplit` and :func:`resplit_`
communicate.  Block boundaries follow docs/semantics.md (``ceil(N / P)`` per rank,
trailing ranks possibly empty), which is also what HeAT's ``chunk`` gives for
``N`` divisible by ``P``; for uneven lengths HeAT spreads the remainder over
the first ranks instead, so blocks may differ by a row from HeAT's.
"""

import operator

from . import ops
from ..core.errors import LayoutError, MeshError
from ..core.layout import Layout

__all__ = ["layout_for_split", "split_of", "split", "resplit", "resplit_", "heat_counts"]


def _ndim(ndim):
    try:
        n = operator.index(ndim)
    except TypeError:
        raise LayoutError(f"ndim must be an integer, found {ndim!r}") from None
    if n < 0:
        raise LayoutError(f"ndim must be non-negative, found {n}")
    return n


def _normalise_split(split, ndim):
    """``split`` as a dim index in ``range(ndim)``; negative counts from the end."""
    try:
        d = operator.index(split)
    except TypeError:
        raise LayoutError(f"split must be None or an integer dim, found {split!r}") from None
    if not -ndim <= d < ndim:
        raise LayoutError(f"split {d} is out of range for an array of {ndim} "
                          f"dimension(s); expected None or -{ndim} <= split < {ndim}"
                          if ndim else
                          f"split {d} is out of range for a 0-dimensional array; "
                          "expected None")
    return d % ndim


def layout_for_split(split, ndim, axis_name="x"):
    """Return the layout of a HeAT array split along ``split`` over ``axis_name``.

    Parameters
    ----------
    split : int or None
        The split dimension (negative counts from the end) or None for a
        replicated array.
    ndim : int
        Number of array dimensions.
    axis_name : str
        Name of the (single) mesh axis.

    Returns
    -------
    Layout

    Examples
    --------
    >>> str(layout_for_split(-1, 3, "x"))
    '[{}, {}, {x}]'
    >>> str(layout_for_split(None, 2, "x"))
    '[{}, {}]'
    """
    ndim = _ndim(ndim)
    if split is None:
        return Layout.replicated(ndim)
    d = _normalise_split(split, ndim)
    return Layout(tuple((axis_name,) if i == d else () for i in range(ndim)))


def split_of(layout, axis_name=None):
    """Return the HeAT split of ``layout`` (an int dim, or None if replicated).

    Parameters
    ----------
    layout : Layout or str
    axis_name : str, optional
        If given, the one sharding axis must be this one.

    Raises
    ------
    LayoutError
        If the layout has partial axes, shards more than one dim, or shards a
        dim over more than one mesh axis: HeAT cannot express it.

    Examples
    --------
    >>> split_of("[{}, {x}]")
    1
    >>> split_of("[{}, {}]") is None
    True
    """
    layout = Layout.parse(layout)
    if layout.partial:
        raise LayoutError(f"layout {layout} holds partial results over "
                          f"{list(layout.partial)}; a HeAT split cannot express it "
                          "(reduce it first)")
    sharded = [d for d, axes in enumerate(layout.dims) if axes]
    if len(sharded) > 1:
        raise LayoutError(f"layout {layout} shards dims {sharded}; a HeAT split "
                          "shards at most one dim")
    if not sharded:
        return None
    d = sharded[0]
    axes = layout.dims[d]
    if len(axes) != 1:
        raise LayoutError(f"layout {layout} shards dim {d} over mesh axes "
                          f"{list(axes)}; a HeAT split uses exactly one mesh axis")
    if axis_name is not None and axes[0] != axis_name:
        raise LayoutError(f"layout {layout} shards dim {d} over mesh axis "
                          f"{axes[0]!r}, expected {axis_name!r}")
    return d


def _axis_name(array, what):
    mesh = array.mesh
    if len(mesh.axes) != 1:
        raise MeshError(f"{what}: a HeAT split needs a 1-D mesh, but the array "
                        f"lives on mesh {mesh} with {len(mesh.axes)} axes; use "
                        "redistribute() with a layout instead")
    return mesh.names[0]


def split(array):
    """Return the HeAT split of ``array`` (local, no communication).

    Raises :class:`LayoutError` when the array's layout is not a HeAT split
    and :class:`MeshError` when its mesh is not 1-D.
    """
    return split_of(array.layout, _axis_name(array, "split"))


def resplit(array, axis=None):
    """Return ``array`` split along ``axis`` (None: replicated) (collective).

    The HeAT ``resplit``: ``array.redistribute(layout_for_split(axis, ...))``.
    ``array`` may also be a ``heat.DNDarray``: then the result is one too,
    with HeAT's own (balanced) distribution on ``axis``, moved by one
    mpiredist exchange within max(S, T) + W (a drop-in for ``heat.resplit``).
    ``array`` is not modified.  Needs a 1-D mesh, e.g. ``Mesh({"x": 4})``
    with ``mpirun -n 4``.  A partial ``array`` is reduced on the way.

    Raises
    ------
    MeshError
        The mesh has more than one axis.
    LayoutError
        ``axis`` is out of range.
    """
    if type(array).__module__.split(".")[0] == "heat":
        return _resplit_dndarray(array, axis)
    name = _axis_name(array, f"resplit(axis={axis!r})")
    dst = layout_for_split(axis, array.ndim, name)
    if array.layout.partial:
        return ops.reduce(array, dst)
    return array.redistribute(dst)


def heat_counts(n, size):
    """HeAT's lengths of a dim of ``n`` split over ``size`` processes (its
    ``chunk``: the remainder on the first processes)."""
    base, extra = divmod(n, size)
    return [base + (r < extra) for r in range(size)]


def _boxes(shape, split, lengths):
    """Per process: its box of a HeAT array split on ``split`` with ``lengths``."""
    if split is None:
        return [tuple((0, n) for n in shape)] * len(lengths)
    out, at = [], 0
    for k in lengths:
        out.append(tuple((at, at + k) if d == split else (0, n) for d, n in enumerate(shape)))
        at += k
    return out


def _resplit_dndarray(x, axis, workspace_bytes=None):
    """``heat.resplit`` of a ``heat.DNDarray``, moved by one mpiredist exchange
    from HeAT's own distribution (``lshape_map``, which need not be balanced)
    to HeAT's balanced one on ``axis``: memory max(S, T) + W per process,
    where HeAT's own needs twice the local data or more.  One agreement on
    the call, then a job of the one run path
    (:meth:`BoxExchange.from_boxes <mpiredist.runtime.between.BoxExchange.from_boxes>`)
    kept per group and call."""
    import heat as ht

    from ..core.backend import as_dtype, backend_of, dtype_text
    from ..core.caches import recent
    from ..planning.pieces import Source, Target
    from ..runtime.agree import agree, fingerprint
    from ..runtime.between import BoxExchange
    from ..runtime.groups import as_group, kept, library_group
    from ..runtime.run import run

    group = as_group(x.comm.handle)
    library_group(group)            # collective on first use
    size = group.size
    shape, split = tuple(x.gshape), x.split
    axis = None if axis is None else _normalise_split(axis, len(shape))
    lengths = None if split is None else [int(r[split]) for r in x.lshape_map.tolist()]
    dtype = as_dtype(x.larray.dtype)
    key = (shape, dtype_text(dtype), split, None if lengths is None else tuple(lengths), axis,
           workspace_bytes)
    agree(group, "heat resplit", None, {"key": fingerprint(key)})

    def make():
        src = _boxes(shape, split, lengths if lengths is not None else [0] * size)
        dst = _boxes(shape, axis, heat_counts(shape[axis], size) if axis is not None
                     else [0] * size)
        return BoxExchange.from_boxes(group, [Source(b, 0, b) for b in src],
                                        [Target(b, None) for b in dst], dtype, "sum",
                                        workspace_bytes, name="heat resplit")

    # kept per group: the same key on another one is another exchange
    job = recent(kept(group, "heat exchanges"), key, make, 32)
    local = x.larray.detach()
    (tensor,) = run(job, (local,), (None,), agreed=backend_of(local))
    return ht.DNDarray(tensor, shape, x.dtype, axis, x.device, x.comm, True)


def resplit_(array, axis=None):
    """In-place :func:`resplit`: ``array`` donates its block and is returned."""
    name = _axis_name(array, f"resplit_(axis={axis!r})")
    dst = layout_for_split(axis, array.ndim, name)
    if not array.layout.partial:
        return array.redistribute_(dst)
    # ops.reduce works around the planner's handling of min/max partials.
    new = ops.reduce(array, dst, donate=True)
    array._local, array._layout = new.local, new.layout
    return array
