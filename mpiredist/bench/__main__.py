"""``mpirun -n 8 python -m mpiredist.bench [...]``: the benchmark (``--help``).

:func:`main` takes ``argv`` and a communicator, so tests run it in-process.
``--plan-only`` never imports mpi4py.
"""

import argparse
import sys
import textwrap
import time

from ..runtime.failure import abort_on_exception
from ..cli import parse_shape
from ..core.errors import MpiredistError, PlanError, ShapeError
from ..core.layout import Layout
from ..core.mesh import Mesh

__all__ = ["build_parser", "main", "QUICK_SCALE", "QUICK_REPEATS"]

ALL_STRATEGIES = ("collectives", "into_out", "inplace", "donated", "xla", "replicate",
                  "direct", "raw", "raw_packed")
# --quick: 17 cases x 7 strategies at 8 ranks on 2 cores in under 2 minutes
# (measured 20 s); 7 repeats because at 0.5 MiB blocks two runs of one plan
# differ by up to 30 % in medians of 3.
QUICK_SCALE, QUICK_REPEATS = 4, 7
DEFAULT_REPEATS = 5

DESCRIPTION = """\
Run every redistribution strategy side by side on the same data, on the
ranks of MPI_COMM_WORLD, and compare time, bytes and measured memory.

strategies:
  collectives  the paper's normal form (mpiredist's default), run as
               redistribute runs it (not donated): out of place
               (mpiredist.runtime.memory.Fresh) when that fits the memory contract, else
               the plan without exchange steps in one buffer; the table's
               "exec" column says which
  into_out     the same, into an out= array allocated once (Transfer.run(block,
               out=out)), as a loop of repeated redistributions runs it: no
               fresh output pages per run, pack buffers kept
  inplace      the collectives plan as redistribute runs it in one buffer
               (mpiredist.runtime.memory.OneBuffer, W = default workspace): without
               exchange steps (allow_exchange=False) unless its only
               exchange is the first step, which reads the source block
  donated      the same (no exchange at all), given a fresh copy of the
               source block (made before the timed region) that it may
               resize or release (donate=True)
  xla          XLA's SPMD partitioner's own sequence (bench/xla.py) run on
               mpiredist's runtime exactly as collectives is (same choice of
               executor); shared cases on their own mesh only
  replicate    all-gather every sharded dim, then slice (out of place)
  direct       one exchange step of exactly the missing bytes (out of place)
  raw          the limit: one bare MPI collective sending as many bytes per
               rank as the collectives plan, on preallocated contiguous
               buffers, no planning, no packing.  Chosen from the plan's
               dominant step (most bytes) on that step's sub-communicator:
               all_to_all/exchange -> Alltoall, all_gather -> Allgather,
               permute -> Sendrecv (ring shift), all_reduce -> Allreduce,
               reduce_scatter -> Reduce_scatter_block; none if nothing moves.
"""

EPILOG = """\
{rule}

timing: per case, one untimed warm-up run per strategy (checked against a
numpy oracle: every rank slices its expected block from the same seeded
global array; raw checks the bytes it received), one untimed run under
tracemalloc for the peak E (bytes newly allocated, max over ranks; tracing
starts before the blocks exist so a donated block's realloc counts only its
growth, and stops before the timed rounds), then
--repeats rounds running every strategy once in an order shuffled each round,
with a barrier before each timed run.  A run's time is the largest over
ranks; the table gives median, min and max over rounds, GB/s = bytes sent
per rank (counted by the executor) / median.  Planning is outside the timing.
--quick = --scale {qs} --repeats {qr} (unless given).

memory contract (docs/semantics.md), per rank, W = max(S,T)/4 + 1 MiB of the
strategy's plan: limit = max(S,T) + W, or max(0, T-S) + W for donated; the
table gives E/max(S,T), limit/max(S,T) and E<=lim; "x coll" is the median
time over collectives' median.

A "finding:" line names each case where collectives' median is over {noise}x
that of direct or xla, where inplace or donated takes over {target}x
collectives' median, and where inplace or donated allocates over the limit.

--plan-only --ranks N models every case scaled onto N devices with the
alpha-beta model of bench/model.py (no MPI; N must be a case's mesh size times
or divided by a power of two); --ranks-per-node R plans and prices them for
nodes of R devices (the two-level model: across-node bytes at --beta-across).

--nodes runs the cases that matter across nodes instead (bench/nodes.py):
the shared cases on meshes whose major or minor digits cross nodes, and
train-to-serve between nodes, against XLA's plans, raw MPI and the link
limit (--link-rate), with the bytes the network interfaces counted.
"""


