"""Plan a redistribution: validate, build candidate step sequences, pick one.

Strategies:

``collectives``
    The paper's normal form (:mod:`mpiredist.planning.normal_form`); among its
    candidates within the memory bound, the one with the least predicted
    time under the machine profile (:mod:`mpiredist.planning.profile`:
    ``python -m mpiredist calibrate``, or the built-in default), then the
    fewest bytes and rounds.  An ``exchange`` replaces the size-preserving
    phase where the collective form cannot express a case (uneven lengths
    whose shards do not nest) or where it is predicted faster; the plan's
    ``note`` says so.  Every plan of this strategy satisfies the memory bound.
``replicate``
    All-gather every sharded dim, then slice: XLA's fallback.
``direct``
    One exchange of exactly the bytes each rank lacks (after reducing
    partial sums with an all-reduce).
"""

import itertools
import math
import operator
from functools import lru_cache

import numpy as np

from . import crossmesh
from . import profile as profiles
from . import normal_form as nf
from ..core.backend import as_dtype
from ..core.blocks import divides_evenly, local_shape
from .costs import (collective_bytes, exchange_bytes, exchange_messages, group_sends,
                    lower_bound_bytes, most_missing)
from ..core.errors import MeshError, PlanError, ShapeError
from ..core.layout import Layout
from ..core.mesh import Mesh, crossing_sub_axes
from .nodes import Move, across_lower_bound, step_across_bytes
from .plans import Plan, Step
from .views import node_views
from ..core.topology import Topology
from ..core.subaxes import expand, group_size

__all__ = ["shape_of", "validate_sides", "check_reducible", "predicted_seconds", "plan", "STRATEGIES"]

STRATEGIES = ("collectives", "replicate", "direct")

def plan(global_shape, dtype, mesh, src, dst, strategy="collectives", allow_exchange=True,
         dst_mesh=None, profile=None, topology=None):
    """Plan the redistribution of an array from layout ``src`` to ``dst``.

    Parameters
    ----------
    global_shape : sequence of int
    dtype : numpy dtype or anything ``numpy.dtype`` accepts
    mesh : Mesh, dict or str
        Only the axis names and sizes are used; no MPI is needed.
    src, dst : Layout or str
    strategy : {"collectives", "replicate", "direct"}
    allow_exchange : bool
        With False, ``collectives`` takes an exchange step only where no
        sequence of collectives exists (the in-place executor asks for this:
        collectives run in place, an exchange does not).

    dst_mesh : Mesh, dict or str, optional
        The target layout's mesh (default ``mesh``); either mesh may list
        its ``ranks``.  Meshes over the same ranks whose axes nest give the
        Plan on their refined mesh (axes ``_r0, _r1, ...``); others a
        :class:`~mpiredist.planning.crossmesh.CrossPlan` of the exchange,
        for a communicator just large enough for both meshes.

    profile : Profile, optional
        The machine figures that rank the candidates (default
        :func:`mpiredist.planning.profile.current`: ``MPIREDIST_PROFILE``,
        the calibrate file, or the built-in default).

    topology : Topology, optional
        The node of each device (default the mesh's own, if it has one);
        between meshes, the node of each rank of the communicator, which
        orders a ``ranks="auto"`` target to keep bytes inside nodes
        (:func:`~mpiredist.planning.crossmesh.relabel`).
        Every step then knows its across-node bytes
        (``Step.inter_node_bytes_per_rank``, :mod:`mpiredist.planning.nodes`),
        the plan their sum and what must cross nodes whatever the plan
        (``Plan.inter_node_lower_bound_bytes_per_rank``), and a profile with
        across-node rates (``calibrate`` on two or more nodes) prices
        candidates by where their bytes go.

    Returns
    -------
    Plan or CrossPlan

    Raises
    ------
    LayoutError, ShapeError, MeshError, PlanError
        For bad input; each names the layout, axis or shape at fault.

    Examples
    --------
    >>> p = plan((4096, 4096), "float32", {"x": 8}, "[{x},{}]", "[{},{x}]")
    >>> [s.op for s in p.steps]
    ['all_to_all']
    """
    if crossmesh.between(mesh, dst_mesh):
        return _plan_between(global_shape, dtype, mesh, src, dst, strategy, dst_mesh, topology)
    shape, dtype, mesh, src, dst = validate(global_shape, dtype, mesh, src, dst)
    if strategy not in STRATEGIES:
        raise PlanError(f"strategy {strategy!r} is not one of {STRATEGIES}")
    topology = mesh.topology if topology is None else topology
    if topology is not None:
        if not isinstance(topology, Topology):
            raise MeshError(f"topology must be a Topology, found {type(topology).__name__}")
        if topology.size != mesh.size:
            raise MeshError(f"topology {topology!r} has {topology.size} devices, but mesh "
                            f"{mesh} has {mesh.size}")
    profile = profiles.current() if profile is None else profile
    return _plan(shape, dtype, mesh.with_topology(None), src, dst, strategy,
                 bool(allow_exchange), profile, topology)


