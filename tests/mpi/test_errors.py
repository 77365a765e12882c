"""Bad input to mpiredist.redistribute raises on every rank, and nobody hangs.

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_errors.py

Each test collects, per rank, the exception the call raised (or None) and
agrees across ranks that every rank raised the expected ``ValueError``
subclass (an allreduce, so a rank that did not raise fails them all instead
of hanging).  Every test then checks that a correct redistribute still works,
i.e. no rank was left inside a collective.  Tests about ranks that disagree
need at least two ranks and skip, with a reason, on one.
"""

import numpy as np
import pytest
from helpers import all_ok, need_ranks

import oracle

MPI = pytest.importorskip("mpi4py.MPI")

import mpiredist as mr  # noqa: E402
from mpiredist import (LayoutError, MeshError, MismatchError, PlanError,  # noqa: E402
                       RemoteError, ShapeError)

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
MESH = mr.Mesh({"x": SIZE})
SHAPE = (2 * SIZE + 1, 3)          # uneven: the last rank's block is shorter


def block(layout="[{x}, {}]", shape=SHAPE, dtype="float32", mesh=MESH):
    """This rank's block of a known global array (local: the numpy oracle)."""
    g = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    dims = [list(d) for d in mr.Layout.parse(layout).dims]
    return oracle.local_block(g, list(mesh.axes), dims, RANK)


def outcome(fn, *args, **kwargs):
    """The exception ``fn`` raises on this rank, or None."""
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - judged below, on every rank
        return exc
    return None


def raised_everywhere(err, expected, text=(), culprit=None):
    """Agree that this rank raised an ``expected`` ValueError naming ``text``,
    with the same message as every other rank.

    With ``culprit`` (the rank at fault), that rank raises ``expected`` itself
    and the others its :class:`~mpiredist.RemoteError` subclass.  Collective:
    the per-rank verdicts are reduced with MIN, so every rank asserts the
    same thing.
    """
    text = (text,) if isinstance(text, str) else tuple(text)
    remote = culprit is not None and RANK != culprit
    ok = (isinstance(err, expected) and isinstance(err, ValueError)
          and all(t in str(err) for t in text)
          and (culprit is None or isinstance(err, RemoteError) == remote))
    messages = COMM.allgather(str(err))
    ok = ok and len(set(messages)) == 1
    got = "nothing" if err is None else f"{type(err).__name__}: {err}"
    everywhere = COMM.allreduce(int(ok), op=MPI.MIN)
    assert everywhere == 1, (f"not every rank raised {expected.__name__} naming {text}; "
                             f"rank {RANK} raised {got}")


def still_works():
    """A correct redistribute after the error: no rank is stuck or out of step."""
    g = np.arange(SHAPE[0] * SHAPE[1], dtype="int64").reshape(SHAPE)
    a = mr.DistArray.from_global(g, MESH, "[{x}, {}]")
    out = mr.redistribute(a.local, SHAPE, MESH, "[{x}, {}]", "[{}, {x}]")
    want = mr.DistArray.from_global(g, MESH, "[{}, {x}]").local
    all_ok(COMM, np.array_equal(out, want), "redistribute after an error went wrong")


def call(local=None, shape=SHAPE, mesh=MESH, src="[{x}, {}]", dst="[{}, {x}]", **kw):
    """Outcome of a redistribute of ``block()`` unless told otherwise."""
    local = block() if local is None else local
    return outcome(mr.redistribute, local, shape, mesh, src, dst, **kw)


# ---------------------------------------------------------- every rank bad

@pytest.mark.mpi
@pytest.mark.parametrize("dst", ["[{x}, {}", "{x}, {}", "[{x}, {}] sum", "[{x} {}]",
                                 "[{x}, {}] avg{x}", "[{x,x}, {}]"])
def test_bad_layout_text(dst):
    raised_everywhere(call(dst=dst), LayoutError, "layout")
    still_works()


