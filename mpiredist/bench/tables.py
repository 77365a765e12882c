"""The plan-only table: every case scaled to N devices, planned and modelled.

The time model itself (alpha-beta, its table of rounds per collective) is
:mod:`mpiredist.planning.model`; its names are re-exported here.

Scaling a case to N ranks (:func:`grow_mesh`, :func:`grow_shape`): N must
be the case's mesh size times a power of two, ``2**k``.  Every mesh axis is
multiplied by ``2**(k // n_axes)`` and the last ``k % n_axes`` axes (the
minor, fastest-varying ones) by one more 2, so the product is exactly N and
each layout keeps its meaning.  The global shape grows by the same factor
``2**k`` (each dim by ``2**(k // ndim)``, the leading dims one more 2): weak
scaling, where a layout sharded over every axis keeps the local block size
of the original case; layouts that replicate over some axes grow with those
axes.  ``keep_shape=True`` keeps the shape instead (strong scaling).  For
N smaller than the mesh, the largest axes are halved (the minor one first
on ties) and the shape is kept.

Examples
--------
>>> from mpiredist.bench.cases import get_case
>>> rows = plan_only_table(4096, ["collectives"], [get_case("c05")])
>>> rows[0].mesh, rows[0].shape
('x=32,y=128', (131072, 65536))
"""

import math
from dataclasses import dataclass, replace

from ..core.errors import MeshError, MpiredistError, PlanError
from ..core.mesh import Mesh
from ..core.topology import Topology
from ..planning import planner
from ..planning.model import (ALPHA, BETA, MEMORY_BANDWIDTH, Network, Prediction,
                              exchange_peers, predict, recv_peers, step_rounds)
from .cases import load_cases, scaled

__all__ = ["Row", "grow_mesh", "grow_shape", "plan_only_table", "format_table", "STRATEGIES",
           # re-exported from mpiredist.planning.model
           "Network", "Prediction", "predict", "step_rounds", "exchange_peers", "recv_peers",
           "ALPHA", "BETA", "MEMORY_BANDWIDTH"]

STRATEGIES = planner.STRATEGIES + ("xla",)

def _log2_ratio(ranks, size, what):
    big, small = max(ranks, size), min(ranks, size)
    ratio, rem = divmod(big, small)
    if rem or ratio & (ratio - 1):
        raise MeshError(f"{ranks} ranks is not the {size} devices of {what} times or "
                        "divided by a power of two")
    return (ratio.bit_length() - 1) * (1 if ranks >= size else -1)