def _plan_between(global_shape, dtype, mesh, src, dst, strategy, dst_mesh, topology=None):
    """:func:`plan` between two meshes: the refined mesh's Plan, or a CrossPlan;
    ``topology`` (of the communicator's ranks) orders a ``ranks="auto"`` target."""
    target = mesh if dst_mesh is None else dst_mesh
    target = target if isinstance(target, Mesh) else Mesh(target)
    size = None if target.auto else crossmesh.comm_size_of(
        mesh if isinstance(mesh, Mesh) else Mesh(mesh), target)
    shape, dtype, mesh, src, target, dst = validate_sides(global_shape, dtype, mesh, src,
                                                          target, dst, size)
    mesh, target = mesh.abstract(), target.abstract()
    if target.auto:
        target = crossmesh.relabel(shape, mesh, src, target, dst, max(
            target.size, crossmesh.comm_size_of(mesh)), topology)
        size = crossmesh.comm_size_of(mesh, target)
    found = crossmesh.route(mesh, src, target, dst, size)
    if found is not None:                   # one mesh over every rank in order
        return plan(shape, dtype, *found, strategy, topology=topology)
    return crossmesh.cross_plan(shape, dtype, mesh, src, target, dst, size)


def shape_of(global_shape):
    """``global_shape`` as a tuple of ints; ShapeError for anything but a sequence
    of integers (a float is refused, as numpy refuses it, never truncated)."""
    try:
        return tuple(operator.index(n) for n in global_shape)
    except TypeError:
        found = [n for n in global_shape] if hasattr(global_shape, "__iter__") else []
        bad = next((n for n in found if not hasattr(n, "__index__")), global_shape)
        raise ShapeError(f"global shape {global_shape!r} is not a sequence of integers "
                         f"(found {bad!r})") from None


def validate(global_shape, dtype, mesh, src, dst):
    """Normalise and check the arguments of :func:`plan`; return them."""
    mesh = Mesh(mesh).abstract() if not isinstance(mesh, Mesh) else mesh.abstract()
    src, dst = Layout.parse(src), Layout.parse(dst)
    shape = shape_of(global_shape)
    if any(n < 0 for n in shape):
        raise ShapeError(f"global shape {shape} has a negative length")
    try:
        dtype = as_dtype(dtype)
    except (TypeError, ValueError, SyntaxError) as exc:  # numpy parses ',' and '(' as Python
        raise ShapeError(f"dtype {dtype!r} is not a numpy dtype: {exc}") from None
    if dtype.hasobject or dtype.itemsize == 0:
        raise ShapeError(f"dtype {dtype} has no fixed size; only fixed-size dtypes move")
    src.validate(mesh, len(shape))
    dst.validate(mesh, len(shape))
    new = [a for a in dst.partial if a not in src.partial]
    if new:
        raise PlanError(f"target {dst} has partial axes {new} that source {src} does not "
                        "have; a redistribution cannot create partial sums")
    if dst.partial and src.op != dst.op:
        raise PlanError(f"source {src} and target {dst} reduce with different ops")
    if any(a not in dst.partial for a in src.partial):
        check_reducible(dtype, src)
    return shape, dtype, mesh, src, dst


