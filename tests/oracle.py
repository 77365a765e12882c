"""An independent reference for block geometry and redistribution results.

Written only from docs/semantics.md (Mesh, Layout, Local block), with numpy and the standard library;
it deliberately imports nothing from ``mpiredist`` so that a shared mistake
cannot make the planner and its tests agree.

Conventions
-----------
``mesh_axes`` is a list of ``(name, size)`` pairs in mesh order.  ``dims`` is a
list, one entry per array dimension, of lists of axis names, major to minor.
Rank ``r`` has coordinates ``numpy.unravel_index(r, sizes)`` (row-major).
"""

import functools
import math

import numpy as np

__all__ = ["coords", "mesh_size", "shard_interval", "block_slices", "local_block",
           "partial_blocks", "reduce_groups", "expected", "REDUCE", "layout_text",
           "global_array", "source_blocks", "target_mismatch", "lower_bound_bytes",
           "max_local_bytes"]

REDUCE = {
    "sum": np.add,
    "max": np.maximum,
    "min": np.minimum,
    "prod": np.multiply,
}


def mesh_size(mesh_axes):
    """Number of ranks of the mesh."""
    return math.prod(size for _, size in mesh_axes)


def coords(rank, sizes):
    """Coordinates of ``rank`` on a mesh of ``sizes``: row-major, last fastest."""
    return tuple(int(c) for c in np.unravel_index(rank, tuple(sizes)))