def _csv(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def build_parser():
    from .report import INPLACE_TARGET, NOISE
    from .runner import MAPPING_RULE

    p = argparse.ArgumentParser(
        prog="python -m mpiredist.bench", description=DESCRIPTION,
        epilog=EPILOG.format(rule=textwrap.fill(MAPPING_RULE, 78), qs=QUICK_SCALE,
                             qr=QUICK_REPEATS, noise=NOISE,
                             target=INPLACE_TARGET),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", metavar="FILE", help="write one record per case and "
                   "strategy, the skipped ones and a summary to FILE")
    p.add_argument("--plot", metavar="FILE.png", help="draw time over raw MPI's and "
                   "E/max(S,T) against the bound per case and strategy (needs matplotlib)")
    p.add_argument("--table", action="store_true", help="also print the full table: one "
                   "line per case and strategy, 20 columns (always in --json)")
    p.add_argument("--from-json", metavar="FILE", help="run nothing: read the results of "
                   "an earlier --json FILE and print (and --plot) them; no MPI")
    p.add_argument("--cases", metavar="IDS", help="comma-separated shared cases "
                   "(c01,c04 or full ids); 'none' for only the --mesh case")
    p.add_argument("--scale", type=int, metavar="K", help="divide every case's lengths "
                   "by K (default 1; --quick: %d)" % QUICK_SCALE)
    p.add_argument("--quick", action="store_true", help="a run of under 2 minutes at 8 "
                   "ranks on 2 cores (every strategy): --scale %d --repeats %d"
                   % (QUICK_SCALE, QUICK_REPEATS))
    p.add_argument("--repeats", type=int, metavar="R", help="timed rounds (default %d; "
                   "--quick: %d)" % (DEFAULT_REPEATS, QUICK_REPEATS))
    p.add_argument("--strategies", default=",".join(ALL_STRATEGIES), metavar="LIST",
                   help="comma-separated, of %s (default all)" % ",".join(ALL_STRATEGIES))
    p.add_argument("--seed", type=int, default=0, help="seed of the global arrays")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")

    user = p.add_argument_group("your own case (added to the suite; needs all four)")
    user.add_argument("--mesh", metavar="AXES", help="e.g. x=2,y=4 (as many devices as "
                      "ranks)")
    user.add_argument("--shape", metavar="N,N,...", help="global shape, e.g. 512,512")
    user.add_argument("--src", metavar="LAYOUT", help="source layout, e.g. '[{x},{}]'")
    user.add_argument("--dst", metavar="LAYOUT", help="target layout, e.g. '[{},{x}]'")
    user.add_argument("--dtype", default="float32", help="element type of every case "
                      "(default float32)")
    nodes = p.add_argument_group("across nodes (bench/nodes.py; two or more nodes)")
    nodes.add_argument("--nodes", action="store_true", help="run the cases that matter "
                       "across nodes instead: the shared cases on meshes whose major or minor "
                       "digits cross nodes, train-to-serve between nodes (default --scale 2)")
    nodes.add_argument("--link-rate", metavar="RATE", help="the links' rate for the link "
                       "limit, as tc writes it (e.g. 1gbit; default: measured)")
    model = p.add_argument_group("model only (no MPI)")
    model.add_argument("--plan-only", action="store_true", help="print bytes, peak/max, "
                       "rounds and modelled time per case and strategy; no MPI")
    model.add_argument("--ranks", type=int, metavar="N", help="devices to scale the cases "
                       "onto (default: each case's own mesh)")
    model.add_argument("--alpha", type=float, metavar="S", help="seconds per message")
    model.add_argument("--beta", type=float, metavar="BPS", help="bytes per second per rank")
    model.add_argument("--ranks-per-node", type=int, metavar="R", help="plan for nodes of R "
                       "devices (device d on node d // R) with the two-level model: bytes "
                       "that cross nodes at the across-node rate")
    model.add_argument("--beta-across", type=float, metavar="BPS", help="bytes per second "
                       "per rank across nodes (default: the profile's, measured by calibrate "
                       "on two or more nodes, else a tenth of beta)")
    return p


class _Options:
    """Checked options: strategies, scale, repeats, case ids, user case."""

    def __init__(self, args):
        self.strategies = _csv(args.strategies)
        bad = [s for s in self.strategies if s not in ALL_STRATEGIES]
        if bad or not self.strategies:
            raise PlanError(f"--strategies {args.strategies!r}: expected a comma-separated "
                            f"list of {', '.join(ALL_STRATEGIES)}")
        self.strategies = list(dict.fromkeys(self.strategies))
        self.scale = args.scale if args.scale is not None else (
            QUICK_SCALE if args.quick else 1)
        self.repeats = args.repeats if args.repeats is not None else (
            QUICK_REPEATS if args.quick else DEFAULT_REPEATS)
        if self.scale < 1:
            raise ShapeError(f"--scale {self.scale} must be a positive integer")
        if self.repeats < 1:
            raise PlanError(f"--repeats {self.repeats} must be at least 1")
        self.case_ids = None
        if args.cases is not None:
            ids = _csv(args.cases)
            self.case_ids = [] if ids == ["none"] else ids
        self.dtype = args.dtype
        self.user = _user_case(args)
        if self.case_ids == [] and self.user is None:
            raise PlanError("--cases none leaves nothing to run: give --mesh, --shape, "
                            "--src and --dst")


def _user_case(args):
    from ..planning import planner
    from .cases import Case

    given = {k: getattr(args, k) for k in ("mesh", "shape", "src", "dst")}
    if not any(v is not None for v in given.values()):
        return None
    missing = [f"--{k}" for k, v in given.items() if v is None]
    if missing:
        raise PlanError(f"your own case needs --mesh, --shape, --src and --dst; "
                        f"missing {', '.join(missing)}")
    mesh, shape = Mesh(args.mesh), parse_shape(args.shape)
    src, dst = Layout.parse(args.src), Layout.parse(args.dst)
    planner.validate(shape, args.dtype, mesh, src, dst)
    return Case("user", dict(mesh.axes), shape, src, dst)


def main(argv=None, comm=None):
    """Run the benchmark; return the exit status (0: every result correct).

    ``comm`` defaults to ``MPI.COMM_WORLD``; every rank of it calls this.
    """
    args = build_parser().parse_args(argv)
    if args.from_json:
        return _from_json(args)
    try:
        opts = _Options(args)
        if args.plan_only:
            return _plan_only(args, opts)
    except (MpiredistError, KeyError) as exc:
        return _fail(exc, root=args.plan_only or _is_root(comm))
    if args.nodes:
        from ..runtime.mpi import mpi
        from . import multinode
        if args.link_rate is not None:
            try:
                multinode.parse_rate(args.link_rate)
            except ValueError as exc:
                return _fail(exc, root=_is_root(comm))
        return multinode.run(mpi().COMM_WORLD if comm is None else comm, args)
    return _run(args, opts, comm)


def _is_root(comm):
    if comm is None:
        from ..runtime.mpi import mpi
        comm = mpi().COMM_WORLD
    return comm.Get_rank() == 0


def _fail(exc, root=True):
    if root:
        print(f"error: {exc}", file=sys.stderr)
    return 2


def _plan_only(args, opts):
    from .cases import load_cases
    from .tables import STRATEGIES, Network, format_table, plan_only_table
    from .runner import select_cases

    if args.ranks is not None and args.ranks < 1:
        raise ShapeError(f"--ranks {args.ranks} must be a positive integer")
    if args.ranks_per_node is not None:
        net = _two_level(args)
    elif args.beta_across is not None:
        raise PlanError("--beta-across prices bytes across nodes: give --ranks-per-node")
    elif args.alpha is None and args.beta is None:
        from ..planning.profile import current
        net = current()                  # MPIREDIST_PROFILE, the calibrate file, or built-in
    else:
        net = Network(**{k: v for k, v in (("alpha", args.alpha), ("beta", args.beta))
                         if v is not None})
    cases = select_cases(opts.case_ids, load_cases())
    if cases is None:
        cases = load_cases()
    if opts.user is not None:
        cases = cases + [opts.user]
    strategies = [s for s in opts.strategies if s in STRATEGIES]
    rows = plan_only_table(args.ranks, strategies, cases, opts.scale, net,
                           per_node=args.ranks_per_node)
    where = f"{args.ranks} devices" if args.ranks else "each case's own mesh"
    if args.ranks_per_node is not None:
        across = sorted({b for _, _, b in net.beta_across})
        where += (f", nodes of {args.ranks_per_node} (across nodes "
                  f"{'/'.join(f'{b:g}' for b in across)} B/s per rank)")
    beta = getattr(net, "beta", None) if isinstance(net, Network) else None
    figures = (f"alpha {net.alpha:g} s/message, beta {beta:g} B/s per rank (bench/model.py)"
               if beta is not None else f"profile: {net.source}, alpha {net.alpha:g} s/message")
    print(f"plan only, {where}, scale {opts.scale}: {figures}; no MPI"
          + "".join(f"; {s} has no model" for s in opts.strategies if s not in STRATEGIES))
    print(format_table(rows))
    if args.json:
        import json
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"ranks": args.ranks, "scale": opts.scale, "alpha": net.alpha,
                       "beta": beta, "rows": [r.to_dict() for r in rows]}, f, indent=1)
    return 0


