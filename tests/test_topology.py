"""Topology, Mesh.hybrid, node_axes and plans that know nodes (no MPI)."""

import dataclasses
import pickle

import numpy as np
import pytest

import mpiredist as mr
from mpiredist.core.mesh import crossing_names
from mpiredist.planning import profile as profiles
from mpiredist.planning.nodes import Move, across_lower_bound, step_across_bytes

MESH = {"dp": 2, "tp": 4}
TWO_BY_FOUR = mr.Topology.uniform(2, 4)


# -- Topology ------------------------------------------------------------------

def test_labels_are_renumbered_in_order_of_first_device():
    t = mr.Topology(["b", "a", "b", "c"])
    assert [t.node(d) for d in range(4)] == [0, 1, 0, 2]
    assert (t.count, t.size, t.per_node, t.is_uniform) == (3, 4, None, False)
    assert t.array().tolist() == [0, 1, 0, 2]


def test_uniform_equals_the_same_nodes_listed():
    listed = mr.Topology([5, 5, 5, 9, 9, 9])
    assert listed == mr.Topology.uniform(2, 3) and listed.is_uniform
    assert hash(listed) == hash(mr.Topology.uniform(2, 3))
    assert mr.Topology([0, 1, 0, 1]) != mr.Topology.uniform(2, 2)
    assert mr.Topology([0, 1, 0, 1]).per_node == 2


@pytest.mark.parametrize("t", [mr.Topology.uniform(3, 2), mr.Topology([0, 1, 1, 0, 2])])
def test_repr_round_trips_and_pickles(t):
    assert eval(repr(t), {"Topology": mr.Topology}) == t
    assert pickle.loads(pickle.dumps(t)) == t


def test_immutable():
    t = mr.Topology.uniform(2, 2)
    with pytest.raises(AttributeError):
        t._nodes = (0,)


@pytest.mark.parametrize("args", [(0, 4), (2, 0), (2.0, 4), (True, 4), (2, "4")])
def test_uniform_rejects_what_is_not_a_positive_integer(args):
    with pytest.raises(mr.MeshError, match="positive integer"):
        mr.Topology.uniform(*args)


def test_empty_and_out_of_range():
    with pytest.raises(mr.MeshError, match="at least one device"):
        mr.Topology([])
    with pytest.raises(mr.MeshError, match="device 8 is outside"):
        TWO_BY_FOUR.node(8)


def test_devices_takes_the_nodes_of_a_subset_or_reordering():
    assert TWO_BY_FOUR.devices([4, 0, 5, 1]) == mr.Topology([0, 1, 0, 1])
    assert TWO_BY_FOUR.devices([6, 7]) == mr.Topology.uniform(1, 2)


# -- meshes with a topology -------------------------------------------------------

def test_topology_is_kept_but_is_not_part_of_equality():
    m = mr.Mesh(MESH, topology=TWO_BY_FOUR)
    assert m.topology == TWO_BY_FOUR and m == mr.Mesh(MESH)
    assert m.abstract().topology == TWO_BY_FOUR
    assert mr.Mesh(m).topology == TWO_BY_FOUR
    assert m.with_topology(None).topology is None


def test_topology_of_another_size_or_kind_is_refused():
    with pytest.raises(mr.MeshError, match="has 8 devices, but the mesh x=4 has 4"):
        mr.Mesh({"x": 4}, topology=TWO_BY_FOUR)
    with pytest.raises(mr.MeshError, match="must be a Topology, found list"):
        mr.Mesh({"x": 4}, topology=[0, 0, 1, 1])


