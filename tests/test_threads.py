"""Plans end to end over the thread transport: the transport seam, without MPI.

Every rank is a thread of this process (:mod:`mpiredist.runtime.threads`),
and the public API runs over it as it runs over MPI: a mesh whose ``comm``
is the thread's group.  Each case runs a plan that has a given step kind
(the test checks the plan has it and that the step's records show messages),
an exchange between meshes, a TransferGroup and a donated run in one
buffer, and compares every rank's block with the oracle (tests/oracle.py).
Both of the engine's ways are run: a transport that takes boxes of arrays
(MPI's datatypes) and one that takes only contiguous buffers (torch's).
A last test runs the same in a fresh interpreter where importing mpi4py
fails.
"""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import mpiredist as mr
from mpiredist.runtime import threads

import oracle

# (mesh axes, shape, src dims, src partial, op, dst dims, the step kind the plan has)
CASES = [
    ([("x", 4)], (9, 6), [[], []], (), "sum", [["x"], []], "slice"),
    ([("x", 4)], (9, 6), [["x"], []], (), "sum", [[], []], "all_gather"),
    ([("x", 4)], (9, 6), [["x"], []], (), "sum", [[], ["x"]], "all_to_all"),
    ([("x", 2), ("y", 2)], (8, 6), [[], []], ("x",), "sum", [["x"], []], "reduce_scatter"),
    ([("x", 2), ("y", 2)], (7, 5), [[], ["y"]], ("x",), "max", [[], ["y"]], "all_reduce"),
    ([("x", 2), ("y", 2)], (8, 6), [["x", "y"], []], (), "sum", [["y", "x"], []], "permute"),
    ([("x", 2), ("y", 2)], (5, 7, 3), [["x"], ["y"], []], (), "sum", [[], ["x"], ["y"]],
     None),
]


def _run_case(group, case, donate, workspace=None):
    axes, shape, src, partial, op, dst, kind = case
    mesh = mr.Mesh(dict(axes), comm=group)
    rng = np.random.default_rng(7)
    G = oracle.global_array(shape, "int64", rng)
    blocks = oracle.source_blocks(G, axes, src, partial, op, rng)
    src_text, dst_text = oracle.layout_text(src, partial, op), oracle.layout_text(dst)
    records = []
    with mr.Transfer(shape, "int64", mesh, src_text, dst_text, donate=donate,
                     workspace_bytes=workspace) as t:
        ops = [s.op for s in t.plan.steps]
        out = t.run(blocks[group.rank].copy(), records=records)
    return out, ops, records, G


@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[-1] or "mixed")
def test_every_step_kind_over_threads(case, strided):
    axes, shape, src, partial, op, dst, kind = case
    size = oracle.mesh_size(axes)
    results = threads.run(size, lambda g: _run_case(g, case, False), strided=strided)
    G = results[0][3]
    problem = oracle.target_mismatch([r[0] for r in results], G, axes, dst)
    assert problem is None, problem
    ops = results[0][1]
    if kind is not None:
        assert kind in ops, f"the plan {ops} has no {kind}"
        moved = [r for r in results[0][2] if r.op == kind]
        if kind != "slice":
            assert sum(r.calls for rs in results for r in rs[2] if r.op == kind) > 0
        assert moved, "no record of the step"


@pytest.mark.parametrize("case", CASES[1:3] + CASES[5:6], ids=lambda c: c[-1])
def test_donated_runs_in_one_buffer_over_threads(case):
    """Donated, with a small W: the one-buffer strategy's in-place halves."""
    axes, shape, src, partial, op, dst, kind = case
    size = oracle.mesh_size(axes)
    results = threads.run(size, lambda g: _run_case(g, case, True, workspace=256))
    problem = oracle.target_mismatch([r[0] for r in results], results[0][3], axes, dst)
    assert problem is None, problem


def _between(group):
    """x=4 over every rank to y=2 over ranks 2 and 3: an exchange."""
    shape = (9, 5)
    G = np.arange(45, dtype=np.float32).reshape(shape)
    source = mr.Mesh({"x": 4}, comm=group)
    target = mr.Mesh({"y": 2}, comm=group, ranks=[3, 2])
    a = mr.DistArray.from_global(G, source, "[{x}, {}]")
    with mr.Transfer(shape, "float32", source, "[{x}, {}]", "[{}, {y}]", dst_mesh=target) as t:
        out = t.run(a.local)
        executor = t.executor
    return out, executor, G


def test_a_move_between_meshes_over_threads():
    results = threads.run(4, _between)
    G = results[0][2]
    assert results[0][1] == "exchange"
    assert results[0][0] is None and results[1][0] is None      # outside the target mesh
    np.testing.assert_array_equal(results[3][0], G[:, :3])      # device 0 of y is rank 3
    np.testing.assert_array_equal(results[2][0], G[:, 3:])


def _group(group):
    mesh = mr.Mesh({"x": 2, "y": 2}, comm=group)
    rng = np.random.default_rng(3)
    items, arrays = {}, {}
    for name, shape, src, dst in [("w", (6, 4), "[{x}, {y}]", "[{y}, {x}]"),
                                  ("b", (5,), "[{x,y}]", "[{}]"),
                                  ("e", (4, 8), "[{}, {}]", "[{}, {x,y}]")]:
        items[name] = (shape, "float64", src, dst)
        arrays[name] = rng.standard_normal(shape)
    blocks = {n: mr.DistArray.from_global(arrays[n], mesh, items[n][2]).local for n in items}
    with mr.TransferGroup(items, mesh) as g:
        out = g.run(blocks)
    want = {n: mr.DistArray.from_global(arrays[n], mesh, items[n][3]).local for n in items}
    return all(np.array_equal(out[n], want[n]) for n in items)


def test_a_transfer_group_over_threads():
    assert all(threads.run(4, _group))


def test_a_failure_after_data_moved_ends_every_thread(monkeypatch):
    """A fault on rank 1 in step 0: the job is aborted, no thread waits forever."""
    monkeypatch.setenv("MPIREDIST_FAULT", "1:0")
    monkeypatch.setenv("MPIREDIST_ON_FAILURE", "abort")
    with pytest.raises(threads.Aborted):
        threads.run(4, lambda g: _run_case(g, CASES[2], False), timeout=30)


def test_the_seam_needs_no_mpi4py():
    """The same plans in a fresh interpreter where ``import mpi4py`` fails."""
    code = textwrap.dedent("""
        import sys
        sys.modules["mpi4py"] = None            # any import of it raises ImportError
        sys.path.insert(0, "tests")
        import test_threads as t
        t.test_every_step_kind_over_threads(t.CASES[2], False)
        t.test_a_move_between_meshes_over_threads()
        t.test_a_transfer_group_over_threads()
        assert "mpi4py.MPI" not in sys.modules
        print("ran without mpi4py")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ran without mpi4py" in done.stdout