def grow_mesh(mesh, ranks):
    """Mesh ``mesh`` (dict name -> size) scaled to ``ranks`` devices (module doc)."""
    names, sizes = list(mesh), list(mesh.values())
    k = _log2_ratio(ranks, math.prod(sizes), f"mesh {Mesh(mesh)}")
    n = len(sizes)
    if k >= 0:
        sizes = [s << (k // n + (i >= n - k % n)) for i, s in enumerate(sizes)]
    for _ in range(-k):
        even = [i for i, s in enumerate(sizes) if s % 2 == 0]
        if not even:
            raise MeshError(f"mesh {Mesh(mesh)} cannot shrink to {ranks} ranks")
        i = max(even, key=lambda i: (sizes[i], i))
        sizes[i] //= 2
    return dict(zip(names, sizes))


def grow_shape(shape, factor):
    """``shape`` with ``factor`` (a power of two, >= 1) more elements (module doc)."""
    if factor <= 1:
        return tuple(shape)
    k, n = factor.bit_length() - 1, len(shape)
    if not n:
        return ()
    return tuple(s << (k // n + (i < k % n)) for i, s in enumerate(shape))


@dataclass(frozen=True)
class Row:
    """One line of the plan-only table; ``seconds`` is None if not planned."""

    case: str
    ranks: int
    mesh: str
    shape: tuple
    strategy: str
    bytes_sent_per_rank: int = None
    lower_bound_bytes_per_rank: int = None
    peak_over_max: float = None
    rounds: int = None
    seconds: float = None
    ops: tuple = ()
    note: str = ""
    inter_node_bytes_per_rank: int = None               # with ranks per node
    inter_node_lower_bound_bytes_per_rank: int = None

    def to_dict(self):
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["shape"], out["ops"] = list(self.shape), list(self.ops)
        return out


def _make_plan(case, shared, strategy, topology=None, profile=None):
    """``(plan, None)`` or ``(None, why not)`` for one row of the table."""
    if strategy == "xla":
        if not shared or case.mesh != shared.mesh:
            return None, "XLA's plan exists only for the shared cases on their own mesh"
        from .xla import xla_plan
        return xla_plan(case.id, case.shape, topology=topology), None
    return planner.plan(case.shape, "float32", case.mesh, case.src, case.dst, strategy,
                        profile=profile, topology=topology), None


def _row(case, shared, strategy, network, topology=None):
    row = Row(case.id, math.prod(case.mesh.values()), str(Mesh(case.mesh)), case.shape,
              strategy)
    profile = network if hasattr(network, "step_seconds") else None
    try:
        p, why = _make_plan(case, shared, strategy, topology, profile)
    except MpiredistError as exc:
        p, why = None, f"not planned: {exc}"
    if p is None:
        return replace(row, note=why)
    big = max(p.src_local_bytes, p.dst_local_bytes)
    pred = predict(p, network)
    return replace(row, bytes_sent_per_rank=p.bytes_sent_per_rank,
                   lower_bound_bytes_per_rank=p.lower_bound_bytes_per_rank,
                   peak_over_max=p.peak_local_bytes / big if big else 1.0,
                   rounds=pred.rounds, seconds=pred.seconds,
                   ops=tuple(s.op for s in p.steps), note=p.note,
                   inter_node_bytes_per_rank=p.inter_node_bytes_per_rank,
                   inter_node_lower_bound_bytes_per_rank=p.inter_node_lower_bound_bytes_per_rank)


def plan_only_table(ranks=None, strategies=STRATEGIES, cases=None, scale=1,
                    network=None, keep_shape=False, per_node=None):
    """Plan every case on ``ranks`` devices and model each plan; no MPI.

    Parameters
    ----------
    ranks : int, optional
        Devices; each case's mesh and shape are scaled to it (module doc).
        None keeps every case's own mesh.
    strategies : sequence of str
        Of ``STRATEGIES``; ``"xla"`` only where the mesh is the case's own.
    cases : list of Case, optional
        Default: the shared cases.  A user case is a ``Case`` too.
    scale : int
        Divide the case's lengths by this first (:func:`cases.scaled`).
    network : Network, optional
    keep_shape : bool
        Keep the (scaled) shape instead of growing it with the mesh.
    per_node : int, optional
        Devices per node: each case is planned for
        ``Topology.uniform(N // per_node, per_node)`` (device d on node
        d // per_node; MeshError unless it divides N), its rows get the
        across-node bytes, and a profile with across-node rates (``network``)
        both chooses the plans and prices them (the two-level model).

    Returns
    -------
    list of Row
    """
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise PlanError(f"strategies {unknown} are not among {STRATEGIES}")
    network = network or Network()
    shared_cases = load_cases()
    rows = []
    for original in shared_cases if cases is None else cases:
        shared = original if original in shared_cases else None
        case = scaled(original, scale) if scale != 1 else original
        size = math.prod(case.mesh.values())
        n = size if ranks is None else ranks
        mesh = grow_mesh(case.mesh, n)
        shape = case.shape if keep_shape or n <= size else grow_shape(case.shape, n // size)
        grown = replace(case, mesh=mesh, shape=shape)
        topology = None
        if per_node is not None:
            if per_node < 1 or n % per_node:
                raise MeshError(f"{per_node} devices per node do not divide the {n} devices "
                                f"of {case.id}")
            topology = Topology.uniform(n // per_node, per_node)
        rows.extend(_row(grown, shared, strategy, network, topology) for strategy in strategies)
    return rows


def format_table(rows):
    """The rows as an aligned text table (sizes in MiB, time in ms); with
    across-node figures (``per_node``), two more columns: the plan's bytes
    across nodes per rank and their lower bound."""
    nodes = any(r.inter_node_bytes_per_rank is not None for r in rows)
    head = ("case", "ranks", "mesh", "strategy", "sent MiB", "bound MiB") + (
        ("across MiB", "across bound") if nodes else ()) + (
        "peak/max", "rounds", "model ms", "steps")
    mib = (lambda v: "-" if v is None else f"{v / 2**20:.2f}")
    lines = [head]
    for r in rows:
        if r.seconds is None:
            lines.append((r.case, str(r.ranks), r.mesh, r.strategy)
                         + ("-",) * (len(head) - 5) + (r.note,))
            continue
        lines.append((r.case, str(r.ranks), r.mesh, r.strategy,
                      mib(r.bytes_sent_per_rank), mib(r.lower_bound_bytes_per_rank))
                     + ((mib(r.inter_node_bytes_per_rank),
                         mib(r.inter_node_lower_bound_bytes_per_rank)) if nodes else ())
                     + (f"{r.peak_over_max:.2f}", str(r.rounds), f"{r.seconds * 1e3:.3f}",
                        ",".join(r.ops) or "-"))
    widths = [max(len(line[c]) for line in lines) for c in range(len(head) - 1)]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths + [0])).rstrip()
                     for line in lines)
