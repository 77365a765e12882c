"""Benchmark results: ratios, summary, findings, tables, JSON, plot, progress.

The bench prints :func:`format_cases` (one line per case: ours against raw
MPI, XLA's plan and the bounds) and :func:`format_summary`; the full table of
every case and strategy (:func:`format_table`) only with ``--table``, and
every field in ``--json``.

Everything here is plain Python over the records of
:func:`mpiredist.bench.runner.run_suite` (dicts, one per case and strategy);
no MPI.  Tables and the progress bar use tabulate and tqdm (the ``bench``
extra), imported only by :func:`display_libraries`; without them both fall
back to plain text.  matplotlib is imported only by :func:`plot` (through
:mod:`mpiredist.draw`).
"""

import json
import math
import statistics
import sys

__all__ = ["NOISE", "INPLACE_TARGET", "REQUIRED_KEYS", "MISSING_NOTE", "Progress",
           "display_libraries", "geomean", "add_ratios", "inplace_ratios", "summarize",
           "findings", "format_cases", "format_summary", "format_table", "to_json",
           "write_json", "read_json", "plot", "plot_figure", "require_matplotlib"]

# A median ratio above this is a difference, not noise (shared 2-core machines).
NOISE = 1.05
# The in-place path's target: no slower than this times the out-of-place one.
INPLACE_TARGET = 1.3
INPLACE = ("inplace", "donated")

REQUIRED_KEYS = ("case", "strategy", "ranks", "median_s", "min_s", "max_s",
                 "bytes_sent_per_rank", "plan_bytes_sent_per_rank",
                 "lower_bound_bytes_per_rank", "peak_bytes", "peak_over_max",
                 "limit_bytes", "within_limit", "correct", "gbps")

MISSING_NOTE = ("note: tabulate or tqdm is not installed (pip install 'mpiredist[bench]'); "
                "plain-text tables and progress")

# tqdm's bar: [#####     ] 12/40 [00:03<00:07] c04 xla
BAR_FORMAT = "[{bar:%d}] {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {desc}"


def display_libraries():
    """Return ``(tabulate, tqdm)``, or None if either is missing.

    The one place the optional display libraries are imported.

    Returns
    -------
    tuple of (callable, type) or None
        ``tabulate.tabulate`` and ``tqdm.tqdm``; None means plain text.
    """
    try:
        from tabulate import tabulate
        from tqdm import tqdm
    except ImportError:
        return None
    return tabulate, tqdm


class _PlainBar:
    """The fallback of tqdm's bar: ``\\r12/40 c04 xla`` lines on ``stream``."""

    def __init__(self, total, stream):
        self.total, self.n, self.stream = total, 0, stream
        self._label, self._last = "", 0

    def set_description_str(self, label, refresh=False):
        self._label = label

    def update(self, n=1):
        self.n += n
        text = f"\r{self.n}/{self.total} {self._label}"
        self.stream.write(text + " " * max(0, self._last - len(text)))
        self.stream.flush()
        self._last = len(text)

    def close(self):
        if self._last:
            self.stream.write("\n")
            self.stream.flush()


class Progress:
    """A progress bar of runs done out of ``total`` on ``stream`` (stderr).

    tqdm's bar (``[####    ] 12/40 [00:03<00:07] c04 xla``), or plain text
    without tqdm; nothing at all when not ``enabled`` (ranks other than 0).

    Parameters
    ----------
    total : int
        Runs expected.
    stream : file, optional
        Where to draw (default ``sys.stderr``).
    width : int
        Characters of the bar.
    enabled : bool
        False: draw nothing.
    interval : float
        Least seconds between two redraws (tqdm's ``mininterval``).
    """

    def __init__(self, total, stream=None, width=30, enabled=True, interval=0.1):
        self.total = max(0, total)
        self._bar = (_make_bar(self.total, sys.stderr if stream is None else stream,
                               width, interval) if enabled else None)

    @property
    def done(self):
        """Runs counted so far (0 when disabled)."""
        return 0 if self._bar is None else self._bar.n

    def step(self, label="", n=1):
        """Count ``n`` runs and show ``label`` (the last run's case and strategy)."""
        if self._bar is not None:
            self._bar.set_description_str(label, refresh=False)
            self._bar.update(min(n, self.total - self._bar.n))

    def skip(self, n):
        """Count ``n`` runs that will not happen (a strategy that does not apply)."""
        if self._bar is not None:
            self._bar.update(min(n, self.total - self._bar.n))

    def close(self):
        """End the bar's line."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _make_bar(total, stream, width, interval):
    """tqdm's bar, or the plain one without the display libraries."""
    libs = display_libraries()
    if libs is None:
        return _PlainBar(total, stream)
    return libs[1](total=total, file=stream, bar_format=BAR_FORMAT % width, ascii=" #",
                   mininterval=interval, dynamic_ncols=False)


