"""Plans on a view that splits a dim at the node boundary (no MPI).

A gather or reduce-scatter over an axis whose major digits cross nodes
moves, on the unsplit dim, the large block across the links; on the view
``(k, N / k)`` the crossing digits get a dim of their own and cross while
the block is small (mpiredist/planning/views.py).  The oracle is
tests/oracle.py through the simulator, which moves the data itself.
"""

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mpiredist as mr
from mpiredist.core.mesh import crossing_sub_axes
from mpiredist.core.subaxes import expand
from mpiredist.planning import profile as profiles
from mpiredist.planning.simulate import simulate
from mpiredist.planning.views import node_views, split_group, split_layout
from oracle import global_array, layout_text, source_blocks, target_mismatch
from test_properties import _layout

# links between nodes 20x slower than inside them: across-node bytes matter
SLOW = dataclasses.replace(profiles.DEFAULT, beta_across=tuple(
    (op, 1, profiles.BETA / 20) for op in profiles.OPS))
X8 = mr.Mesh({"x": 8})
TWO_BY_FOUR = mr.Topology.uniform(2, 4)


def _subs(mesh, text):
    return expand(mr.Layout.parse(text), mesh)


# -- the views -----------------------------------------------------------------

def test_split_group_at_the_size_of_its_leading_sub_axes():
    x = _subs(X8, "[{x}]").dims[0]                      # x:0, x:1, x:2
    assert split_group(x, 2) == (x[:1], x[1:])
    assert split_group(x, 4) == (x[:2], x[2:])
    assert split_group((), 2) == ((), ())               # whole: every row of the view
    assert split_group(x[2:], 2) == (x[2:], ())         # size divides k: on the major dim
    assert split_group(x[1:], 8) == (x[1:], ())
    y = _subs(mr.Mesh({"y": 6}), "[{y}]").dims[0]       # y:0 (2), y:1 (3)
    assert split_group(y, 3) is None                    # 2 first: no prefix of size 3
    assert split_group(y, 4) is None


def test_node_views_only_where_the_major_digits_cross_and_lengths_divide():
    crossing = set(crossing_sub_axes(X8.axes, TWO_BY_FOUR))       # x:0
    S, T = _subs(X8, "[{x}, {}]"), _subs(X8, "[{}, {}]")
    (view, s, t), = node_views((64, 6), S, T, crossing)
    assert view == (2, 32, 6)
    assert str(s) == "[{x:0}, {x:1,x:2}, {}]" and str(t) == "[{}, {}, {}]"
    assert node_views((60, 6), S, T, crossing) == []    # 60 does not split into 8
    minor = set(crossing_sub_axes(X8.axes, mr.Topology([0, 1] * 4)))    # x:2 crosses
    assert node_views((64, 6), S, T, minor) == []       # the across-first split does it
    assert node_views((64, 6), S, T, set()) == []
    assert split_layout(_subs(X8, "[{}, {x}]"), 0, 2) == _subs(X8, "[{}, {}, {x}]")


# -- plans on views ------------------------------------------------------------

@pytest.mark.parametrize("src, dst", [
    ("[{x}, {}]", "[{}, {}]"),                          # c02: all-gather
    ("[{}, {}] sum{x}", "[{x}, {}]"),                   # c11: reduce-scatter
])
def test_major_crossing_gather_and_reduce_scatter_reach_the_across_node_bound(src, dst):
    shape = (64, 32)
    p = mr.plan(shape, "float32", X8, src, dst, topology=TWO_BY_FOUR, profile=SLOW)
    flat = mr.plan(shape, "float32", X8, src, dst, topology=TWO_BY_FOUR)
    assert p.view_shape == (2, 32, 32), p.explain()
    assert p.step_shape == p.view_shape and p.global_shape == shape
    assert p.inter_node_bytes_per_rank == p.inter_node_lower_bound_bytes_per_rank, p.explain()
    assert flat.view_shape is None
    assert flat.inter_node_bytes_per_rank == 4 * p.inter_node_bytes_per_rank, flat.explain()
    assert p.within_bound and p.bytes_sent_per_rank == flat.bytes_sent_per_rank
    assert "steps on the view [2, 32, 32]" in p.explain()
    assert p.to_dict()["view_shape"] == [2, 32, 32] and flat.to_dict()["view_shape"] is None
    # the crossing part is gathered first and reduced last: small blocks cross
    crossing = [s for s in p.steps if s.inter_node_bytes_per_rank]
    small = min(p.src_local_bytes, p.dst_local_bytes) // 4
    assert len(crossing) == 1, p.explain()
    assert max(math.prod(crossing[0].local_shape_before),
               math.prod(crossing[0].local_shape_after)) == 2 * small, p.explain()


