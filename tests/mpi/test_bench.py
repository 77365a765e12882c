"""The benchmark, run in-process on the current communicator (any rank count)."""


import pytest
from helpers import all_ok, run_json

from mpiredist.bench import report, runner
from mpiredist.bench.__main__ import main

SCALE = 64


def _run_bench(comm, argv):
    """Run ``main(argv + --json F)`` on every rank; return (rc, document) agreed."""
    return run_json(comm, main, list(argv) + ["--no-progress"])


def _expected_pairs(entries, strategies):
    out = set()
    for e in entries:
        for s in strategies:
            if s == "xla" and not (e.shared and e.native):
                continue
            if s == "raw_packed" and e.case.src.partial:
                continue
            out.add((e.case.id, s))
    return out


def _check(comm, rc, doc, pairs):
    all_ok(comm, rc == 0, f"bench exit status {rc}")
    got = {(r["case"], r["strategy"]) for r in doc["records"]}
    all_ok(comm, got == pairs, f"records {sorted(got ^ pairs)} missing or unexpected")
    missing = [(r["case"], r["strategy"], k) for r in doc["records"]
               for k in report.REQUIRED_KEYS if k not in r]
    all_ok(comm, not missing, f"records lack keys {missing[:5]}")
    wrong = [(r["case"], r["strategy"]) for r in doc["records"] if r["correct"] is not True]
    all_ok(comm, not wrong, f"incorrect results {wrong}")
    ranks = {r["ranks"] for r in doc["records"]}
    all_ok(comm, ranks == {comm.size}, f"records name ranks {ranks}")
    # Up to an element per step of rounding: the planner floors all-reduce
    # bytes in elements, the executor in bytes.
    bad = [(r["case"], r["strategy"], r["bytes_sent_per_rank"], r["plan_bytes_sent_per_rank"])
           for r in doc["records"] if r["strategy"] != "raw"
           and r["bytes_sent_per_rank"] > r["plan_bytes_sent_per_rank"] + 8 * len(r["ops"])]
    all_ok(comm, not bad, f"executor sent more than the plan says on {bad}")
    all_ok(comm, "summary" in doc and "geomean_collectives_vs_xla" in doc["summary"],
           "JSON has no summary with the geometric means")
    over = [(r["case"], r["strategy"], r["peak_bytes"], r["limit_bytes"])
            for r in doc["records"] if r["strategy"] in runner.INPLACE
            and not (r["within_limit"] is True and r["peak_bytes"] <= r["limit_bytes"])]
    all_ok(comm, not over, f"in-place runs over the memory contract's limit: {over}")
    # in-place times are compared with collectives where it ran out of place
    out_of_place = {r["case"] for r in doc["records"] if r["strategy"] == "collectives"
                    and r["executor"] == "out of place"}
    inplace = {(r["case"], r["strategy"]) for r in doc["records"]
               if r["strategy"] in runner.INPLACE and r["case"] in out_of_place}
    ratios = doc["summary"]["inplace_vs_collectives"]
    have = {(case, s) for case, row in ratios.items() for s in row}
    all_ok(comm, have == inplace, f"summary ratios for {sorted(have ^ inplace)}")


@pytest.mark.mpi
def test_quick_suite_every_case_and_strategy(comm):
    rc, doc = _run_bench(comm, ["--quick", "--scale", str(SCALE), "--repeats", "1"])
    entries = runner.suite(comm.size, None, SCALE)
    _check(comm, rc, doc, _expected_pairs(entries, runner.STRATEGIES))
    skipped = {(s["case"], s["strategy"]) for s in doc["skipped"]}
    want = {(e.case.id, "xla") for e in entries if not e.native} | \
        {(e.case.id, "raw_packed") for e in entries if e.case.src.partial}
    all_ok(comm, skipped == want, f"skipped {sorted(skipped)}, expected {sorted(want)}")
    for s in runner.INPLACE:
        all_ok(comm, doc["summary"][f"geomean_{s}_vs_collectives"] is not None,
               f"no geometric mean of {s} vs collectives")


@pytest.mark.mpi
def test_donated_counts_only_the_growth(comm):
    """All-gather of 8 MiB blocks by k, the smallest prime factor of the rank
    count: T = k S.  A donated block grows by T - S with ``ndarray.resize``
    (a new buffer plus the live block would not fit the donated limit when
    k < 4); had tracing started after the block was allocated, its realloc
    would count T."""
    n = comm.size
    k = next((p for p in range(2, n + 1) if n % p == 0), 1)
    if k >= 4:
        pytest.skip(f"needs a rank count with a prime factor 2 or 3, not {n}")
    rows, cols = 4096, 512                         # S = 8 MiB of float32 per rank
    mesh, src, dst = f"x={k},y={n // k}", "[{x,y},{}]", "[{y},{}]"
    strategies = ["collectives", "inplace", "donated"]
    rc, doc = _run_bench(comm, ["--cases", "none", "--repeats", "1",
                                "--strategies", ",".join(strategies),
                                "--mesh", mesh, "--shape", f"{rows * n},{cols}",
                                "--src", src, "--dst", dst])
    _check(comm, rc, doc, {("user", s) for s in strategies})
    by = {r["strategy"]: r for r in doc["records"]}
    s_bytes, t_bytes = by["donated"]["src_local_bytes"], by["donated"]["dst_local_bytes"]
    all_ok(comm, (s_bytes, t_bytes) == (rows * cols * 4, k * rows * cols * 4),
           f"S, T = {s_bytes}, {t_bytes}")
    w = by["donated"]["workspace_bytes"]
    all_ok(comm, by["donated"]["limit_bytes"] == t_bytes - s_bytes + w,
           f"donated limit {by['donated']['limit_bytes']}")
    all_ok(comm, by["inplace"]["limit_bytes"] == t_bytes + w,
           f"inplace limit {by['inplace']['limit_bytes']}")
    saved = by["inplace"]["peak_bytes"] - by["donated"]["peak_bytes"]
    all_ok(comm, saved >= s_bytes // 2, f"donating saved {saved} B of S = {s_bytes} B "
           f"(inplace E {by['inplace']['peak_bytes']}, donated E "
           f"{by['donated']['peak_bytes']})")