def geomean(values):
    """Geometric mean of the positive finite ``values``; None if there are none."""
    xs = [float(v) for v in values if v is not None and v > 0 and math.isfinite(v)]
    return statistics.geometric_mean(xs) if xs else None


def _by_case(records):
    out = {}
    for r in records:
        out.setdefault(r["case"], {})[r["strategy"]] = r
    return out


def _ratio(a, b):
    if a is None or b is None or not b > 0:
        return None
    return a / b


def add_ratios(records):
    """Add ``ratio_vs_raw``, ``ratio_vs_xla`` and ``ratio_vs_collectives`` (median
    time over theirs) in place.

    None where the case has no such run, or ``raw`` sends nothing.
    """
    for runs in _by_case(records).values():
        raw, xla, coll = runs.get("raw"), runs.get("xla"), runs.get("collectives")
        for r in runs.values():
            useful = raw is not None and raw["bytes_sent_per_rank"] > 0
            r["ratio_vs_raw"] = _ratio(r["median_s"], raw["median_s"]) if useful else None
            r["ratio_vs_xla"] = _ratio(r["median_s"], xla["median_s"]) if xla else None
            r["ratio_vs_collectives"] = (_ratio(r["median_s"], coll["median_s"])
                                         if coll else None)
    return records


def inplace_ratios(records):
    """``{case: {"inplace": x, "donated": y}}``: median time over collectives' median.

    Only cases with a ``collectives`` run that ran out of place (its record's
    ``executor``; where the contract sends it in place too, there is no
    out-of-place time to compare with) and at least one of the two.
    """
    out = {}
    for case, runs in _by_case(records).items():
        coll = runs.get("collectives")
        if coll is None or coll.get("executor", "out of place") != "out of place":
            continue
        row = {s: _ratio(runs[s]["median_s"], coll["median_s"]) for s in INPLACE
               if s in runs}
        if row:
            out[case] = row
    return out


def _speedups(records, other):
    """``{case: other median / collectives median}`` over cases with both."""
    out = {}
    for case, runs in _by_case(records).items():
        if "collectives" in runs and other in runs:
            s = _ratio(runs[other]["median_s"], runs["collectives"]["median_s"])
            if s is not None:
                out[case] = s
    return out


