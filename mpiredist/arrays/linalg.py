"""``matmul`` (``a @ b``) after GSPMD's dot rules.

Operands ``a`` of shape ``batch + (m, k)`` and ``b`` of ``batch + (k, n)``
(equal batch shapes, none or more batch dims; 1-D operands are promoted as
NumPy does).  A choice of mesh axes -- ``B`` per batch dim, ``M`` for m,
``K`` for the contracting dim, ``N`` for n, all disjoint -- puts

    a in [B..., {M}, {K}]      b in [B..., {K}, {N}]

and each rank multiplies its blocks locally: the result ``[B..., {M}, {N}]
sum{K}`` holds partial sums over ``K``, which one reduce-scatter (or
all-reduce) combines (:func:`mpiredist.arrays.ops.reduce`).  The candidates
are built from the operands' own layouts (keep a's, keep b's, keep both
sides' non-contracting axes, replicate the contracting dim); each is priced
by the planner's own score of the plans moving a and b and reducing the
result (:func:`mpiredist.planning.planner.predicted_seconds`, under the
machine profile), and the cheapest wins (first on a tie): a choice made from shapes,
layouts and dtypes only, so every rank makes the same one.

Result layout (``layout=None``): ``[B..., {M,K}, {N}]``: the partial sums
are reduce-scattered over K onto the row dim (no rank keeps a replica it did
not ask for).  Pass ``layout`` to get another (the reduction goes straight
there).

Working set per rank: a's block in ``[B,{M},{K}]`` + b's block in
``[B,{K},{N}]`` + the partial product block ``batch/|B| x m/|M| x n/|N|``,
plus the bound of the redistributions that produce them (each within its
own ``max(S, T) + W``) and the reduce-scatter's (within max(partial block,
result block) + W).
"""

import numpy as np

from ..core.backend import array_module
from ..core.errors import LayoutError, ShapeError
from ..core.layout import Layout
from ..planning import planner
from . import ops
from .base import DistArrayBase
from .broadcast import align, move_cost

__all__ = ["matmul"]


def _check(a, b):
    for i, x in enumerate((a, b)):
        if not isinstance(x, DistArrayBase):
            raise ops.OperandError(f"matmul: operand {i} is a {type(x).__name__}, not a "
                                   "DistArray (wrap it with DistArray.from_global)")
        if x.ndim == 0:
            raise ShapeError(f"matmul: operand {i} is 0-dimensional; use multiply")
    if a.mesh != b.mesh:
        raise ShapeError(f"matmul: operand 0 is on mesh {a.mesh}, operand 1 on {b.mesh}")
    if a.shape[-1] != b.shape[-2 if b.ndim > 1 else -1]:
        raise ShapeError(f"matmul: contracting dims do not match: operand 0 has shape "
                         f"{a.shape} (k={a.shape[-1]}), operand 1 has shape {b.shape} "
                         f"(k={b.shape[-2 if b.ndim > 1 else -1]})")
    if a.ndim > 2 or b.ndim > 2:
        if a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2]:
            raise ShapeError(f"matmul: batch dims must be equal: operand 0 has shape "
                             f"{a.shape}, operand 1 has {b.shape}")


def _promote(x, where):
    """A 1-D operand as a matrix: (k,) -> (1, k) for a, (k, 1) for b (local view)."""
    if x.ndim != 1:
        return x
    if where == 0:
        lay = Layout(((),) + x.layout.dims, x.layout.partial, x.layout.op)
        return type(x)(x.local[None, :], (1,) + x.shape, lay, x.mesh)
    lay = Layout(x.layout.dims + ((),), x.layout.partial, x.layout.op)
    return type(x)(x.local[:, None], x.shape + (1,), lay, x.mesh)


