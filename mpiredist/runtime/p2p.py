"""Point-to-point parts in a pipeline, packed within two bounded rings.

The one point-to-point engine under every move of the runtime: the
exchange (:mod:`mpiredist.runtime.exchange`) and the one-buffer swaps and
permutes (:mod:`mpiredist.runtime.steps`) hand it two sequences of parts.

Rounds with one ``Waitall`` each make every rank wait for its slowest peer
once per round: at 8 ranks on 2 cores, c01 with the default workspace took
14.4 ms in three rounds against 9.3 ms in one.  Here sends and receives are
each one sequence of parts, posted in order as soon as there is room:

* a part given as a message (a contiguous stretch of its array, or a
  :class:`~mpiredist.runtime.transport.Strided` box) is posted at its turn
  and needs no room;
* a part given as an array view is packed into the send ring, or received
  into the receive ring and unpacked as soon as it arrives (the rings may
  be host memory and the views device memory: a device run staged through
  the host, :func:`mpiredist.core.backend.copy_into`);
* when the next part does not fit its ring, the rank waits for *any* of its
  posted parts to finish (the group's ``wait_some``, which yields the CPU),
  unpacks what arrived, and frees ring space oldest first;
* in place (``paired``), what arrives waits in the receive ring until the
  sends that read its place have released it.

Both ends of every message post it at the same place in their sequence
relative to the other messages between them (callers order parts by
``(part index, peer offset)``, which both ends compute), so the transport's
non-overtaking order (:mod:`mpiredist.runtime.transport`) matches every
send with its receive.
No deadlock: the incomplete message with the smallest key has every earlier
part of both its ends finished, so both rings have room for it (in place,
the receiver's earlier sends have finished too, so what waited in its ring
has been applied and freed: send i and receive i of a rank share a key).
"""

from collections import deque

from ..core.backend import copy_into, on_device_of, synchronize

__all__ = ["Ring", "Part", "run", "posted_within", "objects_bytes"]

# Posted and unfinished parts per side, at most: each holds Python objects
# and an MPI request, and tiny parts (a low count limit) would otherwise put
# thousands in flight at once.  A caller with a smaller margin for them
# passes fewer (:func:`posted_within`): POSTED_BYTES per part and side, from
# a measurement (a staged device run of 4 KiB parts, W = 128 KiB, 2 ranks:
# traced host memory 114 KB with 2 parts in flight a side, 162 KB with 16,
# about 1.7 KB a part and side), with room to spare.
MAX_POSTED = 32
POSTED_BYTES = 3 << 10
# Python objects of a move while it runs, beside its parts in flight: a
# fixed part (CALL_BYTES) and one per piece that makes messages
# (PIECE_BYTES: its parts' generator and place in the order).  Measured on
# the same staged run with 2 parts in flight a side: 19.8 KB of objects at 2
# ranks, 23.1 KB at 4, 30.7 KB at 8 (2, 6 and 14 such pieces), about 0.9 KB a
# piece and 15 KB besides; with room to spare.
CALL_BYTES = 16 << 10
PIECE_BYTES = 1 << 10


