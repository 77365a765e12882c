"""Layouts from and to DTensor placements and JAX PartitionSpecs (no MPI), and the
block rule against DTensor's own computation, uneven lengths included."""

import itertools

import numpy as np
import pytest

import mpiredist as mr
from mpiredist.core.placements import dtensor_boxes, shard_interval
from mpiredist.planning.pieces import layout_boxes

try:
    from hypothesis import given, settings, strategies as st
except ImportError:
    given = None

torch = pytest.importorskip("torch")
from torch.distributed.tensor import Partial, Replicate, Shard  # noqa: E402
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset  # noqa


def test_from_and_to_placements():
    lay = mr.Layout.from_placements([Shard(0), Replicate(), Shard(1)], ["dp", "x", "tp"], 2)
    assert lay == mr.Layout.parse("[{dp}, {tp}]")
    assert lay.to_placements(["dp", "x", "tp"]) == [Shard(0), Replicate(), Shard(1)]
    nested = mr.Layout.from_placements([Shard(0), Shard(0)], ["a", "b"], 1)
    assert nested == mr.Layout.parse("[{a,b}]")
    part = mr.Layout.from_placements([Partial("max"), Shard(-1)], ["a", "b"], 3)
    assert part == mr.Layout.parse("[{}, {}, {b}] max{a}")
    assert part.to_placements(["a", "b"]) == [Partial("max"), Shard(2)]


def test_placements_refusals():
    from torch.distributed.tensor.placement_types import _StridedShard
    with pytest.raises(mr.LayoutError, match="strided"):
        mr.Layout.from_placements([_StridedShard(0, split_factor=2), Shard(0)], ["a", "b"], 1)
    with pytest.raises(mr.LayoutError, match="avg"):
        mr.Layout.from_placements([Partial("avg")], ["a"], 1)
    with pytest.raises(mr.LayoutError, match="no dim 2"):
        mr.Layout.from_placements([Shard(2)], ["a"], 2)
    with pytest.raises(mr.LayoutError, match="mesh-dim order"):
        mr.Layout.parse("[{b,a}]").to_placements(["a", "b"])
    with pytest.raises(mr.LayoutError, match="not dims of the mesh"):
        mr.Layout.parse("[{q}]").to_placements(["a"])


def test_partition_specs():
    lay = mr.Layout.from_partition_spec((("x", "y"), None, "z"))
    assert lay == mr.Layout.parse("[{x,y}, {}, {z}]")
    assert mr.Layout.from_partition_spec(("x",), ndim=3) == mr.Layout.parse("[{x}, {}, {}]")
    with pytest.raises(mr.LayoutError, match="UNCONSTRAINED"):
        mr.Layout.from_partition_spec((object(),))
    jax = pytest.importorskip("jax")
    from jax.sharding import PartitionSpec
    spec = lay.to_partition_spec()
    assert spec == PartitionSpec(("x", "y"), None, "z")
    assert mr.Layout.from_partition_spec(spec) == lay
    with pytest.raises(mr.LayoutError, match="partial"):
        mr.Layout.parse("[{x}] sum{y}").to_partition_spec()
    assert jax is not None


def _torch_box(shape, mesh_shape, placements, coord):
    local, offset = _compute_local_shape_and_global_offset(shape, mesh_shape, list(coord),
                                                           placements)
    return tuple((o, o + n) for o, n in zip(offset, local))


def _norm(box):
    """Empty intervals compare as empty, wherever they start."""
    return tuple((lo, hi) if hi > lo else (0, 0) for lo, hi in box)


def _check(shape, mesh_shape, placements):
    coords = list(itertools.product(*[range(k) for k in mesh_shape]))
    ours = dtensor_boxes(shape, mesh_shape, placements, coords)
    for coord, (box, _) in zip(coords, ours):
        assert _norm(box) == _norm(_torch_box(shape, mesh_shape, placements, coord)), coord
    names = [f"m{i}" for i in range(len(mesh_shape))]
    lay = mr.Layout.from_placements(placements, names, len(shape))
    mesh = mr.Mesh(",".join(f"{n}={k}" for n, k in zip(names, mesh_shape)))
    theirs = layout_boxes(shape, mesh, lay, mesh.size)
    nested = any(len(d) > 1 for d in lay.dims)
    even = all(n % int(np.prod([mesh_shape[names.index(a)] for a in d])) == 0
               for n, d in zip(shape, lay.dims) if d)
    same = all(_norm(b) == _norm(t) for (b, _), t in zip(ours, theirs))
    if not nested or even:      # one mesh dim per tensor dim, or even lengths: the same rule
        assert same, (shape, mesh_shape, placements)
    return same


def test_block_rule_uneven_single_and_nested():
    _check((5, 7), (3,), [Shard(0)])
    _check((2, 9), (4, 2), [Shard(1), Shard(0)])
    _check((0, 3), (2,), [Shard(0)])
    # nested shards of an uneven dim: DTensor nests the rule, mpiredist does not
    assert not _check((5,), (2, 2), [Shard(0), Shard(0)])
    assert shard_interval(5, 4, 3) == (5, 5)


if given is not None:
    @settings(max_examples=150, deadline=None)
    @given(st.lists(st.integers(0, 11), min_size=1, max_size=3),
           st.lists(st.integers(1, 4), min_size=1, max_size=3), st.data())
    def test_block_rule_property(shape, mesh_shape, data):
        placements = [data.draw(st.sampled_from(
            [Replicate()] + [Shard(d) for d in range(len(shape))])) for _ in mesh_shape]
        _check(tuple(shape), tuple(mesh_shape), placements)

