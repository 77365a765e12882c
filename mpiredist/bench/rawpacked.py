"""``raw_packed``: pack, one bare Alltoallv, unpack, with unbounded memory.

Beside ``raw`` (one bare collective on contiguous buffers) this reference
does the whole redistribution the simplest way: every rank packs all it
sends (its source block cut by every other rank's target block, the pieces
of the piece model, :mod:`mpiredist.planning.pieces`) into one buffer of up to S bytes,
runs one ``Alltoallv`` over the mesh, and unpacks into a new target block;
its own piece is copied directly (MPICH 5 copies a rank's own part of an
``Alltoallv`` at about 100 MB/s here: 20 ms for 2 MiB at 4 ranks, against
0.8 ms for 1 MiB to a peer).  It
allocates about S + 2T, above the memory contract: it shows what packing
costs without a bound, so that ``collectives`` / ``raw_packed`` is the price
of the bound and of the plan, and ``raw_packed`` / ``raw`` that of packing.
Partial sources are not covered (a reduction is no Alltoallv).
"""

import numpy as np

from ..core.blocks import box_shape, box_size, sub_index
from ..planning.pieces import Holders, layout_sources, layout_targets, recv_pieces, send_pieces

__all__ = ["RawPacked"]


def _counts(pieces, size, me):
    counts = np.zeros(size, np.int64)
    for x in pieces:
        if x.peer != me:
            counts[x.peer] += box_size(x.box)
    return counts


class RawPacked:
    """The ``raw_packed`` reference of one (shape, dtype, mesh, src, dst), collective.

    ``comm`` is the mesh's communicator (rank ``r`` is device ``r``).
    """

    def __init__(self, plan, comm):
        from ..runtime.mpi import mpi

        self._mpi, self.comm = mpi(), comm
        size, rank = comm.Get_size(), comm.Get_rank()
        src = layout_sources(plan.global_shape, plan.mesh, plan.src, size)
        dst = layout_targets(plan.global_shape, plan.mesh, plan.dst, size)
        holders = Holders(src)
        self.src_box, self.dst_box = src[rank].box, dst[rank].box
        self.dtype = np.dtype(plan.dtype)
        self.sends = send_pieces(rank, src, dst, holders)              # ordered by target
        self.recvs = sorted(recv_pieces(rank, src, dst, holders), key=lambda x: x.peer)
        item = self.dtype.itemsize
        self._scount, self._rcount = _counts(self.sends, size, rank) * item, \
            _counts(self.recvs, size, rank) * item
        self.bytes_sent = int(self._scount.sum())
        self.rank = rank

    def run(self, local, records=None):
        """Pack, Alltoallv, unpack; return the new target block (``records`` ignored)."""
        send = np.empty(int(self._scount.sum()) // self.dtype.itemsize, self.dtype)
        at = 0
        for x in self.sends:
            if x.peer == self.rank:
                continue
            view = local[sub_index(self.src_box, x.box)]
            send[at:at + view.size].reshape(view.shape)[...] = view
            at += view.size
        recv = np.empty(int(self._rcount.sum()) // self.dtype.itemsize, self.dtype)
        byte = self._mpi.BYTE
        self.comm.Alltoallv([send.view(np.uint8), (self._scount, _displs(self._scount)), byte],
                            [recv.view(np.uint8), (self._rcount, _displs(self._rcount)), byte])
        del send
        out = np.empty(box_shape(self.dst_box), self.dtype)
        at = 0
        for x in self.recvs:
            view = out[sub_index(self.dst_box, x.box)]
            if x.peer == self.rank:
                view[...] = local[sub_index(self.src_box, x.box)]
                continue
            view[...] = recv[at:at + view.size].reshape(view.shape)
            at += view.size
        return out

    def free(self):
        """Nothing to release (for the runner's uniform clean-up)."""


def _displs(counts):
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
