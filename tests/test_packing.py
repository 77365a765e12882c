"""mpiredist.runtime.packing.parts: how a piece is cut into the parts of its rounds."""

import math

import numpy as np
from hypothesis import given, strategies as st

from mpiredist.runtime.packing import parts

shapes = st.lists(st.integers(0, 7), min_size=0, max_size=4).map(tuple)


@given(shapes, st.integers(1, 400))
def test_parts_tile_the_box_within_the_limit(shape, limit):
    seen = np.zeros(shape, dtype=np.int64)
    for starts, box in parts(shape, limit):
        assert math.prod(box) <= max(limit, 1) or math.prod(box) == 0
        seen[tuple(slice(s, s + n) for s, n in zip(starts, box))] += 1
    assert (seen == 1).all()


@given(shapes, st.integers(1, 400), st.integers(0, 3))
def test_parts_of_a_contiguous_box_are_contiguous(shape, limit, pad):
    """A box that spans its array after its first long dim keeps that in every part."""
    if not shape:
        return
    array = np.zeros((shape[0] + pad,) + shape[1:])
    for starts, box in parts(shape, limit):
        view = array[tuple(slice(s, s + n) for s, n in zip(starts, box))]
        assert view.flags.c_contiguous


def test_parts_are_the_same_for_the_same_shape():
    assert parts((5, 3, 4), 10) == parts((5, 3, 4), 10)
    assert parts((5, 3, 4), 10)[:3] == [((0, 0, 0), (1, 2, 4)), ((0, 2, 0), (1, 1, 4)),
                                        ((1, 0, 0), (1, 2, 4))]
    assert parts((5, 3, 4), 1000) == [((0, 0, 0), (5, 3, 4))]