def _two_level(args):
    """The profile of ``--ranks-per-node``: the current one (or ``--alpha``/``--beta``)
    with across-node rates (``--beta-across``, the profile's, or a tenth of beta)."""
    import dataclasses

    from ..planning.profile import OPS, current

    if args.ranks_per_node < 1:
        raise ShapeError(f"--ranks-per-node {args.ranks_per_node} must be a positive integer")
    for name in ("alpha", "beta", "beta_across"):
        value = getattr(args, name)
        if value is not None and not (value > 0 or (name == "alpha" and value == 0)):
            raise PlanError(f"--{name.replace('_', '-')} {value} must be a positive number")
    net = current()
    if args.alpha is not None or args.beta is not None:
        net = dataclasses.replace(net, alpha=net.alpha if args.alpha is None else args.alpha,
                                  default_beta=net.default_beta if args.beta is None
                                  else args.beta, beta=() if args.beta is not None
                                  else net.beta)
    if args.beta_across is not None:
        across = tuple((op, 1, args.beta_across) for op in OPS)
    else:
        across = net.beta_across or tuple((op, 1, net.default_beta / 10) for op in OPS)
    return dataclasses.replace(net, beta_across=across)


def _run(args, opts, comm):
    from ..runtime.mpi import mpi
    from . import report
    from . import runner

    comm = mpi().COMM_WORLD if comm is None else comm
    root = comm.Get_rank() == 0
    error = None
    try:
        entries = runner.suite(comm.Get_size(), opts.case_ids, opts.scale, opts.user)
        if args.plot and root:
            report.require_matplotlib()
    except (MpiredistError, KeyError, ImportError) as exc:
        error = exc
    errors = comm.allgather(None if error is None else str(error))
    if any(errors):
        if root:
            print(f"error: {next(e for e in errors if e)}", file=sys.stderr)
        return 2
    if root:
        _note_plain_text()
    from .measure import rss_environment_missing
    missing = rss_environment_missing()
    if root and missing:
        print(f"note: the RSS/max column includes the allocator's history; start with "
              f"{' '.join(missing)} to see only what each run allocates", file=sys.stderr)
    total = runner.count_runs(entries, opts.strategies, opts.repeats)
    progress = report.Progress(total, enabled=root and not args.no_progress)
    t0 = time.perf_counter()
    records, skipped = runner.run_suite(entries, opts.strategies, opts.repeats, opts.dtype,
                                        comm, args.seed, progress)
    wall = time.perf_counter() - t0
    progress.close()
    report.add_ratios(records)
    summary = report.summarize(records)
    found = report.findings(records)
    if root:
        mapped = any(not e.native for e in entries)
        print(f"mpiredist bench: {comm.Get_size()} ranks, scale {opts.scale}, "
              f"{opts.repeats} repeats, dtype {opts.dtype}; time = max over ranks"
              + (f"; * = mesh mapped onto {comm.Get_size()} devices" if mapped else ""))
        _print_results(records, summary, skipped, found, args.table)
        print(f"wall time {wall:.1f} s for {len(entries)} cases")
        meta = {"ranks": comm.Get_size(), "scale": opts.scale, "repeats": opts.repeats,
                "dtype": opts.dtype, "seed": args.seed, "strategies": opts.strategies,
                "wall_s": wall}
        if args.json:
            report.write_json(args.json, records, summary, meta, skipped, found)
        if args.plot:
            report.plot(records, args.plot)
    comm.Barrier()                                # files exist on return, for every rank
    return 0 if summary["all_correct"] else 1


