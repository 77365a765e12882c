"""DTensor's block rule with strided shards, and exchanges of blocks of several
boxes (no MPI, no torch).

:func:`mpiredist.core.placements.dtensor_ranges` against the nested chunk
rule written out here (torch.chunk's chunks, one mesh dim after another;
``_StridedShard(f)`` takes a chunk of each of f chunks and joins them), and
a move between such blocks (:class:`~mpiredist.planning.pieces.Segments`)
over the thread transport against numpy.
"""

import numpy as np
from hypothesis import given, settings, strategies as st

from mpiredist.runtime import threads


def _chunk(items, n, k):
    """torch.chunk's chunk ``k`` of ``n`` of a list (empty past the last)."""
    c = -(-len(items) // n) if items else 0
    return items[k * c:(k + 1) * c] if c else []


def _held(length, kinds, mesh_shape, coord):
    """The indices of one tensor dim a device holds, in its local order, by the
    nested chunk rule (Shard: a chunk; _StridedShard(f): a chunk of each of f
    chunks, joined)."""
    held = list(range(length))
    for (kind, value), n, k in zip(kinds, mesh_shape, coord):
        if kind == "shard":
            held = _chunk(held, n, k)
        elif kind == "strided":
            held = [i for j in range(value[1]) for i in _chunk(_chunk(held, value[1], j), n, k)]
    return held


@settings(max_examples=300)
@given(st.integers(0, 40), st.lists(st.tuples(st.sampled_from(["shard", "strided", "replicate",
                                                               "partial"]),
                                              st.integers(1, 4), st.integers(1, 4)),
                                    min_size=1, max_size=3), st.data())
def test_dtensor_ranges_follow_the_nested_chunk_rule(length, dims, data):
    from mpiredist.core.placements import dtensor_ranges
    mesh_shape = tuple(n for _, n, _ in dims)
    kinds = [("shard", 0) if k == "shard" else ("strided", (0, f)) if k == "strided"
             else ("replicate", None) if k == "replicate" else ("partial", "sum")
             for k, _, f in dims]
    coord = tuple(data.draw(st.integers(0, n - 1)) for n in mesh_shape)
    (ranges,), partial = dtensor_ranges((length,), mesh_shape, kinds, coord)
    got = [i for lo, hi in ranges for i in range(lo, hi)]
    assert got == _held(length, kinds, mesh_shape, coord)
    assert partial == tuple(c for (k, _), c in zip(kinds, coord) if k == "partial")


def _blocks(G, kinds, mesh_shape):
    """Every device's local block of the 2-D ``G`` (placements on dim 0), its
    rows in local order, by the rule above."""
    coords = list(np.ndindex(*mesh_shape))
    return [G[_held(G.shape[0], kinds, mesh_shape, c)] for c in coords]


def _strided_move(group, src, dst, mesh_shape, G):
    from mpiredist.arrays.dtensor import _pieces
    from mpiredist.runtime.between import BoxExchange

    class Call:                         # what _pieces reads of a checked call
        shape, kept_dims = G.shape, ()
        src_info = (tuple(range(group.size)), mesh_shape, ())
        dst_info = src_info
        src_key, dst_key = src, dst

    sources, targets, segments = _pieces(Call, group.size)
    job = BoxExchange.from_boxes(group, sources, targets, G.dtype, segments=segments,
                                 workspace=256)
    local = _blocks(G, src, mesh_shape)[group.rank][None]
    return job._exchange.fill(np.ascontiguousarray(local), None)[0]


def test_a_move_between_strided_blocks_over_threads():
    G = np.arange(23 * 3, dtype=np.int64).reshape(23, 3)
    mesh_shape = (2, 2)
    for src, dst in [([("strided", (0, 2)), ("shard", 0)], [("shard", 0), ("shard", 0)]),
                     ([("shard", 0), ("replicate", None)], [("shard", 0), ("strided", (0, 3))]),
                     ([("strided", (0, 3)), ("strided", (0, 2))], [("replicate", None),
                                                                   ("shard", 0)])]:
        out = threads.run(4, lambda g: _strided_move(g, src, dst, mesh_shape, G))
        want = _blocks(G, dst, mesh_shape)
        for rank, (got, expected) in enumerate(zip(out, want)):
            np.testing.assert_array_equal(got, expected, err_msg=f"{src} -> {dst}, rank {rank}")
