"""The benchmark's MPI-free parts: report formatting, summary, suite, --plan-only."""

import io
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from mpiredist.bench import report, runner
from mpiredist.bench.__main__ import main
from mpiredist.bench.cases import load_cases
from mpiredist.bench.measure import settled, traced_peak, tracing
from mpiredist.core.layout import Layout
from mpiredist.core.mesh import Mesh


def _rec(case, strategy, median, sent=1000, peak_over_max=1.0, correct=True,
         within=True):
    return {"case": case, "label": case[:3], "strategy": strategy, "ranks": 8,
            "mesh": "x=8", "mapped": False, "median_s": median, "min_s": median * 0.9,
            "max_s": median * 1.1, "bytes_sent_per_rank": sent,
            "plan_bytes_sent_per_rank": sent, "lower_bound_bytes_per_rank": sent,
            "peak_bytes": int(peak_over_max * 100), "peak_over_max": peak_over_max,
            "limit_bytes": 125, "limit_over_max": 1.25, "within_limit": within,
            "correct": correct, "gbps": sent / median / 1e9}


@pytest.fixture
def records():
    recs = [_rec("c01_a", "collectives", 1.0), _rec("c01_a", "inplace", 1.2),
            _rec("c01_a", "donated", 1.5, peak_over_max=0.1),
            _rec("c01_a", "xla", 2.0),
            _rec("c01_a", "replicate", 4.0, peak_over_max=3.0, within=False),
            _rec("c01_a", "direct", 0.5),
            _rec("c01_a", "raw", 0.25, peak_over_max=0.0),
            _rec("c02_b", "collectives", 1.0), _rec("c02_b", "inplace", 2.0,
                                                    peak_over_max=1.5, within=False),
            _rec("c02_b", "donated", 0.8, peak_over_max=0.2),
            _rec("c02_b", "xla", 0.5),
            _rec("c02_b", "replicate", 1.0), _rec("c02_b", "direct", 1.04),
            _rec("c02_b", "raw", 0.5, sent=0, peak_over_max=0.0)]
    return report.add_ratios(recs)


@pytest.fixture(params=["library", "plain"])
def display(request, monkeypatch):
    """Run a test with tabulate and tqdm, then with the plain-text fallback."""
    if request.param == "library":
        if report.display_libraries() is None:
            pytest.skip("tabulate or tqdm is not installed (the bench extra)")
    else:
        monkeypatch.setattr(report, "display_libraries", lambda: None)
    return request.param


def test_geomean():
    assert report.geomean([1, 4]) == pytest.approx(2.0)
    assert report.geomean([2, None, 0, -1, float("nan"), 8]) == pytest.approx(4.0)
    assert report.geomean([]) is None


def test_ratios(records):
    by = {(r["case"], r["strategy"]): r for r in records}
    assert by["c01_a", "collectives"]["ratio_vs_raw"] == pytest.approx(4.0)
    assert by["c01_a", "collectives"]["ratio_vs_xla"] == pytest.approx(0.5)
    assert by["c02_b", "collectives"]["ratio_vs_raw"] is None   # raw sends nothing
    assert by["c01_a", "inplace"]["ratio_vs_collectives"] == pytest.approx(1.2)
    assert by["c02_b", "donated"]["ratio_vs_collectives"] == pytest.approx(0.8)
    assert by["c02_b", "collectives"]["ratio_vs_collectives"] == pytest.approx(1.0)
    assert report.inplace_ratios(records) == {
        "c01_a": {"inplace": pytest.approx(1.2), "donated": pytest.approx(1.5)},
        "c02_b": {"inplace": pytest.approx(2.0), "donated": pytest.approx(0.8)}}


def test_summary(records):
    s = report.summarize(records)
    assert s["geomean_collectives_vs_xla"] == pytest.approx(1.0)        # 2x and 0.5x
    assert s["geomean_collectives_vs_replicate"] == pytest.approx(2.0)  # 4x and 1x
    assert s["cases_collectives_vs_xla"] == 2
    assert s["worst_ratio_vs_raw"] == {"case": "c01_a", "strategy": "replicate",
                                       "ratio": pytest.approx(16.0)}
    assert s["peak_over_max"]["raw"]["max"] == 0.0
    assert s["peak_over_max"]["inplace"] == {"max": 1.5, "case": "c02_b",
                                            "geomean": pytest.approx(math.sqrt(1.5)),
                                            "within_limit": 1, "cases": 2}
    assert s["peak_over_max"]["replicate"]["within_limit"] == 1
    assert s["geomean_inplace_vs_collectives"] == pytest.approx(math.sqrt(2.4))
    assert s["geomean_donated_vs_collectives"] == pytest.approx(math.sqrt(1.2))
    assert s["worst_inplace_vs_collectives"] == pytest.approx(2.0)
    assert s["inplace_vs_collectives"]["c01_a"]["donated"] == pytest.approx(1.5)
    assert s["all_correct"] is True
    assert s["all_inplace_within_limit"] is False