# dtype.char of the numpy types that have a predefined MPI datatype in every
# MPI library (MPI_C_BOOL ... MPI_C_DOUBLE_COMPLEX): MPI reduces them.  Other
# dtypes that numpy can combine (float16, ml_dtypes.bfloat16, ...) are
# reduced by numpy from pipelined parts in a fixed order.
REDUCIBLE = "?bhilqBHILQfdFD"
_UFUNCS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def validate_sides(global_shape, dtype, mesh, src, dst_mesh, dst, comm_size=None):
    """Validate a redistribution between meshes, each side against its own mesh
    (the one place every route checks them); return ``(shape, dtype, mesh,
    src, dst_mesh, dst)`` with the meshes as given (their communicators kept).

    ``comm_size``: the ranks of the communicator both meshes live on; each
    mesh's ranks must be distinct ranks of it (a ``ranks="auto"`` target is
    ordered later, by :func:`mpiredist.planning.crossmesh.relabel`).
    """
    mesh = mesh if isinstance(mesh, Mesh) else Mesh(mesh)
    dst_mesh = dst_mesh if isinstance(dst_mesh, Mesh) else Mesh(dst_mesh)
    shape, dt, _, s, _ = validate(global_shape, dtype, mesh, src, src)
    _, _, _, d, _ = validate(shape, dt, dst_mesh, dst, dst)
    if s.partial and not d.partial:
        check_reducible(dt, s)
    if comm_size is not None:
        mesh.check_ranks(comm_size, "source")
        if not dst_mesh.auto:
            dst_mesh.check_ranks(comm_size, "target")
    return shape, dt, mesh, s, dst_mesh, d


def mpi_reduces(dtype):
    """True when MPI has a predefined reduction for ``dtype``."""
    return dtype.char in REDUCIBLE and dtype.isnative


@lru_cache(maxsize=64)
def _numpy_combines(dtype, op):
    try:
        zero = np.zeros(1, dtype)
        return _UFUNCS[op](zero, zero).dtype == dtype
    except TypeError:           # numpy's UFuncTypeError is one
        return False


def check_reducible(dtype, src):
    """ShapeError unless partial values of ``dtype`` can be reduced by ``src``'s op."""
    if dtype.kind == "c" and src.op in ("max", "min"):
        raise ShapeError(f"layout {src}: {src.op} is not defined for complex dtype {dtype}")
    if not (mpi_reduces(dtype) or _numpy_combines(dtype, src.op)):
        raise ShapeError(f"layout {src} reduces partial sums ({src.op}), but dtype {dtype} "
                         f"has no reduction: MPI has none and numpy cannot combine it with "
                         f"{_UFUNCS[src.op].__name__}; use a numeric dtype")


@lru_cache(maxsize=512)
def _plan(shape, dtype, mesh, src, dst, strategy, allow_exchange=True, profile=None,
          topology=None):
    S, T = expand(src, mesh), expand(dst, mesh)
    view = None
    if strategy == "collectives":
        profile = profile or profiles.DEFAULT
        cost = _Cost(dtype.itemsize, profile, shape, mesh.axes, topology)
        moves, note = _collectives(shape, S, T, mesh.axes, allow_exchange, cost)
        if cost.topology is not None:
            moves, note, view = _on_views(shape, S, T, mesh.axes, allow_exchange, cost,
                                          moves, note)
    else:
        build = {"replicate": _replicate, "direct": _direct}
        moves, note = build[strategy](shape, S, T, mesh.axes)
    return assemble(shape, dtype, mesh, src, dst, strategy, moves, note, topology, view)


def _on_views(shape, S, T, mesh_axes, allow_exchange, cost, moves, note):
    """``(moves, note, view)``: the plan of ``moves`` or, where one is predicted
    faster, the plan on a view that splits a dim at the node boundary
    (:func:`mpiredist.planning.views.node_views`; ``view`` is ``(view_shape,
    S', T')`` then, else None)."""
    crossing = set(crossing_sub_axes(mesh_axes, cost.topology))
    best = _score(shape, S, moves, mesh_axes, cost)
    plain, chosen = best[3], (moves, note, None)
    for view_shape, s, t in node_views(shape, S, T, crossing):
        on_view = _Cost(cost.itemsize, cost.profile, view_shape, mesh_axes, cost.topology)
        found, why = _collectives(view_shape, s, t, mesh_axes, allow_exchange, on_view)
        if not allow_exchange and _has_exchange(found) and not _has_exchange(moves):
            continue            # the view needs an exchange, the plain dim does not
        score = _score(view_shape, s, found, mesh_axes, on_view)
        if (score[3], score[1], score[2]) < (best[3], best[1], best[2]):
            best = score
            text = (f"steps on the view {list(view_shape)}: predicted {score[3] * 1e3:.3g} "
                    f"ms against {plain * 1e3:.3g} ms "
                    f"unsplit ({cost.profile.source})")
            chosen = (found, f"{text}; {why}" if why else text, (view_shape, s, t))
    return chosen


