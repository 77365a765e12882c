"""Nodes on MPI: the communicator's topology, Mesh.hybrid, meshes over every
rank in another order, and Transfers that know their nodes.

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_nodes.py

Runs at every N.  On one machine every rank shares one node; the cluster
stage (scripts/cluster_ci.sh) runs it on two network-namespace nodes, where
the hybrid mesh crosses them and the Transfer's plan knows its across-node
bytes.  The oracle for the topology is the ranks' host names (each node of
the simulated cluster has its own); for the data, tests/oracle.py on the
device each rank is (device ``d`` is rank ``mesh.ranks[d]``).
"""

import socket
import warnings

import numpy as np
import pytest
from helpers import all_ok

import oracle

MPI = pytest.importorskip("mpi4py.MPI")

import mpiredist as mr  # noqa: E402
from mpiredist.runtime.groups import topology  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()

pytestmark = pytest.mark.mpi


def _host_topology():
    return mr.Topology(COMM.allgather(socket.gethostname()))


def test_topology_is_the_ranks_host_names_and_is_cached():
    found = topology(COMM)
    expected = _host_topology()
    all_ok(COMM, found == expected, f"rank {RANK}: {found!r}, host names say {expected!r}")
    all_ok(COMM, topology(COMM) is found, "the topology is found again on a second call")
    all_ok(COMM, mr.topology() == found, "mr.topology() is COMM_WORLD's")


def _hybrid_or_none():
    t = topology(COMM)
    per = t.per_node
    if per is None:
        return None
    return mr.Mesh.hybrid({"tp": per}, {"dp": t.count}, COMM, topology=mr.topology(COMM))


def test_hybrid_mesh_of_the_communicator_runs_and_its_plan_knows_the_nodes():
    mesh = _hybrid_or_none()
    if mesh is None:
        pytest.skip("nodes with different numbers of ranks")
    t = topology(COMM)
    device = mesh.device_ranks().index(RANK)
    all_ok(COMM, mesh.topology.node(device) == t.node(RANK),
           f"rank {RANK} is device {device} of node {mesh.topology.node(device)}, but is on "
           f"node {t.node(RANK)}")
    G = oracle.global_array((13, 10), np.float64, np.random.default_rng(1))
    axes = list(mesh.axes)
    for src, dst in ((("dp",), ("tp",)), (("tp",), ("dp",)), (("dp", "tp"), ())):
        sd, dd = (src, ()), (dst, ())
        block = oracle.local_block(G, axes, sd, device)
        with mr.Transfer(G.shape, G.dtype, mesh, oracle.layout_text(sd),
                         oracle.layout_text(dd)) as tr:
            out = tr.run(block)
            plan = tr.plan
        want = oracle.expected(G, axes, dd, device)
        all_ok(COMM, np.array_equal(out, want), f"rank {RANK} (device {device}) {sd}->{dd}")
        if t.count > 1:
            all_ok(COMM, plan.topology == mesh.topology and
                   plan.inter_node_bytes_per_rank is not None,
                   f"on {t.count} nodes the plan knows its nodes: {plan.explain()}")


def test_hybrid_refuses_on_every_rank_what_the_nodes_do_not_allow():
    t = topology(COMM)
    try:
        mr.Mesh.hybrid({"tp": SIZE + 1}, {"dp": t.count}, COMM, topology=t)
    except mr.MeshError as exc:
        err = str(exc)
    else:
        err = None
    all_ok(COMM, err is not None and "needs" in err, f"rank {RANK}: {err!r}")