def test_findings_name_the_slow_cases(records):
    lines = report.findings(records)
    assert lines == [l for l in lines if l.startswith("finding: ")]
    text = "\n".join(lines)
    assert "c01_a: collectives is 2.00x slower than direct" in text
    assert "c02_b: collectives is 2.00x slower than xla" in text
    assert not any("c02_b" in l and "direct" in l for l in lines)   # 1.04x is noise


def test_findings_name_slow_inplace_runs_and_contract_breaches(records):
    lines = report.findings(records)
    text = "\n".join(lines)
    assert "c01_a: donated takes 1.50x the time of collectives, over the 1.3x target" in text
    assert "c02_b: inplace takes 2.00x the time of collectives" in text
    assert not any("c01_a: inplace takes" in l for l in lines)      # 1.2x meets the target
    assert not any("c02_b: donated takes" in l for l in lines)
    assert "c02_b: inplace allocated E = 150 B, over the contract's limit 125 B" in text
    assert not any("replicate allocated" in l for l in lines)       # only in-place runs


def test_table_is_fixed_width(records, display):
    records[0]["correct"] = False
    text = report.format_table(records)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["case", "mesh", "strategy"]
    assert set(lines[1]) == {"-", " "}
    assert len(lines[1].split()) == 20                          # a rule under each column
    assert len(lines) == 2 + len(records)
    ends = {len(l) for l in lines[2:]}
    assert len(ends) == 1                                       # right-aligned columns
    assert " NO " in lines[2] and "c01" in lines[2] and "collectives" in lines[2]
    assert "x=8" in lines[3]
    head = lines[0].split()
    assert {"E/max", "RSS/max", "lim/max", "E<=lim", "coll", "pred"} <= set(head)
    col = lines[0].index("E<=lim") + len("E<=lim")
    flags = {r["strategy"] + r["case"]: line[col - 3:col]
             for r, line in zip(records, lines[2:])}
    assert flags["inplacec02_b"] == " NO" and flags["inplacec01_a"] == "yes"


def test_summary_text(records, display):
    text = report.format_summary(report.summarize(records))
    lines = text.splitlines()
    i = next(k for k, l in enumerate(lines) if l.startswith("E/max(S,T) per strategy"))
    assert lines[i + 1].split() == ["strategy", "worst", "case", "geomean", "within"]
    rows = {l.split()[0]: l.split() for l in lines[i + 2:i + 9]}
    assert rows["inplace"] == ["inplace", "1.50", "c02_b", "1.22", "1/2"]
    assert rows["replicate"] == ["replicate", "3.00", "c01_a", "1.73", "1/2"]
    assert len(rows) == 7                                       # one row per strategy
    i = next(k for k, l in enumerate(lines) if l.startswith("median time / median of"))
    assert "1.3x" in lines[i]
    assert lines[i + 1].split() == ["case", "inplace", "donated"]
    assert lines[i + 2].split() == ["c01_a", "1.20", "1.50"]
    assert lines[i + 3].split() == ["c02_b", "2.00", "0.80"]
    assert lines[i + 4].split() == ["geomean", "1.55", "1.10"]


def test_json_document(records):
    summary = report.summarize(records)
    doc = json.loads(report.to_json(records, summary, {"ranks": 8},
                                    [{"case": "c03", "strategy": "xla", "reason": "r"}],
                                    ["finding: x"]))
    assert doc["ranks"] == 8 and doc["findings"] == ["finding: x"]
    assert len(doc["records"]) == len(records)
    for r in doc["records"]:
        assert set(report.REQUIRED_KEYS) <= set(r)
    assert doc["summary"]["geomean_collectives_vs_xla"] == pytest.approx(1.0)
    assert doc["skipped"][0]["strategy"] == "xla"


