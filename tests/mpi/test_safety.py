"""Memory that is not there, and isolation: raised on every rank, never a hang.

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_safety.py

- A call whose bound does not fit what a rank may allocate
  (``MPIREDIST_MEMORY_LIMIT`` here; the cgroup and ``ulimit -v`` in
  ``scripts/test.sh``) raises :class:`~mpiredist.MemoryBudgetError` on every
  rank before any data moves, the source untouched.
- mpiredist's messages never match the user's own receives on the user's
  communicator; two Transfers may be interleaved; a Transfer used after
  ``free()`` raises :class:`~mpiredist.ClosedError` on every rank.
"""

import numpy as np
import pytest
from helpers import all_ok, need_ranks

MPI = pytest.importorskip("mpi4py.MPI")

import mpiredist as mr  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
MESH = mr.Mesh({"x": SIZE})
SHAPE = (64 * SIZE + 3, 128)
SRC, DST = "[{x}, {}]", "[{}, {x}]"


def _pair():
    g = np.arange(int(np.prod(SHAPE)), dtype="float32").reshape(SHAPE)
    return (mr.DistArray.from_global(g, MESH, SRC).local.copy(),
            mr.DistArray.from_global(g, MESH, DST).local)


def _outcome(call):
    try:
        return call(), None
    except Exception as exc:  # noqa: BLE001 - judged on every rank
        return None, exc


@pytest.mark.mpi
@pytest.mark.parametrize("route", ["Transfer", "redistribute", "between"])
def test_a_bound_that_does_not_fit_raises_everywhere_before_data_moves(monkeypatch, route):
    block, want = _pair()
    kept = block.copy()
    monkeypatch.setenv("MPIREDIST_MEMORY_LIMIT", "64K")     # read when a Transfer is made
    other = mr.Mesh({"a": SIZE}, ranks=list(reversed(range(SIZE))))
    calls = {"Transfer": lambda: mr.Transfer(SHAPE, "float32", MESH, SRC, DST).run(block),
             "redistribute": lambda: mr.redistribute(block, SHAPE, MESH, SRC, DST,
                                                     workspace_bytes=1 << 20),
             "between": lambda: mr.redistribute(block, SHAPE, MESH, SRC, "[{}, {a}]",
                                                dst_mesh=other)}
    _, err = _outcome(calls[route])
    alike = "" if SIZE == 1 else f"(also on rank(s) {', '.join(map(str, range(1, SIZE)))})"
    all_ok(COMM, isinstance(err, mr.MemoryBudgetError) and str(err).startswith("rank 0: ")
           and "65536 B are available (MPIREDIST_MEMORY_LIMIT" in str(err) and alike in str(err)
           and len(set(COMM.allgather(str(err)))) == 1,
           f"{route}: rank {RANK} raised {err!r}")
    all_ok(COMM, np.array_equal(block, kept), "the source is untouched")
    monkeypatch.delenv("MPIREDIST_MEMORY_LIMIT")
    out = mr.Transfer(SHAPE, "float32", MESH, SRC, DST).run(block)
    all_ok(COMM, np.array_equal(out, want), "a run that fits works afterwards")


@pytest.mark.mpi(min_size=2)
def test_a_bound_that_does_not_fit_one_rank_names_it_everywhere(monkeypatch):
    block, _ = _pair()
    if RANK == SIZE - 1:
        monkeypatch.setenv("MPIREDIST_MEMORY_LIMIT", "1K")
    t = mr.Transfer(SHAPE, "float32", MESH, SRC, DST)
    _, err = _outcome(lambda: t.run(block))
    messages = COMM.allgather(str(err))
    all_ok(COMM, isinstance(err, mr.MemoryBudgetError)
           and isinstance(err, mr.RemoteError) == (RANK != SIZE - 1)
           and f"rank {SIZE - 1}: " in str(err) and len(set(messages)) == 1,
           f"rank {RANK} raised {err!r}")
    t.free()


