"""Planner and simulator on the anchor cases of shared/cases.json.

Every case is planned at full size (bounds, bytes, report) and simulated at a
scaled-down shape against the independent oracle, for all three strategies.
"""

import json
import math
import os
import zlib
from pathlib import Path

import numpy as np
import pytest

import mpiredist as mr
from oracle import (global_array, layout_text, lower_bound_bytes, max_local_bytes,
                    source_blocks, target_mismatch)

STRATEGIES = ("collectives", "replicate", "direct")
OPS = {"slice", "all_gather", "all_to_all", "reduce_scatter", "all_reduce",
       "permute", "exchange"}
STEP_KEYS = {"op", "axes", "dims", "local_shape_before", "local_shape_after",
             "bytes_sent_per_rank"}
PLAN_KEYS = {"strategy", "steps", "src_local_bytes", "dst_local_bytes",
             "peak_local_bytes", "bytes_sent_per_rank", "lower_bound_bytes_per_rank"}
ITEMSIZE = 4  # cases.json: float32


def _cases_path():
    here = Path(__file__).resolve()
    candidates = [here.parents[2] / "shared" / "cases.json"]
    env = os.environ.get("MPIREDIST_SHARED")
    if env:
        candidates += [Path(env) / "cases.json", Path(env)]
    # the packaged copy (tests/test_xla_plans.py checks that it equals shared/)
    candidates.append(here.parents[1] / "mpiredist" / "bench" / "data" / "cases.json")
    for path in candidates:
        if path.is_file():
            return path
    return None


def _load_cases():
    path = _cases_path()
    if path is None:
        return []
    return json.loads(path.read_text())["cases"]


CASES = _load_cases()
BY_ID = {c["id"].split("_")[0]: c for c in CASES}
needs_cases = pytest.mark.skipif(
    not CASES, reason="shared/cases.json not found next to the repository "
                      "(set MPIREDIST_SHARED to the folder that holds it)")
case_params = pytest.mark.parametrize(
    "case", CASES or [None], ids=[c["id"] for c in CASES] or ["no-cases"])


def _mesh_axes(case):
    return list(case["mesh"].items())


def _dims(spec):
    return [list(d) for d in spec["dims"]]


def _text(spec):
    return layout_text(spec["dims"], spec.get("partial", ()), spec.get("op", "sum"))


def _plan(case, strategy="collectives", shape=None):
    return mr.plan(tuple(shape or case["shape"]), "float32", case["mesh"],
                   _text(case["src"]), _text(case["dst"]), strategy=strategy)