def test_json_converts_numpy_scalars():
    rec = _rec("c01", "raw", np.float64(0.5), sent=np.int64(3))
    assert json.loads(report.to_json([rec], {}))["records"][0]["bytes_sent_per_rank"] == 3


def _frames(text):
    """The lines a carriage-return progress bar drew, in order."""
    return [f.rstrip() for f in text.replace("\n", "\r").split("\r") if f.strip()]


def test_progress_bar(display):
    out = io.StringIO()
    bar = report.Progress(4, stream=out, width=8, interval=0)
    bar.step("c04 xla")
    bar.skip(1)
    bar.step("c05 raw")
    assert bar.done == 3
    bar.close()
    text = out.getvalue()
    frames = _frames(text)
    assert any(f.startswith(("[##      ] 1/4", "1/4")) and f.endswith("c04 xla")
               for f in frames)
    assert frames[-1].startswith(("[######  ] 3/4", "3/4")) and frames[-1].endswith("c05 raw")
    assert text.endswith("\n")
    if display == "library":
        assert "[{}] 1/4".format("##".ljust(8)) in text            # tqdm's bar, 8 wide
    quiet = io.StringIO()
    bar = report.Progress(4, stream=quiet, enabled=False)
    bar.step("x")
    bar.close()
    assert quiet.getvalue() == ""


def test_progress_never_counts_past_the_total(display):
    out = io.StringIO()
    bar = report.Progress(2, stream=out, interval=0)
    bar.skip(1)
    bar.step("c01 raw", n=5)
    bar.step("c01 xla")
    assert bar.done == 2
    bar.close()
    assert not any(" 3/2" in f or f.startswith("3/2") for f in _frames(out.getvalue()))


def test_missing_display_libraries_give_one_note(monkeypatch, capsys):
    from mpiredist.bench import __main__ as bench_main
    monkeypatch.setattr(report, "display_libraries", lambda: None)
    bench_main._note_plain_text()
    err = capsys.readouterr().err
    assert err == report.MISSING_NOTE + "\n" and "mpiredist[bench]" in err


