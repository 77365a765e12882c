"""Distributed FFTs by transposition: local FFTs between redistributions.

An FFT along a dim needs the whole dim on each rank.  So: transform every dim
that is whole locally, then redistribute to make the remaining dims whole
(moving their mesh axes onto dims already transformed), and repeat.  On a 1-D
mesh this is the slab decomposition; on a 2-D mesh (``[{x}, {y}, {}]``) the
pencil decomposition.  Each redistribution is one planned collective step
(an all-to-all for even shapes) within the memory bound (docs/semantics.md).

Layouts, for a 1-D mesh ``x`` (the output stays transposed unless
``out_layout`` asks otherwise, as in FFTW's ``TRANSPOSED_OUT``)::

    fft2:   [{x}, {}]      ->  [{}, {x}]
    fftn3:  [{x}, {}, {}]  ->  [{}, {x}, {}]
    fftn:   [{x}, {y}, {}] ->  [{}, {x}, {y}]   (pencils on a 2-D mesh)

Results equal ``numpy.fft.fft2`` / ``fftn`` of the gathered array (same dtype:
complex64 for float32/complex64 input, else complex128).  Any number of
ranks, e.g. ``mpirun -n 4``; lengths need not divide evenly.
"""

import numpy as np

from ..core.backend import array_module
from ..core.errors import LayoutError, MeshError, ShapeError
from ..core.layout import Layout
from .base import DistArrayBase

__all__ = ["fft2", "ifft2", "fftn3", "ifftn3", "fftn", "ifftn", "fft_layouts"]


def fft_layouts(layout):
    """The sequence of ``(dims to transform locally, layout)`` steps (pure).

    Starting from ``layout``: transform the whole (unsharded) dims not yet
    transformed; then move the mesh axes of the last untransformed sharded
    dim onto the first transformed unsharded dim; repeat.  Returns a list of
    ``(dims, layout_in_which_they_are_transformed)``.

    >>> [(d, str(l)) for d, l in fft_layouts(Layout.parse("[{x}, {}, {}]"))]
    [((1, 2), '[{x}, {}, {}]'), ((0,), '[{}, {x}, {}]')]
    """
    layout = Layout.parse(layout)
    dims = [tuple(d) for d in layout.dims]
    done, steps = set(), []
    while len(done) < len(dims):
        now = tuple(d for d in range(len(dims)) if not dims[d] and d not in done)
        if not now:
            if not done:
                raise LayoutError(f"layout {layout} shards every dim; a distributed "
                                  "FFT needs at least one whole dim to start with")
            src = max(d for d in range(len(dims)) if d not in done)
            dst = min(d for d in done if not dims[d]) if any(not dims[d] for d in done) \
                else None
            if dst is None:
                raise LayoutError(f"layout {layout}: no transformed whole dim left "
                                  "to move mesh axes to; use fewer sharded dims")
            dims[dst], dims[src] = dims[src], ()
            continue
        steps.append((now, Layout(dims)))
        done.update(now)
    return steps


def _check(a, what, ndim=None, mesh_ndim=None, layout=None):
    if not isinstance(a, DistArrayBase):
        raise TypeError(f"{what}: expected a DistArray, found {type(a).__name__}")
    if a.ndim == 0:
        raise ShapeError(f"{what}: a 0-dimensional array has no dim to transform")
    if ndim is not None and a.ndim != ndim:
        raise ShapeError(f"{what}: expected a {ndim}-D array, found shape {a.shape}")
    if mesh_ndim is not None and len(a.mesh.axes) != mesh_ndim:
        raise MeshError(f"{what}: expected a {mesh_ndim}-D mesh, found mesh {a.mesh}")
    if a.layout.partial:
        raise LayoutError(f"{what}: layout {a.layout} holds partial results; "
                          "reduce them first (mpiredist.arrays.ops.reduce)")
    if layout is not None and a.layout != layout:
        raise LayoutError(f"{what}: expected layout {layout} (split along dim 0), "
                          f"found {a.layout}; redistribute first, e.g. "
                          f"a.redistribute('{layout}')")
    if any(n == 0 for n in a.shape):
        raise ShapeError(f"{what}: global shape {a.shape} has a zero-length dim; "
                         "an FFT needs at least one point per dim")


