"""The paper's normal form, as moves on sub-axis layouts.

A move is ``(op, axes, dims, after)``: the collective, its sub-axis group,
its array dims (see :mod:`mpiredist.planning.plans`) and the layout it produces.  The
candidates are built in three phases, ordered by memory effect (as Shardy
and arXiv 2112.01075 do):

1. shrink: slice in the target axes the source replicates, reduce-scatter
   the partial axes the target shards, all-reduce the other partial axes;
2. size-preserving: all-to-alls that move the minor axes of one dim to the
   dim that needs them next, then at most one permute that fixes the order;
3. grow: all-gather, per dim, the minor axes the target does not shard.

Steps whose fine shards would not tile the coarse ones (uneven lengths, see
:func:`mpiredist.core.blocks.aligned`) are not emitted; the caller then plans an
exchange.  Returns None where a phase cannot be expressed.
"""

from collections import Counter

from ..core.blocks import aligned, group_size
from ..core.subaxes import prime_factors

__all__ = ["shrink", "rearrange", "finish", "fix_counts", "direct_permute"]


def _with(state, changes, partial=None):
    dims = list(state.dims)
    for d, group in changes.items():
        dims[d] = group
    return state.replace(dims=tuple(dims), partial=partial)


def shrink(shape, state, target, minimal=False):
    """Phase 1: slices, reduce-scatters, all-reduce.  ``(state, moves)`` or None.

    With ``minimal``, a dim is sliced only until it has as many shards as the
    target wants (a permute can then relabel the rest, as XLA does).
    """
    moves, used = [], state.used()
    changes, sliced, sliced_dims = {}, [], []
    for j, want in enumerate(target.dims):
        add = tuple(a for a in want if a not in used and a not in state.partial)
        if minimal:
            add = _enough(state.dims[j], want, add)
        if add:
            if not aligned(shape[j], group_size(state.dims[j]), group_size(add)):
                return None
            changes[j] = state.dims[j] + add
            sliced += add
            sliced_dims.append(j)
    if changes:
        state = _with(state, changes)
        moves.append(("slice", tuple(sliced), tuple(sliced_dims), state))
    reduced = [a for a in state.partial if a not in target.partial]
    for j, want in enumerate(target.dims):
        group = tuple(a for a in want if a in reduced)
        if group:
            if not aligned(shape[j], group_size(state.dims[j]), group_size(group)):
                return None
            left = tuple(a for a in state.partial if a not in group)
            state = _with(state, {j: state.dims[j] + group}, partial=left)
            moves.append(("reduce_scatter", group, (j,), state))
    rest = tuple(a for a in state.partial if a not in target.partial)
    if rest:
        state = state.replace(partial=tuple(a for a in state.partial if a not in rest))
        moves.append(("all_reduce", rest, (), state))
    return state, moves


def _enough(have, want, add):
    """The shortest prefix of ``add`` that brings ``have`` to ``want``'s shard count."""
    count, goal = group_size(have), group_size(want)
    for k in range(len(add) + 1):
        if count * group_size(add[:k]) >= goal:
            return add[:k]
    return add


def _prefix(have, want):
    n = 0
    while n < len(have) and n < len(want) and have[n] == want[n]:
        n += 1
    return n


def _next_all_to_all(shape, state, target):
    for j, want in enumerate(target.dims):
        have = state.dims[j]
        m = _prefix(have, want)
        if len(have) != m or m == len(want):
            continue
        need = want[m:]
        for i, other in enumerate(state.dims):
            if i == j:
                continue
            k = max((k for k in range(1, min(len(other), len(need)) + 1)
                     if other[-k:] == need[:k]), default=0)
            if not k:
                continue
            group, g = need[:k], group_size(need[:k])
            if (aligned(shape[i], group_size(other[:-k]), g)
                    and aligned(shape[j], group_size(have), g)):
                after = _with(state, {i: other[:-k], j: have + group})
                return ("all_to_all", group, (i, j), after)
    return None


def rearrange(shape, state, target):
    """Phase 2a: greedy all-to-alls.  Returns ``(state, moves)``."""
    moves = []
    while True:
        move = _next_all_to_all(shape, state, target)
        if move is None:
            return state, moves
        moves.append(move)
        state = move[3]


