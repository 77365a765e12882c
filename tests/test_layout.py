"""Layout: text form, value semantics, validation against a mesh."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpiredist import Layout, LayoutError, Mesh

TEXTS = [
    "[]",
    "[{}]",
    "[{x}]",
    "[{}, {}]",
    "[{x}, {}]",
    "[{}, {x}]",
    "[{x,y}, {}]",
    "[{y,x}, {}]",
    "[{x}, {y}]",
    "[{x}, {y}, {z}]",
    "[{}, {x,y,z}, {}]",
    "[{x}, {}] sum{y}",
    "[{}, {}] sum{x}",
    "[{}, {}] sum{x,y}",
    "[{x}, {}] max{y}",
    "[{}, {x}] min{y,z}",
    "[{}] prod{x}",
    "[{a_1}, {B2}] sum{_c}",
]


@pytest.mark.parametrize("text", TEXTS)
def test_str_round_trip(text):
    layout = Layout.parse(text)
    assert str(layout) == text
    assert Layout.parse(str(layout)) == layout


@pytest.mark.parametrize("text", TEXTS)
def test_repr_evaluates_back(text):
    layout = Layout.parse(text)
    back = eval(repr(layout), {"Layout": Layout})
    assert back == layout
    assert hash(back) == hash(layout)


@pytest.mark.parametrize("text, dims, partial, op", [
    ("[{x,y}, {}]", (("x", "y"), ()), (), "sum"),
    ("[{}, {x}]", ((), ("x",)), (), "sum"),
    ("[{x}, {}] sum{y}", (("x",), ()), ("y",), "sum"),
    ("[{}, {}]", ((), ()), (), "sum"),
    ("  [ { x , y } ,{ } ]  max{ z }", (("x", "y"), ()), ("z",), "max"),
    ("[{x},{y}]", (("x",), ("y",)), (), "sum"),
])
def test_parse_fields(text, dims, partial, op):
    layout = Layout.parse(text)
    assert layout.dims == dims
    assert layout.partial == partial
    assert layout.op == op
    assert layout.ndim == len(dims)
    assert layout == Layout(dims, partial, op)


def test_whitespace_is_normalised():
    assert str(Layout.parse("[ {x , y},{ } ]")) == "[{x,y}, {}]"


def test_constructor_forms():
    assert Layout([["x"], []]) == Layout.parse("[{x}, {}]")
    assert Layout(["x", []]) == Layout.parse("[{x}, {}]")
    assert Layout([[], []], "y") == Layout.parse("[{}, {}] sum{y}")
    assert Layout.replicated(3) == Layout.parse("[{}, {}, {}]")
    assert Layout.parse(Layout.parse("[{x}]")) == Layout.parse("[{x}]")
    d = Layout.parse("[{x}, {}] max{y}").to_dict()
    assert Layout.from_dict(d) == Layout.parse("[{x}, {}] max{y}")
    assert Layout.from_dict({"dims": [["x"], []]}) == Layout.parse("[{x}, {}]")


def test_equality_and_hash():
    a = Layout.parse("[{x}, {}] sum{y}")
    b = Layout([["x"], []], ["y"], "sum")
    assert a == b and hash(a) == hash(b)
    assert a != Layout.parse("[{x}, {}] max{y}")
    assert a != Layout.parse("[{x}, {}]")
    assert Layout.parse("[{x,y}]") != Layout.parse("[{y,x}]")
    assert Layout.parse("[{x}, {}]") != Layout.parse("[{}, {x}]")
    assert Layout.parse("[{x}]") != "[{x}]"
    # Without partial axes the op does not matter.
    assert Layout([["x"]], (), "max") == Layout([["x"]])
    assert len({a, b, Layout.parse("[{x}, {}]")}) == 2


def test_immutable():
    layout = Layout.parse("[{x}]")
    with pytest.raises(AttributeError):
        layout.dims = ()


def test_axes_used_and_without_partial():
    layout = Layout.parse("[{y}, {x,z}] sum{w}")
    assert layout.axes_used() == ("y", "x", "z")
    assert layout.without_partial() == Layout.parse("[{y}, {x,z}]")


@pytest.mark.parametrize("text, axis", [
    ("[{x,x}, {}]", "x"),
    ("[{x}, {x}]", "x"),
    ("[{y}, {z,y}]", "y"),
    ("[{x}, {}] sum{x}", "x"),
    ("[{}, {}] sum{y,y}", "y"),
    ("[{}, {z}] max{z}", "z"),
])
def test_axis_used_twice(text, axis):
    with pytest.raises(LayoutError) as info:
        Layout.parse(text)
    assert repr(axis) in str(info.value) or axis in str(info.value)


def test_axis_used_twice_via_constructor():
    with pytest.raises(LayoutError, match="'x'"):
        Layout([["x"], ["x"]])
    with pytest.raises(LayoutError, match="'x'"):
        Layout([["x"], []], ["x"])


@pytest.mark.parametrize("text", [
    "",
    "x",
    "{x}",
    "[{x}",
    "[{x}, {}",
    "[{x}, ]",
    "[{x}, {}],",
    "[{x} {y}]",
    "[x, {}]",
    "[{x}] avg{y}",
    "[{x}] sum{",
    "[{x}] sum y",
    "[{1x}]",
    "[{x-y}]",
    "[{x}] sum{y} extra",
    "[{{x}}]",
])
def test_bad_text(text):
    with pytest.raises(LayoutError):
        Layout.parse(text)


def test_bad_op_and_non_text():
    with pytest.raises(LayoutError, match="avg"):
        Layout([["x"]], ["y"], "avg")
    with pytest.raises(LayoutError):
        Layout.parse(42)
    with pytest.raises(LayoutError):
        Layout("[{x}]")


def test_layout_error_is_value_error():
    assert issubclass(LayoutError, ValueError)


def test_validate_unknown_axis_names_it():
    mesh = Mesh("x=2,y=4")
    assert Layout.parse("[{x,y}, {}]").validate(mesh) is not None
    Layout.parse("[{x}, {}] sum{y}").validate(mesh, 2)
    for text in ("[{x}, {z}]", "[{zz,x}]", "[{x}, {}] sum{z}", "[{}] max{y,z}"):
        with pytest.raises(LayoutError) as info:
            Layout.parse(text).validate(mesh)
        assert "z" in str(info.value)


def test_validate_wrong_number_of_dims():
    mesh = Mesh("x=2,y=4")
    with pytest.raises(LayoutError, match="3"):
        Layout.parse("[{x}, {}]").validate(mesh, 3)
    with pytest.raises(LayoutError):
        Layout.parse("[{x}, {}]").validate(mesh, 1)
    Layout.parse("[{x}, {}]").validate(mesh, 2)
    Layout.parse("[]").validate(Mesh("x=2"), 0)


# -- random layouts ----------------------------------------------------------

NAMES = ["x", "y", "z", "w", "a1", "_b", "Long_name"]


@st.composite
def layouts(draw):
    ndim = draw(st.integers(0, 4))
    axes = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=len(NAMES)))
    axes = draw(st.permutations(axes))
    dims = [[] for _ in range(ndim)]
    partial = []
    for a in axes:
        where = draw(st.integers(-1, ndim - 1))
        (partial if where < 0 else dims[where]).append(a)
    op = draw(st.sampled_from(["sum", "max", "min", "prod"]))
    return Layout(dims, partial, op)


@settings(database=None, max_examples=300, deadline=None)
@given(layouts(), st.sampled_from(["", " ", "  "]))
def test_random_round_trip(layout, pad):
    text = str(layout)
    assert Layout.parse(text) == layout
    assert Layout.parse(pad + text + pad) == layout
    assert str(Layout.parse(text)) == text
    assert eval(repr(layout), {"Layout": Layout}) == layout
    assert hash(Layout.parse(text)) == hash(layout)
    assert Layout.from_dict(layout.to_dict()) == layout
