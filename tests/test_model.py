"""The alpha-beta model (mpiredist.planning.model) and the plan-only table
(mpiredist.bench.tables); no MPI."""

import math
import time

import pytest

import mpiredist as mr
from mpiredist.bench.cases import Case, get_case, load_cases
from mpiredist.bench.tables import format_table, grow_mesh, grow_shape, plan_only_table
from mpiredist.bench.xla import xla_plan
from mpiredist.core.errors import MeshError, PlanError
from mpiredist.core.layout import Layout
from mpiredist.planning.model import (Network, exchange_peers, most_recv_peers, predict,
                                      recv_peers, step_rounds)
from mpiredist.planning.pieces import Holders, layout_sources, layout_targets, recv_pieces

ROUNDS_ONLY = Network(alpha=1.0, beta=math.inf)
BYTES_ONLY = Network(alpha=0.0, beta=1.0, memory_bandwidth=math.inf)


def _plan(case_id, strategy="collectives", shape=None):
    c = get_case(case_id)
    return mr.plan(shape or c.shape, "float32", c.mesh, c.src, c.dst, strategy)


@pytest.mark.parametrize("case_id, strategy, rounds", [
    ("c01", "collectives", 7),          # all_to_all on 8: pairwise, G-1
    ("c02", "collectives", 7),          # all_gather on 8: ring, G-1
    ("c11", "collectives", 7),          # reduce_scatter on 8: ring, G-1
    ("c12", "collectives", 14),         # all_reduce on 8: ring, 2(G-1)
    ("c06", "collectives", 1),          # permute: one message
    ("c03", "collectives", 0),          # slice: local
    ("c01", "direct", 7),               # exchange: 7 distinct peers
    ("c16", "direct", 1),               # a transpose of blocks: one peer
])
def test_alpha_term_counts_rounds(case_id, strategy, rounds):
    p = _plan(case_id, strategy)
    pred = predict(p, ROUNDS_ONLY)
    assert pred.rounds == rounds
    if all(s.op != "slice" for s in p.steps):
        assert pred.seconds == rounds


def test_time_is_alpha_rounds_plus_bytes_over_beta():
    p = xla_plan("c18")
    net = Network(alpha=3e-6, beta=10e9, memory_bandwidth=50e9)
    pred = predict(p, net)
    want = 0.0
    for step in p.steps:
        if step.op == "slice":
            want += math.prod(step.local_shape_after) * 4 / 50e9
        else:
            want += step_rounds(p, step) * 3e-6 + step.bytes_sent_per_rank / 10e9
    assert pred.seconds == pytest.approx(want)
    assert [op for op, _, _ in pred.steps] == ["all_reduce", "slice", "all_to_all"]
    assert predict(p, BYTES_ONLY).seconds == p.bytes_sent_per_rank


@pytest.mark.parametrize("strategy", ["collectives", "replicate", "direct"])
def test_monotonic_in_bytes(strategy):
    times, sent = [], []
    for n in (256, 1024, 4096, 16384):
        p = _plan("c05", strategy, (n, n))
        times.append(predict(p).seconds)
        sent.append(p.bytes_sent_per_rank)
    assert sent == sorted(sent) and times == sorted(times)
    assert len(set(times)) == len(times)
    # Same plan, more bytes per second: faster; more latency: slower.
    p = _plan("c04", strategy)
    assert predict(p, Network(beta=50e9)).seconds < predict(p).seconds
    assert predict(p, Network(alpha=1e-5)).seconds > predict(p).seconds


