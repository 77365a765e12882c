"""Run an exchange between any two sets of blocks, in rounds (point to point).

The pieces and the rounds are those of :mod:`mpiredist.planning.exchange`.
Construction is collective over the communicator: one Allreduce agrees on
the most peers and the largest piece, which fix the segment size and the
number of rounds.  Each round every rank posts its receives (into one
receive buffer), packs and sends its segments (from one send buffer), waits,
then combines what arrived into the target block in the agreed order.  A
segment that is one contiguous stretch of the source or target block is sent
from or received into the block itself, without packing.  Ranks outside
both meshes only take part in the construction.

Memory: the target block, plus at most ``W // 2`` for each buffer.
"""

import numpy as np

from ..core.backend import array_module, synchronize
from ..core.blocks import box_size, sub_index
from ..planning.exchange import REDUCERS, plan_rounds, rounds, segment_boxes, segment_items
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
        """Fill ``out`` (this rank's target block, or None) from ``local`` (or None)."""
        xp = array_module(out if out is not None else local) if (
            out is not None or local is not None) else np
        buffers = {"xp": xp}
        for r in range(self.local_rounds):
            if r < self.rounds:
                self._round(r, local, out, buffers)
            else:
                self._combine(r, local, out, None, {})

    def _buffer(self, buffers, which):
        """The send or receive buffer, made when a segment first needs packing."""
        if which not in buffers:
            pieces = self.sends if which == "send" else self.recvs
            n = sum(min(box_size(x.box), self.segment) for x in pieces
                    if x.peer != self.rank and not x.direct)
            buffers[which] = buffers["xp"].empty(n, self.dtype)
        return buffers[which]

    def _round(self, r, local, out, buffers):
        requests, direct = [], {}
        at = 0
        for i, x in enumerate(self.recvs):
            if x.peer == self.rank:
                continue
            subs = segment_boxes(x.box, r, self._seg(x))
            if not subs:
                continue
            n = sum(box_size(b) for b in subs)
            target = self._direct(out, self.dst_box, x, r) if not i or self._first(i) \
                else None
            if target is None:
                recvbuf = self._buffer(buffers, "recv")
                target, direct[i] = recvbuf[at:at + n], at
                at += n
            else:
                direct[i] = None
            requests.append(self.comm.Irecv(self._bytes(target), x.peer, TAG))
        at = 0
        pending = []
        for x in self.sends:
            if x.peer == self.rank:
                continue
            subs = segment_boxes(x.box, r, self._seg(x))
            if not subs:
                continue
            view = self._direct(local, self.src_box, x, r)
            if view is None:
                view = self._buffer(buffers, "send")[at:at + sum(box_size(b) for b in subs)]
                at += view.size
                self._pack(local, subs, view)
            pending.append((view, x.peer))
        if pending:
            synchronize(pending[0][0])
        for view, peer in pending:
            requests.append(self.comm.Isend(self._bytes(view), peer, TAG))
        self.MPI.Request.Waitall(requests)
        self._combine(r, local, out, buffers.get("recv"), direct)

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

    def _pack(self, block, subs, flat):
        at = 0
        for sub in subs:
            view = block[sub_index(self.src_box, sub)]
            flat[at:at + view.size].reshape(view.shape)[...] = view
            at += view.size

    def _combine(self, r, local, out, recvbuf, direct):
        """Copy or combine segment ``r`` of every received piece into ``out``, in order."""
        done = set()
        for i, x in enumerate(self.recvs):
            subs = segment_boxes(x.box, r, self._seg(x))
            if not subs:
                continue
            if x.peer == self.rank:
                values = [local[sub_index(self.src_box, b)] for b in subs]
            elif direct.get(i) is None:
                done.update(subs)
                continue
            else:
                values, at = [], direct[i]
                for b in subs:
                    n = box_size(b)
                    values.append(recvbuf[at:at + n].reshape(tuple(y - x for x, y in b)))
                    at += n
            for b, value in zip(subs, values):
                target = out[sub_index(self.dst_box, b)]
                if b in done:
                    self.reduce(target, value, out=target)
                else:
                    target[...] = value
                    done.add(b)
