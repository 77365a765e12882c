"""Every rank as a thread of one process: a transport for tests, without MPI.

:func:`run` starts ``size`` threads, gives each a :class:`ThreadGroup` of a
shared :class:`ThreadWorld` and runs ``body(group)`` on every one; the plans,
exchanges and groups of mpiredist then run over it end to end, as they do
over MPI.  It proves the transport seam (:mod:`mpiredist.runtime.transport`):
nothing but this module knows that the ranks are threads.

Messages are matched per (group, sender, receiver) in posting order, and a
send finishes only when its receive is posted and the bytes are copied
(rendezvous, the strictest case: nothing is buffered), so a buffer reused
before its send finished shows.  The collectives are built from those
messages, reductions combined by numpy in rank order.  ``strided`` (default
False) says whether the group takes :class:`~mpiredist.runtime.transport.Strided`
messages, so that both of the engine's ways can be run.

A failure on one thread (an exception, or :meth:`ThreadGroup.abort`) ends
every other thread at its next wait with :class:`Aborted`; a thread still
running after ``timeout`` seconds fails :func:`run` (a deadlock).
"""

import threading
from collections import defaultdict, deque

import numpy as np

from .transport import Group, Strided, own_into_slot

__all__ = ["ThreadWorld", "ThreadGroup", "Aborted", "run"]


class Aborted(BaseException):
    """The job was aborted (by :meth:`ThreadGroup.abort` or a failing thread)."""


class _Request:
    __slots__ = ("done",)

    def __init__(self):
        self.done = False


class ThreadWorld:
    """The ranks' shared mailboxes; ``size`` threads, nodes as given."""

    def __init__(self, size, strided=False, nodes=None):
        self.size, self.strided = size, strided
        self.node_of = list(nodes) if nodes is not None else [0] * size
        self.cond = threading.Condition()
        self.sends = defaultdict(deque)     # (context, src, dst) -> (request, data)
        self.recvs = defaultdict(deque)     # (context, src, dst) -> (request, buffer)
        self.failed = None                  # the exception that aborted the job

    def post(self, kind, key, data):
        """Post a send (``data``: what to send) or a receive (``data``: where to)."""
        request = _Request()
        with self.cond:
            self._check()
            mine, other = (self.sends, self.recvs) if kind == "send" else (self.recvs, self.sends)
            if other[key]:
                peer, theirs = other[key].popleft()
                sent, into = (data, theirs) if kind == "send" else (theirs, data)
                _deliver(sent, into)
                request.done = peer.done = True
                self.cond.notify_all()
            else:
                mine[key].append((request, data))
        return request

    def wait(self, requests, every):
        """Wait until some (``every``: all) of ``requests`` are done."""
        with self.cond:
            while True:
                self._check()
                done = [i for i, r in enumerate(requests) if r.done]
                if done and (not every or len(done) == len(requests)) or not requests:
                    return done
                self.cond.wait(0.05)

    def abort(self, exc):
        with self.cond:
            if self.failed is None:
                self.failed = exc
            self.cond.notify_all()

    def _check(self):
        if self.failed is not None:
            raise Aborted(f"the job was aborted: {self.failed!r}")


def _bytes_of(data):
    """The elements of a message in C order, as flat bytes (a copy for a box)."""
    if type(data) is Strided:
        view = data.base[tuple(slice(s, s + n) for s, n in zip(data.starts, data.shape))]
        return np.ascontiguousarray(view).reshape(-1).view(np.uint8)
    return np.ascontiguousarray(data).reshape(-1).view(np.uint8)


def _deliver(sent, into):
    """Copy a send's bytes into a receive's buffer (a box, or a contiguous
    array), or hand over an object."""
    if type(sent) is _ObjectBox:
        into.cell[0] = sent.cell[0]
        return
    data = _bytes_of(sent)
    if type(into) is Strided:
        base = into.base
        view = base[tuple(slice(s, s + n) for s, n in zip(into.starts, into.shape))]
        if data.size != view.nbytes:
            raise ValueError(f"matched messages of {data.size} and {view.nbytes} bytes")
        view[...] = data.view(base.dtype).reshape(view.shape)
        return
    if not into.flags.c_contiguous:
        raise ValueError("a receive buffer must be C-contiguous")
    flat = into.reshape(-1).view(np.uint8)
    if data.size != flat.size:
        raise ValueError(f"matched messages of {data.size} and {flat.size} bytes")
    flat[...] = data


_COMBINE = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}
_LOGICAL = {"sum": np.logical_or, "max": np.logical_or, "min": np.logical_and,
            "prod": np.logical_and}