def _scaled(shape):
    """Each length divided by 64; odd lengths stay odd (uneven shards remain)."""
    out = []
    for n in shape:
        m = max(1, n // 64)
        if n % 2 and m % 2 == 0:
            m += 1
        out.append(m)
    return tuple(out)


def _ops(plan):
    return [s.op for s in plan.steps]


def _check_steps(plan, itemsize):
    """Chained local shapes; peak covers every step; valid ops."""
    for s in plan.steps:
        assert s.op in OPS, s.op
        assert s.bytes_sent_per_rank >= 0
        for shape in (s.local_shape_before, s.local_shape_after):
            assert math.prod(shape) * itemsize <= plan.peak_local_bytes, (s, plan.explain())
    for a, b in zip(plan.steps, plan.steps[1:]):
        assert tuple(a.local_shape_after) == tuple(b.local_shape_before), plan.explain()
    assert plan.bytes_sent_per_rank >= 0


# -- full-size planning --------------------------------------------------------

@needs_cases
@case_params
def test_case_collectives_within_bound(case):
    p = _plan(case)
    assert p.strategy == "collectives"
    assert p.peak_local_bytes <= max(p.src_local_bytes, p.dst_local_bytes), p.explain()
    assert p.within_bound
    mesh = _mesh_axes(case)
    assert p.src_local_bytes == max_local_bytes(case["shape"], mesh, _dims(case["src"]), ITEMSIZE)
    assert p.dst_local_bytes == max_local_bytes(case["shape"], mesh, _dims(case["dst"]), ITEMSIZE)
    _check_steps(p, ITEMSIZE)


@needs_cases
@case_params
def test_case_bytes(case):
    plans = {s: _plan(case, s) for s in STRATEGIES}
    for s, p in plans.items():
        assert p.strategy == s
        assert p.lower_bound_bytes_per_rank <= p.bytes_sent_per_rank, (s, p.explain())
        _check_steps(p, ITEMSIZE)
    assert plans["collectives"].bytes_sent_per_rank <= plans["replicate"].bytes_sent_per_rank
    lb = {p.lower_bound_bytes_per_rank for p in plans.values()}
    assert len(lb) == 1, "the lower bound does not depend on the strategy"
    if not case["src"].get("partial"):
        want = lower_bound_bytes(case["shape"], _mesh_axes(case), _dims(case["src"]),
                                 _dims(case["dst"]), ITEMSIZE)
        assert plans["collectives"].lower_bound_bytes_per_rank == want


@needs_cases
@case_params
def test_case_report(case):
    p = _plan(case)
    text = p.explain()
    assert isinstance(text, str)
    for op in _ops(p):
        assert op in text
    d = p.to_dict()
    assert PLAN_KEYS <= set(d), PLAN_KEYS - set(d)
    assert d["strategy"] == "collectives"
    assert len(d["steps"]) == len(p.steps)
    for step in d["steps"]:
        assert STEP_KEYS <= set(step), STEP_KEYS - set(step)
    assert json.loads(p.to_json()) == json.loads(json.dumps(d))
    assert d["peak_local_bytes"] == p.peak_local_bytes
    assert d["bytes_sent_per_rank"] == p.bytes_sent_per_rank


# -- scaled-down simulation ----------------------------------------------------

@needs_cases
@case_params
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_case_simulates_exactly(case, strategy):
    from mpiredist.planning.simulate import simulate
    shape = _scaled(case["shape"])
    mesh = _mesh_axes(case)
    src, dst = case["src"], case["dst"]
    rng = np.random.default_rng(zlib.crc32(case["id"].encode()))
    G = global_array(shape, "float32", rng)
    blocks = source_blocks(G, mesh, _dims(src), src.get("partial", ()),
                           src.get("op", "sum"), rng)
    before = [b.copy() for b in blocks]
    p = _plan(case, strategy, shape)
    out = simulate(p, blocks)
    err = target_mismatch(out, G, mesh, _dims(dst), dst.get("partial", ()),
                          dst.get("op", "sum"))
    assert err is None, f"{case['id']} {strategy} at {shape}: {err}\n{p.explain()}"
    for a, b in zip(before, blocks):
        assert a.shape == b.shape and np.array_equal(a, b), "simulate modified its input"
    if strategy == "collectives":
        assert p.within_bound, p.explain()


def test_scaled_shapes():
    assert _scaled((4096, 4096)) == (64, 64)
    assert _scaled((256, 256, 256)) == (4, 4, 4)
    a, b = _scaled((4099, 4093))
    assert a % 2 and b % 2 and a % 8 and b % 8


# -- hand-checked plans --------------------------------------------------------

def _case(key):
    if key not in BY_ID:
        pytest.skip(f"case {key} not in shared/cases.json")
    return BY_ID[key]


def test_c01_is_one_all_to_all():
    p = _plan(_case("c01"))
    assert _ops(p) == ["all_to_all"], p.explain()
    assert p.bytes_sent_per_rank == p.lower_bound_bytes_per_rank == 7 * 2 ** 20


def test_c02_is_one_all_gather():
    p = _plan(_case("c02"))
    assert _ops(p) == ["all_gather"], p.explain()
    assert p.bytes_sent_per_rank == p.lower_bound_bytes_per_rank == 56 * 2 ** 20


def test_c03_is_one_free_slice():
    p = _plan(_case("c03"))
    assert _ops(p) == ["slice"], p.explain()
    assert p.steps[0].bytes_sent_per_rank == 0
    assert p.bytes_sent_per_rank == 0 == p.lower_bound_bytes_per_rank


def test_c11_reduce_scatters():
    p = _plan(_case("c11"))
    ops = _ops(p)
    assert "reduce_scatter" in ops and "all_reduce" not in ops, p.explain()
    assert p.within_bound


def test_c12_is_one_all_reduce():
    p = _plan(_case("c12"))
    assert _ops(p) == ["all_reduce"], p.explain()


@pytest.mark.parametrize("shape", [(4096, 4096), (64, 64), (13, 7)])
def test_issue_example_never_gathers_all_of_x(shape):
    # [{x},{}] -> [{y},{x}] on x=4,y=2 (c17): move part of x, never all of it.
    p = mr.plan(shape, "float32", "x=4,y=2", "[{x}, {}]", "[{y}, {x}]")
    big = max(p.src_local_bytes, p.dst_local_bytes)
    for s in p.steps:
        assert math.prod(s.local_shape_after) * 4 <= big, p.explain()
        assert math.prod(s.local_shape_before) * 4 <= big, p.explain()
    assert p.within_bound


# -- API surface ---------------------------------------------------------------

def test_mesh_and_layout_forms_agree():
    a = mr.plan((64, 32), "float32", mr.Mesh({"x": 2, "y": 4}),
                mr.Layout.parse("[{x,y}, {}]"), mr.Layout.parse("[{}, {x,y}]"))
    b = mr.plan((64, 32), "float32", {"x": 2, "y": 4}, "[{x,y}, {}]", "[{}, {x,y}]")
    c = mr.plan([64, 32], np.float32, "x=2,y=4", "[{x,y},{}]", "[{},{x,y}]",
                strategy="collectives")
    assert a.to_dict() == b.to_dict() == c.to_dict()
    assert a.strategy == "collectives"
    assert isinstance(a.note, str)


def test_identity_plan_has_no_communication():
    p = mr.plan((10, 6), "float64", "x=2,y=3", "[{x}, {y}]", "[{x}, {y}]")
    assert p.bytes_sent_per_rank == 0 == p.lower_bound_bytes_per_rank
    assert p.within_bound


@pytest.mark.parametrize("args, error", [
    (((8, 8), "[{x}]", "[{}, {x}]"), (mr.LayoutError, mr.ShapeError)),
    (((8, 8), "[{x}, {}]", "[{}, {}, {}]"), (mr.LayoutError, mr.ShapeError)),
    (((8,), "[{x}, {}]", "[{}, {x}]"), (mr.LayoutError, mr.ShapeError)),
    (((8, 8), "[{q}, {}]", "[{}, {x}]"), mr.LayoutError),
    (((8, 8), "[{x}, {}]", "[{}, {q}]"), mr.LayoutError),
    (((8, 8), "[{x}, {}] sum{q}", "[{}, {x}]"), mr.LayoutError),
    (((8, -1), "[{x}, {}]", "[{}, {x}]"), mr.ShapeError),
    (((8, 8), "[{x}, {}]", "[{}, {x}] sum{y}"), mr.PlanError),
    (((8, 8), "[{x}, {}] sum{y}", "[{}, {x}] max{y}"), mr.PlanError),
])
def test_bad_input(args, error):
    shape, src, dst = args
    with pytest.raises(error) as info:
        mr.plan(shape, "float32", "x=2,y=4", src, dst)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, mr.MpiredistError)


