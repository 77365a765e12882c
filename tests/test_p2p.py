"""The pipelined part engine (mpiredist.runtime.p2p), without MPI.

Ranks are threads of the thread transport (:mod:`mpiredist.runtime.threads`),
which matches sends with receives in posting order per pair and completes a
send only when its receive is posted (rendezvous, the strictest case:
nothing is buffered).  Random parts, ring
sizes, and directly sent or packed parts must arrive intact and never
deadlock (a thread still running after the timeout fails the test); the
in-place ``paired`` mode swaps slots pairwise, as the one-buffer all-to-all
does.
"""

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpiredist.runtime import p2p
from mpiredist.runtime.p2p import Part, Ring
from mpiredist.runtime.threads import ThreadGroup, ThreadWorld

TIMEOUT = 20


def _run_ranks(n, body):
    """Run ``body(rank, group)`` on ``n`` threads of one :class:`ThreadWorld` (ranks
    that fail do not abort the others); fail on an exception or a hang."""
    world, errors = ThreadWorld(n), []

    def target(rank):
        try:
            body(rank, ThreadGroup(world, range(n), rank))
        except BaseException as exc:      # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads), "the pipeline deadlocked"
    if errors:
        raise errors[0]


# ------------------------------------------------------------------ Ring


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64), st.lists(st.tuples(st.booleans(), st.integers(0, 70)), max_size=60))
def test_ring_spans_never_overlap(size, ops):
    ring, live = Ring(size), []
    for finish, count in ops:
        if finish and live:
            ring.done(live.pop(0 if count % 2 else -1)[1])
            continue
        empty = not ring.live
        got = ring.take(count)
        assert got is not None or count > size or not empty    # an empty ring takes any fit
        if got is not None:
            start, entry = got
            assert 0 <= start and start + count <= size
            for other, _ in live:
                assert start + count <= other[0] or other[1] <= start or not count
            live.append(((start, start + count), entry))
    while live:
        ring.done(live.pop()[1])
    assert not ring.live and ring.take(size) is not None


def test_ring_frees_oldest_first():
    ring = Ring(10)
    (a, ea), (b, eb) = ring.take(6), ring.take(4)
    assert (a, b) == (0, 6) and ring.take(1) is None
    ring.done(eb)                       # newer finished: still no room
    assert ring.take(1) is None
    ring.done(ea)
    assert ring.take(10)[0] == 0


# -------------------------------------------------------------- pipeline


def _messages(rng, n):
    """Random parts per ordered pair: sizes in elements, and which end packs."""
    out = {}
    for a in range(n):
        for b in range(n):
            if a != b:
                out[a, b] = [(int(rng.integers(1, 40)), bool(rng.integers(2)),
                              bool(rng.integers(2))) for _ in range(int(rng.integers(0, 4)))]
    return out


def _sequence(rank, n, messages, side):
    """Parts in the order of (part index, peer offset), as the exchange engine orders them."""
    keyed = []
    for k in range(1, n):
        peer = (rank + k) % n if side == "send" else (rank - k) % n
        pair = (rank, peer) if side == "send" else (peer, rank)
        for r, (count, send_packs, recv_packs) in enumerate(messages[pair]):
            keyed.append((r, k, peer, pair, r, count, send_packs if side == "send" else recv_packs))
    keyed.sort(key=lambda x: x[:2])
    return [x[2:] for x in keyed]


def _payload(pair, r, count):
    a, b = pair
    return (np.arange(count) + 1000 * a + 100 * b + 10 * r).astype(np.float64)


