"""``python -m benchmarks.bench_cross_mesh``, run in-process at a tiny size (any rank count).

    timeout 300 mpiexec -n 4 python -m pytest -q --with-mpi tests/mpi/test_bench_crossmesh.py
"""

import pytest
from helpers import all_ok, run_json

from benchmarks.bench_cross_mesh import (STRATEGIES, Unfit, evaluate, instantiate,
                                       load_cross_cases, main, parse_ranks)

pytestmark = pytest.mark.mpi

TINY = ["--size", "0.0005", "--repeats", "1"]


def _fits(case, P):
    try:
        instantiate(case, P)
    except Unfit:
        return False
    return True


def test_rows_are_correct_and_count_bytes(comm):
    rc, doc = run_json(comm, main, TINY)
    rows, skipped = doc["rows"], doc["skipped"]
    all_ok(comm, rc == 0, f"rc {rc}")
    cases = load_cross_cases()
    ran = [c.id for c in cases if _fits(c, comm.size)]
    all_ok(comm, [r["case"] for r in rows] == [i for i in ran for _ in STRATEGIES],
           f"rows {[r['case'] for r in rows]}, expected {ran}")
    all_ok(comm, len(ran) + len(skipped) == len(cases), f"skipped {skipped}")
    by = {(r["case"], r["strategy"]): r for r in rows}
    for r in rows:
        what = f"{r['case']} {r['strategy']}"
        all_ok(comm, r["check"] == "ok", f"{what}: check {r['check']}")
        for key in ("bytes_sent", "peak_bytes", "workspace_bytes"):
            all_ok(comm, isinstance(r[key], int) and r[key] >= 0, f"{what}: {key} {r[key]!r}")
        all_ok(comm, r["median_s"] >= 0 and r["peak_ratio"] >= 0, what)
    for case in ran:
        mine, gs, raw = (by[case, k] for k in ("mpiredist", "gather_scatter", "raw"))
        if not mine["source_replicated"]:
            all_ok(comm, mine["bytes_sent"] <= gs["bytes_sent"],
                   f"{case}: mpiredist sends {mine['bytes_sent']} B, gather_scatter "
                   f"{gs['bytes_sent']} B")
        if mine["route"] == "exchange":     # raw has the exchange's totals by construction
            all_ok(comm, mine["bytes_sent"] == raw["bytes_sent"],
                   f"{case}: exchange {mine['bytes_sent']} B, raw {raw['bytes_sent']} B")
    if comm.size >= 2:
        all_ok(comm, any(r["route"] == "exchange" for r in rows), "no case ran the exchange")


def test_case_selection(comm):
    rc, doc = run_json(comm, main, TINY + ["--cases", "x02"])
    all_ok(comm, rc == 0, f"rc {rc}")
    all_ok(comm, {r["case"] for r in doc["rows"]} == {"x02_reversed_transpose"},
           f"{doc['rows']}")


def test_cases_scale_with_the_rank_count(comm):
    cases = load_cross_cases()
    all_ok(comm, all(_fits(c, 8) for c in cases), "every case runs at 8 ranks")
    all_ok(comm, sum(_fits(c, 4) for c in cases) > len(cases) // 2, "most run at 4 ranks")
    ids = [c.short_id for c in cases]
    all_ok(comm, len(set(ids)) == len(ids), f"ids {ids}")


def test_expressions_and_ranks(comm):
    all_ok(comm, evaluate("P/2", 8) == 4 and evaluate("P-P//2", 5) == 3
           and evaluate("min(2, P)", 1) == 1 and evaluate(6, 3) == 6, "evaluate")
    with pytest.raises(Unfit):
        evaluate("P/2", 3)
    with pytest.raises(ValueError):
        evaluate("__import__('os')", 3)
    all_ok(comm, parse_ranks("P-1:-1:-1", 3) == (2, 1, 0)
           and parse_ranks("0, P/2:P", 4) == (0, 2, 3)
           and parse_ranks("max(0, P-2)", 4) == (2,) and parse_ranks("all", 4) is None,
           "parse_ranks")
