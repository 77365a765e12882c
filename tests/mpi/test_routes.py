"""The same bad input raises the same exception on every route and every rank.

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_routes.py
    timeout 300 torchrun --nproc-per-node N -m pytest -q tests/mpi/test_routes.py

Routes: ``redistribute`` on one mesh and between meshes, ``Transfer`` (made,
then run) on one mesh and between meshes, ``DistArray.redistribute`` on its
mesh and to another, and the HeAT-style ``resplit``.  For each mistake every
route raises the same class, every rank the same message, and ranks not at
fault the matching :class:`~mpiredist.RemoteError` subclass; a correct call
works afterwards (nobody is left in a collective).
"""

import numpy as np
import pytest
from helpers import all_ok, job_comm

import mpiredist as mr

COMM = job_comm()       # MPI's COMM_WORLD, or torch.distributed's world under torchrun
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
MESH = mr.Mesh({"x": SIZE})
OTHER = mr.Mesh({"a": SIZE}, ranks=list(reversed(range(SIZE))))
SHAPE = (2 * SIZE + 1, 3)
SRC = "[{x}, {}]"


def _block(shape=SHAPE):
    g = np.arange(int(np.prod(shape)), dtype="float32").reshape(shape)
    return mr.DistArray.from_global(g, MESH, SRC)


def _routes(dst, dst_other, **kw):
    """``{route: zero-argument call}`` of one redistribution with ``kw``."""
    a = _block()
    local = a.local.copy()
    strategy = kw.get("strategy", "collectives")
    w = kw.get("workspace_bytes")
    return {
        "redistribute": lambda: mr.redistribute(local, SHAPE, MESH, SRC, dst, **kw),
        "redistribute between meshes": lambda: mr.redistribute(
            local, SHAPE, MESH, SRC, dst_other, dst_mesh=OTHER, **kw),
        "Transfer": lambda: mr.Transfer(SHAPE, "float32", MESH, SRC, dst, strategy=strategy,
                                        workspace_bytes=w).run(local),
        "Transfer between meshes": lambda: mr.Transfer(
            SHAPE, "float32", MESH, SRC, dst_other, strategy=strategy, workspace_bytes=w,
            dst_mesh=OTHER).run(local),
        "DistArray.redistribute": lambda: a.redistribute(dst, **kw),
        "DistArray.redistribute to a mesh": lambda: a.redistribute(dst_other, mesh=OTHER, **kw),
    }