@pytest.mark.parametrize("seed", range(30))
def test_random_parts_arrive_without_deadlock(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 6))
    messages = _messages(rng, n)
    rooms = {(r, side): int(rng.integers(39, 60)) for r in range(n) for side in ("s", "r")}
    received = {}

    def body(rank, comm):
        sends, recvs, targets = [], [], []
        for peer, pair, r, count, packs in _sequence(rank, n, messages, "send"):
            data = _payload(pair, r, count)
            sends.append(Part(peer, view=data) if packs else
                         Part(peer, spec=data))
        for peer, pair, r, count, packs in _sequence(rank, n, messages, "recv"):
            target = np.zeros(count)
            targets.append((pair, r, target))
            recvs.append(Part(peer, view=target) if packs else
                         Part(peer, spec=target))
        p2p.run(comm, sends, recvs, np.empty(rooms[rank, "s"]),
                     np.empty(rooms[rank, "r"]))
        for pair, r, target in targets:
            received[pair, r] = target

    _run_ranks(n, body)
    for pair, parts in messages.items():
        for r, (count, _, _) in enumerate(parts):
            assert np.array_equal(received[pair, r], _payload(pair, r, count)), (pair, r)


# How a paired run may take its parts: packed sends with straight or ring
# receives, or straight sends with ring receives (the one-buffer executor's).
MODES = [("packed", "straight"), ("packed", "ring"), ("straight", "ring")]


def _paired_parts(peer, view, mode):
    send, recv = mode
    return (Part(peer, view=view) if send == "packed" else Part(peer, spec=view),
            Part(peer, view=view) if recv == "ring" else Part(peer, spec=view))


def _rings(mode, room):
    send, recv = mode
    return (np.empty(room) if send == "packed" else None,
            np.empty(room) if recv == "ring" else None)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(15))
def test_paired_swap_in_place(seed, mode):
    """The one-buffer all-to-all's swap: slot p goes to p and is replaced, in parts."""
    rng = np.random.default_rng(seed)
    n, length = int(rng.integers(2, 7)), int(rng.integers(1, 30))
    part = int(rng.integers(1, length + 1))
    room = part * int(rng.integers(1, 4))
    slots = {r: np.arange(n * length, dtype=np.float64).reshape(n, length) + 1000 * r
             for r in range(n)}

    def body(me, comm):
        buf = slots[me]
        sends, recvs = [], []
        for k in range(n):
            p = (k - me) % n
            if p == me:
                continue
            for lo in range(0, length, part):
                s, r = _paired_parts(p, buf[p, lo:lo + part], mode)
                sends.append(s)
                recvs.append(r)
        p2p.run(comm, sends, recvs, *_rings(mode, room), paired=True)

    _run_ranks(n, body)
    for me in range(n):
        for p in range(n):
            want = np.arange(me * length, (me + 1) * length) + 1000 * p
            assert np.array_equal(slots[me][p], want), (me, p)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(15))
def test_paired_permute_around_a_cycle(seed, mode):
    """The one-buffer permute: every rank sends its block to the next one and
    takes the previous one's in its place, in parts; the cycle is where a
    wrong release order would deadlock or overwrite unsent data."""
    rng = np.random.default_rng(seed)
    n, length = int(rng.integers(2, 7)), int(rng.integers(1, 40))
    part = int(rng.integers(1, length + 1))
    room = part * int(rng.integers(1, 4))
    blocks = {r: np.arange(length, dtype=np.float64) + 1000 * r for r in range(n)}

    def body(me, comm):
        buf = blocks[me]
        sends, recvs = [], []
        for lo in range(0, length, part):
            s, _ = _paired_parts((me + 1) % n, buf[lo:lo + part], mode)
            _, r = _paired_parts((me - 1) % n, buf[lo:lo + part], mode)
            sends.append(s)
            recvs.append(r)
        p2p.run(comm, sends, recvs, *_rings(mode, room), paired=True)

    _run_ranks(n, body)
    for me in range(n):
        assert np.array_equal(blocks[me], np.arange(length) + 1000 * ((me - 1) % n)), me