def shard_interval(n, k, p):
    """Global ``(start, stop)`` of shard ``p`` of ``k`` of a length-``n`` dim."""
    c = -(-n // k)
    return min(p * c, n), min((p + 1) * c, n)


def block_slices(global_shape, mesh_axes, dims, rank):
    """Tuple of slices selecting ``rank``'s local block of the global array."""
    if len(dims) != len(global_shape):
        raise ValueError(f"{len(dims)} layout dims for a {len(global_shape)}-dim shape")
    return _all_slices(tuple(global_shape), tuple(map(tuple, mesh_axes)),
                       tuple(map(tuple, dims)))[rank]


@functools.lru_cache(maxsize=4096)
def _all_slices(global_shape, mesh_axes, dims):
    """``block_slices`` of every rank (cached: the tests ask many times)."""
    sizes = dict(mesh_axes)
    names = [name for name, _ in mesh_axes]
    out = []
    for rank in range(mesh_size(mesh_axes)):
        coord = dict(zip(names, coords(rank, [s for _, s in mesh_axes])))
        block = []
        for n, axes in zip(global_shape, dims):
            k, p = 1, 0
            for a in axes:
                k *= sizes[a]
                p = p * sizes[a] + coord[a]
            block.append(slice(*shard_interval(n, k, p)))
        out.append(tuple(block))
    return out


def local_block(G, mesh_axes, dims, rank):
    """Copy of ``rank``'s local block of the global array ``G``."""
    return G[block_slices(G.shape, mesh_axes, dims, rank)].copy()


def expected(G, mesh_axes, dst_dims, rank):
    """The block that ``rank`` must hold after redistributing ``G`` to ``dst_dims``."""
    return local_block(G, mesh_axes, dst_dims, rank)


def _groups(mesh_axes, partial):
    """Lists of ranks that differ only in their coordinates on ``partial``."""
    names = [name for name, _ in mesh_axes]
    sizes = [s for _, s in mesh_axes]
    keep = [i for i, name in enumerate(names) if name not in set(partial)]
    groups = {}
    for r in range(mesh_size(mesh_axes)):
        c = coords(r, sizes)
        groups.setdefault(tuple(c[i] for i in keep), []).append(r)
    return list(groups.values())


def _small_ints(rng, shape, dtype, low, high):
    """Random integers in ``[low, high]`` as ``dtype`` (real and imaginary)."""
    vals = rng.integers(low, high + 1, size=shape)
    if np.dtype(dtype).kind == "c":
        vals = vals + 1j * rng.integers(low, high + 1, size=shape)
    return vals.astype(dtype)


def _is_small_integral(v):
    """True if every element (both parts if complex) is an integer below 2**20."""
    parts = (v.real, v.imag) if v.dtype.kind == "c" else (v,)
    return all(np.all(np.isfinite(x)) and np.all(np.abs(x) < 2 ** 20)
               and np.all(x == np.round(x)) for x in parts)


def _split(v, n, op, rng):
    """``n`` arrays whose reduction by ``op`` is exactly ``v`` (elementwise)."""
    if n == 1:
        return [v.copy()]
    kind = v.dtype.kind
    if kind == "b" and op in ("sum", "prod"):
        raise ValueError(f"bool partial blocks need op max or min, not {op!r}")
    holder = int(rng.integers(n))
    others = []
    for _ in range(n - 1):
        if op == "prod":
            others.append(np.ones_like(v))
        elif op in ("max", "min"):
            if kind == "b":
                r = rng.integers(0, 2, size=v.shape).astype(bool)
            elif kind == "c":
                raise ValueError("complex partial blocks need op sum or prod")
            else:
                info = np.iinfo(v.dtype) if kind in "iu" else None
                lo, hi = (max(info.min, -100), min(info.max, 100)) if info else (-100, 100)
                r = rng.integers(lo, hi + 1, size=v.shape).astype(v.dtype)
            # Never changes the result: <= v for max, >= v for min.
            others.append(np.minimum(v, r) if op == "max" else np.maximum(v, r))
        elif kind == "u":
            # Non-negative parts that never wrap: each at most v // (n - 1).
            others.append(rng.integers(0, v.astype(np.int64) // (n - 1) + 1,
                                       size=v.shape).astype(v.dtype))
        elif kind == "i" or _is_small_integral(v):
            others.append(_small_ints(rng, v.shape, v.dtype, -3, 3))
        else:
            # Arbitrary floats: zero contributions keep the sum exact.
            others.append(np.zeros_like(v))
    if op in ("sum",):
        rest = others[0].copy()
        for o in others[1:]:
            rest = rest + o
        main = (v - rest).astype(v.dtype)
    else:
        main = v.copy()
    parts = others[:holder] + [main] + others[holder:]
    return parts


def partial_blocks(G, mesh_axes, dims, partial, op, rng):
    """Per-rank source blocks of a layout with partial axes.

    Ranks that differ only in their coordinates on ``partial`` hold the same
    block of the array; their contributions reduce by ``op`` to exactly that
    block of ``G``.  Integer sums are exact (unsigned parts never wrap); float
    and complex sums are exact when ``G`` holds small integers (otherwise the
    other ranks contribute zeros).  For max/min one rank holds the true value
    and the others values that do not change the result; for prod the others
    hold ones.  Bool arrays need max or min.
    """
    if op not in REDUCE:
        raise ValueError(f"reduction {op!r} is not one of {sorted(REDUCE)}")
    blocks = [None] * mesh_size(mesh_axes)
    for group in _groups(mesh_axes, partial):
        v = local_block(G, mesh_axes, dims, group[0])
        for r, part in zip(group, _split(v, len(group), op, rng)):
            blocks[r] = part
    return blocks


def reduce_groups(blocks, mesh_axes, partial, op):
    """Per-rank reduction by ``op`` of ``blocks`` over each group on ``partial``.

    Every rank of a group gets the group's reduced block; with no partial
    axes this returns copies of ``blocks``.  Used to check targets that stay
    partial, whose per-rank parts are not unique but whose reduction is.
    """
    out = [None] * len(blocks)
    ufunc = REDUCE[op]
    for group in _groups(mesh_axes, partial):
        acc = blocks[group[0]].copy()
        for r in group[1:]:
            acc = ufunc(acc, blocks[r]).astype(acc.dtype)
        for r in group:
            out[r] = acc.copy()
    return out


# -- helpers shared by the planner tests -------------------------------------

def layout_text(dims, partial=(), op="sum"):
    """The text form of docs/semantics.md (Layout), e.g. ``[{x,y}, {}] sum{z}``."""
    text = "[" + ", ".join("{" + ",".join(d) + "}" for d in dims) + "]"
    if partial:
        text += f" {op}{{" + ",".join(partial) + "}"
    return text


def global_array(shape, dtype, rng):
    """A random global array of small integers (exact under sums of a few terms)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind == "u":
        return rng.integers(0, 60, size=shape).astype(dtype)
    return _small_ints(rng, shape, dtype, -30, 30)


def source_blocks(G, mesh_axes, dims, partial=(), op="sum", rng=None):
    """Per-rank source blocks: plain copies, or partial contributions."""
    if partial:
        return partial_blocks(G, mesh_axes, dims, partial, op,
                              rng if rng is not None else np.random.default_rng(0))
    return [local_block(G, mesh_axes, dims, r) for r in range(mesh_size(mesh_axes))]


def target_mismatch(out, G, mesh_axes, dst_dims, dst_partial=(), op="sum"):
    """Describe the first rank whose target block is wrong, or return None.

    ``out`` is the list of per-rank target blocks.  A target that stays
    partial is checked through the reduction over its partial groups.
    """
    P = mesh_size(mesh_axes)
    if not isinstance(out, (list, tuple)) or len(out) != P:
        return f"expected a list of {P} blocks, got {type(out).__name__}"
    want = [G[block_slices(G.shape, mesh_axes, dst_dims, r)] for r in range(P)]
    for r in range(P):
        got = out[r]
        if not isinstance(got, np.ndarray):
            return f"rank {r}: got a {type(got).__name__}, expected a numpy array"
        if got.shape != want[r].shape:
            return f"rank {r}: shape {got.shape}, expected {want[r].shape}"
        if got.dtype != want[r].dtype:
            return f"rank {r}: dtype {got.dtype}, expected {want[r].dtype}"
    if dst_partial:
        out = reduce_groups(out, mesh_axes, dst_partial, op)
    for r in range(P):
        if not np.array_equal(out[r], want[r]):
            return f"rank {r}: got\n{out[r]!r}\nexpected\n{want[r]!r}"
    return None


def _box(global_shape, mesh_axes, dims, rank):
    return [(s.start, s.stop) for s in block_slices(global_shape, mesh_axes, dims, rank)]


def max_local_bytes(global_shape, mesh_axes, dims, itemsize):
    """Largest local block over ranks, in bytes."""
    return max(math.prod(b - a for a, b in _box(global_shape, mesh_axes, dims, r))
               for r in range(mesh_size(mesh_axes))) * itemsize


def lower_bound_bytes(global_shape, mesh_axes, src_dims, dst_dims, itemsize):
    """Max over ranks of the target bytes a rank does not already hold."""
    worst = 0
    for r in range(mesh_size(mesh_axes)):
        src = _box(global_shape, mesh_axes, src_dims, r)
        dst = _box(global_shape, mesh_axes, dst_dims, r)
        need = math.prod(b - a for a, b in dst)
        held = math.prod(max(0, min(b1, b2) - max(a1, a2))
                         for (a1, b1), (a2, b2) in zip(src, dst))
        worst = max(worst, need - held)
    return worst * itemsize