def posted_within(margin, pieces=0):
    """Parts per side in flight whose Python objects fit ``margin`` bytes beside
    those of a move of ``pieces`` pieces (2 at least, :data:`MAX_POSTED` at
    most)."""
    margin -= objects_bytes(pieces, 0)
    return max(2, min(MAX_POSTED, margin // (2 * POSTED_BYTES)))


def objects_bytes(pieces, posted):
    """Bytes for the Python objects of a move of ``pieces`` pieces with ``posted``
    parts in flight a side: what a caller keeps beside its rings."""
    return CALL_BYTES + pieces * PIECE_BYTES + 2 * posted * POSTED_BYTES


class Part:
    """One message, or one local value in the order of the receives.

    ``peer`` and either ``spec`` (a message of the transport: a contiguous
    array or a Strided box, sent or received as is) or ``view`` (an array to pack from, or to unpack into; or a tuple
    of arrays, packed one after another).  A received ``view`` takes the
    data by ``combine(view, data)`` when given (e.g. a reduction into it),
    else by copy.  ``value``: no message; at its turn among the receives,
    ``value`` (an array, or a tuple like ``view``) goes into ``view`` the
    same way (a rank's own piece, combined in order with the others).
    """

    __slots__ = ("peer", "spec", "view", "combine", "value")

    def __init__(self, peer, spec=None, view=None, combine=None, value=None):
        self.peer, self.spec, self.view = peer, spec, view
        self.combine, self.value = combine, value

    def __repr__(self):
        what = "spec" if self.spec is not None else f"{size(self.view)} elements"
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


def run(group, sends, recvs, send_buffer, recv_buffer, paired=False, posted=MAX_POSTED):
    """Post ``sends`` and ``recvs`` (iterables of :class:`Part`, read as they
    are posted) in order; return, when all have finished, the number of
    messages posted (sends and receives).

    ``send_buffer`` and ``recv_buffer`` are 1-D arrays of the element type
    (or None where no part of that side is packed); a packed part must be
    no larger than its buffer.

    ``paired``: in-place moves (no local values among the receives), where
    receive i overwrites only what sends 0..i read.  Its data enters its
    place only once sends 0..i have *released* theirs: a packed send at
    packing, a straight one (a ``spec``) when it has finished.  A receive
    through the ring may arrive earlier and waits there; a straight receive
    is posted only after the release, so it needs packed sends (a straight
    send and a straight receive of one place would wait for each other
    around a cycle of ranks).  Straight sends and ring receives are the
    fast pairing: every send is posted at once, and each byte is copied
    once, from the ring into its place (8 MiB permute at 8 ranks on 2
    cores: 4.6-5.7 ms against 7.6-8.3 packing every send).  Progress holds
    when send i and receive i of a rank carry the same place in the order
    of messages, as pairwise swaps and permutes in parts do.
    """
    state = _State(group, send_buffer, recv_buffer, paired, posted)
    sends, recvs = _Ahead(sends), _Ahead(recvs)
    while True:
        for _ in range(2):          # receives first: posted receives let senders go
            while recvs and state.may_post(recvs.head) and state.post_recv(recvs.head):
                recvs.advance()
            while sends and state.post_send(sends.head):
                sends.advance()
            state.all_sent = not sends
        if not sends and not recvs:
            state.finish()
            return state.posted
        if not state.requests:
            raise ValueError(f"nothing in flight, and the next part does not fit its ring: "
                             f"{sends.head if sends else recvs.head}")
        state.wait_some()


class _Ahead:
    """An iterator with its next item in view: parts are made as they are
    posted, never all at once (a rank may have thousands; their Python
    objects count against the memory bound too)."""

    def __init__(self, items):
        self._items = iter(items)
        self.advance()

    def advance(self):
        self.head = next(self._items, None)

    def __bool__(self):
        return self.head is not None


class _Recv:
    """A posted receive (or local value) waiting to be applied in order."""

    __slots__ = ("part", "data", "ring", "entry", "done", "index")

    def __init__(self, part, data=None, ring=None, entry=None, done=False, index=0):
        self.part, self.data, self.ring, self.entry, self.done = part, data, ring, entry, done
        self.index = index

    def apply(self):
        views, data = self.part.view, self.data
        if views is not None and data is not None:
            if isinstance(data, tuple):
                pairs = zip(views, data)            # local values, one per view
            elif isinstance(views, tuple):
                pairs = _spans(views, data)         # one packed stretch
            else:
                pairs = [(views, data)]
            for view, value in pairs:
                value = value.reshape(view.shape)
                if self.part.combine is None:
                    copy_into(view, value)          # host or device, either way
                else:
                    self.part.combine(view, on_device_of(view, value))
                synchronize(view)   # a GPU unpack must end before the span is reused
        if self.ring is not None:
            self.ring.done(self.entry)


class _Send:
    """A posted send: the ring span it frees, and whether its place is released
    (its data packed, or for a straight send, the send finished)."""

    __slots__ = ("ring", "entry", "released")

    def __init__(self, ring=None, entry=None, released=False):
        self.ring, self.entry, self.released = ring, entry, released


class _State:
    """Posted parts: requests with what finishing them frees or fills.

    Receives are applied (unpacked, combined) strictly in posting order, so
    combinations are deterministic; rings free oldest first anyway, so this
    holds no space longer than the ring would.
    """

    def __init__(self, group, send_buffer, recv_buffer, paired=False, posted=MAX_POSTED):
        self.group, self.paired = group, paired
        self.most = posted                      # parts in flight per side, at most
        self.rings = {}
        for side, buffer in (("send", send_buffer), ("recv", recv_buffer)):
            if buffer is not None:
                self.rings[side] = (Ring(buffer.size), buffer)
        self.requests, self.tokens = [], []     # token: _Recv or _Send
        self.arrived = deque()                  # _Recv in posting order
        self.received = 0                       # receives posted
        self.sent = 0                           # sends posted
        self.holding = deque()                  # _Send not yet released, in posting order
        self.released = 0                       # leading sends whose place is free
        self.all_sent = False                   # every send posted
        self.flying = {"send": 0, "recv": 0}    # posted, not yet seen finished
        self.posted = 0                         # messages posted in all

    def may_post(self, part):
        """False while a paired straight receive must wait for its place."""
        if not self.paired or part.spec is None:
            return True
        if self.received < self.released:
            return True
        head = self.received - self.released
        if head < len(self.holding) and self.holding[head].ring is None:
            raise ValueError("paired run: a straight receive over a straight send "
                             f"(receive {self.received}) would wait around a cycle of ranks")
        return False

    def _room(self, side, count):
        if side not in self.rings:
            return None
        ring, buffer = self.rings[side]
        got = ring.take(count)
        if got is None:
            return None
        start, entry = got
        return ring, entry, buffer[start:start + count]

    def post_recv(self, part):
        index = self.received
        if part.value is not None:
            self.arrived.append(_Recv(part, part.value, done=True, index=index))
            self.received += 1
            self._drain()
            return True
        if self.flying["recv"] >= self.most:
            return False
        if part.spec is not None:
            token = _Recv(part, index=index)
            self._add(self.group.irecv(part.spec, part.peer), token)
        else:
            room = self._room("recv", size(part.view))
            if room is None:
                return False
            ring, entry, packed = room
            token = _Recv(part, packed, ring, entry, index=index)
            self._add(self.group.irecv(packed, part.peer), token)
        self.arrived.append(token)
        self.received += 1
        return True

    def post_send(self, part):
        if self.flying["send"] >= self.most:
            return False
        # Past the first ``most`` sends, synchronous sends: a small part goes
        # eagerly, completes at once and would let a sender run ahead into its
        # receivers' MPI buffers (unexpected messages, outside the rings): with
        # 4 KiB parts at 8 ranks a donated swap grew RSS by 8-18 MB against a
        # 3 MiB bound.  The first ones stay eager: a small move is one message a
        # peer, and a handshake each would cost it a round trip.
        sync = self.sent >= self.most
        if part.spec is not None:
            token = _Send()
            self._add(self.group.isend(part.spec, part.peer, sync), token)
        else:
            room = self._room("send", size(part.view))
            if room is None:
                return False
            ring, entry, packed = room
            for view, span in _spans(part.view, packed):
                copy_into(span.reshape(view.shape), view)   # a device part into a host ring too
            synchronize(packed)
            token = _Send(ring, entry, released=True)
            self._add(self.group.isend(packed, part.peer, sync), token)
        self.sent += 1
        if self.paired:                 # only in place does a release order anything
            self.holding.append(token)
            self._release()
        return True

    def _release(self):
        while self.holding and self.holding[0].released:
            self.holding.popleft()
            self.released += 1

    def _add(self, request, token):
        self.posted += 1
        self.requests.append(request)
        self.tokens.append(token)
        self.flying["recv" if isinstance(token, _Recv) else "send"] += 1

    def wait_some(self):
        """Wait until some posted part has finished (the group's ``wait_some``)."""
        done = set(self.group.wait_some(self.requests))
        for i in done:
            self._finished(self.tokens[i])
        keep = [i for i in range(len(self.requests)) if i not in done]
        self.requests = [self.requests[i] for i in keep]
        self.tokens = [self.tokens[i] for i in keep]
        self._drain()

    def finish(self):
        """Everything is posted: wait for the rest at once, then apply it."""
        self.group.wait_all(self.requests)
        for token in self.tokens:
            self._finished(token)
        self.requests, self.tokens = [], []
        self._drain()

    def _finished(self, token):
        if isinstance(token, _Recv):
            self.flying["recv"] -= 1
            token.done = True
            return
        self.flying["send"] -= 1
        token.released = True
        if token.ring is not None:
            token.ring.done(token.entry)
        self._release()

    def _drain(self):
        while self.arrived and self.arrived[0].done and self._free(self.arrived[0]):
            self.arrived.popleft().apply()

    def _free(self, token):
        """True when ``token``'s place may be written (always, unless paired;
        then once sends 0..index have released theirs, or all sends have)."""
        return (not self.paired or token.index < self.released
                or self.all_sent and not self.holding)


def size(view):
    """Elements of an array, or of a tuple of arrays."""
    return sum(v.size for v in view) if isinstance(view, tuple) else view.size


def _spans(view, flat):
    """``(array, its stretch of flat)`` for an array or each of a tuple of arrays."""
    if not isinstance(view, tuple):
        return [(view, flat[:view.size])]
    out, at = [], 0
    for v in view:
        out.append((v, flat[at:at + v.size]))
        at += v.size
    return out