@pytest.mark.mpi
def test_bad_source_layout_text():
    raised_everywhere(call(local=block(), src="[{x}, {}]]"), LayoutError, "layout")
    still_works()


@pytest.mark.mpi
def test_unknown_axis():
    raised_everywhere(call(dst="[{}, {q}]"), LayoutError, "'q'")
    raised_everywhere(call(dst="[{}, {}] sum{q}"), LayoutError, "'q'")
    still_works()


@pytest.mark.mpi
def test_layout_rank_does_not_match_array():
    raised_everywhere(call(dst="[{x}, {}, {}]"), LayoutError, "dimension")
    still_works()


@pytest.mark.mpi
@pytest.mark.parametrize("axes", [{"x": SIZE + 1}, {"x": SIZE, "y": 2}],
                         ids=["size_plus_1", "extra_axis"])
def test_mesh_size_does_not_match_comm(axes):
    mesh = mr.Mesh(axes)
    local = np.zeros((1, 3), dtype="float32")
    err = outcome(mr.redistribute, local, (mesh.size, 3), mesh, "[{x}, {}]", "[{}, {x}]")
    raised_everywhere(err, MeshError, (str(mesh.size), "communicator"))
    still_works()


@pytest.mark.mpi
def test_unknown_strategy():
    raised_everywhere(call(strategy="teleport"), PlanError, "teleport")
    still_works()


@pytest.mark.mpi
def test_partial_target_axis_not_in_source():
    raised_everywhere(call(dst="[{}, {}] sum{x}"), PlanError, "partial")
    mesh = mr.Mesh({"x": SIZE, "y": 1})
    local = np.zeros(SHAPE, dtype="float32")
    err = outcome(mr.redistribute, local, SHAPE, mesh, "[{}, {}] sum{y}",
                  "[{}, {}] sum{x,y}")
    raised_everywhere(err, PlanError, "partial")
    still_works()


@pytest.mark.mpi
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_on_complex(op):
    local = np.zeros(SHAPE, dtype="complex128")
    err = outcome(mr.redistribute, local, SHAPE, MESH, f"[{{}}, {{}}] {op}{{x}}",
                  "[{x}, {}]")
    raised_everywhere(err, ShapeError, ("complex", op))
    still_works()


@pytest.mark.mpi
def test_reduction_of_structured_dtype():
    local = np.zeros(SHAPE, dtype=[("a", "i4"), ("b", "f8")])
    err = outcome(mr.redistribute, local, SHAPE, MESH, "[{}, {}] sum{x}", "[{x}, {}]")
    raised_everywhere(err, ShapeError, "reduction")
    still_works()


@pytest.mark.mpi
def test_negative_global_shape():
    local = np.zeros((0, 3), dtype="float32")
    err = outcome(mr.redistribute, local, (-1, 3), MESH, "[{}, {}]", "[{x}, {}]")
    raised_everywhere(err, ShapeError, "negative")
    still_works()


# ---------------------------------------------------------- one rank bad

@pytest.mark.mpi
def test_wrong_local_shape_on_rank_0_only():
    local = np.zeros((SHAPE[0] + 5, 7), dtype="float32") if RANK == 0 else block()
    err = call(local=local)
    raised_everywhere(err, ShapeError, ("rank 0", "local block has shape"), culprit=0)
    still_works()


@pytest.mark.mpi
def test_wrong_local_shape_on_last_rank_only():
    bad = SIZE - 1
    local = np.zeros((1, 2), dtype="float32") if RANK == bad else block()
    err = call(local=local)
    raised_everywhere(err, ShapeError, f"rank {bad}:", culprit=bad)
    still_works()


@pytest.mark.mpi
def test_bad_layout_on_rank_0_only():
    dst = "[{}, {q}]" if RANK == 0 else "[{}, {x}]"
    err = call(dst=dst)
    raised_everywhere(err, LayoutError, ("rank 0: " if SIZE > 1 else "", "'q'"), culprit=0)
    still_works()


