"""HeAT split <-> layout conversions (MPI-free), and resplit's checks.

``resplit`` itself is exercised under MPI in ``tests/mpi/test_ops.py``; here
it runs against a stand-in array that records the redistribution asked for.
"""

import pytest

from mpiredist.core.errors import LayoutError, MeshError
from mpiredist.arrays.heat import layout_for_split, resplit, resplit_, split, split_of
from mpiredist.core.layout import Layout
from mpiredist.core.mesh import Mesh


@pytest.mark.parametrize("split_, ndim, text", [
    (None, 0, "[]"),
    (None, 2, "[{}, {}]"),
    (0, 1, "[{x}]"),
    (0, 2, "[{x}, {}]"),
    (1, 2, "[{}, {x}]"),
    (-1, 3, "[{}, {}, {x}]"),
    (-3, 3, "[{x}, {}, {}]"),
])
def test_layout_for_split(split_, ndim, text):
    layout = layout_for_split(split_, ndim, "x")
    assert layout == Layout.parse(text)
    expected = None if split_ is None else split_ % ndim
    assert split_of(layout) == expected
    assert split_of(layout, "x") == expected


def test_layout_for_split_axis_name():
    assert str(layout_for_split(1, 2, "procs")) == "[{}, {procs}]"


def test_round_trip_every_split():
    for ndim in range(5):
        for s in [None] + list(range(-ndim, ndim)):
            layout = layout_for_split(s, ndim, "x")
            back = split_of(layout)
            assert layout_for_split(back, ndim, "x") == layout


@pytest.mark.parametrize("split_, ndim", [(2, 2), (-3, 2), (0, 0)])
def test_split_out_of_range(split_, ndim):
    with pytest.raises(LayoutError, match=f"split {split_} is out of range"):
        layout_for_split(split_, ndim, "x")


@pytest.mark.parametrize("bad", [1.0, "0", (0,)])
def test_split_not_an_int(bad):
    with pytest.raises(LayoutError, match="None or an integer"):
        layout_for_split(bad, 2, "x")


def test_bad_ndim():
    with pytest.raises(LayoutError, match="ndim"):
        layout_for_split(0, -1, "x")


@pytest.mark.parametrize("text, match", [
    ("[{x}, {y}]", r"shards dims \[0, 1\]"),
    ("[{x,y}, {}]", "over mesh axes"),
    ("[{x}, {}] sum{y}", "partial"),
    ("[{}, {}] max{x}", "partial"),
])
def test_split_of_not_expressible(text, match):
    with pytest.raises(LayoutError, match=match) as info:
        split_of(text)
    assert isinstance(info.value, ValueError)
    assert Layout.parse(text).__str__() in str(info.value)


def test_split_of_wrong_axis_name():
    with pytest.raises(LayoutError, match="expected 'x'"):
        split_of("[{}, {y}]", "x")


class FakeArray:
    """Stands in for DistArray: records redistribute calls, no MPI."""

    def __init__(self, mesh, layout, ndim):
        self.mesh, self.layout, self.ndim = Mesh(mesh), Layout.parse(layout), ndim
        self.calls = []

    def redistribute(self, dst, donate=False):
        self.calls.append(("redistribute", dst, donate))
        return FakeArray(self.mesh, dst, self.ndim)

    def redistribute_(self, dst):
        self.calls.append(("redistribute_", dst))
        self.layout = dst
        return self


def test_resplit_asks_for_the_split_layout():
    a = FakeArray({"p": 4}, "[{p}, {}, {}]", 3)
    b = resplit(a, -1)
    assert a.calls == [("redistribute", Layout.parse("[{}, {}, {p}]"), False)]
    assert split(b) == 2
    c = resplit(a, None)
    assert split(c) is None
    assert split(a) == 0


def test_resplit_in_place():
    a = FakeArray({"x": 2}, "[{x}, {}]", 2)
    assert resplit_(a, 1) is a
    assert a.calls == [("redistribute_", Layout.parse("[{}, {x}]"))]
    assert split(a) == 1


def test_resplit_needs_a_1d_mesh():
    a = FakeArray({"x": 2, "y": 2}, "[{x}, {y}]", 2)
    with pytest.raises(MeshError, match="1-D mesh") as info:
        resplit(a, 0)
    assert "x=2,y=2" in str(info.value)
    assert a.calls == []
    with pytest.raises(MeshError, match="1-D mesh"):
        split(a)


def test_resplit_axis_out_of_range_before_any_communication():
    a = FakeArray({"x": 2}, "[{x}, {}]", 2)
    with pytest.raises(LayoutError, match="out of range"):
        resplit(a, 2)
    assert a.calls == []