def _reduce_all(S, T):
    rest = tuple(a for a in S.partial if a not in T.partial)
    if not rest:
        return S, []
    after = S.replace(partial=tuple(a for a in S.partial if a in T.partial))
    return after, [("all_reduce", rest, (), after)]


def _exchange(state, T):
    if state == T:
        return []
    return [("exchange", (), tuple(range(len(T.dims))), T)]


def _direct(shape, S, T, mesh_axes):
    state, moves = _reduce_all(S, T)
    if state != T and not most_missing(shape, state, T, mesh_axes):
        # every rank already holds its target block: a local slice
        return moves + [("slice", (), tuple(range(len(T.dims))), T)], ""
    return moves + _exchange(state, T), ""


def _replicate(shape, S, T, mesh_axes):
    state, moves = _reduce_all(S, T)
    for d in range(len(state.dims)):
        if state.dims[d]:
            group = state.dims[d]
            state = nf._with(state, {d: ()})
            moves.append(("all_gather", group, (d,), state))
    if state != T:
        axes = tuple(a for g in T.dims for a in g)
        moves.append(("slice", axes, tuple(d for d, g in enumerate(T.dims) if g), T))
    return moves, ""


def _collectives(shape, S, T, mesh_axes, allow_exchange, cost):
    """Candidates of the normal form; the cheapest valid one and its note.

    Partial sums are reduced either where the target shards (reduce-scatter,
    the default) or all at once up front (one all-reduce: cheaper when most
    shards of the scattered dim are empty).
    """
    candidates = []
    direct = nf.direct_permute(S, T)
    if direct is not None:
        candidates.append(direct)
    reduced, head = _reduce_all(S, T)
    for start, first in ((S, []), (reduced, head)) if S != reduced else ((S, []),):
        candidates += _normal_forms(shape, start, T, first)
    candidates.append(head + _exchange(reduced, T))
    candidates.append(head + _gather_within_bound(shape, reduced, S, T))
    fallback = _replicate(shape, S, T, mesh_axes)[0]
    candidates.append(fallback)         # kept only where it stays within the bound
    if cost.topology is not None:       # priced by where bytes go: gather across nodes first
        crossing = set(crossing_sub_axes(mesh_axes, cost.topology))
        candidates += [m for m in (_across_first(shape, S, c, crossing) for c in candidates)
                       if m]
        candidates += [m for c in candidates for m in _commuted(S, c)]
    ceiling = _score(shape, S, fallback, mesh_axes, cost)[1]
    return _choose(shape, S, candidates, mesh_axes, allow_exchange, cost, ceiling)


def _across_first(shape, start, moves, crossing):
    """``moves`` (from layout ``start``) with each all-gather or reduce-scatter of
    one dim whose minor sub-axes cross nodes (and major ones do not) split in
    two, so that the bytes cross nodes while the block is small: an
    all-gather gathers the crossing part first, then the rest inside nodes; a
    reduce-scatter scatters inside nodes first, then across.  None if none
    splits.

    Both are valid steps: a gather removes the minor end of a dim's group
    and a reduce-scatter appends to it, one part of the group after the
    other, the partial sum left over the part not yet reduced.  The bytes
    are the same; the part that crosses nodes shrinks by the size of the
    rest.  Only where the dim's length divides evenly into the whole group:
    uneven blocks of part of a group do not nest in those of all of it.
    """
    out, split, before = [], False, start
    for move in moves:
        op, axes, dims, after = move
        whole = after if op == "reduce_scatter" else before
        if op == "all_reduce":
            three = _all_reduce_by_levels(shape, before, move, crossing)
            before = after
            out += three or [move]
            split = split or bool(three)
            continue
        before = after
        cut = next((i for i, s in enumerate(axes) if s in crossing), None)
        if op not in ("all_gather", "reduce_scatter") or len(dims) != 1 or not cut \
                or any(s not in crossing for s in axes[cut:]) \
                or not divides_evenly(shape, [whole], dims):
            out.append(move)
            continue
        d, major, minor = dims[0], axes[:cut], axes[cut:]
        if op == "all_gather":
            middle = after.replace(dims=tuple(g + major if k == d else g
                                              for k, g in enumerate(after.dims)))
            out += [(op, minor, dims, middle), (op, major, dims, after)]
        elif after.dims[d][len(after.dims[d]) - len(minor):] == minor:
            middle = after.replace(dims=tuple(g[:len(g) - len(minor)] if k == d else g
                                              for k, g in enumerate(after.dims)),
                                   partial=tuple(after.partial) + tuple(minor))
            out += [(op, major, dims, middle), (op, minor, dims, after)]
        else:
            out.append(move)
            continue
        split = True
    return out if split else None