def summarize(records):
    """The summary object: geometric-mean speed-ups, worst ratios, memory."""
    out = {}
    for other in ("xla", "replicate", "direct"):
        s = _speedups(records, other)
        out[f"geomean_collectives_vs_{other}"] = geomean(s.values())
        out[f"cases_collectives_vs_{other}"] = len(s)
    runs = _by_case(records)
    differ = {c: x for c, x in _speedups(records, "xla").items()
              if not _same_plan(runs[c]["collectives"], runs[c]["xla"])}
    out["geomean_collectives_vs_xla_where_plans_differ"] = geomean(differ.values())
    out["cases_collectives_vs_xla_where_plans_differ"] = len(differ)
    for s in ("collectives", "into_out"):
        values = [r["ratio_vs_raw"] for r in records
                  if r["strategy"] == s and r.get("ratio_vs_raw") is not None]
        out[f"geomean_{s}_vs_raw"] = geomean(values)
        out[f"worst_{s}_vs_raw"] = max(values, default=None)
    worst = max((r for r in records if r["strategy"] not in ("raw", "raw_packed")
                 and r.get("ratio_vs_raw") is not None),
                key=lambda r: r["ratio_vs_raw"], default=None)
    out["worst_ratio_vs_raw"] = None if worst is None else {
        "case": worst["case"], "strategy": worst["strategy"],
        "ratio": worst["ratio_vs_raw"]}
    strategies = list(dict.fromkeys(r["strategy"] for r in records))
    out["peak_over_max"] = {}
    for s in strategies:
        rs = [r for r in records if r["strategy"] == s]
        top = max(rs, key=lambda r: r["peak_over_max"])
        out["peak_over_max"][s] = {
            "max": top["peak_over_max"], "case": top["case"],
            "geomean": geomean(r["peak_over_max"] for r in rs),
            "within_limit": sum(1 for r in rs if r.get("within_limit")), "cases": len(rs)}
    ratios = inplace_ratios(records)
    out["inplace_vs_collectives"] = ratios
    for s in INPLACE:
        values = [row[s] for row in ratios.values() if row.get(s) is not None]
        out[f"geomean_{s}_vs_collectives"] = geomean(values)
        out[f"worst_{s}_vs_collectives"] = max(values, default=None)
    out["all_correct"] = all(r["correct"] for r in records)
    out["all_inplace_within_limit"] = all(r.get("within_limit", False) for r in records
                                          if r["strategy"] in INPLACE)
    return out


def findings(records, noise=NOISE, target=INPLACE_TARGET):
    """Lines naming the cases where ``collectives`` is slower than direct or xla,
    where ``inplace`` or ``donated`` takes over ``target`` times collectives'
    median, and where either of those two allocates more than the contract's
    limit."""
    lines = []
    for case, runs in _by_case(records).items():
        coll = runs.get("collectives")
        for other in ("direct", "xla"):
            if coll is None or other not in runs:
                continue
            ratio = _ratio(coll["median_s"], runs[other]["median_s"])
            if ratio is not None and ratio > noise:
                same = _same_plan(coll, runs[other])
                lines.append(f"finding: {case}: collectives is {ratio:.2f}x slower than "
                             f"{other} (median {coll['median_s'] * 1e3:.3f} ms vs "
                             f"{runs[other]['median_s'] * 1e3:.3f} ms)"
                             + (": the same steps and bytes, so this is noise" if same else ""))
        for s in INPLACE:
            if coll is None or s not in runs:
                continue
            ratio = _ratio(runs[s]["median_s"], coll["median_s"])
            if ratio is not None and ratio > target:
                lines.append(f"finding: {case}: {s} takes {ratio:.2f}x the time of "
                             f"collectives, over the {target:g}x target (median "
                             f"{runs[s]['median_s'] * 1e3:.3f} ms vs "
                             f"{coll['median_s'] * 1e3:.3f} ms)")
        for s in INPLACE:
            r = runs.get(s)
            if r is not None and "within_limit" in r and not r["within_limit"]:
                lines.append(f"finding: {case}: {s} allocated E = {r['peak_bytes']} B, over "
                             f"the contract's limit {r['limit_bytes']} B "
                             f"(E/max(S,T) {r['peak_over_max']:.2f})")
    return lines


def _same_plan(a, b):
    """True if two records ran the same step kinds sending the same bytes, the same way."""
    return (a.get("ops") == b.get("ops") and a.get("executor") == b.get("executor")
            and a["plan_bytes_sent_per_rank"] == b["plan_bytes_sent_per_rank"])


def _num(v, fmt):
    return "-" if v is None else format(v, fmt)


def _yes(flag):
    return "-" if flag is None else "yes" if flag else "NO"


_EXEC = {"out of place": "out", "in place": "in", "raw MPI": "raw", "raw MPI packed": "raw+pack"}


_HEAD = ("case", "mesh", "strategy", "exec", "median ms", "pred ms", "min ms", "max ms", "GB/s",
         "sent MiB", "plan MiB", "bound MiB", "E/max", "RSS/max", "lim/max", "E<=lim", "ok",
         "x raw", "x xla", "x coll")