def _outcome(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - judged below, on every rank
        return exc
    return None


def _same_everywhere(routes, expected, text, culprit=None):
    """Every route raises ``expected`` naming ``text``, with one message per route
    on every rank (RemoteError where this rank is not the ``culprit``)."""
    bad = []
    for name, call in routes.items():
        err = _outcome(call)
        ok = isinstance(err, expected) and text in str(err)
        if culprit is not None:
            ok = ok and isinstance(err, mr.RemoteError) == (RANK != culprit)
        messages = COMM.allgather(None if err is None else str(err))
        if not ok or len(set(messages)) != 1:
            bad.append(f"{name}: rank {RANK} raised {type(err).__name__}: {err}")
    all_ok(COMM, not bad, "; ".join(bad[:3]))


def _still_works():
    out = mr.redistribute(_block().local, SHAPE, MESH, SRC, "[{}, {x}]")
    all_ok(COMM, out.shape[0] == SHAPE[0], "a correct call after the errors")


@pytest.mark.mpi
def test_unknown_strategy():
    _same_everywhere(_routes("[{}, {x}]", "[{}, {a}]", strategy="teleport"), mr.PlanError,
                     "strategy 'teleport' is not one of")
    _still_works()


@pytest.mark.mpi
@pytest.mark.parametrize("w, text", [(-1, "workspace_bytes must be non-negative, found -1"),
                                     ("lots", "workspace_bytes must be an integer")])
def test_bad_workspace(w, text):
    routes = _routes("[{}, {x}]", "[{}, {a}]", workspace_bytes=w)
    _same_everywhere(routes, mr.ShapeError, text)
    err = _outcome(routes["redistribute"])
    all_ok(COMM, "rank" not in str(err), f"an argument of every rank names no rank: {err}")
    _still_works()


@pytest.mark.mpi
def test_unknown_axis_in_the_target():
    _same_everywhere(_routes("[{}, {q}]", "[{}, {q}]"), mr.LayoutError, "'q'")
    _still_works()


@pytest.mark.mpi
def test_malformed_target_text():
    _same_everywhere(_routes("[{x}, {}", "[{a}, {}"), mr.LayoutError, "layout")
    _still_works()


@pytest.mark.mpi(min_size=2)
def test_bad_target_on_rank_0_only():
    """Rank 0 alone names an axis the mesh lacks: everywhere "rank 0: ..."."""
    dst, other = ("[{}, {q}]", "[{}, {q}]") if RANK == 0 else ("[{}, {x}]", "[{}, {a}]")
    _same_everywhere(_routes(dst, other), mr.LayoutError, "rank 0: ", culprit=0)
    _still_works()


@pytest.mark.mpi(min_size=2)
def test_wrong_block_on_the_last_rank_only():
    """The last rank's block has a wrong shape: every route but the DistArray's
    (whose blocks are its own) says so on every rank, naming that rank."""
    bad = SIZE - 1
    a = _block()
    local = a.local.copy() if RANK != bad else np.zeros((1, 1), "float32")
    routes = {
        "redistribute": lambda: mr.redistribute(local, SHAPE, MESH, SRC, "[{}, {x}]"),
        "redistribute between meshes": lambda: mr.redistribute(
            local, SHAPE, MESH, SRC, "[{}, {a}]", dst_mesh=OTHER),
        "Transfer": lambda: mr.Transfer(SHAPE, "float32", MESH, SRC, "[{}, {x}]").run(local),
        "Transfer between meshes": lambda: mr.Transfer(
            SHAPE, "float32", MESH, SRC, "[{}, {a}]", dst_mesh=OTHER).run(local),
    }
    _same_everywhere(routes, mr.ShapeError, f"rank {bad}: local block has shape", culprit=bad)
    _still_works()


@pytest.mark.mpi
def test_resplit_of_an_axis_out_of_range():
    """The analytics route: HeAT's resplit names the axis on every rank."""
    a = _block()
    err = _outcome(lambda: mr.heat.resplit(a, 5))
    all_ok(COMM, isinstance(err, ValueError) and "5" in str(err)
           and len(set(COMM.allgather(str(err)))) == 1, f"resplit(a, 5): {err!r}")
    _still_works()


# ------------------------------------------------------------ the table of mistakes
#
# Each mistake on every route that can make it: redistribute, Transfer,
# DistArray.redistribute, TransferGroup, between meshes (redistribute with
# dst_mesh, and a TransferGroup to another mesh).  Every route raises the same
# class with a message holding the same words, on every rank (the torch
# drop-in's share of the table is in tests/mpi/test_dtensor.py).

PART = mr.Mesh({"x": SIZE}, ranks=list(range(SIZE)))         # a mesh over listed ranks
FEW = mr.Mesh({"p": max(1, SIZE // 2)}, ranks=list(range(max(1, SIZE // 2))))


def _item(src=SRC, dst="[{}, {x}]", shape=SHAPE):
    return {"w": (shape, "float32", src, dst)}


def _group(items, blocks=None, **kw):
    def call():
        with mr.TransferGroup(items, MESH, **kw) as g:
            g.run({"w": _block().local.copy()} if blocks is None else blocks)
    return call


def _mistakes():
    """``{mistake: (class, words, {route: call})}``."""
    local = _block().local.copy()
    a = _block()
    other = COMM.Dup()
    on_other = mr.Mesh({"y": SIZE}, comm=other)
    wrong = np.zeros((SHAPE[0] + 3, 5), "float32") if RANK == SIZE - 1 else local
    table = {
        "unknown strategy": (mr.PlanError, "is not one of", {
            "redistribute": lambda: mr.redistribute(local, SHAPE, MESH, SRC, "[{}, {x}]",
                                                    strategy="teleport"),
            "Transfer": lambda: mr.Transfer(SHAPE, "float32", MESH, SRC, "[{}, {x}]",
                                            strategy="teleport"),
            "DistArray": lambda: a.redistribute("[{}, {x}]", strategy="teleport"),
            "between meshes": lambda: mr.redistribute(local, SHAPE, MESH, SRC, "[{}, {a}]",
                                                      strategy="teleport", dst_mesh=OTHER)}),
        "bad W": (mr.ShapeError, "workspace_bytes must be", {
            "redistribute": lambda: mr.redistribute(local, SHAPE, MESH, SRC, "[{}, {x}]",
                                                    workspace_bytes=-5),
            "Transfer": lambda: mr.Transfer(SHAPE, "float32", MESH, SRC, "[{}, {x}]",
                                            workspace_bytes=-5),
            "DistArray": lambda: a.redistribute("[{}, {x}]", workspace_bytes=-5),
            "TransferGroup": _group(_item(), workspace_bytes=-5),
            "between meshes": lambda: mr.redistribute(local, SHAPE, MESH, SRC, "[{}, {a}]",
                                                      workspace_bytes=-5, dst_mesh=OTHER)}),
        "bad layout text": (mr.LayoutError, "layout", {
            "redistribute": lambda: mr.redistribute(local, SHAPE, MESH, SRC, "[{}, {x}"),
            "Transfer": lambda: mr.Transfer(SHAPE, "float32", MESH, SRC, "[{}, {x}"),
            "DistArray": lambda: a.redistribute("[{}, {x}"),
            "TransferGroup": _group(_item(dst="[{}, {x}")),
            "between meshes": lambda: mr.redistribute(local, SHAPE, MESH, SRC, "[{}, {a}",
                                                      dst_mesh=OTHER)}),
        "unknown axis": (mr.LayoutError, "'q'", {
            "redistribute": lambda: mr.redistribute(local, SHAPE, MESH, SRC, "[{}, {q}]"),
            "Transfer": lambda: mr.Transfer(SHAPE, "float32", MESH, SRC, "[{}, {q}]"),
            "DistArray": lambda: a.redistribute("[{}, {q}]"),
            "TransferGroup": _group(_item(dst="[{}, {q}]")),
            "between meshes": lambda: mr.redistribute(local, SHAPE, MESH, SRC, "[{}, {q}]",
                                                      dst_mesh=OTHER)}),
        "wrong ndim": (mr.LayoutError, "dimension(s) but the array has 2", {
            "redistribute": lambda: mr.redistribute(local, SHAPE, MESH, SRC, "[{}, {x}, {}]"),
            "Transfer": lambda: mr.Transfer(SHAPE, "float32", MESH, SRC, "[{}, {x}, {}]"),
            "DistArray": lambda: a.redistribute("[{}, {x}, {}]"),
            "TransferGroup": _group(_item(dst="[{}, {x}, {}]")),
            "between meshes": lambda: mr.redistribute(local, SHAPE, MESH, SRC,
                                                      "[{}, {a}, {}]", dst_mesh=OTHER)}),
        "a float in the global shape": (mr.ShapeError, "is not a sequence of integers", {
            "redistribute": lambda: mr.redistribute(local, (SHAPE[0] + 0.5, 3), MESH, SRC,
                                                    "[{}, {x}]"),
            "Transfer": lambda: mr.Transfer((SHAPE[0] + 0.5, 3), "float32", MESH, SRC,
                                            "[{}, {x}]"),
            "DistArray": lambda: mr.DistArray.from_local(local, MESH, SRC,
                                                         (SHAPE[0] + 0.5, 3)),
            "TransferGroup": _group(_item(shape=(SHAPE[0] + 0.5, 3))),
            "between meshes": lambda: mr.redistribute(local, (SHAPE[0] + 0.5, 3), MESH, SRC,
                                                      "[{}, {a}]", dst_mesh=OTHER)}),
        "target mesh on another communicator": (mr.MeshError, "another communicator", {
            "redistribute": lambda: mr.redistribute(local, SHAPE, MESH, SRC, "[{}, {y}]",
                                                    dst_mesh=on_other),
            "Transfer": lambda: mr.Transfer(SHAPE, "float32", MESH, SRC, "[{}, {y}]",
                                            dst_mesh=on_other),
            "DistArray": lambda: a.redistribute("[{}, {y}]", mesh=on_other),
            "TransferGroup": _group(_item(dst="[{}, {y}]"), dst_mesh=on_other)}),
    }
    if SIZE > 1:
        table["a wrong block on the last rank"] = (mr.ShapeError, "local block has shape", {
            "redistribute": lambda: mr.redistribute(wrong, SHAPE, MESH, SRC, "[{}, {x}]"),
            "Transfer": lambda: mr.Transfer(SHAPE, "float32", MESH, SRC,
                                            "[{}, {x}]").run(wrong),
            "TransferGroup": _group(_item(), {"w": wrong}),
            "between meshes": lambda: mr.redistribute(wrong, SHAPE, MESH, SRC, "[{}, {a}]",
                                                      dst_mesh=OTHER)})
        # ranks past the first half are outside FEW; they pass a block all the same
        few_src = "[{p}, {}]"
        mine = mr.DistArray.from_global(np.zeros(SHAPE, "float32"), FEW, few_src).local
        few_block = np.zeros((1, 3), "float32") if mine is None else mine
        table["a rank outside the source mesh passing a block"] = (
            mr.ShapeError, "outside the source mesh", {
                "redistribute": lambda: mr.redistribute(few_block, SHAPE, FEW, few_src,
                                                        "[{}, {x}]", dst_mesh=PART),
                "Transfer": lambda: mr.Transfer(SHAPE, "float32", FEW, few_src, "[{}, {x}]",
                                                dst_mesh=PART).run(few_block),
                "TransferGroup": lambda: mr.TransferGroup(
                    {"w": (SHAPE, "float32", few_src, "[{}, {x}]")}, FEW,
                    dst_mesh=PART).run({"w": few_block})})
    return table, other


@pytest.mark.mpi
def test_each_mistake_raises_one_class_on_every_route():
    """The table of mistakes: one class and the same words on every route, every
    rank; a correct call works afterwards."""
    table, other = _mistakes()
    try:
        bad = []
        for mistake, (expected, words, routes) in table.items():
            for name, call in routes.items():
                err = _outcome(call)
                ok = isinstance(err, expected) and words in str(err)
                if not ok:
                    bad.append(f"{mistake} / {name}: rank {RANK} raised "
                               f"{type(err).__name__}: {err}")
        all_ok(COMM, not bad, "; ".join(bad[:4]))
    finally:
        (other.Free if hasattr(other, "Free") else other.free)()
    _still_works()
