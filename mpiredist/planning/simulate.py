"""Run a plan for all P virtual ranks in one process, with numpy.

The semantic reference for the MPI runtime (a test oracle): each step is
carried out the way its collective defines it (concatenate members' blocks,
split and swap, reduce), rank by rank, sharing no code with the runtime's
steps or its piece model (an exchange copies each piece from any rank that
holds it).

Examples
--------
>>> import numpy as np, mpiredist as mr
>>> p = mr.plan((4, 4), "int64", {"x": 2}, "[{x},{}]", "[{},{x}]")
>>> g = np.arange(16).reshape(4, 4)
>>> out = simulate(p, [g[:2], g[2:]])
>>> out[1].tolist()
[[2, 3], [6, 7], [10, 11], [14, 15]]
"""

import numpy as np

from ..core.blocks import block_index, box_shape, overlap, rank_block
from ..core.errors import ShapeError
from ..core.subaxes import expand, rank_digits
from .pieces import REDUCERS
from .routing import member_ranks, permute_source

from .nodes import node_share

__all__ = ["simulate"]


def simulate(plan, blocks, topology=None):
    """Return the target local blocks of every rank; ``blocks`` is not modified.

    Parameters
    ----------
    plan : Plan
    blocks : list of numpy arrays
        ``blocks[r]`` is rank ``r``'s source local block.
    topology : Topology, optional
        With one, returns ``(blocks, across)``: per step, the most bytes that
        left or entered one node in the simulation, shared by the node's
        ranks (:func:`mpiredist.planning.nodes.node_share`), every member
        sending what its receiver takes from it (an all-reduce: each member
        reduces one slice, then sends it to the others; an exchange: from
        the lowest rank that holds a piece).
    """
    mesh = plan.mesh
    if len(blocks) != mesh.size:
        raise ShapeError(f"simulate: {len(blocks)} blocks for a mesh of {mesh.size} ranks")
    digits = [rank_digits(mesh, r) for r in range(mesh.size)]
    state = [np.array(b, dtype=plan.dtype, copy=True) for b in blocks]
    if plan.view_shape is not None:         # the same elements, one dim split in two
        state = [b.reshape(box_shape(rank_block(plan.view_shape, plan.steps[0].before, d)))
                 for b, d in zip(state, digits)]
    nodes = None if topology is None else topology.array()
    across = []
    for step in plan.steps:
        run = _RUN[step.op]
        sent = np.zeros(mesh.size, dtype=np.int64)
        got = np.zeros(mesh.size, dtype=np.int64)

        def account(src, dst, nbytes):
            if nodes is not None and nodes[src] != nodes[dst]:
                sent[src] += nbytes
                got[dst] += nbytes
        state = [run(plan, step, state, digits, r, account) for r in range(mesh.size)]
        across.append(node_share(sent, got, nodes) if nodes is not None else 0)
    if plan.view_shape is not None:
        dst = expand(plan.dst, mesh)
        state = [b.reshape(box_shape(rank_block(plan.global_shape, dst, d)))
                 for b, d in zip(state, digits)]
    return state if topology is None else (state, across)


def _relative(box, outer):
    return tuple(slice(lo - o0, hi - o0) for (lo, hi), (o0, _) in zip(box, outer))


def _slice(plan, step, state, digits, r, account):
    before = rank_block(plan.step_shape, step.before, digits[r])
    after = rank_block(plan.step_shape, step.after, digits[r])
    if any(hi <= lo for lo, hi in after):
        return np.empty(tuple(hi - lo for lo, hi in after), dtype=plan.dtype)
    return state[r][_relative(after, before)].copy()


def _members(plan, step, digits, r):
    return member_ranks(plan.mesh, digits[r], step.axes)


def _all_gather(plan, step, state, digits, r, account):
    (d,) = step.dims
    members = _members(plan, step, digits, r)
    for m in members:
        account(m, r, state[m].nbytes)
    return np.concatenate([state[m] for m in members], axis=d)


def _all_to_all(plan, step, state, digits, r, account):
    i, j = step.dims
    after = rank_block(plan.step_shape, step.after, digits[r])
    parts = []
    for m in _members(plan, step, digits, r):
        before = rank_block(plan.step_shape, step.before, digits[m])
        rel = _relative(after, before)
        index = [slice(None)] * len(after)
        index[j] = rel[j]
        parts.append(state[m][tuple(index)])
        account(m, r, parts[-1].nbytes)
    return np.concatenate(parts, axis=i)


def _reduce(plan, arrays):
    out = arrays[0].copy()
    for a in arrays[1:]:
        REDUCERS[plan.src.op](out, a, out=out)
    return out


def _reduce_scatter(plan, step, state, digits, r, account):
    before = rank_block(plan.step_shape, step.before, digits[r])
    after = rank_block(plan.step_shape, step.after, digits[r])
    rel = _relative(after, before)
    parts = []
    for m in _members(plan, step, digits, r):
        parts.append(state[m][rel])
        account(m, r, parts[-1].nbytes)
    return _reduce(plan, parts)


def _all_reduce(plan, step, state, digits, r, account):
    members = _members(plan, step, digits, r)
    g, n, size = len(members), state[r].size, state[r].itemsize
    me = members.index(r)
    for c, m in enumerate(members):
        account(m, r, ((me + 1) * n // g - me * n // g) * size)   # m's part of r's slice
        account(m, r, ((c + 1) * n // g - c * n // g) * size)     # m's reduced slice to r
    return _reduce(plan, [state[m] for m in members])


def _permute(plan, step, state, digits, r, account):
    source = permute_source(plan.mesh, step.before, step.after, digits[r])
    account(source, r, state[source].nbytes)
    return state[source].copy()


def _exchange(plan, step, state, digits, r, account):
    """Every element of rank r's target block from some rank holding it in the
    same partial class (the lowest such rank: any holder has the same values)."""
    shape = plan.step_shape
    mine = rank_block(shape, step.after, digits[r])
    out = np.empty(tuple(hi - lo for lo, hi in mine), dtype=plan.dtype)
    filled = np.zeros(out.shape, dtype=bool)
    cls = block_index(step.before.partial, digits[r])
    for s in range(plan.mesh.size):
        if block_index(step.before.partial, digits[s]) != cls:
            continue
        held = rank_block(shape, step.before, digits[s])
        box = overlap(mine, held) if mine else ()
        if box is None:
            continue
        where = _relative(box, mine)
        if filled[where].all():
            continue
        out[where] = state[s][_relative(box, held)]
        account(s, r, int(np.count_nonzero(~filled[where])) * out.itemsize)
        filled[where] = True
    if not filled.all():
        raise AssertionError(f"exchange left {int((~filled).sum())} of {out.size} elements "
                             f"of rank {r} unfilled")
    return out


_RUN = {"slice": _slice, "all_gather": _all_gather, "all_to_all": _all_to_all,
        "reduce_scatter": _reduce_scatter, "all_reduce": _all_reduce,
        "permute": _permute, "exchange": _exchange}
