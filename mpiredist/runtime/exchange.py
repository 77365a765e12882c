"""Run an exchange between any two sets of blocks, segment by segment (point to point).

The pieces and the segments are those of :mod:`mpiredist.planning.exchange`.
Construction is collective over the communicator: one Allreduce agrees on
the most peers and the largest piece, which fix the segment size and the
number of segments.  A run posts every segment through the pipeline of
:mod:`mpiredist.runtime.pipeline` (packed into a send ring, received into a
receive ring and combined into the target block in the agreed order, as
soon as each arrives); a segment that is one contiguous stretch of the
source or target block is sent from or received into the block itself,
without packing.  Ranks outside both meshes only take part in the
construction.

Memory: the target block, plus at most ``W // 2`` for each ring.
"""

import numpy as np

from ..core.backend import array_module, synchronize
from ..core.blocks import box_size, sub_index
from ..planning.exchange import REDUCERS, plan_rounds, rounds, segment_boxes, segment_items
from . import pipeline
from .comm import mpi
from .counts import count_limit

__all__ = ["Exchange"]

TAG = 7


class Exchange:
    """One exchange, agreed and ready to run many times (collective construction).

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        Every rank of it constructs the Exchange and calls :meth:`run`.
    dtype : numpy dtype
    src_box, dst_box : tuple or None
        This rank's source and target boxes (global ``(start, stop)`` per dim).
    sends, recvs : list of Piece
        This rank's pieces (:func:`~mpiredist.planning.exchange.send_pieces`,
        :func:`~mpiredist.planning.exchange.recv_pieces`).
    workspace : int
        W: each of the send and receive buffers holds at most ``W // 2``.
    op : str
        How partial classes combine.
    direct : bool
        Whether ``local`` and ``out`` will be whole C-contiguous blocks of
        their boxes, so that *direct* pieces (one contiguous stretch at both
        ends) go whole, without a buffer.  Every rank must pass the same;
        False treats every piece as packed (views of larger arrays).
    """

    def __init__(self, comm, dtype, src_box, dst_box, sends, recvs, workspace, op="sum",
                 direct=True):
        MPI = mpi()
        self.MPI, self.comm = MPI, comm.Dup()
        self.rank = comm.Get_rank()
        self.dtype = np.dtype(dtype)
        self.src_box, self.dst_box = src_box, dst_box
        self.sends, self.recvs = list(sends), list(recvs)
        if not direct:
            self.sends = [x._replace(direct=False) for x in self.sends]
            self.recvs = [x._replace(direct=False) for x in self.recvs]
        self.reduce = REDUCERS[op]
        limit = count_limit(MPI)
        mine = np.array(plan_rounds(self.sends, self.recvs, self.rank, workspace // 2,
                                    self.dtype.itemsize, limit), np.int64)
        most = np.empty_like(mine)
        self.comm.Allreduce(mine, most, op=MPI.MAX)
        self.peers, largest, direct_rounds = (int(v) for v in most)
        self.segment = segment_items(max(1, workspace // 2), self.dtype.itemsize, self.peers,
                                     limit)
        self.whole = max(1, limit // self.dtype.itemsize)     # a direct piece's segment
        self.room = max(1, workspace // 2) // self.dtype.itemsize   # elements per ring
        self.rounds = max(rounds(largest, self.segment), direct_rounds)
        own = [rounds(box_size(x.box), self._seg(x)) for x in self.recvs
               if x.peer == self.rank]
        self.local_rounds = max(own + [self.rounds])

    def _seg(self, piece):
        """Items per segment of ``piece``: whole (within the count limit) if direct."""
        return self.whole if piece.direct else self.segment

    @property
    def bytes_sent(self):
        """Bytes this rank sends to other ranks per run."""
        return sum(box_size(x.box) for x in self.sends if x.peer != self.rank) \
            * self.dtype.itemsize

    def free(self):
        if self.comm is not None:
            self.comm.Free()
            self.comm = None

    def run(self, local, out):
        """Fill ``out`` (this rank's target block, or None) from ``local`` (or None).

        Segments go through :func:`mpiredist.runtime.pipeline.run`: sends in
        the order (segment, target, box, class) and receives in the order
        (segment, box, class), which both ends of every message share, so
        the pipeline progresses; receives (and this rank's own pieces, at
        their place) are combined in that order, classes of a box in class
        order, so replicated results are bitwise equal.
        """
        arrays = [a for a in (out, local) if a is not None]
        xp = array_module(arrays[0]) if arrays else np
        if local is not None:
            synchronize(local)
        sends = sorted((x for x in self.sends if x.peer != self.rank),
                       key=lambda x: (x.peer, x.box, x.cls))
        packed_in = [x for i, x in enumerate(self.recvs) if x.peer != self.rank and (
            i and not self._first(i) or self._packs(out, self.dst_box, x))]
        packed_out = [x for x in sends if self._packs(local, self.src_box, x)]
        rooms = [min(self.room, sum(min(box_size(x.box), self.segment) for x in pieces))
                 for pieces in (packed_out, packed_in)]
        buffers = [xp.empty(n, self.dtype) if n else None for n in rooms]
        pipeline.run(self.MPI, self.comm, self._send_parts(sends, local),
                     self._recv_parts(local, out), *buffers, tag=TAG)

    def _send_parts(self, sends, local):
        for r in range(self.rounds):
            for x in sends:
                subs = segment_boxes(x.box, r, self._seg(x))
                if not subs:
                    continue
                view = self._direct(local, self.src_box, x, r)
                if view is not None:
                    yield pipeline.Part(x.peer, spec=self._bytes(view))
                else:
                    yield pipeline.Part(x.peer, view=tuple(
                        local[sub_index(self.src_box, b)] for b in subs))

    def _recv_parts(self, local, out):
        for r in range(self.local_rounds):
            for i, x in enumerate(self.recvs):
                subs = segment_boxes(x.box, r, self._seg(x))
                if not subs:
                    continue
                first = not i or self._first(i)
                combine = None if first else self._combine
                if x.peer == self.rank:
                    yield pipeline.Part(None, combine=combine,
                                        view=tuple(out[sub_index(self.dst_box, b)] for b in subs),
                                        value=tuple(local[sub_index(self.src_box, b)]
                                                    for b in subs))
                    continue
                target = self._direct(out, self.dst_box, x, r) if first else None
                if target is not None:
                    yield pipeline.Part(x.peer, spec=self._bytes(target))
                else:
                    yield pipeline.Part(x.peer, combine=combine, view=tuple(
                        out[sub_index(self.dst_box, b)] for b in subs))

    def _combine(self, target, value):
        self.reduce(target, value, out=target)

    def _packs(self, block, box, piece):
        """True if ``piece`` goes through a ring at this end: not one stretch of ``block``."""
        return not block[sub_index(box, piece.box)].flags.c_contiguous

    def _first(self, i):
        """True if piece ``i`` is the first of its part (nothing to combine it with)."""
        return self.recvs[i - 1].box != self.recvs[i].box

    def _direct(self, block, box, piece, r):
        """The block's memory of segment ``r`` of ``piece`` if the piece is one
        contiguous stretch of the block, else None (pack it)."""
        view = block[sub_index(box, piece.box)]
        if not view.flags.c_contiguous:
            if piece.direct:
                raise AssertionError("a direct piece of a non-contiguous block: the "
                                     "Exchange needs direct=False for views")
            return None
        s = self._seg(piece)
        return view.reshape(-1)[r * s:(r + 1) * s]

    def _bytes(self, flat):
        return [flat.view("u1"), self.MPI.BYTE]
