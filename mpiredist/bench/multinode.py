"""The benchmark across nodes: ``mpirun -n P python -m mpiredist.bench --nodes``.

Run on two or more nodes of equal size (``scripts/cluster.sh up 2 --rate
1gbit`` makes two on one machine).  The nodes are the communicator's
(:func:`mpiredist.runtime.groups.topology`).  Cases:

* every shared case with as many devices as ranks, on two meshes: one whose
  *major* digits cross nodes (device ``d`` on node ``d // R``, R ranks per
  node: ``Mesh.hybrid`` with the leading axes across) and one whose *minor*
  digits do (device ``d`` on node ``d % N``);
* train to serve between nodes: ``t2s`` (node 0 holds ``[{tp}, {}]`` over
  its R ranks, the last node wants ``[{}, {tp}]``: every byte crosses) and
  ``fsdp2s`` (every rank holds a shard ``[{dp,tp}, {}]``, dp across nodes;
  the last node wants ``[{tp}, {}]``).

Strategies: ``mpiredist`` (the planner's choice under the current profile,
with the mesh's nodes: a profile that ``calibrate`` measured on the nodes
prices across-node bytes at their own rates), ``bytes`` (the planner's choice
under the same profile without across-node rates, run only where it
differs), ``xla`` (XLA's plan of the shared case on the same mesh) and
``raw`` (one bare MPI collective of mpiredist's bytes per rank on its
dominant step's group, :func:`mpiredist.bench.runner.make_raw`).

Figures per case: the bytes each plan moves across nodes per rank (the most
any rank sends or receives, :mod:`mpiredist.planning.nodes`) and the lower
bound; the **link limit**, the bytes that must enter the busiest node over
the link rate (``--link-rate``, e.g. ``1gbit``; else the rate measured
here by a ring of sends between nodes, every rank at once); median times
(slowest rank) over ``--repeats`` rounds in shuffled order, each run checked
against the global array; and the bytes the nodes' network interfaces sent
per run (``/proc/self/net/dev``, every interface but ``lo``, read by
the first rank of each node around each timed run: what crossed the links,
headers included).
"""

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.blocks import box_size, overlap
from ..core.errors import MeshError
from ..core.layout import Layout
from ..core.mesh import Mesh

__all__ = ["parse_rate", "node_order", "cases", "run", "format_table", "summarize",
           "NodeCase"]

MIB = 2 ** 20
TARGET_LINK, TARGET_XLA, FLOOR_XLA = 1.3, 1.3, 0.95     # issue 21's targets


def parse_rate(text):
    """Bits per second of ``text`` as ``tc`` writes rates: ``1gbit``, ``500mbit``,
    ``100kbit``, ``8bit`` or a number (bits/s)."""
    t = str(text).strip().lower()
    for unit, factor in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if t.endswith(unit):
            t, scale = t[: -len(unit)], factor
            break
    else:
        scale = 1.0
    try:
        value = float(t) * scale
    except ValueError:
        raise ValueError(f"link rate {text!r}: expected e.g. 1gbit, 500mbit or bits/s") \
            from None
    if not value > 0:
        raise ValueError(f"link rate {text!r} must be positive")
    return value