def test_a_view_brings_no_exchange_where_exchanges_are_not_allowed():
    """The one-buffer strategy asks for plans without exchange steps: a view
    whose plan needs one is not taken where the plain dim's plan has none."""
    args = ((12, 6), "float64", {"x": 2, "y": 6}, "[{y},{}] sum{x}", "[{x},{y}]")
    kw = dict(topology=mr.Topology.uniform(4, 3), profile=SLOW)
    p = mr.plan(*args, **kw, allow_exchange=False)
    assert all(s.op != "exchange" for s in p.steps), p.explain()
    assert any(s.op == "exchange" for s in mr.plan(*args, **kw).steps)


def test_no_view_on_one_node_or_without_across_node_rates():
    for kwargs in ({}, {"profile": SLOW}, {"topology": TWO_BY_FOUR}):
        p = mr.plan((64, 32), "float32", X8, "[{x}, {}]", "[{}, {}]", **kwargs)
        assert p.view_shape is None and p.step_shape == (64, 32)


@st.composite
def view_problems(draw):
    """A mesh of 1-2 axes (4-16 devices) on nodes whose major digits cross,
    lengths that divide into every shard count (or not, now and then), and
    layouts that gather, reduce and move the crossing axes."""
    sizes = draw(st.sampled_from([(4,), (8,), (6,), (2, 4), (4, 2), (2, 2), (2, 3), (4, 4)]))
    mesh = list(zip("xy", sizes))
    size = math.prod(sizes)
    per = draw(st.sampled_from([k for k in range(1, size) if size % k == 0 and k > 1]
                               or [1]))
    topology = mr.Topology.uniform(size // per, per)
    ndim = draw(st.integers(1, 3))
    shape = tuple(size * draw(st.integers(1, 2)) - draw(st.sampled_from([0, 0, 0, 1]))
                  for _ in range(ndim))
    names = [a for a, _ in mesh]
    partial = draw(st.sampled_from([[], [], names[:1], names]))
    src = _layout(draw, [a for a in names if a not in partial], ndim)
    dst = _layout(draw, names, ndim)
    dtype = draw(st.sampled_from(["float64", "int32"]))
    return mesh, topology, shape, dtype, src, partial, dst


@settings(database=None, deadline=None, max_examples=300,
          suppress_health_check=[HealthCheck.too_slow])
@given(view_problems())
def test_plans_with_views_are_exact_within_the_bound_and_count_their_bytes(problem):
    mesh, topology, shape, dtype, src, partial, dst = problem
    rng = np.random.default_rng(1)
    G = global_array(shape, dtype, rng)
    blocks = source_blocks(G, mesh, src, partial, "sum", rng)
    before = [b.copy() for b in blocks]
    src_text, dst_text = layout_text(src, partial), layout_text(dst)
    p = mr.plan(shape, dtype, dict(mesh), src_text, dst_text, topology=topology, profile=SLOW)
    where = f"{dict(mesh)} {topology!r} {shape} {src_text} -> {dst_text}\n{p.explain()}"
    out, across = simulate(p, blocks, topology)
    assert target_mismatch(out, G, mesh, dst) is None, where
    assert all(np.array_equal(a, b) for a, b in zip(before, blocks)), where
    assert p.within_bound, where
    assert p.inter_node_bytes_per_rank >= p.inter_node_lower_bound_bytes_per_rank, where
    for step, counted in zip(p.steps, across):
        if step.op != "exchange":
            assert step.inter_node_bytes_per_rank == counted, where
    if p.view_shape is not None:
        assert math.prod(p.view_shape) == math.prod(shape), where
        assert len(p.view_shape) == len(shape) + 1, where
