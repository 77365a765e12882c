"""One exchange between arbitrary boxes, for the array operations (collective).

``reshape``, slicing and ``concatenate`` each describe what every rank holds
and must end with as boxes of one index space (global ``(start, stop)`` per
dim), and :func:`exchange_into` moves the data by the one exchange of the
runtime (:class:`mpiredist.runtime.exchange.Exchange`, the piece model of
:mod:`mpiredist.planning.pieces`): every rank allocates nothing but the
rings of at most W, and the caller's result block.  Every rank calls it
with the same entries; they come from agreed shapes and layouts only, so
the call makes no agreement of its own and no communicator: it runs on the
library's duplicate of the mesh's communicator.
"""

from ..planning.pieces import Target, box_sources, exchange_workspace, layout_sources
from ..runtime.comm import base_comm, library_comm
from ..runtime.context import Context
from ..runtime.exchange import Exchange
from ..runtime.failure import guard

__all__ = ["exchange_into", "source_entries", "shifted"]


def source_entries(shape, mesh, layout):
    """``(box, class)`` of every communicator rank for ``layout`` (None off the mesh)."""
    return [None if s is None else (s.box, s.cls)
            for s in layout_sources(shape, mesh, layout, base_comm(mesh).Get_size())]


def shifted(box, dim, offset):
    """``box`` with ``dim`` moved by ``offset``."""
    return box[:dim] + ((box[dim][0] + offset, box[dim][1] + offset),) + box[dim + 1:]


def exchange_into(mesh, dtype, src, dst, local, out, op="sum", workspace=None, whole=False):
    """Fill ``out`` (this rank's target box, or None) from ``local`` (collective).

    ``src``: per communicator rank ``(box, class)`` or None; ``dst``: per
    rank a box or None (classes are combined).  ``local`` and ``out`` are
    this rank's arrays of those boxes' shapes: views are allowed unless
    ``whole`` (every rank's are whole C-contiguous arrays, and contiguous
    pieces go unbuffered).  Returns the bytes this rank sent.
    """
    sources = box_sources(src)
    targets = [None if b is None else Target(b, None) for b in dst]
    if workspace is None:
        workspace = exchange_workspace(sources, targets, dtype.itemsize)
    base = base_comm(mesh)
    ctx = Context(library_comm(base), dtype)
    try:
        ex = Exchange(ctx, sources, targets, workspace, op, views=not whole)
        guard(base, "an exchange of the array operations", ex.run, local, out)
        return ex.bytes_sent
    finally:
        ctx.free()