def _candidates(a, b):
    """(B, M, K, N) choices from the operands' layouts, first choices first."""
    la, lb = a.layout, b.layout
    nb = a.ndim - 2
    B = tuple(la.dims[:nb])
    used_b = {x for g in B for x in g}

    def free(axes, taken):
        return tuple(x for x in axes if x not in taken)

    out = []
    for M0, K0, N0 in ((la.dims[-2], la.dims[-1], lb.dims[-1]),
                       (la.dims[-2], lb.dims[-2], lb.dims[-1]),
                       (la.dims[-2], (), lb.dims[-1]),
                       (la.dims[-2], la.dims[-1], ()),
                       ((), lb.dims[-2], lb.dims[-1]),
                       ((), la.dims[-1] + la.dims[-2], lb.dims[-1])):
        M = free(M0, used_b)
        K = free(K0, used_b | set(M))
        N = free(N0, used_b | set(M) | set(K))
        out.append((B, M, K, N))
    return list(dict.fromkeys(out))


def _result_layout(B, M, K, N):
    return Layout(B + (M + K, N))


def matmul(a, b, layout=None):
    """``a @ b`` (collective); see the module docstring for the layouts chosen."""
    _check(a, b)
    squeeze = (a.ndim == 1, b.ndim == 1)
    if a.layout.partial:
        a = ops.reduce(a)
    if b.layout.partial:
        b = ops.reduce(b)
    a2, b2 = _promote(a, 0), _promote(b, 1)
    nb = a2.ndim - 2
    shape = a2.shape[:-1] + (b2.shape[-1],)
    dst = None if layout is None else Layout.parse(layout)
    out_ndim = len(shape) - sum(squeeze)
    if dst is not None:
        dst.validate(a.mesh, out_ndim)
        if dst.partial:
            raise LayoutError(f"matmul: target layout {dst} has partial axes")
    dtype = np.result_type(a.dtype, b.dtype)
    best, best_cost = None, None
    for B, M, K, N in _candidates(a2, b2):
        la = Layout(B + (M, K))
        lb = Layout(B + (K, N))
        part = Layout(B + (M, N), K, "sum")
        want = _final_layout(B, M, K, N, squeeze, dst)
        cost = move_cost(a2, la) + move_cost(b2, lb)
        if K:
            cost += planner.predicted_seconds(planner.plan(shape, dtype, a.mesh, part,
                                                           _unsqueezed(want, squeeze)))
        elif want != _unsqueezed(Layout(B + (M, N)), squeeze):
            cost += planner.predicted_seconds(planner.plan(shape, dtype, a.mesh,
                                                           Layout(B + (M, N)),
                                                           _unsqueezed(want, squeeze)))
        if best_cost is None or cost < best_cost:
            best, best_cost = (B, M, K, N, la, lb, part, want), cost
    B, M, K, N, la, lb, part, want = best
    a3, b3 = align(a2, la), align(b2, lb)
    xp = array_module(a3.local)
    local = xp.matmul(a3.local, b3.local)
    if local.dtype != dtype:
        local = local.astype(dtype)
    del a3, b3
    full_want = _unsqueezed(want, squeeze)
    c = type(a)(xp.asarray(local), shape, part if K else Layout(B + (M, N)), a.mesh)
    c = align(c, full_want) if c.layout != full_want else c
    if any(squeeze):
        key = tuple([slice(None)] * nb + [0 if squeeze[0] else slice(None),
                                          0 if squeeze[1] else slice(None)])
        c = type(a)(c.local[key], tuple(n for n, k in zip(shape, key) if k != 0), want, a.mesh)
    return c


def _final_layout(B, M, K, N, squeeze, dst):
    if dst is not None:
        return dst
    dims = list(B) + [M + K, N]
    if squeeze[1]:
        dims.pop()
    if squeeze[0]:
        dims.pop(len(B))
    return Layout(tuple(dims))


def _unsqueezed(want, squeeze):
    """The layout ``want`` of the squeezed result with the promoted dims put back."""
    dims = list(want.dims)
    nb = len(dims) - (2 - sum(squeeze))
    if squeeze[0]:
        dims.insert(nb, ())
    if squeeze[1]:
        dims.append(())
    return Layout(tuple(dims))