def _print_results(records, summary, skipped, found, table):
    """The per-case lines, the full table if asked, the summary, skips and findings."""
    from . import report

    if table:
        print(report.format_table(records))
        print()
    print("per case, ours (collectives): median time, x raw MPI, x XLA's plan, bytes "
          "sent over the lower bound, E and the limit over max(S,T)"
          + ("" if table else "; every strategy: --table or --json"))
    print(report.format_cases(records))
    print(report.format_summary(summary))
    for line in _skipped_lines(skipped):
        print(line)
    for line in found:
        print(line)


def _from_json(args):
    """``--from-json FILE``: print (and ``--plot``) the results of an earlier run."""
    from . import report

    try:
        doc = report.read_json(args.from_json)
        if args.plot:
            report.require_matplotlib()
    except (OSError, ValueError, ImportError) as exc:
        return _fail(exc)
    records = doc["records"]
    print(f"mpiredist bench results from {args.from_json}: {doc.get('ranks', '?')} ranks, "
          f"scale {doc.get('scale', '?')}, {doc.get('repeats', '?')} repeats, "
          f"dtype {doc.get('dtype', '?')}; time = max over ranks")
    _print_results(records, doc.get("summary") or report.summarize(records),
                   doc.get("skipped", []), doc.get("findings", []), args.table)
    if args.plot:
        report.plot(records, args.plot)
    return 0 if all(r.get("correct") for r in records) else 1


def _note_plain_text():
    """Say on stderr, in one line, that tables and progress are plain text."""
    from . import report

    if report.display_libraries() is None:
        print(report.MISSING_NOTE, file=sys.stderr)


def _skipped_lines(skipped):
    by = {}
    for s in skipped:
        by.setdefault((s["strategy"], s["reason"]), []).append(s)
    return [f"skipped {strategy} on {len(items)} case(s) "
            f"({','.join(i['label'] for i in items)}): {items[0]['reason']}"
            for (strategy, _), items in by.items()]


if __name__ == "__main__":
    sys.exit(abort_on_exception(main))   # a failure on any rank ends the job
