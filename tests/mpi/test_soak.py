"""The soak in-process (benchmarks.soak): random cases pass, wrong ones are caught.

Every rank runs the same cases (they depend only on the seed, the index and
the number of ranks); verdicts are agreed inside the soak, so these tests
pass or fail on every rank together.  The soak's own logic (cases, oracle)
is tested without MPI in ``tests/test_soak.py``.
"""

import math

import numpy as np
import pytest
from helpers import all_ok

import mpiredist as mr
from benchmarks import soak
from mpiredist.core.layout import Layout

SEED, CASES = 11, 40



@pytest.fixture(scope="module")
def comms(comm):
    """The soak's sub-communicators, made once for the module."""
    return soak.communicators(comm)


def _agreed(comm, summary):
    """``[(index, description, problems)]`` of the failures (the same on every rank)."""
    found = None
    if comm.rank == 0:
        found = [(c.index, str(c), p) for c, p in summary.failures]
    return comm.bcast(found)


def _first(comm, wanted):
    """The first case of SEED at this size that ``wanted`` accepts."""
    for k in range(500):
        case = soak.make_case(SEED, k, comm.size)
        if wanted(case):
            return case
    pytest.skip(f"no such case among the first 500 of seed {SEED} at {comm.size} ranks")


def _perturb(block):
    """The block with its first element changed (other blocks unchanged)."""
    if not isinstance(block, np.ndarray) or not block.size:
        return block
    block = block.copy()
    flat = block.reshape(-1)
    flat[0] = not flat[0] if block.dtype == np.bool_ else flat[0] + 1
    return block


def _moves(case):
    return math.prod(case.shape) > 0 and case.route != "distarray_"


@pytest.mark.mpi
def test_random_cases_pass(comm, comms):
    summary = soak.soak(comm, SEED, range(CASES), comms=comms)
    failures = _agreed(comm, summary)
    all_ok(comm, summary.passed + len(failures) == CASES, "the soak lost cases")
    all_ok(comm, not failures, f"soak failures: {failures}")


@pytest.mark.mpi
def test_main_replays_one_case(comm, capsys):
    # on every rank: main frees its sub-communicators, which mpiredist then never used
    case = _first(comm, lambda c: c.comm_size == c.size)
    rc = soak.main(["--seed", str(SEED), "--case", str(case.index)], comm=comm)
    out = capsys.readouterr().out
    all_ok(comm, rc in (0, 1), f"main returned {rc}")
    summary = f"soak: seed {SEED}, 1 case(s) at {comm.size} ranks"
    printed = summary in out if comm.rank == 0 else out == ""     # only rank 0 prints
    all_ok(comm, printed, f"rank {comm.rank} printed {out!r}")


def _plain(c):
    return _moves(c) and not Layout.parse(c.dst).partial


def _kept_partial(c):
    # a target that keeps partial axes is checked by reducing each group's blocks;
    # every rank adds 1 to an element: sum, max and min then change (bool or prod may not)
    return (_moves(c) and Layout.parse(c.dst).partial and Layout.parse(c.dst).op != "prod"
            and c.dtype != "bool")


@pytest.mark.mpi
@pytest.mark.parametrize("pick, named", [(_plain, "elements differ"),
                                         (_kept_partial, "target reduced over")],
                         ids=["plain", "partial-target"])
def test_a_wrong_result_is_caught(comm, comms, pick, named):
    case = _first(comm, pick)
    summary = soak.soak(comm, SEED, [case.index], tamper=_perturb, comms=comms)
    failures = _agreed(comm, summary)
    all_ok(comm, [f[0] for f in failures] == [case.index], f"not reported: {failures}")
    all_ok(comm, any(named in p for f in failures for found in f[2].values() for p in found),
           f"no rank said {named!r}: {failures}")


@pytest.mark.mpi
def test_an_exception_on_one_rank_fails_the_case_on_every_rank(comm, comms):
    last = comm.size - 1

    def tamper(block):
        if comm.rank == last:
            raise RuntimeError("deliberate")
        return block

    case = _first(comm, lambda c: c.comm_size == c.size and not Layout.parse(c.dst).partial)
    summary = soak.soak(comm, SEED, [case.index], tamper=tamper, comms=comms)
    failures = _agreed(comm, summary)
    all_ok(comm, [f[0] for f in failures] == [case.index], str(failures))
    all_ok(comm, failures[0][2] == {last: ["RuntimeError: deliberate"]}, str(failures))


@pytest.mark.mpi
def test_redistribute__takes_the_target_mesh(comm):
    n = comm.size
    src = mr.Mesh({"x": n})
    dst = mr.Mesh({"a": n}, ranks=list(reversed(range(n))))
    g = np.arange(3 * n, dtype=np.float64)
    a = mr.DistArray.from_global(g, src, "[{x}]")
    a.redistribute_("[{a}]", mesh=dst)
    device = n - 1 - comm.rank
    all_ok(comm, np.array_equal(a.local, g[3 * device:3 * device + 3]), "wrong block")
    all_ok(comm, a.mesh == dst, f"a.mesh is {a.mesh!r}, expected {dst!r}")