@pytest.mark.parametrize("mesh, topology, expected", [
    ({"dp": 2, "tp": 4}, TWO_BY_FOUR, ("dp",)),
    ({"tp": 4, "dp": 2}, TWO_BY_FOUR, ("tp:0",)),        # tp's major digit picks the node
    ({"x": 8}, TWO_BY_FOUR, ("x:0",)),
    ({"x": 6}, mr.Topology.uniform(2, 3), ("x:0",)),
    ({"x": 12}, mr.Topology.uniform(3, 4), ("x",)),      # 12 = 2*2*3 digits; 4 cuts through
    ({"a": 2, "b": 2}, mr.Topology([0, 1, 0, 1]), ("b",)),
    ({"a": 2, "b": 2}, mr.Topology([0, 1, 1, 0]), ("a", "b")),
    ({"dp": 2, "tp": 4}, mr.Topology.uniform(1, 8), ()),
])
def test_node_axes(mesh, topology, expected):
    assert mr.Mesh(mesh, topology=topology).node_axes() == expected
    assert crossing_names(tuple(mesh.items()), topology) == expected


def test_node_axes_needs_a_topology():
    with pytest.raises(mr.MeshError, match="has no topology"):
        mr.Mesh(MESH).node_axes()


# -- Mesh.hybrid -------------------------------------------------------------------

def test_hybrid_orders_devices_node_by_node():
    m = mr.Mesh.hybrid({"tp": 2}, {"dp": 2}, topology=mr.Topology([0, 1, 0, 1]))
    assert m.axes == (("dp", 2), ("tp", 2)) and m.ranks == (0, 2, 1, 3)
    assert m.topology == mr.Topology.uniform(2, 2) and m.node_axes() == ("dp",)
    # device n * W + j is the j-th rank (in rank order) of node n
    nodes = np.array([0, 1, 0, 1])
    assert [int(nodes[r]) for r in m.device_ranks()] == [0, 0, 1, 1]


def test_hybrid_on_ranks_already_node_by_node_lists_no_ranks():
    m = mr.Mesh.hybrid({"tp": 4}, {"dp": 2}, topology=TWO_BY_FOUR)
    assert m.ranks is None and m == mr.Mesh(MESH) and m.node_axes() == ("dp",)


def test_hybrid_with_several_axes_each_side():
    m = mr.Mesh.hybrid({"tp": 2, "sp": 2}, {"pp": 2, "dp": 1}, topology=TWO_BY_FOUR)
    assert m.axes == (("pp", 2), ("dp", 1), ("tp", 2), ("sp", 2))
    assert m.node_axes() == ("pp",)


@pytest.mark.parametrize("within, across, topology, match", [
    ({"tp": 3}, {"dp": 2}, mr.Topology([0, 1, 0, 1]), "needs 3 rank"),
    ({"tp": 2}, {"dp": 3}, mr.Topology([0, 1, 0, 1]), "on each of 3 node"),
    ({"tp": 2}, {"dp": 2}, mr.Topology([0, 0, 0, 1]), r"of \[1, 3\] rank"),
    ({"tp": 2}, {"tp": 2}, mr.Topology([0, 0, 1, 1]), "tp"),
    ({"tp": 2}, {"dp": 2}, [0, 0, 1, 1], "must be a Topology"),
])
def test_hybrid_refuses_what_does_not_fit(within, across, topology, match):
    with pytest.raises(mr.MeshError, match=match):
        mr.Mesh.hybrid(within, across, topology=topology)


# -- across-node bytes -------------------------------------------------------------

@pytest.mark.parametrize("src, dst, across", [
    ("[{dp},{tp}]", "[{},{tp}]", 32 * 16 * 4),     # gather over dp: the whole block crosses
    ("[{dp},{tp}]", "[{dp},{}]", 0),               # gather over tp: stays on the node
    ("[{dp},{tp}]", "[{dp},{tp}]", 0),
])
def test_hand_computed_across_bytes(src, dst, across):
    p = mr.plan((64, 64), "f4", MESH, src, dst, topology=TWO_BY_FOUR)
    assert p.inter_node_bytes_per_rank == across, p.explain()