def _ready(state, target):
    """True if only all-gathers of minor axes remain."""
    return all(have[:len(want)] == want for have, want in zip(state.dims, target.dims))


def _permute_target(state, target):
    """The layout ``target + extras`` with the shard counts of ``state``, or None."""
    kept = target.used()
    extras = [a for d in state.dims for a in d if a not in kept]
    need = []
    for have, want in zip(state.dims, target.dims):
        q, r = divmod(group_size(have), group_size(want))
        if r:
            return None
        need.append(Counter(prime_factors(q)))
    placed = [[] for _ in state.dims]
    pool = list(extras)
    for d, have in enumerate(state.dims):          # keep extras where they are
        for a in have:
            if a in pool and need[d][a.size]:
                need[d][a.size] -= 1
                placed[d].append(a)
                pool.remove(a)
    for a in list(pool):                            # then anywhere that fits
        d = next((d for d in range(len(need)) if need[d][a.size]), None)
        if d is not None:                           # else it becomes replicated
            need[d][a.size] -= 1
            placed[d].append(a)
            pool.remove(a)
    if any(sum(c.values()) for c in need):
        return None
    dims = tuple(want + tuple(p) for want, p in zip(target.dims, placed))
    return state.replace(dims=dims)


def _gathers(shape, state, target):
    moves = []
    for d, (have, want) in enumerate(zip(state.dims, target.dims)):
        extra = have[len(want):]
        if extra:
            if not aligned(shape[d], group_size(want), group_size(extra)):
                return None
            state = _with(state, {d: want})
            moves.append(("all_gather", extra, (d,), state))
    return moves


def finish(shape, state, target):
    """Phase 2b and 3: optional permute, then all-gathers; None if impossible."""
    if _ready(state, target):
        return _gathers(shape, state, target)
    fixed = _permute_target(state, target)
    if fixed is None:
        return None
    gathers = _gathers(shape, fixed, target)
    if gathers is None:
        return None
    return [permute_move(state, fixed)] + gathers


def _wanted_counts(state, target):
    """Shard count per dim that ``finish`` needs: target axes plus extras."""
    kept = target.used()
    extras = [a for d in state.dims for a in d if a not in kept]
    counts = [Counter(prime_factors(group_size(w))) for w in target.dims]
    spare = Counter(a.size for a in extras)
    return counts, spare


def fix_counts(shape, state, target):
    """All-to-alls of minor sub-axes until a permute can finish; None if stuck.

    Moves the minor sub-axes of a dim with more shards than the target
    wants to a dim with fewer, fusing consecutive sub-axes with the same
    source and destination into one all-to-all.
    """
    moves = []
    for _ in range(sum(len(d) for d in state.dims)):
        if _permute_target(state, target) is not None:
            return state, moves
        move = _count_move(shape, state, target)
        if move is None:
            return None
        moves.append(move)
        state = move[3]
    return None


def _count_move(shape, state, target):
    want, spare = _wanted_counts(state, target)
    have = [Counter(prime_factors(group_size(d))) for d in state.dims]
    for i, dim in enumerate(state.dims):
        k = 0
        surplus = have[i] - want[i]
        while k < len(dim) and surplus[dim[len(dim) - 1 - k].size] > 0:
            surplus[dim[len(dim) - 1 - k].size] -= 1
            k += 1
        if not k:
            continue
        for j in range(len(state.dims)):
            deficit = want[j] - have[j]
            group = dim[len(dim) - k:]
            if j == i or not all(deficit[p] >= n for p, n in Counter(a.size for a in group).items()):
                continue
            g = group_size(group)
            if aligned(shape[i], group_size(dim) // g, g) and aligned(
                    shape[j], group_size(state.dims[j]), g):
                after = _with(state, {i: dim[:len(dim) - k], j: state.dims[j] + group})
                return ("all_to_all", group, (i, j), after)
    return None


def permute_move(before, after):
    changed = tuple(d for d, (a, b) in enumerate(zip(before.dims, after.dims)) if a != b)
    axes = tuple(dict.fromkeys(a for d in changed
                               for a in before.dims[d] + after.dims[d]))
    return ("permute", axes, changed, after)


def direct_permute(source, target):
    """One permute if both layouts have the same shard counts; else None."""
    if source.partial != target.partial or source.counts() != target.counts():
        return None
    return [permute_move(source, target)]