def _transform(a, inverse, norm, out_layout):
    DistArray = type(a)
    xp = array_module(a.local)
    fn = xp.fft.ifftn if inverse else xp.fft.fftn
    local, owned = a.local, False
    current = a.layout
    for dims, layout in fft_layouts(a.layout):
        if layout != current:
            moved = DistArray(local, a.shape, current, a.mesh).redistribute(
                layout, donate=owned)
            local, current = moved.local, layout
        local = fn(local, axes=dims, norm=norm) if local.size else \
            xp.empty(local.shape, dtype=_complex(local.dtype))
        owned = True
    out = DistArray(local, a.shape, current, a.mesh)
    if out_layout is not None and Layout.parse(out_layout) != current:
        out = out.redistribute(out_layout, donate=True)
    return out


def _complex(dtype):
    return np.result_type(dtype, np.complex64)


def fftn(a, out_layout=None, norm=None):
    """N-D FFT of a DistArray in any layout with at least one whole dim (collective).

    See the module docstring for the output layout; ``out_layout``
    redistributes the result (e.g. back to the input layout).
    """
    _check(a, "fftn")
    return _transform(a, False, norm, out_layout)


def ifftn(a, out_layout=None, norm=None):
    """Inverse of :func:`fftn` (collective); same layout rules."""
    _check(a, "ifftn")
    return _transform(a, True, norm, out_layout)


def _split0(ndim, mesh):
    name = mesh.names[0]
    return Layout(tuple((name,) if d == 0 else () for d in range(ndim)))


def fft2(a, out_layout=None, norm=None):
    """2-D FFT of a 2-D array split along dim 0 on a 1-D mesh (collective).

    Parameters
    ----------
    a : DistArray
        Global shape ``(n0, n1)``, layout ``[{x}, {}]`` on a mesh with one
        axis ``x``.
    out_layout : Layout or str, optional
        Redistribute the result to this layout (e.g. ``"[{x}, {}]"``).
    norm : {None, "backward", "ortho", "forward"}
        As in ``numpy.fft``.

    Returns
    -------
    DistArray
        ``numpy.fft.fft2`` of the global array, in layout ``[{}, {x}]``
        (split along dim 1) unless ``out_layout`` is given.

    Steps: FFT along dim 1 locally; redistribute to ``[{}, {x}]``
    (all-to-all); FFT along dim 0 locally.
    """
    _check(a, "fft2", 2, 1, _split0(2, a.mesh) if len(a.mesh.axes) == 1 else None)
    return _transform(a, False, norm, out_layout)


def ifft2(a, out_layout=None, norm=None):
    """Inverse of :func:`fft2`; input ``[{x}, {}]``, output ``[{}, {x}]``."""
    _check(a, "ifft2", 2, 1, _split0(2, a.mesh) if len(a.mesh.axes) == 1 else None)
    return _transform(a, True, norm, out_layout)


def fftn3(a, out_layout=None, norm=None):
    """3-D FFT of a 3-D array split along dim 0 on a 1-D mesh (slabs, collective).

    Input layout ``[{x}, {}, {}]``: FFT along dims 1 and 2 locally;
    redistribute to ``[{}, {x}, {}]`` (all-to-all); FFT along dim 0.

    Returns
    -------
    DistArray
        ``numpy.fft.fftn`` of the global array in layout ``[{}, {x}, {}]``
        unless ``out_layout`` is given.
    """
    _check(a, "fftn3", 3, 1, _split0(3, a.mesh) if len(a.mesh.axes) == 1 else None)
    return _transform(a, False, norm, out_layout)


def ifftn3(a, out_layout=None, norm=None):
    """Inverse of :func:`fftn3`; input ``[{x}, {}, {}]``, output ``[{}, {x}, {}]``."""
    _check(a, "ifftn3", 3, 1, _split0(3, a.mesh) if len(a.mesh.axes) == 1 else None)
    return _transform(a, True, norm, out_layout)
