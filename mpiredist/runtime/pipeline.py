"""Point-to-point parts in a pipeline, packed within two bounded rings.

Rounds with one ``Waitall`` each make every rank wait for its slowest peer
once per round: at 8 ranks on 2 cores, c01 with the default workspace took
14.4 ms in three rounds against 9.3 ms in one.  Here sends and receives are
each one sequence of parts, posted in order as soon as there is room:

* a part given as an MPI buffer spec (contiguous in its array, or a
  datatype) is posted at its turn and needs no room;
* a part given as an array view is packed into the send ring, or received
  into the receive ring and unpacked as soon as it arrives;
* when the next part does not fit its ring, the rank waits for *any* of its
  posted parts to finish (``Waitsome``), unpacks what arrived, and frees
  ring space oldest first.

Both ends of every message post it at the same place in their sequence
relative to the other messages between them (callers order parts by
``(part index, peer offset)``, which both ends compute), so MPI's
non-overtaking order matches every send with its receive under one tag.
No deadlock: the incomplete message with the smallest key has every earlier
part of both its ends finished, so both rings have room for it.
"""

import os
from collections import deque

from ..core.backend import synchronize

__all__ = ["Ring", "Part", "run"]

TAG = 0x6d72        # "mr": one tag for every part; order within a pair is MPI's


class Part:
    """One message: ``peer``, and either ``spec`` (an MPI buffer spec, sent or
    received as is) or ``view`` (an array to pack from, or unpack into)."""

    __slots__ = ("peer", "spec", "view")

    def __init__(self, peer, spec=None, view=None):
        self.peer, self.spec, self.view = peer, spec, view

    def __repr__(self):
        what = "spec" if self.spec is not None else f"view {tuple(self.view.shape)}"
        return f"Part(peer={self.peer}, {what})"


class Ring:
    """First-in first-out allocation of ``size`` elements of one buffer.

    :meth:`take` returns ``(start, entry)`` or None when ``count`` elements
    do not fit after the newest taken span; :meth:`done` marks an entry
    finished, and space comes back from the oldest end only, so a span is
    never reused while an older one is still in flight.
    """

    def __init__(self, size):
        self.size = size
        self.live = deque()         # [start, end, finished]

    def __repr__(self):
        return f"Ring(size={self.size}, live={len(self.live)})"

    def take(self, count):
        start = self._place(count)
        if start is None:
            return None
        entry = [start, start + count, False]
        self.live.append(entry)
        return start, entry

    def _place(self, count):
        if count > self.size:
            return None
        if not self.live:
            return 0
        oldest, newest = self.live[0][0], self.live[-1]
        if newest[0] >= oldest:                 # not wrapped: room at the end, then the start
            if newest[1] + count <= self.size:
                return newest[1]
            return 0 if count <= oldest else None
        return newest[1] if newest[1] + count <= oldest else None

    def done(self, entry):
        entry[2] = True
        while self.live and self.live[0][2]:
            self.live.popleft()


def run(MPI, comm, sends, recvs, send_buffer, recv_buffer, tag=TAG, paired=False):
    """Post ``sends`` and ``recvs`` (sequences of :class:`Part`) in order; return
    when all have finished.

    ``send_buffer`` and ``recv_buffer`` are 1-D arrays of the element type
    (or None where no part of that side is packed); a packed part must be
    no larger than its buffer.  ``paired``: in-place moves, where receive i
    overwrites only what sends 0..i read; receive i is posted only once
    send i has been packed (sends must then all be packed).  Progress holds
    when send i and receive i of a rank carry the same place in the order
    of messages, as pairwise swaps and permutes in parts do.
    """
    state = _State(MPI, comm, tag, send_buffer, recv_buffer)
    sends, recvs = deque(sends), deque(recvs)
    posted = 0
    while True:
        while recvs and (not paired or state.sent > posted) and state.post_recv(recvs[0]):
            recvs.popleft()
            posted += 1
        while sends and state.post_send(sends[0]):
            sends.popleft()
        while recvs and (not paired or state.sent > posted) and state.post_recv(recvs[0]):
            recvs.popleft()
            posted += 1
        if not state.requests:
            break
        if not sends and not recvs:
            state.finish()
            break
        state.wait_some()


class _State:
    def __init__(self, MPI, comm, tag, send_buffer, recv_buffer):
        self.MPI, self.comm, self.tag = MPI, comm, tag
        self.rings = {}
        for side, buffer in (("send", send_buffer), ("recv", recv_buffer)):
            if buffer is not None:
                self.rings[side] = (Ring(buffer.size), buffer)
        self.requests, self.after = [], []      # after: (ring, entry, view, packed) or None
        self.sent = 0                           # sends posted

    def _room(self, side, count):
        ring, buffer = self.rings[side]
        got = ring.take(count)
        if got is None:
            return None
        start, entry = got
        return ring, entry, buffer[start:start + count]

    def post_recv(self, part):
        if part.spec is not None:
            self._add(self.comm.Irecv(part.spec, part.peer, self.tag), None)
            return True
        room = self._room("recv", part.view.size)
        if room is None:
            return False
        ring, entry, packed = room
        self._add(self.comm.Irecv(_bytes(self.MPI, packed), part.peer, self.tag),
                  (ring, entry, part.view, packed))
        return True

    def post_send(self, part):
        if part.spec is not None:
            self._add(self.comm.Isend(part.spec, part.peer, self.tag), None)
            self.sent += 1
            return True
        room = self._room("send", part.view.size)
        if room is None:
            return False
        ring, entry, packed = room
        packed.reshape(part.view.shape)[...] = part.view
        synchronize(packed)
        self._add(self.comm.Isend(_bytes(self.MPI, packed), part.peer, self.tag),
                  (ring, entry, None, packed))
        self.sent += 1
        return True

    def _add(self, request, after):
        self.requests.append(request)
        self.after.append(after)

    def wait_some(self):
        """Wait until some posted part has finished, yielding the CPU between tests.

        Not ``Waitsome``: MPICH's ``Waitsome`` and ``Waitany`` do not yield
        while they poll, and with more ranks than cores the spinning ranks
        starve the ones they wait for (c01 at 8 ranks on 2 cores: 42 ms with
        ``Waitsome``, 7.7 ms with this loop).
        """
        while True:
            done = self.MPI.Request.Testsome(self.requests)
            if done:
                break
            os.sched_yield()
        done = set(done)
        for i in sorted(done):
            _settle(self.after[i])
        keep = [i for i in range(len(self.requests)) if i not in done]
        self.requests = [self.requests[i] for i in keep]
        self.after = [self.after[i] for i in keep]

    def finish(self):
        """Everything is posted: wait for the rest at once, then unpack."""
        self.MPI.Request.Waitall(self.requests)
        for after in self.after:
            _settle(after)
        self.requests, self.after = [], []


def _settle(after):
    if after is None:
        return
    ring, entry, view, packed = after
    if view is not None:
        view[...] = packed.reshape(view.shape)
        synchronize(view)       # a GPU unpack must end before the span is reused
    ring.done(entry)


def _bytes(MPI, packed):
    return [packed, packed.size * packed.itemsize, MPI.BYTE]