def test_bad_input_names_the_axis():
    with pytest.raises(mr.LayoutError, match="q"):
        mr.plan((8, 8), "float32", "x=2,y=4", "[{q}, {}]", "[{}, {x}]")


def test_bad_strategy():
    with pytest.raises(ValueError, match="nonsense"):
        mr.plan((8, 8), "float32", "x=2", "[{x}, {}]", "[{}, {x}]", strategy="nonsense")


def test_every_strategy_is_accepted():
    for s in STRATEGIES:
        p = mr.plan((9, 5), "int64", "x=2,y=2", "[{x}, {y}]", "[{y}, {x}]", strategy=s)
        assert p.strategy == s


# -- a large mesh --------------------------------------------------------------

MESH_4096 = {"a": 8, "b": 8, "c": 8, "d": 8}


@pytest.mark.parametrize("shape, src, dst", [
    ((64, 64, 64, 64, 8, 8), "[{a}, {b}, {c}, {d}, {}, {}]", "[{}, {}, {a}, {b}, {c}, {d}]"),
    ((64, 32, 16, 16, 8, 4), "[{a,b}, {c}, {d}, {}, {}, {}]", "[{}, {}, {}, {d,c}, {b}, {a}]"),
    ((512, 8, 8, 8, 8, 8), "[{a,b,c,d}, {}, {}, {}, {}, {}]", "[{}, {a}, {b}, {c}, {d}, {}]"),
    ((33, 17, 9, 5, 3, 2), "[{a}, {b}, {c}, {d}, {}, {}]", "[{d}, {c}, {b}, {a}, {}, {}]"),
    ((64, 64, 8, 8, 4, 4), "[{a}, {b}, {}, {}, {}, {}] sum{c,d}", "[{}, {}, {a}, {b}, {c}, {d}]"),
])
def test_plans_4096_devices(shape, src, dst):
    p = mr.plan(shape, "float32", MESH_4096, src, dst)
    assert p.strategy == "collectives"
    assert p.within_bound, p.explain()
    assert p.lower_bound_bytes_per_rank <= p.bytes_sent_per_rank
    assert isinstance(p.explain(), str)
    assert PLAN_KEYS <= set(p.to_dict())


def test_exchange_with_fewer_messages_wins_a_tie_in_bytes():
    """c17 at 4096 ranks: slicing first would split each target block over 64 sources."""
    from mpiredist.planning.costs import exchange_messages
    from mpiredist.core.subaxes import expand
    mesh = mr.Mesh("x=64,y=64")
    src, dst = mr.Layout.parse("[{x}, {}]"), mr.Layout.parse("[{y}, {x}]")
    sliced = mr.Layout.parse("[{x,y}, {}]")
    shape = (4096, 4096)
    assert exchange_messages(shape, expand(src, mesh), expand(dst, mesh)) == 1
    assert exchange_messages(shape, expand(sliced, mesh), expand(dst, mesh)) == 64
    p = mr.plan(shape, "float32", mesh, src, dst)
    assert [s.op for s in p.steps] == ["exchange"]
    assert p.bytes_sent_per_rank == p.lower_bound_bytes_per_rank