@pytest.mark.parametrize("mode", MODES[1:])
def test_paired_more_receives_than_sends(mode):
    """A permute whose incoming block has more parts than the outgoing one:
    the receives past the last send wait only until every send has finished."""
    n, part, sizes = 3, 4, {0: 5, 1: 9, 2: 14}          # rank r sends sizes[r]
    blocks = {r: np.arange(max(sizes.values()), dtype=np.float64) + 100 * r for r in range(n)}

    def body(me, comm):
        buf, dest, source = blocks[me], (me + 1) % n, (me - 1) % n
        sends = [_paired_parts(dest, buf[lo:min(lo + part, sizes[me])], mode)[0]
                 for lo in range(0, sizes[me], part)]
        recvs = [_paired_parts(source, buf[lo:min(lo + part, sizes[source])], mode)[1]
                 for lo in range(0, sizes[source], part)]
        p2p.run(comm, sends, recvs, *_rings(mode, part), paired=True)

    _run_ranks(n, body)
    for me in range(n):
        source = (me - 1) % n
        assert np.array_equal(blocks[me][:sizes[source]],
                              np.arange(sizes[source]) + 100 * source), me


def test_paired_straight_both_ways_is_refused():
    """A straight receive over a straight send of the same place would wait for
    the send to finish, which waits for the peer's receive: refused, not hung."""
    errors = []

    def body(me, comm):
        view = np.zeros(4)
        try:
            p2p.run(comm, [Part(1 - me, spec=view)], [Part(1 - me, spec=view)],
                         None, None, paired=True)
        except ValueError as exc:
            errors.append(exc)
            raise

    with pytest.raises(ValueError, match="straight receive over a straight send"):
        _run_ranks(2, body)
    assert len(errors) == 2


def test_unpaired_in_place_swap_can_overwrite():
    """Without ``paired`` the same swap may receive into a slot before it is
    packed: the test above could fail, so it checks something."""
    n, length = 2, 8
    slots = {r: np.full((n, length), float(r)) for r in range(n)}
    order = []

    class Late(ThreadGroup):
        def isend(self, buf, peer, sync=False):
            order.append(("send", self.rank))
            return super().isend(buf, peer, sync)

        def irecv(self, buf, peer):
            order.append(("recv", self.rank))
            return super().irecv(buf, peer)

    world = ThreadWorld(n)
    comms = [Late(world, range(n), r) for r in range(n)]
    threads = []
    for me in range(n):
        p = 1 - me
        view = slots[me][p]

        def body(me=me, view=view, p=p):
            p2p.run(comms[me], [Part(p, view=view)],
                         [Part(p, spec=view)], np.empty(length), None)
        threads.append(threading.Thread(target=body, daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert order.index(("recv", 0)) < order.index(("send", 0))   # posted before packed


@pytest.mark.parametrize("seed", range(10))
def test_combined_in_posting_order(seed):
    """A reduce-scatter by parts: each rank's own value and the received ones
    are summed in member order, whatever order they arrive in, so the
    floating-point result is exactly that of the sequential sum."""
    rng = np.random.default_rng(seed)
    n, length = int(rng.integers(2, 6)), int(rng.integers(1, 50))
    part = int(rng.integers(1, length + 1))
    blocks = {r: rng.standard_normal((n, length)) * 10.0 ** rng.integers(-8, 8, (n, 1))
              for r in range(n)}
    out = {}

    def add(target, data):
        np.add(target, data, out=target)

    def body(me, comm):
        target = np.zeros(length)
        sends = (Part(m, view=blocks[me][m, lo:lo + part]) for lo in range(0, length, part)
                 for m in range(n) if m != me)
        recvs = (Part(m, view=target[lo:lo + part], combine=add,
                      value=blocks[me][me, lo:lo + part] if m == me else None)
                 for lo in range(0, length, part) for m in range(n))
        p2p.run(comm, sends, recvs, np.empty(part), np.empty(part))
        out[me] = target

    _run_ranks(n, body)
    for me in range(n):
        want = np.zeros(length)
        for m in range(n):
            want += blocks[m][me]
        assert np.array_equal(out[me], want), me
