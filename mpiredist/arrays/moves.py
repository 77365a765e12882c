"""One exchange between arbitrary boxes, for the array operations (collective).

``reshape``, slicing and ``concatenate`` each describe what every rank holds
and must end with as boxes of one index space (global ``(start, stop)`` per
dim), and :func:`exchange_into` moves the data in rounds
(:mod:`mpiredist.runtime.exchange`): every rank allocates nothing but the
buffers of at most W, and the caller's result block.  Every rank calls it
with the same entries; they come from shapes and layouts only.
"""

from ..planning.exchange import (exchange_workspace, holders_of, mesh_boxes, recv_pieces,
                                 send_pieces)
from ..runtime.comm import base_comm
from ..runtime.exchange import Exchange

__all__ = ["exchange_into", "source_entries", "shifted"]


def source_entries(shape, mesh, layout):
    """``(box, class)`` of every communicator rank for ``layout`` (None off the mesh)."""
    return mesh_boxes(shape, mesh, layout, base_comm(mesh).Get_size(), partial=True)


def shifted(box, dim, offset):
    """``box`` with ``dim`` moved by ``offset``."""
    return box[:dim] + ((box[dim][0] + offset, box[dim][1] + offset),) + box[dim + 1:]


def exchange_into(mesh, dtype, src, dst, local, out, op="sum", workspace=None, whole=False):
    """Fill ``out`` (this rank's target box, or None) from ``local`` (collective).

    ``src``: per communicator rank ``(box, class)`` or None; ``dst``: per
    rank a box or None.  ``local`` and ``out`` are this rank's arrays of
    those boxes' shapes: views are allowed unless ``whole`` (every rank's
    are whole C-contiguous arrays, and contiguous pieces go unbuffered).
    Returns the bytes this rank sent.
    """
    comm = base_comm(mesh)
    rank = comm.Get_rank()
    if workspace is None:
        workspace = exchange_workspace(src, dst, dtype.itemsize)
    holders = holders_of(src)
    mine = src[rank]
    ex = Exchange(comm, dtype, None if mine is None else mine[0], dst[rank],
                  send_pieces(rank, src, dst, holders), recv_pieces(rank, src, dst, holders),
                  workspace, op, direct=whole)
    try:
        ex.run(local, out)
        return ex.bytes_sent
    finally:
        ex.free()