def test_all_reduce_across_nodes_counts_both_halves():
    # each rank holds a partial (64,) block; the sum over dp crosses nodes:
    # reduce half of the block to the partner, gather the partner's reduced half
    p = mr.plan((64,), "f4", MESH, "[{}] sum{dp}", "[{}]", topology=TWO_BY_FOUR)
    assert [s.op for s in p.steps] == ["all_reduce"]
    assert p.steps[0].inter_node_bytes_per_rank == 2 * 32 * 4


def test_one_node_sends_nothing_across():
    one = mr.Topology.uniform(1, 8)
    p = mr.plan((64, 64), "f4", MESH, "[{dp},{tp}]", "[{tp},{dp}]", topology=one)
    assert p.inter_node_bytes_per_rank == 0 == p.inter_node_lower_bound_bytes_per_rank
    assert p.bytes_sent_per_rank > 0


def test_a_plan_without_topology_reports_none():
    p = mr.plan((64, 64), "f4", MESH, "[{dp},{tp}]", "[{tp},{dp}]")
    assert p.topology is None and p.inter_node_bytes_per_rank is None
    assert all(s.inter_node_bytes_per_rank is None for s in p.steps)
    assert "across nodes" not in p.explain()


def test_explain_and_to_dict_show_the_bytes_across_nodes():
    p = mr.plan((64, 64), "f4", mr.Mesh(MESH, topology=TWO_BY_FOUR), "[{dp},{tp}]",
                "[{tp},{dp}]")
    d = p.to_dict()
    assert d["topology"] == "2 node(s) x 4"
    assert d["inter_node_bytes_per_rank"] == sum(s["inter_node_bytes_per_rank"]
                                                 for s in d["steps"]) > 0
    assert d["inter_node_lower_bound_bytes_per_rank"] <= d["inter_node_bytes_per_rank"]
    text = p.explain()
    assert "across nodes" in text and "across nodes (2 node(s) x 4) per rank" in text


def test_topology_argument_is_checked():
    with pytest.raises(mr.MeshError, match="has 4 devices, but mesh"):
        mr.plan((8,), "f4", MESH, "[{}]", "[{dp}]", topology=mr.Topology.uniform(2, 2))
    with pytest.raises(mr.MeshError, match="must be a Topology"):
        mr.plan((8,), "f4", MESH, "[{}]", "[{dp}]", topology=(0, 1))


def test_lower_bound_none_past_the_exact_size():
    from mpiredist.planning import nodes
    big = mr.Topology.uniform(2, nodes.EXACT_BOUND)
    p = mr.plan((1 << 14,), "f4", {"x": 2 * nodes.EXACT_BOUND}, "[{x}]", "[{}]", topology=big)
    assert p.inter_node_lower_bound_bytes_per_rank is None
    assert p.inter_node_bytes_per_rank > 0
    assert "not computed at this size" in p.explain()


def test_slow_links_between_nodes_change_the_plan():
    """With across-node rates a hundredth of the others, the planner reduces
    over the node axis by a reduce-scatter (half the bytes cross) instead of
    an all-reduce."""
    slow = dataclasses.replace(profiles.DEFAULT, beta_across=tuple(
        (op, 1, profiles.BETA / 100) for op in profiles.OPS))
    args = ((64, 64), "f4", MESH, "[{tp},{}] sum{dp}", "[{dp},{tp}]")
    fast = mr.plan(*args, topology=TWO_BY_FOUR)
    priced = mr.plan(*args, topology=TWO_BY_FOUR, profile=slow)
    assert priced.inter_node_bytes_per_rank < fast.inter_node_bytes_per_rank
    assert [s.op for s in fast.steps][0] == "all_reduce"
    assert [s.op for s in priced.steps][0] == "reduce_scatter"
    # without a topology the across-node rates have nothing to price
    assert [s.op for s in mr.plan(*args, profile=slow).steps] == [s.op for s in fast.steps]