@pytest.mark.parametrize("src, dst", [
    (("x",), ("y",)), (("x", "y"), ()), (("y", "x"), ("x",)), ((), ("y", "x")),
])
def test_a_mesh_over_every_rank_in_another_order(src, dst):
    """Mesh.hybrid of a made-up topology (ranks dealt to two 'nodes' by
    parity): device d is rank ranks[d], and every rank holds its device's
    block before and after."""
    if SIZE < 2 or SIZE % 2:
        pytest.skip("an even number of ranks")
    fake = mr.Topology([r % 2 for r in range(SIZE)])
    mesh = mr.Mesh.hybrid({"y": SIZE // 2}, {"x": 2}, COMM, topology=fake)
    order = list(mesh.device_ranks())
    all_ok(COMM, order == list(range(0, SIZE, 2)) + list(range(1, SIZE, 2)), f"{order}")
    device = order.index(RANK)
    axes = list(mesh.axes)
    G = oracle.global_array((7, 9), np.int64, np.random.default_rng(3))
    sd, dd = (src, ()), (dst, ())
    block = oracle.local_block(G, axes, sd, device)
    for strategy in ("collectives", "direct"):
        with mr.Transfer(G.shape, G.dtype, mesh, oracle.layout_text(sd),
                         oracle.layout_text(dd), strategy=strategy) as tr:
            out = tr.run(np.array(block))
            on_nodes = tr.plan.topology
        want = oracle.expected(G, axes, dd, device)
        all_ok(COMM, np.array_equal(out, want),
               f"rank {RANK} (device {device}) {strategy} {sd}->{dd}: {out} != {want}")
        all_ok(COMM, on_nodes == fake.devices(order),
               f"the plan takes the mesh's made-up nodes: {on_nodes!r}")
    out = mr.redistribute(np.array(block), G.shape, mesh, oracle.layout_text(sd), oracle.layout_text(dd))
    all_ok(COMM, np.array_equal(out, oracle.expected(G, axes, dd, device)),
           f"rank {RANK}: redistribute on the reordered mesh")


@pytest.mark.parametrize("shape", [(8, 5), (4, 3, 2)])
@pytest.mark.parametrize("src, dst", [
    (("x",), ()),                                       # all-gather (c02)
    ((), ("x",)),                                       # partial sums reduced and scattered (c11)
])
def test_plans_on_a_view_split_at_the_node_boundary_run_exact(shape, src, dst, tmp_path,
                                                              monkeypatch):
    """On two made-up nodes whose major digit of x crosses (device d on node
    d // (P/2)) and links priced 20x slower, gathers and reduce-scatters over
    x run on the view that splits dim 0 at the node boundary: every rank's
    result equals the oracle's, with ``out=`` too and donated, and a source
    that is not donated is unchanged."""
    import dataclasses
    import json

    from mpiredist.planning import profile as profiles
    if SIZE < 4 or SIZE % 2:
        pytest.skip("an even number of ranks, at least 4 (two nodes, two ranks each)")
    slow = dataclasses.replace(profiles.DEFAULT, beta_across=tuple(
        (op, 1, profiles.BETA / 20) for op in profiles.OPS))
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(slow.to_dict()))
    monkeypatch.setenv(profiles.ENV, str(path))
    fake = mr.Topology.uniform(2, SIZE // 2)
    mesh = mr.Mesh({"x": SIZE}, COMM, None, fake)
    axes = list(mesh.axes)
    shape = (shape[0] * SIZE,) + shape[1:]
    rest = ((),) * (len(shape) - 1)
    sd = ((src,) + rest, () if src else ("x",))       # dim 0 over x, or partial sums over x
    dd = ((dst,) + rest, ())
    rng = np.random.default_rng(5)
    G = oracle.global_array(shape, np.int64, rng)
    block = oracle.source_blocks(G, axes, *sd, rng=rng)[RANK]
    want = oracle.expected(G, axes, dd[0], RANK)
    # (donate, out=, W): a small W makes the donated block itself the buffer
    for donate, given, w in ((False, False, None), (False, True, None), (True, False, None),
                             (True, True, None), (True, False, 1 << 16), (False, False, 1 << 16)):
        with mr.Transfer(shape, G.dtype, mesh, oracle.layout_text(*sd), oracle.layout_text(*dd),
                         donate=donate, workspace_bytes=w) as tr:
            all_ok(COMM, tr.plan.view_shape == (2, shape[0] // 2) + shape[1:],
                   f"the plan runs on the view: {tr.plan.explain()}")
            mine = block.copy()
            if len(shape) == 2 and not donate:
                mine = np.asmatrix(mine)        # a block the checks take, with two dims only
            out = np.empty(tr.target_shape, G.dtype) if given else None
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = tr.run(mine, out=out)
        where = f"rank {RANK} {sd}->{dd} donate={donate} out={given} W={w}"
        all_ok(COMM, got.shape == want.shape and np.array_equal(got, want),
               f"{where}: {got} != {want}")
        all_ok(COMM, not given or got is out, f"{where}: out= is the result")
        all_ok(COMM, donate or np.array_equal(mine, block), f"{where}: source changed")
        all_ok(COMM, not caught, f"{where}: {[str(c.message) for c in caught]}")
        if donate and w is not None:            # the donated memory became the result
            all_ok(COMM, np.shares_memory(got, mine), f"{where}: the donated block is reused")