def _has_exchange(moves):
    return any(m[0] == "exchange" for m in moves)


def _commuted(start, moves):
    """``moves`` (from layout ``start``) with each run of all-gathers, or of
    reduce-scatters, on distinct dims in the other orders: they commute (each
    changes only its own dim, a reduce-scatter also drops its axes from the
    partial ones), but which goes first decides whether the bytes that cross
    nodes move while the block is large or small.  The block sizes between
    them stay between those at the run's ends, within the bound."""
    out, i = [], 0
    states = [start] + [move[3] for move in moves]     # the layout before each move
    while i < len(moves):
        op = moves[i][0]
        j = i
        while j < len(moves) and moves[j][0] == op and op in ("all_gather", "reduce_scatter") \
                and len(moves[j][2]) == 1:
            j += 1
        run = moves[i:j]
        if len(run) > 1 and len({m[2][0] for m in run}) == len(run) and len(run) <= 3:
            for order in itertools.permutations(run):
                if list(order) == list(run):
                    continue
                new, state = [], states[i]
                for op_, axes, dims, after in order:
                    d = dims[0]
                    state = state.replace(
                        dims=tuple(after.dims[d] if k == d else g
                                   for k, g in enumerate(state.dims)),
                        partial=tuple(a for a in state.partial if a not in axes)
                        if op_ == "reduce_scatter" else state.partial)
                    new.append((op_, axes, dims, state))
                out.append(list(moves[:i]) + new + list(moves[j:]))
        i = max(j, i + 1)
    return out


def _all_reduce_by_levels(shape, before, move, crossing):
    """An all-reduce over sub-axes of which some cross nodes and some do not, as
    three steps: reduce-scatter inside nodes into the first dim that the
    inside part divides evenly, all-reduce across nodes on that 1/W of the
    block, all-gather inside nodes (W the inside group's size).  The block
    never outgrows the one before; None where no dim divides."""
    op, axes, _, after = move
    inside = tuple(s for s in axes if s not in crossing)
    across = tuple(s for s in axes if s in crossing)
    if not inside or not across:
        return None
    for d, group in enumerate(before.dims):
        scattered = before.replace(
            dims=tuple(g + inside if k == d else g for k, g in enumerate(before.dims)),
            partial=tuple(s for s in before.partial if s not in inside))
        if divides_evenly(shape, [scattered], [d]) and shape[d] // group_size(group) \
                >= group_size(inside):
            reduced = scattered.replace(partial=tuple(s for s in scattered.partial
                                                      if s not in across))
            return [("reduce_scatter", inside, (d,), scattered),
                    ("all_reduce", across, (), reduced),
                    ("all_gather", inside, (d,), after)]
    return None


def _normal_forms(shape, S, T, first):
    """Normal-form move lists from ``S``, each prefixed by ``first``."""
    out = []
    shrunk = nf.shrink(shape, S, T)
    if shrunk is not None:
        state, head = shrunk
        head = first + head
        mid_state, middle = nf.rearrange(shape, state, T)
        tail = nf.finish(shape, mid_state, T)
        if tail is not None:
            out.append(head + middle + tail)
        else:
            fixed = nf.fix_counts(shape, mid_state, T)
            if fixed is not None:
                tail = nf.finish(shape, fixed[0], T)
                if tail is not None:
                    out.append(head + middle + fixed[1] + tail)
            out.append(head + middle + _exchange(mid_state, T))
        out.append(head + _exchange(state, T))
    for minimal in (True, False):       # fewer slices, or no shrink phase at all
        shrunk = nf.shrink(shape, S, T, minimal=True) if minimal else (S, [])
        tail = nf.finish(shape, shrunk[0], T) if shrunk and not shrunk[0].partial else None
        if tail is not None:
            out.append(first + shrunk[1] + tail)
    return out


