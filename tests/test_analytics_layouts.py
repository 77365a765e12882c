"""Pure layout arithmetic of the HeAT-style analytics (no MPI)."""

import pytest

from mpiredist import Layout
from mpiredist.core.errors import ShapeError


def test_compatible_layout_broadcasts():
    from mpiredist.arrays.broadcast import compatible_layout
    lay = Layout.parse("[{x}, {y}]")
    assert compatible_layout((5,), (4, 5), lay) == Layout.parse("[{y}]")
    assert compatible_layout((4, 1), (4, 5), lay) == Layout.parse("[{x}, {}]")
    assert compatible_layout((1, 1), (1, 5), lay) == Layout.parse("[{x}, {}]")


def test_off_dims_moves_axes_to_the_longest_other_dim():
    from mpiredist.arrays.shape import off_dims
    assert off_dims("[{x}, {}, {y}]", (8, 20, 3), (0,)) == Layout.parse("[{}, {x}, {y}]")
    assert off_dims("[{x}]", (8,), (0,)) == Layout.parse("[{}]")
    assert off_dims("[{}, {y}]", (8, 3), (0,)) == Layout.parse("[{}, {y}]")


def test_reshape_target_shape():
    from mpiredist.arrays.shape import _target_shape
    assert _target_shape(24, (-1, 3), "r") == (8, 3)
    assert _target_shape(0, (0, 4), "r") == (0, 4)
    for bad in ((5, 5), (-1, -1), (7, -1)):
        with pytest.raises(ShapeError):
            _target_shape(24, bad, "r")


def test_index_parsing():
    from mpiredist.arrays.indexing import IndexingError, _parse
    items = _parse((None, 1, Ellipsis), (3, 4, 5))
    assert [k for k, _, _ in items] == ["new", "int", "slice", "slice"]
    with pytest.raises(IndexingError):
        _parse((3,), (3, 4))
    with pytest.raises(IndexError):
        _parse((0, 0, 0), (3, 4))