_LEFT = 4                                   # case, mesh, strategy, exec: left-aligned


def format_table(records):
    """A fixed-width table, one line per case and strategy (times in ms)."""
    align = ["left"] * _LEFT + ["right"] * (len(_HEAD) - _LEFT)
    return table([_row(r) for r in records], _HEAD, align)


def _row(r):
    """One record as the table's cells (strings)."""
    mesh = r["mesh"] + ("*" if r.get("mapped") else "")
    return (r.get("label", r["case"]), mesh, r["strategy"],
            _EXEC.get(r.get("executor"), "-"),
            _num(r["median_s"] * 1e3, ".3f"),
            _num(None if r.get("predicted_s") is None else r["predicted_s"] * 1e3, ".3f"),
            _num(r["min_s"] * 1e3, ".3f"),
            _num(r["max_s"] * 1e3, ".3f"), _num(r["gbps"], ".2f"),
            _num(r["bytes_sent_per_rank"] / 2**20, ".2f"),
            _num(r["plan_bytes_sent_per_rank"] / 2**20, ".2f"),
            _num(r["lower_bound_bytes_per_rank"] / 2**20, ".2f"),
            _num(r["peak_over_max"], ".2f"), _num(r.get("rss_over_max"), ".2f"),
            _num(r.get("limit_over_max"), ".2f"),
            _yes(r.get("within_limit")), "yes" if r["correct"] else "NO",
            _num(r.get("ratio_vs_raw"), ".2f"), _num(r.get("ratio_vs_xla"), ".2f"),
            _num(r.get("ratio_vs_collectives"), ".2f"))


_CASE_HEAD = ("case", "mesh", "ours ms", "x raw", "x xla", "sent/bound", "E/max", "lim/max",
              "ok")


def format_cases(records):
    """One line per case: ours (``collectives``) against raw MPI, XLA's plan and the
    bounds.

    Columns: ``ours ms`` the median time of ``collectives``; ``x raw`` and
    ``x xla`` that time over raw MPI's and over XLA's plan's (``-`` where the
    case has no such run, or raw sends nothing); ``sent/bound`` the bytes
    sent per rank over the lower bound (no plan can send less); ``E/max``
    the bytes newly allocated at the peak over max(S, T) (the plan's bound:
    no intermediate block is larger) and ``lim/max`` the contract's limit
    max(S, T) + W on the same scale; ``ok`` whether every strategy's result
    of the case was correct.  Cases without a ``collectives`` run are left
    out.
    """
    rows = []
    for runs in _by_case(records).values():
        ours = runs.get("collectives")
        if ours is None:
            continue
        bound = ours["lower_bound_bytes_per_rank"]
        sent = ours["bytes_sent_per_rank"]
        over = sent / bound if bound else (1.0 if sent == 0 else None)
        rows.append((ours["case"],
                     ours["mesh"] + ("*" if ours.get("mapped") else ""),
                     _num(ours["median_s"] * 1e3, ".3f"), _num(ours.get("ratio_vs_raw"), ".2f"),
                     _num(ours.get("ratio_vs_xla"), ".2f"), _num(over, ".2f"),
                     _num(ours["peak_over_max"], ".2f"), _num(ours.get("limit_over_max"), ".2f"),
                     "yes" if all(r["correct"] for r in runs.values()) else "NO"))
    return table(rows, _CASE_HEAD, ["left", "left"] + ["right"] * (len(_CASE_HEAD) - 2))


def table(rows, head, align, rule=True):
    """``rows`` of strings under ``head``, each column aligned "left" or "right".

    tabulate's ``simple`` format (``plain`` without ``rule``: no line of
    dashes under the header), or the same layout in plain Python.
    """
    libs = display_libraries()
    if libs is not None:
        return libs[0](rows, head, tablefmt="simple" if rule else "plain",
                       colalign=align, disable_numparse=True)
    rows = [tuple(head)] + [tuple(row) for row in rows]
    widths = [max(len(row[c]) for row in rows) for c in range(len(head))]
    lines = ["  ".join(v.ljust(w) if a == "left" else v.rjust(w)
                       for v, w, a in zip(row, widths, align)) for row in rows]
    if rule:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _indent(text):
    return "\n".join("  " + line for line in text.splitlines())