@pytest.mark.mpi
def test_a_donated_bound_is_checked_against_the_donated_contract(monkeypatch):
    """Donated, only the growth is new: a limit between the donated bound
    max(0, T - S) + W and the kept one max(S, T) + W lets the donated run go
    and stops the kept one."""
    block, want = _pair()
    probe = mr.Transfer(SHAPE, "float32", MESH, SRC, DST)
    p, w = probe.plan, probe.workspace_bytes
    s, t = p.src_local_bytes, p.dst_local_bytes
    donated, kept = max(0, t - s) + w, max(s, t) + w
    probe.free()
    limit = (donated + kept) // 2
    monkeypatch.setenv("MPIREDIST_MEMORY_LIMIT", str(limit))
    with mr.Transfer(SHAPE, "float32", MESH, SRC, DST, donate=True) as given:
        out, err = _outcome(lambda: given.run(block.copy()))
    all_ok(COMM, err is None and np.array_equal(out, want), f"donated under {limit} B: {err!r}")
    with mr.Transfer(SHAPE, "float32", MESH, SRC, DST) as copying:
        _, err = _outcome(lambda: copying.run(block))
    all_ok(COMM, isinstance(err, mr.MemoryBudgetError), f"kept under {limit} B: {err!r}")


@pytest.mark.mpi(min_size=2)
def test_mpiredist_messages_never_match_the_users_receives():
    """A user's wildcard receive posted before a run still gets the user's own
    message afterwards, not one of mpiredist's (its communicators are its own)."""
    need_ranks(COMM, 2)
    block, want = _pair()
    t = mr.Transfer(SHAPE, "float32", MESH, SRC, DST)
    cross = mr.Transfer(SHAPE, "float32", MESH, SRC, "[{}, {a}]",
                        dst_mesh=mr.Mesh({"a": SIZE}, ranks=list(reversed(range(SIZE)))))
    got = np.zeros(1, np.int64)
    request = COMM.Irecv(got, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
    out = t.run(block)
    cross.run(block)
    mr.DistArray.from_local(block, MESH, SRC, SHAPE)[1:-1]          # an exchange of indexing
    COMM.Send(np.array([1000 + RANK], np.int64), dest=(RANK + 1) % SIZE, tag=5)
    request.Wait()
    all_ok(COMM, got[0] == 1000 + (RANK - 1) % SIZE and np.array_equal(out, want),
           f"the user's receive got {got[0]}")
    t.free()
    cross.free()


@pytest.mark.mpi
def test_two_transfers_interleaved():
    block, want = _pair()
    back = mr.Transfer(SHAPE, "float32", MESH, DST, SRC)
    there = mr.Transfer(SHAPE, "float32", MESH, SRC, DST)
    ok = True
    for _ in range(3):
        out = there.run(block)
        ok &= np.array_equal(out, want)
        ok &= np.array_equal(back.run(out), block)
    all_ok(COMM, ok, "interleaved runs of two Transfers")
    back.free()
    there.free()


@pytest.mark.mpi
def test_a_freed_transfer_raises_on_every_rank():
    block, want = _pair()
    t = mr.Transfer(SHAPE, "float32", MESH, SRC, DST)
    t.run(block)
    t.free()
    t.free()                                    # twice is harmless
    _, err = _outcome(lambda: t.run(block))
    all_ok(COMM, isinstance(err, mr.ClosedError) and "was freed" in str(err),
           f"rank {RANK}: {err!r}")
    with mr.Transfer(SHAPE, "float32", MESH, SRC, DST) as t2:
        out = t2.run(block)
    _, err = _outcome(lambda: t2.run(block))
    all_ok(COMM, np.array_equal(out, want) and isinstance(err, mr.ClosedError),
           "a Transfer closed by its with block")


@pytest.mark.mpi(min_size=2)
def test_a_transfer_freed_on_one_rank_only_raises_everywhere():
    need_ranks(COMM, 2)
    block, _ = _pair()
    t = mr.Transfer(SHAPE, "float32", MESH, SRC, DST)
    if RANK == 0:
        t.free()
    _, err = _outcome(lambda: t.run(block))
    all_ok(COMM, isinstance(err, mr.ClosedError) and "rank 0: " in str(err)
           and isinstance(err, mr.RemoteError) == (RANK != 0), f"rank {RANK}: {err!r}")
    t.free()