class ThreadGroup(Group):
    """A group of threads of one :class:`ThreadWorld` (see the module doc).

    ``members``: the world's thread of each rank of the group; ``context``
    keeps its messages apart from every other group's.
    """

    name = "threads"

    def __init__(self, world, members, rank, context=(0,)):
        super().__init__()
        self.world, self.members, self.rank = world, tuple(members), rank
        self.size, self.context = len(self.members), context
        self.strided = world.strided
        self._made = 0          # groups made from this one (split, dup), in call order

    # ---------------------------------------------------- point to point

    def isend(self, buf, peer, sync=False):
        return self.world.post("send", (self.context, self.rank, peer), buf)

    def irecv(self, buf, peer):
        return self.world.post("recv", (self.context, peer, self.rank), buf)

    def wait_some(self, requests):
        return self.world.wait(requests, False)

    def wait_all(self, requests):
        self.world.wait(requests, True)

    # ------------------------------------------------------- collectives

    def _exchange(self, parts_out, parts_in):
        """Send ``parts_out[m]`` to member m and receive ``parts_in[m]`` from it
        (None: nothing); this rank's own part is copied."""
        requests = []
        for k in range(1, self.size):
            dst, src = (self.rank + k) % self.size, (self.rank - k) % self.size
            if parts_in[src] is not None:
                requests.append(self.irecv(parts_in[src], src))
            if parts_out[dst] is not None:
                requests.append(self.isend(parts_out[dst], dst))
        me = self.rank
        if parts_out[me] is not None and parts_in[me] is not None:
            _deliver(parts_out[me], parts_in[me])
        self.wait_all(requests)

    def alltoall(self, send, recv):
        n = send.nbytes // self.size
        self.alltoallv(send, [n] * self.size, recv, [n] * self.size)

    def alltoallv(self, send, send_counts, recv, recv_counts):
        self._exchange(_cut(send, send_counts), _cut(recv, recv_counts))

    def allgather(self, own, out, counts):
        slots = _cut(out, counts)
        if own is not None and slots[self.rank] is not None:
            own_into_slot(slots[self.rank], own)
        self._exchange([slots[self.rank]] * self.size, slots)

    def allreduce(self, send, recv, op):
        mine = np.array(recv if send is None else send, copy=True).reshape(-1)
        parts = self.allgather_object(mine)
        recv.reshape(-1)[...] = _reduce(parts, op)

    def reduce_scatter(self, send, recv, counts, op):
        flat = send.reshape(-1)
        at = np.cumsum([0] + list(counts))
        mine = self.allgather_object([flat[at[m]:at[m + 1]].copy() for m in range(self.size)])
        result = _reduce([parts[self.rank] for parts in mine], op)
        (flat[:counts[self.rank]] if recv is None else recv.reshape(-1))[...] = result

    def sendrecv(self, send, dest, recv, source):
        requests = [self.irecv(recv, source), self.isend(send, dest)]
        self.wait_all(requests)

    def reduces(self, dtype):
        return np.dtype(dtype).char in "?bBhHiIlLqQfdgFDG"

    # ------------------------------------------------------- structure

    def split(self, colour, key):
        chosen = self.allgather_object((colour, key))
        self._made += 1
        mine = sorted((k, r) for r, (c, k) in enumerate(chosen) if c == colour)
        members = [self.members[r] for _, r in mine]
        rank = [r for _, r in mine].index(self.rank)
        return ThreadGroup(self.world, members, rank, self.context + (self._made, colour))

    def dup(self):
        self._made += 1
        return ThreadGroup(self.world, self.members, self.rank, self.context + (self._made,))

    # -------------------------------------------- agreement and failure

    def bitwise_or(self, words):
        out = np.zeros_like(words)
        for theirs in self.allgather_object(words.copy()):
            out |= theirs
        words[...] = out

    def allgather_object(self, obj):
        """Every rank's object (as it is: the ranks share one process)."""
        boxes = [[None] for _ in range(self.size)]
        boxes[self.rank][0] = obj
        requests = []
        for k in range(1, self.size):
            dst, src = (self.rank + k) % self.size, (self.rank - k) % self.size
            requests.append(self.world.post("recv", (self.context + ("obj",), src, self.rank),
                                            _ObjectBox(boxes[src])))
            requests.append(self.world.post("send", (self.context + ("obj",), self.rank, dst),
                                            _ObjectBox([obj])))
        self.wait_all(requests)
        return [b[0] for b in boxes]

    def nodes(self):
        node_of = [self.world.node_of[t] for t in self.members]
        return [min(r for r, n in enumerate(node_of) if n == node) for node in node_of]

    def abort(self, code=1):
        error = Aborted(f"rank {self.rank} aborted the job (code {code})")
        self.world.abort(error)
        raise error


class _ObjectBox:
    """A Python object in a message (copied by reference)."""

    __slots__ = ("cell",)

    def __init__(self, cell):
        self.cell = cell


def _cut(array, counts):
    """Member m's part of a flat byte view of ``array`` (None for an empty one)."""
    flat = array.reshape(-1).view(np.uint8)
    out, at = [], 0
    for c in counts:
        out.append(flat[at:at + c] if c else None)
        at += c
    return out


def _reduce(parts, op):
    """``op`` over ``parts`` in rank order (deterministic)."""
    out = parts[0].copy()
    combine = (_LOGICAL if out.dtype == np.bool_ else _COMBINE)[op]
    for p in parts[1:]:
        combine(out, p, out=out)
    return out


def run(size, body, timeout=60.0, strided=False, nodes=None):
    """Run ``body(group)`` on ``size`` threads, one :class:`ThreadGroup` each;
    return the results in rank order.  The first exception of a thread is
    raised (after it aborted the others); a thread still running after
    ``timeout`` seconds raises ``TimeoutError`` (a deadlock)."""
    world = ThreadWorld(size, strided, nodes)
    results, errors = [None] * size, []

    def target(rank):
        try:
            results[rank] = body(ThreadGroup(world, range(size), rank))
        except Aborted as exc:
            errors.append((rank, exc))
        except BaseException as exc:        # noqa: BLE001  (raised below)
            errors.append((rank, exc))
            world.abort(exc)

    threads = [threading.Thread(target=target, args=(r,), daemon=True,
                                name=f"mpiredist-rank-{r}") for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if any(t.is_alive() for t in threads):
        world.abort(TimeoutError("deadlock"))
        raise TimeoutError(f"threads.run: ranks still running after {timeout} s (a deadlock)")
    first = [e for _, e in errors if not isinstance(e, Aborted)] or [e for _, e in errors]
    if first:
        raise first[0]
    return results