@pytest.mark.parametrize("case", load_cases(), ids=lambda c: c.id)
def test_recv_peers_match_the_piece_model(case):
    p = mr.plan(tuple(max(1, n // 64) for n in case.shape), "float32", case.mesh,
                case.src, case.dst, "direct")
    for step in p.steps:
        if step.op != "exchange":
            continue
        counted = recv_peers(p, step)
        assert counted.shape == (p.mesh.size,)
        n = p.mesh.size
        sources = layout_sources(p.global_shape, p.mesh, step.before, n)
        targets = layout_targets(p.global_shape, p.mesh, step.after, n, keep_classes=True)
        holders = Holders(sources)
        for r in range(n):
            peers = {x.peer for x in recv_pieces(r, sources, targets, holders)}
            assert counted[r] == len(peers - {r}), f"rank {r}"
        most = most_recv_peers(p.global_shape, step.before, step.after, p.mesh.axes)
        assert most == counted.max()
        assert exchange_peers(p, step) >= min(most, p.mesh.size - 1)


def test_bench_reexports_the_planning_model():
    import mpiredist.bench.tables as bench_model
    import mpiredist.planning.model as model
    for name in ("Network", "Prediction", "predict", "step_rounds", "exchange_peers",
                 "recv_peers", "ALPHA", "BETA", "MEMORY_BANDWIDTH"):
        assert getattr(bench_model, name) is getattr(model, name), name


def test_grow_mesh_rule():
    assert grow_mesh({"x": 2, "y": 4}, 8) == {"x": 2, "y": 4}
    assert grow_mesh({"x": 2, "y": 4}, 4096) == {"x": 32, "y": 128}
    assert grow_mesh({"x": 8}, 65536) == {"x": 65536}
    assert grow_mesh({"x": 2, "y": 2, "z": 2}, 65536) == {"x": 32, "y": 32, "z": 64}
    assert grow_mesh({"x": 3, "y": 4}, 48) == {"x": 6, "y": 8}
    assert grow_mesh({"x": 2, "y": 4}, 2) == {"x": 2, "y": 1}
    for ranks in (12, 4095, 3):
        with pytest.raises(MeshError, match=f"{ranks} ranks"):
            grow_mesh({"x": 2, "y": 4}, ranks)


def test_grow_shape_rule():
    assert grow_shape((4096, 4096), 1) == (4096, 4096)
    assert grow_shape((4096, 4096), 512) == (4096 * 32, 4096 * 16)
    assert grow_shape((256, 256, 256), 8192) == (256 * 32, 256 * 16, 256 * 16)
    assert grow_shape((4099, 4093), 2) == (8198, 4093)


def test_table_on_own_meshes_includes_xla():
    rows = plan_only_table(strategies=("collectives", "xla"))
    assert len(rows) == 2 * len(load_cases())
    for row in rows:
        assert row.seconds is not None and row.seconds >= 0, row
        if row.strategy == "xla":
            assert row.bytes_sent_per_rank == xla_plan(row.case).bytes_sent_per_rank
        else:
            assert row.peak_over_max <= 1.0
    text = format_table(rows)
    assert "c18_partial_to_other" in text and "model ms" in text


def test_table_scale_and_user_case():
    user = Case("user", {"x": 2, "y": 4}, (100, 60), Layout.parse("[{x},{y}]"),
                Layout.parse("[{y},{x}]"))
    rows = plan_only_table(64, ("collectives", "direct", "xla"), [user])
    assert [r.mesh for r in rows] == ["x=4,y=16"] * 3
    assert rows[0].shape == (400, 120)
    assert rows[2].seconds is None and "XLA" in rows[2].note
    kept = plan_only_table(64, ("direct",), [user], keep_shape=True)
    assert kept[0].shape == (100, 60)
    small = plan_only_table(None, ("xla",), [get_case("c13")], scale=64)
    assert small[0].shape == (65, 63) and small[0].seconds is not None
    with pytest.raises(PlanError, match="strategies"):
        plan_only_table(8, ("fastest",))


def test_65536_ranks_quickly():
    start = time.process_time()
    rows = plan_only_table(65536, ("collectives", "replicate", "direct", "xla"))
    elapsed = time.process_time() - start
    assert elapsed < 60, f"{elapsed:.1f} s of CPU for 65536 ranks"
    by = {(r.case.split("_")[0], r.strategy): r for r in rows}
    assert by["c01", "collectives"].mesh == "x=65536"
    assert by["c01", "collectives"].rounds == 65535
    assert by["c16", "collectives"].rounds == 1
    for (case, strategy), row in by.items():
        if strategy == "xla":
            assert row.seconds is None and row.note.startswith("XLA")
            continue
        assert row.seconds is not None, row
        assert row.bytes_sent_per_rank >= row.lower_bound_bytes_per_rank
        if strategy == "collectives":
            assert row.peak_over_max <= 1.0