def node_order(topology, orientation):
    """The rank of each device (device order) on ``topology``'s ranks: ``major``
    puts device d on node d // R (the major digits cross nodes), ``minor`` on
    node d % N (the minor digits do)."""
    per, count = topology.per_node, topology.count
    if per is None:
        raise MeshError(f"{topology!r}: the nodes have different numbers of ranks")
    nodes = topology.array().tolist()
    by_node = [[r for r, n in enumerate(nodes) if n == k] for k in range(count)]
    size = per * count
    if orientation == "major":
        return [by_node[d // per][d % per] for d in range(size)]
    return [by_node[d % count][d // count] for d in range(size)]


@dataclass(frozen=True)
class NodeCase:
    """One case of the benchmark: a shared case on one orientation, or a move
    between meshes (``dst_ranks``)."""

    label: str
    shape: tuple
    axes: tuple                 # mesh axes
    ranks: tuple                # rank of each device
    src: Layout
    dst: Layout
    case_id: str = None         # the shared case, for XLA's plan
    dst_axes: tuple = None      # between meshes: the target mesh
    dst_ranks: tuple = None
    src_ranks_only: bool = False


def cases(topology, scale, case_ids=None):
    """The benchmark's cases on ``topology`` (the module doc), lengths // ``scale``."""
    from .cases import load_cases, scaled

    size = topology.size
    out = []
    for c in load_cases():
        if math.prod(c.mesh.values()) != size:
            continue
        if case_ids is not None and c.id not in case_ids and c.short_id not in case_ids:
            continue
        c = scaled(c, scale) if scale != 1 else c
        for orientation in ("major", "minor"):
            out.append(NodeCase(f"{c.short_id} {orientation}", tuple(c.shape),
                                tuple(c.mesh.items()), tuple(node_order(topology, orientation)),
                                c.src, c.dst, c.id))
    if case_ids is not None and not {"t2s", "fsdp2s"} & set(case_ids):
        return out
    per, count = topology.per_node, topology.count
    first, last = node_order(topology, "major")[:per], node_order(topology, "major")[-per:]
    n = max(per * 8, 4096 // scale)
    out.append(NodeCase("t2s", (n, n), (("tp", per),), tuple(first), Layout.parse("[{tp},{}]"),
                        Layout.parse("[{},{tp}]"), dst_axes=(("tp", per),),
                        dst_ranks=tuple(last)))
    out.append(NodeCase("fsdp2s", (n, n), (("dp", count), ("tp", per)),
                        tuple(node_order(topology, "major")), Layout.parse("[{dp,tp},{}]"),
                        Layout.parse("[{tp},{}]"), dst_axes=(("tp", per),),
                        dst_ranks=tuple(last)))
    return out


# ----------------------------------------------------------------- counters

def _tx_bytes():
    """Bytes sent by the interfaces (but ``lo``) of this process's network
    namespace: ``/proc/self/net/dev``, whose table is the reader's namespace
    (``/sys/class/net`` is the namespace that mounted sysfs: the machine's,
    on cluster.sh's nodes)."""
    total = 0
    try:
        lines = Path("/proc/self/net/dev").read_text().splitlines()[2:]
    except OSError:
        return 0
    for line in lines:
        name, _, fields = line.partition(":")
        if name.strip() != "lo" and len(fields.split()) >= 9:
            total += int(fields.split()[8])         # transmit bytes
    return total


class _Counter:
    """The first rank of each node reads its node's counters (the others read 0)."""

    def __init__(self, comm, topology):
        nodes = topology.array().tolist()
        self.leader = nodes.index(nodes[comm.Get_rank()]) == comm.Get_rank()

    def read(self):
        return _tx_bytes() if self.leader else 0


# ----------------------------------------------------------------- link rate

def measure_link(comm, topology, nbytes=8 << 20, repeats=3):
    """Bytes per second one node sends to the next: rank j of node n sends
    ``nbytes`` to rank j of node n+1 (and receives from n-1), all at once."""
    from ..runtime.timing import slowest_median

    if topology.count < 2:
        return None
    order = node_order(topology, "major")
    per, me = topology.per_node, comm.Get_rank()
    d = order.index(me)
    node, j = divmod(d, per)
    to = order[((node + 1) % topology.count) * per + j]
    frm = order[((node - 1) % topology.count) * per + j]
    send, recv = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    seconds = slowest_median(comm, lambda: comm.Sendrecv(send, to, recvbuf=recv, source=frm),
                             repeats, warmup=True)
    return per * nbytes / seconds


# ----------------------------------------------------------------- one case

def _lacking(shape, itemsize, src_boxes, dst_boxes, nodes):
    """Bytes the busiest node must receive: its ranks' distinct target boxes less
    what its ranks' source boxes hold."""
    worst = 0
    for node in set(nodes):
        held = {b for r, b in enumerate(src_boxes) if b is not None and nodes[r] == node}
        want = {b for r, b in enumerate(dst_boxes) if b is not None and nodes[r] == node}
        need = 0
        for tb in want:
            need += box_size(tb) - sum(box_size(o) for o in (overlap(sb, tb) for sb in held)
                                       if o is not None)
        worst = max(worst, need)
    return worst * itemsize


def _mesh_strategies(comm, c, topology, dtype, block):
    """``{name: (run, plan)}`` of a case on one mesh."""
    import dataclasses

    from ..planning import planner
    from ..planning.profile import current
    from ..runtime.groups import mesh_groups
    from ..runtime.transfer import Transfer
    from .runner import make_raw
    from .xla import xla_plan

    nodes = topology.devices(c.ranks)
    ranks = None if list(c.ranks) == list(range(len(c.ranks))) else list(c.ranks)
    mesh = Mesh(dict(c.axes), comm, ranks, nodes)
    ours = Transfer(c.shape, dtype, mesh, c.src, c.dst)
    out = {"mpiredist": (lambda: ours.run(block), ours.plan)}
    blind = dataclasses.replace(current(), beta_across=())
    p = planner.plan(c.shape, dtype, mesh, c.src, c.dst, profile=blind)
    if p.steps != ours.plan.steps:
        t = Transfer.from_plan(p, mesh)
        out["bytes"] = (lambda: t.run(block), t.plan)
    try:
        x = xla_plan(c.case_id, c.shape, dtype, topology=nodes)
    except (KeyError, ValueError):
        x = None
    if x is not None:
        tx = Transfer.from_plan(x, mesh)
        out["xla"] = (lambda: tx.run(block), tx.plan)
    raw = make_raw(ours.plan, mesh_groups(mesh))
    out["raw"] = (lambda: raw.run(), None)
    return out, raw


def _global(c, dtype, seed):
    import zlib

    from .runner import global_array
    return global_array(c.shape, dtype, np.random.default_rng([seed, zlib.crc32(
        c.label.encode())]))


def run_case(comm, topology, c, dtype, repeats, seed=0):
    """Run case ``c`` (collective); its record (the same on every rank)."""
    from mpi4py import MPI

    from ..planning.pieces import layout_boxes
    from .runner import source_block, target_block

    me = comm.Get_rank()
    g = _global(c, dtype, seed)
    itemsize = np.dtype(dtype).itemsize
    src_mesh = Mesh(dict(c.axes))
    nodes = topology.array().tolist()
    raw = None
    if c.dst_ranks is None:
        device = list(c.ranks).index(me)
        block = source_block(g, src_mesh, c.src, device)
        expected = target_block(g, src_mesh, c.dst, device)
        runs, raw = _mesh_strategies(comm, c, topology, dtype, block)
        ours = runs["mpiredist"][1]
        limit_bytes = (ours.inter_node_lower_bound_bytes_per_rank or 0) * topology.per_node
    else:
        from ..runtime.transfer import Transfer
        smesh = Mesh(dict(c.axes), comm, list(c.ranks))
        dmesh = Mesh(dict(c.dst_axes), comm, list(c.dst_ranks))
        block = source_block(g, src_mesh, c.src, list(c.ranks).index(me)) \
            if me in c.ranks else None
        expected = target_block(g, Mesh(dict(c.dst_axes)), c.dst,
                                list(c.dst_ranks).index(me)) if me in c.dst_ranks else None
        t = Transfer(c.shape, dtype, smesh, c.src, c.dst, dst_mesh=dmesh)
        runs = {"mpiredist": (lambda: t.run(block), None)}
        size = comm.Get_size()
        limit_bytes = _lacking(c.shape, itemsize, layout_boxes(c.shape, smesh, c.src, size),
                               layout_boxes(c.shape, dmesh, c.dst, size), nodes)
    del g
    counter = _Counter(comm, topology)
    names = list(runs)
    correct = {}
    for n in names:                                     # warm-up, checked
        comm.Barrier()
        out = runs[n][0]()
        if n == "raw":
            correct[n] = raw.check()
        else:
            correct[n] = (out is None and expected is None) or (
                out is not None and expected is not None and out.shape == expected.shape
                and bool(np.array_equal(out, expected)))
        del out
    times = np.zeros((len(names), repeats))
    sent = np.zeros(len(names), dtype=np.int64)
    order = random.Random(c.label).sample
    for r in range(repeats):
        for i in order(range(len(names)), len(names)):
            comm.Barrier()
            before = counter.read()
            t0 = time.perf_counter()
            runs[names[i]][0]()
            times[i, r] = time.perf_counter() - t0
            comm.Barrier()
            sent[i] += counter.read() - before
    worst = np.empty_like(times)
    comm.Allreduce(times, worst, op=MPI.MAX)
    links = np.empty_like(sent)
    comm.Allreduce(sent, links, op=MPI.SUM)
    ok = comm.allreduce(int(all(correct.values())), op=MPI.MIN)
    record = {"case": c.label, "shape": list(c.shape), "correct": bool(ok),
              "limit_bytes": int(limit_bytes), "strategies": {}}
    for i, n in enumerate(names):
        plan = runs[n][1]
        record["strategies"][n] = {
            "median_s": float(np.median(worst[i])), "min_s": float(worst[i].min()),
            "link_bytes_per_run": int(links[i]) // repeats,
            "ops": None if plan is None else [s.op for s in plan.steps],
            "across_bytes_per_rank": None if plan is None else plan.inter_node_bytes_per_rank,
            "bytes_per_rank": None if plan is None else plan.bytes_sent_per_rank}
        if plan is not None and n == "mpiredist":
            record["node_axes"] = list(plan.mesh.with_topology(plan.topology).node_axes()) \
                if plan.topology is not None else []
            record["across_bound_per_rank"] = plan.inter_node_lower_bound_bytes_per_rank
    return record


# ----------------------------------------------------------------- the run

def run(comm, args, topology=None):
    """The ``--nodes`` benchmark (collective); exit status.  ``topology``: the
    nodes (default the communicator's own; tests make them up)."""
    import json

    from ..runtime.groups import topology as find
    from .runner import agree_names

    me = comm.Get_rank()
    topology = find(comm) if topology is None else topology
    if topology.count < 2 or topology.per_node is None:
        if me == 0:
            print(f"error: --nodes needs two or more nodes of as many ranks; this job has "
                  f"{topology}")
        return 2
    agree_names(comm, ["nodes"])                     # one profile on every rank, or MismatchError
    link = parse_rate(args.link_rate) / 8 if args.link_rate else None
    measured = measure_link(comm, topology)
    rate = link or measured
    scale = args.scale if args.scale is not None else 2
    repeats = args.repeats if args.repeats is not None else 5
    ids = None if args.cases is None else [t.strip() for t in args.cases.split(",") if t.strip()]
    todo = cases(topology, scale, ids)
    records = []
    t0 = time.perf_counter()
    for c in todo:
        rec = run_case(comm, topology, c, args.dtype, repeats, args.seed)
        rec["limit_s"] = rec["limit_bytes"] / rate if rate else None
        rec["measured_limit_s"] = rec["limit_bytes"] / measured if measured else None
        records.append(rec)
        if me == 0 and not args.no_progress:
            print(f"  {c.label}: done", flush=True)
    wall = time.perf_counter() - t0
    summary = summarize(records)
    if me == 0:
        from ..planning.profile import current
        prof = current()
        print(f"mpiredist bench --nodes: {comm.Get_size()} ranks on {topology}, scale "
              f"{scale}, {repeats} repeats, dtype {args.dtype}; link "
              + (f"{link * 8 / 1e9:g} Gbit/s given, " if link else "")
              + f"{measured * 8 / 1e9:.3g} Gbit/s measured (node to node, every rank at once); "
              f"profile {prof.source}{' with across-node rates' if prof.beta_across else ''}")
        print(format_table(records))
        for line in summary["lines"]:
            print(line)
        print(f"wall time {wall:.1f} s for {len(records)} cases")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"ranks": comm.Get_size(), "topology": str(topology),
                           "link_rate_bytes": link, "measured_link_bytes": measured,
                           "scale": scale, "repeats": repeats, "dtype": args.dtype,
                           "profile": prof.source, "records": records,
                           "summary": {k: v for k, v in summary.items() if k != "lines"}},
                          f, indent=1)
    comm.Barrier()
    return 0 if all(r["correct"] for r in records) else 1


def _ms(v):
    return "-" if v is None else f"{v * 1e3:.1f}"


def _mib(v):
    return "-" if v is None else f"{v / MIB:.2f}"


def format_table(records):
    """One line per case: across-node MiB per rank by plan and bound, link limit,
    medians, ratios, and the MiB the links carried per run."""
    head = ("case", "node axes", "mpiredist steps", "across/rank ours", "xla", "bytes",
            "bound", "link ms", "ours ms", "bytes ms", "xla ms", "raw ms", "ours/link",
            "xla/ours", "links MiB/run ours", "xla", "ok")
    rows = [head]
    for r in records:
        s = r["strategies"]
        get = (lambda name, key: s[name][key] if name in s else None)
        ours = s["mpiredist"]["median_s"]
        rows.append((
            r["case"], ",".join(r.get("node_axes", [])) or "-",
            ",".join(s["mpiredist"]["ops"] or []) or "exchange",
            _mib(get("mpiredist", "across_bytes_per_rank")), _mib(get("xla", "across_bytes_per_rank")),
            _mib(get("bytes", "across_bytes_per_rank")), _mib(r.get("across_bound_per_rank")),
            _ms(r["limit_s"]), _ms(ours), _ms(get("bytes", "median_s")), _ms(get("xla", "median_s")),
            _ms(get("raw", "median_s")),
            f"{ours / r['limit_s']:.2f}" if r["limit_s"] else "-",
            f"{get('xla', 'median_s') / ours:.2f}" if "xla" in s and ours else "-",
            _mib(get("mpiredist", "link_bytes_per_run")), _mib(get("xla", "link_bytes_per_run")),
            "yes" if r["correct"] else "NO"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip()
                     for row in rows)


def _geomean(values):
    return float(np.exp(np.mean(np.log(values)))) if values else None


def summarize(records):
    """The targets of issue 21 from the records: ``lines`` to print and figures."""
    link = [(r["case"], r["strategies"]["mpiredist"]["median_s"] / r["limit_s"])
            for r in records if r["limit_s"]]
    xla_more = [(r["case"], r["strategies"]["xla"]["median_s"]
                 / r["strategies"]["mpiredist"]["median_s"])
                for r in records if "xla" in r["strategies"]
                and (r["strategies"]["xla"]["across_bytes_per_rank"] or 0)
                > (r["strategies"]["mpiredist"]["across_bytes_per_rank"] or 0)]
    differ = [(r["case"], r["strategies"]["xla"]["median_s"]
               / r["strategies"]["mpiredist"]["median_s"])
              for r in records if "xla" in r["strategies"]
              and r["strategies"]["xla"]["ops"] != r["strategies"]["mpiredist"]["ops"]]
    blind = [(r["case"], r["strategies"]["bytes"]["median_s"]
              / r["strategies"]["mpiredist"]["median_s"])
             for r in records if "bytes" in r["strategies"]]
    achievable = [(r["case"], r["strategies"]["mpiredist"]["median_s"] / r["measured_limit_s"])
                  for r in records if r.get("measured_limit_s")]
    within = [c for c, v in link if v <= TARGET_LINK]
    lines = []
    if link:
        worst = max(link, key=lambda cv: cv[1])
        lines.append(f"link limit: {len(within)} of {len(link)} cases that must cross nodes "
                     f"within {TARGET_LINK}x (geomean {_geomean([v for _, v in link]):.2f}x, "
                     f"worst {worst[0]} {worst[1]:.2f}x)"
                     + ("" if len(within) == len(link) else "  MISSED: " + ", ".join(
                         f"{c} {v:.2f}x" for c, v in link if v > TARGET_LINK)))
    if achievable:
        ok = [c for c, v in achievable if v <= TARGET_LINK]
        lines.append(f"against the link rate measured here: {len(ok)} of {len(achievable)} "
                     f"within {TARGET_LINK}x (geomean {_geomean([v for _, v in achievable]):.2f}x); "
                     "over: " + (", ".join(f"{c} {v:.2f}x" for c, v in achievable
                                           if v > TARGET_LINK) or "none"))
    if xla_more:
        g = _geomean([v for _, v in xla_more])
        lines.append(f"xla moves more across nodes on {len(xla_more)} case(s): geomean "
                     f"{g:.2f}x faster than XLA's plan (target {TARGET_XLA}x"
                     f"{'' if g >= TARGET_XLA else ', MISSED'}): "
                     + ", ".join(f"{c} {v:.2f}" for c, v in xla_more))
    if differ:
        low = min(differ, key=lambda cv: cv[1])
        lines.append(f"plans differ from XLA's on {len(differ)} case(s): lowest xla/ours "
                     f"{low[0]} {low[1]:.2f} (floor {FLOOR_XLA}"
                     f"{'' if low[1] >= FLOOR_XLA else ', MISSED'})")
    if blind:
        lines.append(f"two-level choice differs from the bytes-priced one on {len(blind)} "
                     f"case(s): bytes/ours " + ", ".join(f"{c} {v:.2f}" for c, v in blind))
    else:
        lines.append("two-level choice: the same plan as the bytes-priced one on every case "
                     "(no profile with across-node rates, or no case where they differ)")
    return {"lines": lines, "link": link, "link_measured": achievable, "xla_more": xla_more,
            "xla_differ": differ, "bytes": blind}