@pytest.mark.mpi
def test_own_case_with_partial_sums_and_uneven_shape(comm):
    n = comm.size
    strategies = ["collectives", "replicate", "direct", "raw"]
    rc, doc = _run_bench(comm, ["--cases", "none", "--repeats", "2",
                                "--strategies", ",".join(strategies),
                                "--mesh", f"x={n}", "--shape", "37,21",
                                "--src", "[{},{}] sum{x}", "--dst", "[{x},{}]"])
    _check(comm, rc, doc, {("user", s) for s in strategies})
    times = [len(r["times_s"]) for r in doc["records"]]
    all_ok(comm, times == [2] * len(strategies), f"repeats per record {times}")


@pytest.mark.mpi
def test_floors_move_the_right_data_and_report_both_ratios(comm):
    from benchmarks import bench_floors as floors

    rc, doc = run_json(comm, floors.main, ["--mib", "0.05", "--repeats", "2"])
    all_ok(comm, rc == 0 and doc["correct"] is True, f"floors rc {rc}, correct {doc['correct']}")
    permutes = floors.permute_mesh(comm.size) is not None       # 4, 6, 8 ... ranks
    kinds = set(floors.KINDS) | (set(floors.PERMUTES) if permutes else set())
    all_ok(comm, set(doc["median_s"]) == kinds, f"kinds {sorted(doc['median_s'])}")
    all_ok(comm, all(t > 0 for t in doc["median_s"].values()), f"times {doc['median_s']}")
    want = {f"{a}/{b}" for a, b, _ in floors.RATIOS if a in kinds}
    all_ok(comm, set(doc["ratios"]) == want, f"ratios {sorted(doc['ratios'])}")


def test_permute_mesh_has_two_factors():
    from benchmarks.bench_floors import permute_mesh

    assert [permute_mesh(n) for n in (1, 2, 3, 5)] == [None] * 4
    assert permute_mesh(8) == {"a": 2, "b": 4} and permute_mesh(9) == {"a": 3, "b": 3}


@pytest.mark.mpi
def test_floors_check_fails_on_wrong_data(comm):
    """The check compares real contents: a block that did not arrive fails it."""
    from benchmarks.bench_floors import Floors, Permutes, permute_mesh

    f = Floors(comm, 0.01)
    f.sendrecv = lambda: f.aside.fill(-1)           # the block never arrives
    all_ok(comm, not f.check(), "a missing block passed the check")
    if permute_mesh(comm.size) is not None:
        p = Permutes(comm, f.n)
        p.given.run = lambda a: a                   # the donated run moves nothing
        caught = comm.allgather(not p.check())     # ranks that keep their rows pass
        all_ok(comm, any(caught), "an unmoved donated block passed the check")
        p.free()


@pytest.mark.mpi
def test_overhead_table_has_every_kind(comm):
    from benchmarks import bench_overhead as overhead

    rc, doc = run_json(comm, overhead.main, ["--bytes", "1024", "--repeats", "2",
                                             "--cases", "c01"])
    rows = doc["rows"]
    all_ok(comm, rc == 0 and len(rows) == 1, f"overhead rc {rc}, {len(rows)} rows")
    missing = [k for k in overhead.KINDS if not rows[0].get(f"{k}_us", 0) > 0]
    all_ok(comm, not missing, f"no time for {missing}")


@pytest.mark.mpi
def test_into_out_runs_into_the_given_array(comm):
    """``into_out`` is the collectives plan run with ``out=``: the same result,
    and the call allocates no target block (collectives does: E >= T)."""
    rc, doc = _run_bench(comm, ["--cases", "c02", "--scale", "8", "--repeats", "1",
                                "--strategies", "collectives,into_out"])
    runs = {r["strategy"]: r for r in doc["records"]}
    all_ok(comm, rc == 0 and set(runs) == {"collectives", "into_out"}, f"rc {rc}, {set(runs)}")
    coll, into = runs["collectives"], runs["into_out"]
    all_ok(comm, coll["correct"] and into["correct"], "wrong result")
    all_ok(comm, into["ops"] == coll["ops"], f"plans differ: {into['ops']} {coll['ops']}")
    t = into["dst_local_bytes"]
    all_ok(comm, into["peak_bytes"] < t // 2 <= coll["peak_bytes"],
           f"E into_out {into['peak_bytes']}, collectives {coll['peak_bytes']}, T {t}")