def test_profile_keeps_its_across_node_rates():
    slow = dataclasses.replace(profiles.DEFAULT, beta_across=(("all_gather", 2, 1e8),))
    back = profiles.Profile.from_dict(slow.to_dict())
    assert back.beta_across == slow.beta_across and back.key == slow.key
    assert slow.key != profiles.DEFAULT.key
    assert slow.beta_for("all_gather", 4, across=True) == 1e8
    assert slow.beta_for("all_gather", 4) == profiles.DEFAULT.beta_for("all_gather", 4)
    assert "beta_across" not in profiles.DEFAULT.to_dict()


def test_step_across_bytes_of_a_move_and_the_bound_directly():
    from mpiredist.core.subaxes import expand
    m = mr.Mesh(MESH)
    before = expand(mr.Layout.parse("[{dp},{tp}]"), m)
    after = expand(mr.Layout.parse("[{},{tp}]"), m)
    dp = tuple(s for s in before.dims[0])
    move = Move("all_gather", dp, before, after, 32 * 16 * 4)
    assert step_across_bytes((64, 64), 4, move, m.axes, TWO_BY_FOUR) == 32 * 16 * 4
    assert step_across_bytes((64, 64), 4, move, m.axes, mr.Topology.uniform(1, 8)) == 0
    # node 0 holds rows 0:32 and needs all 64 of its columns' rows: 32x16 per device
    assert across_lower_bound((64, 64), 4, before, after, m.axes, TWO_BY_FOUR) == 32 * 16 * 4


# -- ranks="auto" by nodes -----------------------------------------------------------

def test_auto_ranks_keep_the_target_blocks_on_the_nodes_that_hold_them():
    """Source halves on ranks 0 (node 0) and 1 (node 1); the target's quarters
    0-1 come from half 0, 2-3 from half 1.  Without nodes the ranks left
    over (2, 3) go in order, and each gets a quarter from the other node;
    with them, ranks 3 (node 0) and 2 (node 1) take the quarters their node
    holds."""
    from mpiredist.planning import crossmesh
    src, dst = mr.Layout.parse("[{x}]"), mr.Layout.parse("[{x}]")
    source, target = mr.Mesh({"x": 2}, ranks=[0, 1]), mr.Mesh({"x": 4}, ranks="auto")
    nodes = mr.Topology([0, 1, 1, 0])
    plain = crossmesh.relabel((16,), source, src, target, dst, 4)
    aware = crossmesh.relabel((16,), source, src, target, dst, 4, nodes)
    assert plain.device_ranks() == (0, 2, 1, 3)
    assert aware.device_ranks() == (0, 3, 1, 2)
    on_node = [nodes.node(r) for r in aware.device_ranks()]
    assert on_node == [0, 0, 1, 1]                  # quarter d on the node of half d // 2
    p = mr.plan((16,), "f4", source, "[{x}]", "[{x}]", dst_mesh=target, topology=nodes)
    assert p.dst_mesh.device_ranks() == (0, 3, 1, 2)
    # one node: the same order as without nodes
    one = crossmesh.relabel((16,), source, src, target, dst, 4, mr.Topology.uniform(1, 4))
    assert one.device_ranks() == plain.device_ranks()


def test_auto_ranks_by_nodes_keep_the_plain_order_when_it_is_as_good():
    from mpiredist.planning import crossmesh
    lay = mr.Layout.parse("[{x}]")
    source, target = mr.Mesh({"x": 4}), mr.Mesh({"x": 4}, ranks="auto")
    out = crossmesh.relabel((16,), source, lay, target, lay, 4, mr.Topology([0, 1, 0, 1]))
    assert out.device_ranks() == (0, 1, 2, 3)


def test_auto_ranks_refuse_a_topology_of_another_size():
    from mpiredist.planning import crossmesh
    lay = mr.Layout.parse("[{x}]")
    with pytest.raises(mr.MeshError, match="has 2 ranks, but the communicator 4"):
        crossmesh.relabel((16,), mr.Mesh({"x": 4}), lay, mr.Mesh({"x": 4}, ranks="auto"), lay,
                          4, mr.Topology.uniform(1, 2))
