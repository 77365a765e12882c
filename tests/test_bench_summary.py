"""The bench's default output (one line per case), --table, --plot and --from-json; no MPI."""

import pytest

from mpiredist.bench import report
from mpiredist.bench.__main__ import main


def _rec(case, strategy, median, sent=1000, bound=1000, peak_over_max=1.0, correct=True):
    return {"case": case, "label": case[:3], "strategy": strategy, "ranks": 4,
            "mesh": "x=4", "mapped": False, "median_s": median, "min_s": median,
            "max_s": median, "bytes_sent_per_rank": sent, "plan_bytes_sent_per_rank": sent,
            "lower_bound_bytes_per_rank": bound, "peak_bytes": int(peak_over_max * 100),
            "peak_over_max": peak_over_max, "limit_bytes": 125, "limit_over_max": 1.25,
            "within_limit": True, "correct": correct, "gbps": 1.0}


@pytest.fixture
def records():
    return report.add_ratios([
        _rec("c01_transpose", "collectives", 0.004, peak_over_max=1.02),
        _rec("c01_transpose", "xla", 0.008, peak_over_max=2.5),
        _rec("c01_transpose", "raw", 0.002, peak_over_max=0.0),
        _rec("c02_gather", "collectives", 0.003, sent=1500, bound=1000),
        _rec("c02_gather", "raw", 0.001, sent=0),                 # raw moves nothing
        _rec("c02_gather", "direct", 0.002, correct=False),
        _rec("c03_raw_only", "raw", 0.001),                       # no collectives run
    ])


def test_one_line_per_case_against_raw_xla_and_the_bounds(records):
    lines = report.format_cases(records).splitlines()
    assert lines[0].split() == ["case", "mesh", "ours", "ms", "x", "raw", "x", "xla",
                                "sent/bound", "E/max", "lim/max", "ok"]
    rows = {l.split()[0]: l.split() for l in lines[2:]}
    assert set(rows) == {"c01_transpose", "c02_gather"}           # c03 has no ours
    assert rows["c01_transpose"] == ["c01_transpose", "x=4", "4.000", "2.00", "0.50",
                                     "1.00", "1.02", "1.25", "yes"]
    # raw sent nothing: no ratio; 1.5x the lower bound; direct's wrong result shows
    assert rows["c02_gather"][3:6] == ["-", "-", "1.50"]
    assert rows["c02_gather"][-1] == "NO"


def test_plot_bars_are_time_over_raw_and_memory_over_the_bound(records):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    fig = report.plot_figure(records)
    try:
        top, bottom = fig.axes
        heights = sorted(round(p.get_height(), 6) for p in top.patches)
        memory = sorted(round(p.get_height(), 6) for p in bottom.patches)
        labels = [t.get_text() for t in bottom.get_xticklabels()]
        legend = [t.get_text() for t in top.get_legend().get_texts()]
    finally:
        plt.close(fig)
    # c01: collectives 2x raw, xla 4x raw; c02 has no useful raw; raw itself not drawn
    assert heights == [2.0, 4.0]
    assert "raw" not in legend and {"collectives", "xla"} <= set(legend)
    assert memory == sorted(round(r["peak_over_max"], 6) for r in records)
    assert labels == ["c01", "c02", "c03"]


def _write(tmp_path, records):
    path = tmp_path / "bench.json"
    report.write_json(path, records, report.summarize(records),
                      {"ranks": 4, "scale": 1, "repeats": 5, "dtype": "float32"})
    return path


def test_from_json_prints_the_cases_first_and_the_table_only_when_asked(
        records, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = _write(tmp_path, records)
    png = tmp_path / "bench.png"
    rc = main(["--from-json", str(path), "--plot", str(png)])
    out = capsys.readouterr().out
    assert rc == 1                                   # direct was wrong on c02
    assert png.stat().st_size > 10_000
    lines = out.splitlines()
    assert lines[0].startswith(f"mpiredist bench results from {path}: 4 ranks")
    head = next(i for i, l in enumerate(lines) if l.split()[:2] == ["case", "mesh"])
    assert lines[head + 2].startswith("c01_transpose")
    assert "x coll" not in out and "--table" in out  # the 20-column table is not printed
    assert "geomean speed-up of collectives" in out
    rc = main(["--from-json", str(path), "--table"])
    out = capsys.readouterr().out
    assert "x coll" in out and "RSS/max" in out
    assert out.index("x coll") < out.index("sent/bound")   # the full table comes first


def test_from_json_of_a_correct_run_exits_0(records, tmp_path, capsys):
    good = [r for r in records if r["correct"]]
    assert main(["--from-json", str(_write(tmp_path, good))]) == 0
    assert "c01_transpose" in capsys.readouterr().out


@pytest.mark.parametrize("content", ["not json", '{"ranks": 4}', "[1, 2]"])
def test_from_json_of_something_else_exits_2(content, tmp_path, capsys):
    path = tmp_path / "x.json"
    path.write_text(content)
    assert main(["--from-json", str(path)]) == 2
    assert capsys.readouterr().err.startswith("error: ")