def _gather_within_bound(shape, state, S, T):
    """All-gathers while the block stays within the bound, then an exchange.

    Where few ranks hold data that many need (uneven lengths leaving most
    shards empty), gathering first spreads the copies that an exchange would
    send from one holder.
    """
    limit = max(_elems(shape, S), _elems(shape, T))
    moves = []
    for d, group in enumerate(state.dims):
        after = nf._with(state, {d: ()})
        if group and _elems(shape, after) <= limit:
            moves.append(("all_gather", group, (d,), after))
            state = after
    return moves + _exchange(state, T)


def _choose(shape, S, candidates, mesh_axes, allow_exchange, cost, ceiling):
    """The valid candidate with the least predicted time, then bytes, then rounds.

    Valid: its peak block stays within ``max(S, T)``, and it sends no more
    than gathering everything (``ceiling``) where some candidate does not.
    Exchange steps only where ``allow_exchange``, or where no
    collective-only candidate exists.
    """
    scored = []
    for moves in candidates:
        peak, sent, rounds, seconds = _score(shape, S, moves, mesh_axes, cost)
        if peak <= max(_elems(shape, S), _elems(shape, moves[-1][3] if moves else S)):
            uses_exchange = any(m[0] == "exchange" for m in moves)
            scored.append((uses_exchange, seconds, sent, rounds, moves))
    any_plain = any(not c[0] for c in scored)
    cheap = [c for c in scored if c[2] <= ceiling and (allow_exchange or not c[0])]
    if cheap:
        scored = [c for c in scored if c[2] <= ceiling]
    plain = min((c for c in scored if not c[0]), key=lambda c: c[1:4], default=None)
    mixed = min((c for c in scored if c[0]), key=lambda c: c[1:4], default=None)
    if plain is None and any_plain:
        return mixed[4], (f"one exchange step: sends {mixed[2]} elements per rank; every "
                          "collective-only plan sends more than gathering everything")
    if plain is None:
        return mixed[4], ("one exchange step: no normal-form sequence of collectives "
                          "reaches the target here (uneven shards that do not nest, or "
                          "shard counts that no all-to-all or permute can match)")
    if allow_exchange and mixed is not None and mixed[1:4] < plain[1:4]:
        return mixed[4], (f"one exchange step: predicted {mixed[1] * 1e3:.3g} ms against "
                          f"{plain[1] * 1e3:.3g} ms for the collective-only plan "
                          f"({cost.profile.source}); sends {mixed[2]} elements per rank "
                          f"against {plain[2]}")
    return plain[4], ""


class _Cost:
    """Predicted seconds of moves for one itemsize under one profile; with a
    topology and a profile that has across-node rates, bytes that cross nodes
    are priced at those."""

    def __init__(self, itemsize, profile, shape=None, mesh_axes=None, topology=None):
        self.itemsize, self.profile = itemsize, profile
        self.shape, self.mesh_axes = shape, mesh_axes
        self.topology = topology if topology is not None and profile.beta_across else None

    def seconds(self, op, elems, rounds, group, after_elems, move=None):
        across = 0
        if self.topology is not None and move is not None:
            across = step_across_bytes(self.shape, self.itemsize, move, self.mesh_axes,
                                       self.topology)
        return self.profile.step_seconds(op, elems * self.itemsize, rounds, group,
                                         after_elems * self.itemsize, across)


def predicted_seconds(plan, profile=None):
    """The predicted time of ``plan`` under ``profile`` (default the machine
    profile in use, :func:`mpiredist.planning.profile.current`): the score by
    which the planner ranks its candidates, so that a caller choosing between
    layouts (the analytics' broadcasting and ``matmul``) ranks them as the
    planner does."""
    profile = profiles.current() if profile is None else profile
    shape = plan.step_shape
    start = plan.steps[0].before if plan.steps else expand(plan.src, plan.mesh)
    moves = [(s.op, s.axes, s.dims, s.after) for s in plan.steps]
    cost = _Cost(plan.dtype.itemsize, profile, shape, plan.mesh.axes, plan.topology)
    return _score(shape, start, moves, plan.mesh.axes, cost)[3]