def format_summary(summary):
    """The summary as a few readable lines and two small tables."""
    lines = [_speedup_line(summary)]
    raw = [f"{s} {summary[f'geomean_{s}_vs_raw']:.2f}x (worst {summary[f'worst_{s}_vs_raw']:.2f}x)"
           for s in ("collectives", "into_out")
           if summary.get(f"geomean_{s}_vs_raw") is not None]
    if raw:
        lines.append("geomean time over raw, cases that move data: " + ", ".join(raw))
    w = summary.get("worst_ratio_vs_raw")
    if w:
        lines.append(f"worst time ratio vs raw: {w['ratio']:.2f}x ({w['case']}, "
                     f"{w['strategy']})")
    mem = summary.get("peak_over_max", {})
    if mem:
        lines.append("E/max(S,T) per strategy: worst and its case, geomean, runs within "
                     "the contract's limit:")
        lines.append(_indent(_memory_table(mem)))
    ratios = summary.get("inplace_vs_collectives") or {}
    if ratios:
        lines.append(f"median time / median of collectives (target <= {INPLACE_TARGET:g}x):")
        lines.append(_indent(_inplace_table(summary, ratios)))
    return "\n".join(lines)


def _speedup_line(summary):
    def g(key):
        v = summary.get(key)
        return "-" if v is None else f"{v:.2f}x"
    return (f"geomean speed-up of collectives: vs xla {g('geomean_collectives_vs_xla')} "
            f"({summary.get('cases_collectives_vs_xla', 0)} cases; "
            f"{g('geomean_collectives_vs_xla_where_plans_differ')} over the "
            f"{summary.get('cases_collectives_vs_xla_where_plans_differ', 0)} where the plans "
            f"differ), vs replicate "
            f"{g('geomean_collectives_vs_replicate')}, vs direct "
            f"{g('geomean_collectives_vs_direct')}")


def _memory_table(mem):
    """E/max(S,T) per strategy: worst and its case, geomean, runs within the limit."""
    rows = [(s, f"{m['max']:.2f}", str(m.get("case", "-")), _num(m["geomean"], ".2f"),
             f"{m.get('within_limit', '-')}/{m.get('cases', '-')}") for s, m in mem.items()]
    return table(rows, ("strategy", "worst", "case", "geomean", "within"),
                  ["left", "right", "left", "right", "right"], rule=False)


def _inplace_table(summary, ratios):
    """Median time of inplace and donated over collectives' median, per case."""
    cols = [s for s in INPLACE if any(s in row for row in ratios.values())]
    rows = [(case, *(_num(row.get(s), ".2f") for s in cols)) for case, row in ratios.items()]
    rows.append(("geomean", *(_num(summary.get(f"geomean_{s}_vs_collectives"), ".2f")
                              for s in cols)))
    return table(rows, ("case", *cols), ["left"] + ["right"] * len(cols), rule=False)


def to_json(records, summary, meta=None, skipped=(), found=()):
    """The JSON document: ``meta`` fields, ``records``, ``skipped``, ``summary``."""
    doc = dict(meta or {})
    doc.update(records=list(records), skipped=list(skipped), summary=summary,
               findings=list(found))
    return json.dumps(doc, indent=1, allow_nan=False, default=_jsonable)


def _jsonable(v):
    if hasattr(v, "item"):
        return v.item()
    raise TypeError(f"{type(v).__name__} is not JSON serialisable")


def write_json(path, *args, **kwargs):
    with open(path, "w", encoding="utf-8") as f:
        f.write(to_json(*args, **kwargs) + "\n")


def read_json(path):
    """The document :func:`write_json` wrote: a dict with ``records`` and ``summary``.

    Raises
    ------
    ValueError
        If the file is not JSON or has no list of records.
    """
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get("records"), list):
        raise ValueError(f"{path}: not a bench result (no list of records); write one "
                         "with python -m mpiredist.bench --json FILE")
    return doc


