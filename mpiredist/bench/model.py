"""An alpha-beta model of a plan's run time, and the plan-only table.

Each step costs ``rounds * alpha + bytes / beta``: ``bytes`` is the step's
``bytes_sent_per_rank`` (DESIGN.md section 3), ``rounds`` the messages a
rank sends one after another under the standard bandwidth-optimal
algorithms, the same ones whose byte counts the plans use:

============== =========================================================
op             rounds on a sub-communicator of G ranks
============== =========================================================
all_gather     G - 1 (ring)
reduce_scatter G - 1 (ring)
all_to_all     G - 1 (pairwise exchange)
all_reduce     2 (G - 1) (ring: reduce-scatter then all-gather)
permute        1 (0 if no rank sends)
exchange       distinct peers of the busiest rank (:func:`exchange_peers`)
slice          0; costs a local copy of the result at memory bandwidth
============== =========================================================

Ring rounds rather than recursive doubling (log2 G) are used throughout
because they are what sends the bytes counted; at large G the alpha term
then dominates small messages, as it does for ring collectives.

Defaults describe a current cluster: ``alpha`` 2 us per message (MPI over
InfiniBand), ``beta`` 25 GB/s per rank (a 200 Gb/s HDR/NDR-class link),
local copies at 100 GB/s.

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

import numpy as np

from ..planning import planner
from ..core.blocks import all_blocks, chunk
from ..core.errors import MeshError, MpiredistError, PlanError
from ..core.mesh import Mesh
from ..planning.routing import exchange_sends
from ..core.subaxes import group_size, rank_digits
from .cases import load_cases, scaled

__all__ = ["Network", "Prediction", "Row", "predict", "step_rounds", "exchange_peers",
           "recv_peers", "grow_mesh", "grow_shape", "plan_only_table", "format_table",
           "STRATEGIES", "ALPHA", "BETA", "MEMORY_BANDWIDTH"]

ALPHA = 2e-6              # seconds per message (MPI latency over InfiniBand)
BETA = 25e9               # bytes per second per rank (200 Gb/s link)
MEMORY_BANDWIDTH = 100e9  # bytes per second for a local copy

STRATEGIES = planner.STRATEGIES + ("xla",)

# Up to this many ranks, exchange send peers are counted from the routing
# (a Python loop per rank); receive peers are counted for any mesh.
EXACT_SEND_PEERS_RANKS = 64
# Above this many ranks, ``collectives`` plans of uneven shapes are not built:
# the planner's exact byte count for uneven all-to-alls costs O(G * P).
UNEVEN_COLLECTIVES_RANKS = 4096


@dataclass(frozen=True)
class Network:
    """Alpha-beta parameters: seconds per message, bytes per second."""

    alpha: float = ALPHA
    beta: float = BETA
    memory_bandwidth: float = MEMORY_BANDWIDTH

    def __post_init__(self):
        for name in ("alpha", "beta", "memory_bandwidth"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value != value or value < 0 \
                    or (name != "alpha" and value == 0):
                raise ValueError(f"network {name} {value!r} must be a positive number"
                                 + (" (or 0)" if name == "alpha" else ""))


@dataclass(frozen=True)
class Prediction:
    """Modelled time of a plan: total, message rounds, and per step."""

    seconds: float
    rounds: int
    steps: tuple  # ((op, rounds, seconds), ...)


def recv_peers(plan, step):
    """Per rank: how many other ranks an ``exchange`` step receives from.

    Exact and vectorised: a rank gets each source block that meets its
    target block, except its own, from one holder (:mod:`mpiredist.planning.routing`).
    """
    mesh, shape = plan.mesh, plan.global_shape
    src = all_blocks(shape, step.before, mesh.axes)
    dst = all_blocks(shape, step.after, mesh.axes)
    count = np.ones(mesh.size, dtype=np.int64)
    held = np.ones(mesh.size, dtype=bool)
    for n, group, (s0, s1), (d0, d1) in zip(shape, step.before.dims, src, dst):
        k = group_size(group)
        c = max(1, chunk(n, k))
        count *= np.where(d1 > d0, np.minimum(k, -(-d1 // c)) - d0 // c, 0)
        held &= np.minimum(s1, d1) > np.maximum(s0, d0)
    return count - held


def exchange_peers(plan, step):
    """Distinct peers of the busiest rank in an ``exchange`` step.

    The most receive peers of any rank (:func:`recv_peers`); up to
    ``EXACT_SEND_PEERS_RANKS`` ranks the send peers are counted from the
    routing too (a loop per rank), and the larger number is taken.
    """
    mesh = plan.mesh
    best = int(recv_peers(plan, step).max(initial=0))
    if mesh.size <= EXACT_SEND_PEERS_RANKS:
        for r in range(mesh.size):
            sends = exchange_sends(mesh, plan.global_shape, step.before, step.after,
                                   rank_digits(mesh, r))
            best = max(best, len({q for q, _ in sends} - {r}))
    return min(best, mesh.size - 1)


def step_rounds(plan, step):
    """Messages a rank sends in ``step``, one after another (module table)."""
    if step.op == "slice" or step.bytes_sent_per_rank == 0:
        return 0
    g = step.group_size
    if step.op in ("all_gather", "reduce_scatter", "all_to_all"):
        return g - 1
    if step.op == "all_reduce":
        return 2 * (g - 1)
    if step.op == "permute":
        return 1
    if step.op == "exchange":
        return max(1, exchange_peers(plan, step))
    raise ValueError(f"no round count for step op {step.op!r}")


def predict(plan, network=None):
    """Modelled seconds of ``plan`` on ``network`` (default :class:`Network`)."""
    network = network or Network()
    out, total, rounds = [], 0.0, 0
    for step in plan.steps:
        n = step_rounds(plan, step)
        if step.op == "slice":
            t = math.prod(step.local_shape_after) * plan.itemsize / network.memory_bandwidth
        else:
            t = n * network.alpha + step.bytes_sent_per_rank / network.beta
        out.append((step.op, n, t))
        total += t
        rounds += n
    return Prediction(total, rounds, tuple(out))


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

    def to_dict(self):
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["shape"], out["ops"] = list(self.shape), list(self.ops)
        return out


def _uneven(case):
    return any(n % math.prod(case.mesh[a] for a in axes)
               for lay in (case.src, case.dst) for n, axes in zip(case.shape, lay.dims))


def _make_plan(case, shared, strategy):
    """``(plan, None)`` or ``(None, why not)`` for one row of the table."""
    ranks = math.prod(case.mesh.values())
    if strategy == "xla":
        if not shared or case.mesh != shared.mesh:
            return None, "XLA's plan exists only for the shared cases on their own mesh"
        from .xla import xla_plan
        return xla_plan(case.id, case.shape), None
    if strategy == "collectives" and ranks > UNEVEN_COLLECTIVES_RANKS and _uneven(case):
        return None, (f"not planned: uneven lengths on {ranks} ranks (the planner's "
                      "uneven all-to-all byte count is O(G*P))")
    return planner.plan(case.shape, "float32", case.mesh, case.src, case.dst, strategy), None


def _row(case, shared, strategy, network):
    row = Row(case.id, math.prod(case.mesh.values()), str(Mesh(case.mesh)), case.shape,
              strategy)
    try:
        p, why = _make_plan(case, shared, strategy)
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
                   ops=tuple(s.op for s in p.steps), note=p.note)


def plan_only_table(ranks=None, strategies=STRATEGIES, cases=None, scale=1,
                    network=None, keep_shape=False):
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
        rows.extend(_row(grown, shared, strategy, network) for strategy in strategies)
    return rows


def format_table(rows):
    """The rows as an aligned text table (sizes in MiB, time in ms)."""
    head = ("case", "ranks", "mesh", "strategy", "sent MiB", "bound MiB", "peak/max",
            "rounds", "model ms", "steps")
    lines = [head]
    for r in rows:
        if r.seconds is None:
            lines.append((r.case, str(r.ranks), r.mesh, r.strategy) + ("-",) * 5
                         + (r.note,))
            continue
        lines.append((r.case, str(r.ranks), r.mesh, r.strategy,
                      f"{r.bytes_sent_per_rank / 2**20:.2f}",
                      f"{r.lower_bound_bytes_per_rank / 2**20:.2f}",
                      f"{r.peak_over_max:.2f}", str(r.rounds), f"{r.seconds * 1e3:.3f}",
                      ",".join(r.ops) or "-"))
    widths = [max(len(line[c]) for line in lines) for c in range(len(head) - 1)]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths + [0])).rstrip()
                     for line in lines)