def _elems(shape, layout):
    return math.prod(local_shape(shape, layout))


def _score(shape, S, moves, mesh_axes, cost):
    """``(peak elements, elements sent, rounds, predicted seconds)`` of a move list.

    Rounds follow :mod:`mpiredist.planning.model`: a ring collective over G
    ranks G - 1 (an all-reduce twice that), a permute 1, an exchange as many
    as the messages a rank receives (so among exchanges of equal bytes the
    one with fewer peers wins, e.g. c17 at 4096 ranks: 1 message per rank,
    not 64 after a slice).
    """
    peak = _elems(shape, S)
    sent = rounds = 0
    seconds = 0.0
    devices = math.prod(s for _, s in mesh_axes)
    state = S
    for op, axes, dims, after in moves:
        peak = max(peak, _elems(shape, after))
        elems = _move_elems(shape, state, (op, axes, dims, after), mesh_axes)
        g = group_size(axes) if axes else devices
        if op == "exchange":
            n = exchange_messages(shape, state, after)
        elif op in ("slice", "permute"):
            n = int(op == "permute" and elems > 0)
        else:
            n = (g - 1) * (2 if op == "all_reduce" else 1)
        seconds += cost.seconds(op, elems, n, g, _elems(shape, after),
                                Move(op, axes, state, after, elems * cost.itemsize))
        sent += elems
        rounds += n
        state = after
    return peak, sent, rounds, seconds


def _move_bytes(shape, itemsize, before, move, mesh_axes):
    """Bytes each rank sends in ``move`` (max over ranks)."""
    return _move_elems(shape, before, move, mesh_axes) * itemsize


@lru_cache(maxsize=1024)
def _move_elems(shape, before, move, mesh_axes):
    op, axes, dims, after = move
    operand = _elems(shape, before)
    if op == "slice":
        return 0
    if op == "permute":
        return operand if before != after else 0
    if op == "exchange":
        return exchange_bytes(shape, 1, before, after, mesh_axes)[0]
    if op in ("all_to_all", "reduce_scatter") and not divides_evenly(shape, (before, after)):
        return group_sends(shape, 1, op, before, after, mesh_axes)
    return collective_bytes(op, operand, axes)


def assemble(shape, dtype, mesh, src, dst, strategy, moves, note="", topology=None,
             view=None):
    """Build a :class:`Plan` from moves ``(op, sub_axes, dims, layout_after)``.

    Used by the strategies here and by anything that brings its own step
    sequence (the benchmark's XLA plans).  Arguments must be normalised as
    :func:`validate` returns them; the moves must end at ``expand(dst)``, or
    with ``view = (view_shape, S', T')`` (:mod:`mpiredist.planning.views`)
    start at ``S'`` and end at ``T'`` on ``view_shape``.
    """
    global_shape, itemsize = shape, dtype.itemsize
    S, T = expand(src, mesh), expand(dst, mesh)
    bound = None if topology is None else across_lower_bound(shape, itemsize, S, T, mesh.axes,
                                                             topology)
    lower = lower_bound_bytes(shape, itemsize, S, T, mesh.axes)
    view_shape = None
    if view is not None:
        view_shape, S, T = view
        shape = view_shape
    steps, state = [], S
    for move in moves:
        op, axes, dims, after = move
        sent = _move_bytes(shape, itemsize, state, move, mesh.axes)
        across = None
        if topology is not None:
            across = step_across_bytes(shape, itemsize, Move(op, axes, state, after, sent),
                                       mesh.axes, topology)
        steps.append(Step(op, tuple(axes), tuple(dims), state, after,
                          local_shape(shape, state), local_shape(shape, after), sent, across))
        state = after
    if state != T:
        raise AssertionError(f"internal planner error: plan ends at {state}, not {T}")
    nbytes = [math.prod(local_shape(shape, S)) * itemsize]
    nbytes += [math.prod(s.local_shape_after) * itemsize for s in steps]
    return Plan(global_shape, dtype, mesh, src, dst, strategy, tuple(steps), nbytes[0],
                math.prod(local_shape(shape, T)) * itemsize, max(nbytes),
                sum(s.bytes_sent_per_rank for s in steps), lower, note, topology, bound,
                view_shape)

