"""The reference oracle checked against hand-written examples of docs/semantics.md (Local block)."""

import numpy as np
import pytest

from oracle import (block_slices, coords, expected, local_block, partial_blocks,
                    reduce_groups, shard_interval)


def intervals(n, k):
    return [shard_interval(n, k, p) for p in range(k)]


def test_coords_row_major_last_axis_fastest():
    assert coords(5, (2, 4)) == (1, 1)
    assert coords(0, (2, 4)) == (0, 0)
    assert coords(3, (2, 4)) == (0, 3)
    assert coords(4, (2, 4)) == (1, 0)
    assert coords(7, (2, 2, 2)) == (1, 1, 1)
    assert coords(6, (2, 2, 2)) == (1, 1, 0)
    assert coords(0, ()) == ()


def test_uneven_length_ceil_chunks():
    # N=10 over k=4: c = 3.
    assert intervals(10, 4) == [(0, 3), (3, 6), (6, 9), (9, 10)]


def test_length_smaller_than_shard_count_gives_empty_blocks():
    assert intervals(3, 4) == [(0, 1), (1, 2), (2, 3), (3, 3)]
    assert intervals(0, 3) == [(0, 0)] * 3
    # c = ceil(5/4) = 2 leaves the last shard empty although N >= k.
    assert intervals(5, 4) == [(0, 2), (2, 4), (4, 5), (5, 5)]


def test_block_slices_major_to_minor():
    mesh = [("x", 2), ("y", 4)]
    # rank 5 = (x=1, y=1); dim 0 over (x, y): p = 1*4 + 1 = 5 of 8.
    assert block_slices((16, 3), mesh, [["x", "y"], []], 5) == (slice(10, 12), slice(0, 3))
    # over (y, x): p = 1*2 + 1 = 3 of 8.
    assert block_slices((16, 3), mesh, [["y", "x"], []], 5) == (slice(6, 8), slice(0, 3))
    # dim 1 over y only, x replicated.
    assert block_slices((16, 8), mesh, [[], ["y"]], 5) == (slice(0, 16), slice(2, 4))
    assert block_slices((16, 8), mesh, [[], ["y"]], 1) == (slice(0, 16), slice(2, 4))


def test_local_block_is_a_copy_of_the_right_elements():
    G = np.arange(40).reshape(10, 4)
    b = local_block(G, [("x", 4)], [["x"], []], 3)
    assert np.array_equal(b, G[9:10])
    b[...] = -1
    assert G[9, 0] == 36
    assert local_block(G, [("x", 4)], [[], ["x"]], 2).shape == (10, 1)
    assert local_block(np.arange(3), [("x", 4)], [["x"]], 3).shape == (0,)


def test_expected_tiles_the_array():
    mesh = [("x", 2), ("y", 3)]
    G = np.arange(7 * 5).reshape(7, 5)
    seen = np.zeros(G.shape, dtype=int)
    for r in range(6):
        seen[block_slices(G.shape, mesh, [["y"], ["x"]], r)] += 1
        assert np.array_equal(expected(G, mesh, [["y"], ["x"]], r),
                              G[block_slices(G.shape, mesh, [["y"], ["x"]], r)])
    assert np.all(seen == 1)


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8", "float32", "float64",
                                   "complex64"])
@pytest.mark.parametrize("op", ["sum", "max", "min", "prod"])
def test_partial_blocks_reduce_to_the_local_block(dtype, op):
    if np.dtype(dtype).kind == "c" and op in ("max", "min"):
        pytest.skip("complex numbers have no order")
    rng = np.random.default_rng(0)
    mesh = [("x", 2), ("y", 3), ("z", 2)]
    G = rng.integers(0, 50, size=(7, 4)).astype(dtype)
    dims = [["x"], []]
    blocks = partial_blocks(G, mesh, dims, ["y", "z"], op, rng)
    assert all(b.dtype == G.dtype for b in blocks)
    reduced = reduce_groups(blocks, mesh, ["y", "z"], op)
    for r in range(12):
        assert np.array_equal(reduced[r], local_block(G, mesh, dims, r))
    if op == "sum":
        # The contributions are not trivially all equal.
        assert any(not np.array_equal(blocks[0], blocks[r]) for r in (1, 2, 3))


def test_partial_blocks_bool_and_or():
    rng = np.random.default_rng(1)
    mesh = [("x", 4)]
    G = rng.integers(0, 2, size=(5, 3)).astype(bool)
    for op in ("max", "min"):
        blocks = partial_blocks(G, mesh, [[], []], ["x"], op, rng)
        acc = np.logical_or.reduce(blocks) if op == "max" else np.logical_and.reduce(blocks)
        assert np.array_equal(acc, G)
    with pytest.raises(ValueError):
        partial_blocks(G, mesh, [[], []], ["x"], "sum", rng)


def test_partial_blocks_arbitrary_floats_stay_exact():
    rng = np.random.default_rng(2)
    G = rng.standard_normal((6, 6))
    blocks = partial_blocks(G, [("x", 3)], [[], []], ["x"], "sum", rng)
    assert np.array_equal(blocks[0] + blocks[1] + blocks[2], G)


def test_reduce_groups_without_partial_axes_is_identity():
    blocks = [np.full(2, r) for r in range(4)]
    out = reduce_groups(blocks, [("x", 2), ("y", 2)], [], "sum")
    assert all(np.array_equal(a, b) for a, b in zip(out, blocks))
    out = reduce_groups(blocks, [("x", 2), ("y", 2)], ["x"], "sum")
    # groups {0, 2} and {1, 3}
    assert [int(o[0]) for o in out] == [2, 4, 2, 4]
