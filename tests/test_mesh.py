"""Mesh: construction, coordinates, errors, value semantics."""

import itertools

import numpy as np
import pytest

from mpiredist import Mesh, MeshError


@pytest.mark.parametrize("spec", [
    {"x": 2, "y": 4},
    "x=2,y=4",
    " x = 2 , y = 4 ",
    [("x", 2), ("y", 4)],
    (("x", 2), ("y", 4)),
])
def test_constructors_agree(spec):
    m = Mesh(spec)
    assert m.axes == (("x", 2), ("y", 4))
    assert m.names == ("x", "y")
    assert m.sizes == (2, 4)
    assert m.size == 8
    assert str(m) == "x=2,y=4"
    assert m == Mesh({"x": 2, "y": 4})
    assert Mesh(m) == m


def test_axis_order_matters():
    assert Mesh("x=2,y=4") != Mesh("y=4,x=2")
    assert Mesh("x=2,y=4").coords(1) == (0, 1)
    assert Mesh("y=4,x=2").coords(1) == (0, 1)


@pytest.mark.parametrize("sizes", [(1,), (8,), (2, 4), (3, 5), (2, 3, 4), (1, 7, 1, 2)])
def test_coords_row_major_and_rank_round_trip(sizes):
    names = "abcdefgh"[:len(sizes)]
    m = Mesh(dict(zip(names, sizes)))
    assert m.size == int(np.prod(sizes))
    for r in range(m.size):
        c = m.coords(r)
        assert c == tuple(int(v) for v in np.unravel_index(r, sizes))
        assert m.rank(c) == r
    for c in itertools.product(*(range(s) for s in sizes)):
        assert m.coords(m.rank(c)) == c


def test_design_example_rank5():
    assert Mesh({"x": 2, "y": 4}).coords(5) == (1, 1)


def test_axis_size():
    m = Mesh("x=2,y=4")
    assert m.axis_size("y") == 4
    with pytest.raises(MeshError, match="'z'"):
        m.axis_size("z")


@pytest.mark.parametrize("rank", [-1, 8, 100])
def test_coords_out_of_range(rank):
    with pytest.raises(MeshError):
        Mesh("x=2,y=4").coords(rank)


@pytest.mark.parametrize("spec, culprit", [
    ("x=2,x=4", "x"),
    ({"x": 0}, "x"),
    ("x=0,y=2", "x"),
    ({"y": -3}, "y"),
    ([("x", 2), ("x", 2)], "x"),
    ("x=2,y", "y"),
    ("x=two", "x"),
    ("x2", "x2"),
    ({"1x": 2}, "1x"),
    ({"x-y": 2}, "x-y"),
    ([("x", 2, 3)], "x"),
    ({"x": 2.5}, "x"),
    ({"x": True}, "x"),
])
def test_errors_name_the_culprit(spec, culprit):
    with pytest.raises(MeshError) as info:
        Mesh(spec)
    assert culprit in str(info.value)


def test_mesh_error_is_value_error():
    assert issubclass(MeshError, ValueError)
    with pytest.raises(ValueError):
        Mesh("x=2,x=2")


@pytest.mark.parametrize("spec", ["x=2,y=4", "a=1", "a=3,b=5,c_1=7", {}, "p=64"])
def test_repr_evaluates_back(spec):
    m = Mesh(spec)
    back = eval(repr(m), {"Mesh": Mesh})
    assert back == m
    assert hash(back) == hash(m)


def test_hash_eq_and_immutability():
    a, b, c = Mesh("x=2,y=4"), Mesh({"x": 2, "y": 4}), Mesh("x=4,y=2")
    assert a == b and hash(a) == hash(b)
    assert a != c
    assert a != "x=2,y=4"
    assert len({a, b, c}) == 2
    with pytest.raises(AttributeError):
        a.foo = 1
    with pytest.raises(AttributeError):
        a._axes = ()


def test_equality_includes_the_communicator():
    sentinel, other = object(), object()
    m = Mesh("x=2", comm=sentinel)
    assert m.comm is sentinel
    assert m == Mesh("x=2", comm=sentinel) and m != Mesh("x=2", comm=other)
    assert m != Mesh("x=2") and m.abstract() == Mesh("x=2")
    assert hash(m) == hash(Mesh("x=2"))         # communicators are not hashable
    assert m.abstract().comm is None
    assert Mesh("x=2").with_comm(sentinel) == m


def test_empty_mesh_has_one_rank():
    m = Mesh({})
    assert m.size == 1
    assert m.coords(0) == ()