# ------------------------------------------------------ ranks that disagree

@pytest.mark.mpi(min_size=2)
def test_ranks_disagree_on_target_layout():
    need_ranks(COMM, 2)
    dst = "[{x}, {}]" if RANK == 0 else "[{}, {x}]"
    raised_everywhere(call(dst=dst), MismatchError, ("dst", "[{x}, {}]", "[{}, {x}]"))
    still_works()


@pytest.mark.mpi(min_size=2)
def test_ranks_disagree_on_source_layout():
    need_ranks(COMM, 2)
    # Replicated and sharded-over-nothing blocks differ; give each rank a block
    # that is right for its own source so that only the disagreement is left.
    src = "[{}, {}]" if RANK == 0 else "[{}, {}] sum{x}"
    local = np.zeros(SHAPE, dtype="float32")
    err = outcome(mr.redistribute, local, SHAPE, MESH, src, "[{x}, {}]")
    raised_everywhere(err, MismatchError, "src")
    still_works()


@pytest.mark.mpi(min_size=2)
def test_ranks_disagree_on_global_shape():
    need_ranks(COMM, 2)
    shape = (3, 4) if RANK == 0 else (4, 3)       # each block right for its shape
    local = np.zeros(shape, dtype="float32")
    err = outcome(mr.redistribute, local, shape, MESH, "[{}, {}]", "[{x}, {}]")
    raised_everywhere(err, MismatchError, ("shape", "(3, 4)", "(4, 3)"))
    still_works()


@pytest.mark.mpi(min_size=2)
def test_ranks_disagree_on_dtype():
    need_ranks(COMM, 2)
    local = block(dtype="float64" if RANK == 0 else "float32")
    raised_everywhere(call(local=local), MismatchError, ("dtype", "float64", "float32"))
    still_works()


@pytest.mark.mpi(min_size=2)
def test_ranks_disagree_on_mesh():
    need_ranks(COMM, 2)
    mesh = mr.Mesh({"x": SIZE}) if RANK == 0 else mr.Mesh({"y": SIZE})
    src, dst = ("[{x}, {}]", "[{}, {x}]") if RANK == 0 else ("[{y}, {}]", "[{}, {y}]")
    local = block(src, mesh=mesh)
    err = outcome(mr.redistribute, local, SHAPE, mesh, src, dst)
    raised_everywhere(err, MismatchError, "mesh")
    still_works()


@pytest.mark.mpi(min_size=2)
def test_ranks_disagree_on_strategy():
    need_ranks(COMM, 2)
    err = call(strategy="direct" if RANK == 0 else "collectives")
    raised_everywhere(err, MismatchError, "strategy")
    still_works()


# ------------------------------------------------ DistArray constructors

@pytest.mark.mpi
def test_from_local_wrong_shape_on_rank_0_only():
    local = np.zeros((5, 5), dtype="float32") if RANK == 0 else block()
    err = outcome(mr.DistArray.from_local, local, MESH, "[{x}, {}]", SHAPE)
    raised_everywhere(err, ShapeError, "rank 0", culprit=0)
    still_works()


@pytest.mark.mpi
def test_from_global_with_partial_layout():
    g = np.zeros(SHAPE, dtype="float32")
    err = outcome(mr.DistArray.from_global, g, MESH, "[{}, {}] sum{x}")
    raised_everywhere(err, ShapeError, "partial")
    still_works()


# ------------------------- arguments of the wrong type on one rank (used to hang)

@pytest.mark.mpi(min_size=2)
def test_non_array_block_on_rank_0_only():
    local = block().tolist() if RANK == 0 else block()
    raised_everywhere(call(local=local), ShapeError, ("rank 0", "list"), culprit=0)
    still_works()


@pytest.mark.mpi(min_size=2)
def test_non_sequence_shape_on_rank_0_only():
    err = call(shape=5 if RANK == 0 else SHAPE)
    raised_everywhere(err, ShapeError, "rank 0", culprit=0)
    still_works()