def test_plot(records, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench.png"
    report.plot(records, str(path))
    assert path.stat().st_size > 1000


def test_traced_peak_counts_freed_and_kept_buffers():
    with traced_peak() as e:
        a = np.ones(1 << 20, dtype=np.uint8)
        b = np.ones(1 << 21, dtype=np.uint8)
        del b
    assert (1 << 20) + (1 << 21) <= e.bytes < (1 << 20) + (1 << 21) + (1 << 16)
    with traced_peak() as e:
        pass
    assert e.bytes < 1 << 12
    del a


def test_realloc_counts_the_growth_only_for_blocks_allocated_while_tracing():
    mib = 1 << 20
    early = np.ones(mib, dtype=np.uint8)          # before tracing: unknown to it
    with tracing():
        late = np.ones(mib, dtype=np.uint8)
        with traced_peak() as grown:
            late.resize(3 * mib, refcheck=False)
        with traced_peak() as unknown:
            early.resize(3 * mib, refcheck=False)
    assert 2 * mib <= grown.bytes < 2 * mib + (1 << 16)
    assert unknown.bytes >= 3 * mib               # why the runner traces first


def test_settled_collections_skip_what_existed_and_still_free_new_cycles():
    import gc
    import weakref

    class Node:
        pass

    old = Node()
    old.me = old                                   # a live cycle made before
    with settled():
        assert gc.get_freeze_count() > 0           # what existed is frozen
        assert not any(o is old for o in gc.get_objects())
        new = Node()
        new.me = new                               # garbage made inside
        gone = weakref.ref(new)
        del new
        gc.collect()
        assert gone() is None                      # still collected
    assert gc.get_freeze_count() == 0
    assert any(o is old for o in gc.get_objects())
    gc.freeze()                                    # frozen by the process itself
    try:
        frozen = gc.get_freeze_count()
        with settled():
            pass
        assert gc.get_freeze_count() == frozen     # left as it was
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("ranks", range(1, 17))
def test_map_mesh_keeps_axes_and_product(ranks):
    for case in load_cases():
        mesh = runner.map_mesh(case.mesh, ranks)
        assert list(mesh) == list(case.mesh)
        assert math.prod(mesh.values()) == ranks


def test_map_mesh_rule():
    assert runner.map_mesh({"x": 2, "y": 4}, 8) == {"x": 2, "y": 4}
    assert runner.map_mesh({"x": 2, "y": 4}, 3) == {"x": 1, "y": 3}
    assert runner.map_mesh({"x": 2, "y": 4}, 6) == {"x": 2, "y": 3}
    assert runner.map_mesh({"x": 2, "y": 2, "z": 2}, 3) == {"x": 1, "y": 1, "z": 3}
    assert runner.map_mesh({"x": 4, "y": 4}, 8) == {"x": 4, "y": 2}     # grow_mesh
    assert runner.map_mesh({"x": 8}, 1) == {"x": 1}


def test_suite_at_8_and_3_ranks():
    at8 = runner.suite(8)
    assert [e.case.short_id for e in at8] == [c.short_id for c in load_cases()
                                              if math.prod(c.mesh.values()) == 8]
    assert all(e.native and e.shared for e in at8)
    at3 = runner.suite(3, scale=64)
    assert len(at3) == len(load_cases()) and not any(e.native for e in at3)
    assert at3[0].case.shape == (64, 64)
    (c16,) = runner.suite(8, ["c16"])
    assert not c16.native and c16.case.mesh == {"x": 4, "y": 2}
    user = runner.suite(4, [], user=runner.Case("user", {"x": 4}, (5, 3),
                                                 Layout.parse("[{x},{}]"),
                                                 Layout.parse("[{},{x}]")))
    assert [e.label for e in user] == ["user"]


def test_partial_source_blocks_sum_to_the_array():
    mesh = Mesh({"x": 2, "y": 2})
    src = Layout.parse("[{x},{}] sum{y}")
    g = runner.global_array((4, 3), "float32", np.random.default_rng(0))
    blocks = [runner.source_block(g, mesh, src, r) for r in range(4)]
    np.testing.assert_array_equal(blocks[0] + blocks[1], g[:2])   # y varies fastest
    assert not blocks[1].any() and not blocks[3].any()


def _bench(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "mpiredist.bench", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_plan_only_at_4096_ranks_prints_every_case():
    done = _bench("--plan-only", "--ranks", "4096")
    assert done.returncode == 0, done.stderr
    for case in load_cases():
        assert case.id in done.stdout
    assert "collectives" in done.stdout and "direct" in done.stdout


def test_plan_only_imports_no_mpi():
    code = ("import sys; from mpiredist.bench.__main__ import main; "
            "rc = main(['--plan-only', '--ranks', '64', '--cases', 'c04', "
            "'--mesh', 'x=2,y=4', '--shape', '64,64', '--src', '[{x},{}]', "
            "'--dst', '[{},{x}]']); "
            "assert 'mpi4py' not in sys.modules, 'mpi4py imported'; sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "c04_swap_unequal" in done.stdout and "user" in done.stdout


@pytest.mark.parametrize("argv, message", [
    (["--strategies", "collectives,fast"], "--strategies"),
    (["--mesh", "x=2"], "missing --shape, --src, --dst"),
    (["--cases", "c99"], "no shared case 'c99'"),
    (["--cases", "none"], "nothing to run"),
])
def test_bad_options_exit_2(argv, message, capsys):
    assert main(["--plan-only", *argv]) == 2
    assert message in capsys.readouterr().err


def test_inplace_ratios_only_against_an_out_of_place_run(records):
    """Where collectives itself ran in place there is nothing to compare with."""
    for r in records:
        if r["case"] == "c02_b" and r["strategy"] == "collectives":
            r["executor"] = "in place"
    assert set(report.inplace_ratios(records)) == {"c01_a"}
    records[0]["executor"] = "out of place"
    assert set(report.inplace_ratios(records)) == {"c01_a"}


def test_findings_say_when_the_plans_are_the_same(records):
    """The records' ops are absent here: the same (no) steps and bytes, so noise."""
    text = "\n".join(report.findings(records))
    assert "c02_b: collectives is 2.00x slower than xla" in text
    assert "the same steps and bytes, so this is noise" in text
    for r in records:
        if r["case"] == "c02_b" and r["strategy"] == "xla":
            r["ops"], r["plan_bytes_sent_per_rank"] = ["all_to_all"], 2000
    line = next(l for l in report.findings(records) if "c02_b" in l and "than xla" in l)
    assert "noise" not in line
