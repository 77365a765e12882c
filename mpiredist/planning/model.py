"""An alpha-beta model of a plan's run time.

Each step costs ``rounds * alpha + bytes / beta``: ``bytes`` is the step's
``bytes_sent_per_rank`` (docs/semantics.md, Plans), ``rounds`` the messages a
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

Examples
--------
>>> import mpiredist as mr
>>> p = mr.plan((4096, 4096), "float32", {"x": 8}, "[{x},{}]", "[{},{x}]")
>>> pred = predict(p)
>>> pred.rounds, [op for op, _, _ in pred.steps]
(7, ['all_to_all'])
"""

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..core.blocks import chunk, slab_interval, slabs
from ..core.subaxes import group_size, mesh_sub_axes
from .pieces import Holders, layout_sources, layout_targets, send_pieces

__all__ = ["Network", "Prediction", "predict", "step_rounds", "exchange_peers",
           "recv_peers", "most_recv_peers", "ALPHA", "BETA", "MEMORY_BANDWIDTH"]

ALPHA = 2e-6              # seconds per message (MPI latency over InfiniBand)
BETA = 25e9               # bytes per second per rank (200 Gb/s link)
MEMORY_BANDWIDTH = 100e9  # bytes per second for a local copy

# Up to this many ranks, exchange send peers are counted from the piece model
# (a Python loop per rank); receive peers are counted for any mesh.
EXACT_SEND_PEERS_RANKS = 64


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


def _peer_counts(shape, before, after, space, combos):
    """Per digit combination: other ranks an exchange ``before -> after`` receives from.

    A rank gets each source block that meets its target block, except its
    own, from one holder (:mod:`mpiredist.planning.pieces`).
    """
    count, held = 1, True
    for n, b, a in zip(shape, before.dims, after.dims):
        k = group_size(b)
        c = max(1, chunk(n, k))
        s0, s1 = slab_interval(n, b, space, combos)
        d0, d1 = slab_interval(n, a, space, combos)
        count = count * np.where(d1 > d0, np.minimum(k, -(-d1 // c)) - d0 // c, 0)
        held = held & (np.minimum(s1, d1) > np.maximum(s0, d0))
    return np.broadcast_to(count - held, combos.shape)


def recv_peers(plan, step):
    """Per rank: how many other ranks an ``exchange`` step receives from.

    An int array of ``plan.mesh.size`` entries, for inspection and tests;
    :func:`most_recv_peers` finds the largest without one.
    """
    space = mesh_sub_axes(plan.mesh.axes)       # combination number == rank
    return np.concatenate([_peer_counts(plan.step_shape, step.before, step.after, space, q)
                           for q in slabs(space)])


@lru_cache(maxsize=1024)
def most_recv_peers(shape, before, after, mesh_axes):
    """The most other ranks that one rank receives from in an exchange.

    Over the digits of the sub-axes either layout uses, a slab at a time.
    """
    space = mesh_sub_axes(mesh_axes, before.used() | after.used())
    return max(int(np.max(_peer_counts(shape, before, after, space, q), initial=0))
               for q in slabs(space))


def exchange_peers(plan, step):
    """Distinct peers of the busiest rank in an ``exchange`` step.

    The most receive peers of any rank (:func:`most_recv_peers`); up to
    ``EXACT_SEND_PEERS_RANKS`` ranks the send peers are counted from the
    piece model too (a loop per rank), and the larger number is taken.
    """
    mesh = plan.mesh
    best = most_recv_peers(plan.step_shape, step.before, step.after, mesh.axes)
    if mesh.size <= EXACT_SEND_PEERS_RANKS:
        sources = layout_sources(plan.step_shape, mesh, step.before, mesh.size)
        targets = layout_targets(plan.step_shape, mesh, step.after, mesh.size, True)
        holders = Holders(sources)
        for r in range(mesh.size):
            sends = send_pieces(r, sources, targets, holders)
            best = max(best, len({x.peer for x in sends} - {r}))
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
    """Modelled seconds of ``plan`` on ``network`` (default :class:`Network`).

    ``network`` may also be a :class:`~mpiredist.planning.profile.Profile`
    (a calibrated machine): its per-op bandwidths and packing rate then price
    each step (:meth:`~mpiredist.planning.profile.Profile.step_seconds`),
    and a plan with a topology has its across-node bytes priced at the
    profile's across-node rates (``beta_across``) where it has them.
    """
    network = network or Network()
    out, total, rounds = [], 0.0, 0
    for step in plan.steps:
        n = step_rounds(plan, step)
        if hasattr(network, "step_seconds"):
            local = math.prod(step.local_shape_after) * plan.itemsize
            t = network.step_seconds(step.op, step.bytes_sent_per_rank, n,
                                     step.group_size, local,
                                     step.inter_node_bytes_per_rank or 0)
        elif step.op == "slice":
            t = math.prod(step.local_shape_after) * plan.itemsize / network.memory_bandwidth
        else:
            t = n * network.alpha + step.bytes_sent_per_rank / network.beta
        out.append((step.op, n, t))
        total += t
        rounds += n
    return Prediction(total, rounds, tuple(out))
