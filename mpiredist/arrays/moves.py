"""One exchange between arbitrary boxes, for the array operations (collective).

``reshape``, slicing and ``concatenate`` each describe what every rank holds
and must end with as boxes of one index space (global ``(start, stop)`` per
dim), and :func:`exchange_into` moves the data as a job of the one run path
(:meth:`BoxExchange.from_boxes <mpiredist.runtime.between.BoxExchange.from_boxes>`:
the piece model of :mod:`mpiredist.planning.pieces`): every rank allocates
nothing but the rings of at most W, and the caller's result block.  Every
rank calls it with the same entries; they come from agreed shapes and
layouts only, so the run makes no agreement of its own (``checked=False``)
and no group: it runs on the library's duplicate of the mesh's group.
"""

from ..planning.pieces import Target, box_sources, layout_sources
from ..runtime.between import BoxExchange
from ..runtime.groups import base_group
from ..runtime.run import run

__all__ = ["exchange_into", "source_entries", "shifted"]


def source_entries(shape, mesh, layout):
    """``(box, class)`` of every rank of the group for ``layout`` (None off the mesh)."""
    return [None if s is None else (s.box, s.cls)
            for s in layout_sources(shape, mesh, layout, base_group(mesh).size)]


def shifted(box, dim, offset):
    """``box`` with ``dim`` moved by ``offset``."""
    return box[:dim] + ((box[dim][0] + offset, box[dim][1] + offset),) + box[dim + 1:]


def exchange_into(mesh, dtype, src, dst, local, out, op="sum", workspace=None, whole=False):
    """Fill ``out`` (this rank's target box, or None) from ``local`` (collective).

    ``src``: per rank ``(box, class)`` or None; ``dst``: per rank a box or
    None (classes are combined).  ``local`` and ``out`` are this rank's
    arrays of those boxes' shapes: views are allowed unless ``whole``
    (every rank's are whole C-contiguous arrays, and contiguous pieces go
    unbuffered).  Returns the bytes this rank sent.
    """
    targets = [None if b is None else Target(b, None) for b in dst]
    job = BoxExchange.from_boxes(base_group(mesh), box_sources(src), targets, dtype, op,
                                   workspace, name="an exchange of the array operations",
                                   views=not whole)
    try:
        run(job, (local,), (out,))
        return job.bytes_sent
    finally:
        job.free()