def require_matplotlib():
    """``matplotlib.pyplot`` on Agg (imported in one place: :mod:`mpiredist.draw`), or
    an ImportError saying how to install it."""
    from ..draw import require_matplotlib as pyplot

    try:
        return pyplot()
    except ImportError as exc:
        raise ImportError(f"--plot: {exc}") from exc


def plot_figure(records):
    """Two panels per case and strategy: time over raw MPI's, and memory over the bound.

    Top: median time over the median of ``raw`` (one bare MPI collective
    of the same bytes), log scale, a line at 1; cases where raw sends
    nothing have no bars.  Bottom: E / max(S, T), the bytes newly
    allocated at the peak over the plan's bound (a line at 1), each bar
    with a black tick at the contract's limit max(S, T) + W on the same
    scale (a triangle at the top where the limit is above the axis, which
    follows E).  ``raw`` itself is left out of the top panel.

    Returns
    -------
    matplotlib.figure.Figure
        Close it with ``matplotlib.pyplot.close(fig)``.
    """
    plt = require_matplotlib()
    cases = list(dict.fromkeys(r.get("label", r["case"]) for r in records))
    strategies = list(dict.fromkeys(r["strategy"] for r in records))
    index = {(r.get("label", r["case"]), r["strategy"]): r for r in records}
    width = 0.8 / max(1, len(strategies))
    colours = plt.get_cmap("tab10")
    limits = []
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(9, 0.75 * len(cases) + 3), 8.5),
                                      sharex=True)
    for k, s in enumerate(strategies):
        xs = [i + (k - (len(strategies) - 1) / 2) * width for i in range(len(cases))]
        rs = [index.get((c, s)) for c in cases]
        if s != "raw":
            pts = [(x, r["ratio_vs_raw"]) for x, r in zip(xs, rs)
                   if r is not None and r.get("ratio_vs_raw")]
            if pts:
                top.bar([x for x, _ in pts], [v for _, v in pts], width, label=s,
                        color=colours(k % 10))
        pts = [(x, r) for x, r in zip(xs, rs) if r is not None]
        bottom.bar([x for x, _ in pts], [r["peak_over_max"] for _, r in pts], width,
                   label=s, color=colours(k % 10))
        limits += [(x, r["limit_over_max"]) for x, r in pts if r.get("limit_over_max")]
    # the limit's W is at least 1 MiB: on small blocks the limits dwarf E, so the
    # axis follows E and a limit above it is a triangle at the top
    top_e = max(1.3, 1.15 * max((r["peak_over_max"] for r in records), default=0))
    bottom.set_ylim(0, top_e)
    inside = [(x, v) for x, v in limits if v <= top_e]
    above = [x for x, v in limits if v > top_e]
    if inside:
        bottom.scatter([x for x, _ in inside], [v for _, v in inside], marker="_", s=60,
                       color="black", linewidths=1.5, zorder=3)
    if above:
        bottom.scatter(above, [top_e * 0.97] * len(above), marker="^", s=18, color="black",
                       zorder=3)
    top.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    top.set_yscale("log")
    top.set_ylabel("median time / raw MPI's (log)")
    top.legend(ncol=min(len(strategies), 5), fontsize="small", loc="upper left")
    ranks = records[0]["ranks"] if records else 0
    top.set_title(f"mpiredist benchmark, {ranks} ranks: time against one bare MPI "
                  "collective of the same bytes")
    bottom.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    bottom.set_ylabel("E / max(S, T)")
    bottom.set_title("memory newly allocated at the peak (E) against the bound max(S, T); "
                     "tick: the limit max(S, T) + W, \u25b2: a limit above the axis",
                     fontsize="medium")
    bottom.set_xticks(range(len(cases)))
    bottom.set_xticklabels(cases, rotation=45, ha="right")
    fig.tight_layout()
    return fig


def plot(records, path):
    """Write :func:`plot_figure` of ``records`` to ``path`` (PNG, SVG or PDF)."""
    plt = require_matplotlib()
    fig = plot_figure(records)
    try:
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
