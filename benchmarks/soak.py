"""Soak: many random redistributions, each checked against an independent oracle.

    mpiexec -n P python -m benchmarks.soak --cases N --seed S [--case K]
        [--json FILE] [--verbose]

Case ``K`` of seed ``S`` at ``P`` ranks is a pure function of ``(S, K, P)``
(:func:`make_case`), so ``--seed S --case K`` replays it alone.  A case is a
communicator (every rank, or the first ``m`` on a sub-communicator), a mesh
of 1-3 axes (any ordered factorisation of its ranks, axes of size 1
included), for moves between meshes a second mesh (the same ranks in
another order or factorisation, or a subset in any order), a global shape
(uneven, shorter than its shard count, zero-length dims, 0-d), a dtype
(:data:`DTYPES`, and :data:`MOVED_ONLY` ones without partial axes), a
source layout (several axes on a dim, replicated axes, partial
``sum``/``max``/``min``/``prod`` axes), a target (which may keep some
partial axes), a strategy, a workspace, donation, the source block's
memory (C or Fortran order, strided, read-only) and a route:
``mr.redistribute``, a ``mr.Transfer`` run several times into one ``out=``
array, ``DistArray.from_local(...).redistribute`` or ``redistribute_``.

The oracle uses no mpiredist code but the ``Layout`` value: the global
array is a hash of the flat global index, so every rank computes its
expected source and target blocks by the block rule of DESIGN.md section 2
alone (:func:`block_box`).  A partial source splits each element among the
classes of the partial axes so that the reduction is exact (small integers;
:func:`partial_values`); a target that keeps partial axes is checked by
reducing the gathered blocks of each group with numpy.  Kept sources must
be unchanged, donated ones are copies.  The ranks agree (an Allreduce)
that each prepared its blocks before any runs, and on the verdict after,
so all ranks fail together; an exception is a failure, named with its
type and message; only rank 0 prints.  A failure after data started to
move aborts the job (mpiredist's rule); ``--verbose`` then shows the case.
"""

import argparse
import itertools
import json
import math
import random
import re
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from mpiredist.core.layout import Layout
from mpiredist.runtime.failure import abort_on_exception

__all__ = ["DTYPES", "MOVED_ONLY", "ROUTES", "STRATEGIES", "Case", "Summary", "factorisations",
           "make_case", "block_box", "global_values", "partial_values", "reduce_shares",
           "run_case", "communicators", "free_communicators", "soak", "report", "main"]

DTYPES = ("float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
          "uint32", "uint64", "bool", "complex64", "complex128")
MOVED_ONLY = ("float16", ">i4", ">f8")     # no MPI reduction: sources without partial axes
MEMORY = ("c", "c", "c", "c", "c", "fortran", "strided", "readonly")   # the source block
ROUTES = ("redistribute", "transfer", "distarray", "distarray_")
STRATEGIES = ("collectives", "replicate", "direct")
WORKSPACES = (None, None, None, None, None, 0, 256, 4096, 65536)
BETWEEN = ("reorder", "refactor", "subset", "own")   # kinds of moves between meshes
MAX_ELEMENTS, BIG_ELEMENTS = 4096, 40000
_M1, _M2, _M3 = (np.uint64(v) for v in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9,
                                        0x94D049BB133111EB))


@dataclass(frozen=True)
class Case:
    """One random redistribution (a value; see :func:`make_case`)."""

    seed: int
    index: int
    size: int                   # ranks of COMM_WORLD
    comm_size: int              # the case's communicator: the first comm_size ranks
    src_axes: tuple             # ((name, size), ...)
    src_ranks: tuple            # device order on the communicator, or None: all, in order
    dst_axes: tuple             # the target mesh's axes, or None: the source mesh
    dst_ranks: tuple
    shape: tuple
    dtype: str
    src: str
    dst: str
    strategy: str
    route: str
    donate: bool
    workspace: int
    runs: int
    memory: str                 # the source block: C order, Fortran order, strided, read-only

    @property
    def between(self):
        """True if the case moves between meshes (``dst_mesh=`` or ``ranks=``)."""
        return self.dst_axes is not None or self.src_ranks is not None

    def __str__(self):
        def mesh(axes, ranks):
            text = ",".join(f"{n}={s}" for n, s in axes)
            return text + ("" if ranks is None else f" ranks={list(ranks)}")
        comm = "" if self.comm_size == self.size else f" on ranks 0-{self.comm_size - 1}"
        target = "" if self.dst_axes is None else \
            f" -> mesh {mesh(self.dst_axes, self.dst_ranks)}"
        runs = f" x{self.runs} into out=" if self.route == "transfer" else ""
        return (f"mesh {mesh(self.src_axes, self.src_ranks)}{target}{comm}: "
                f"{self.src} -> {self.dst}, shape {self.shape} {self.dtype}, route "
                f"{self.route}{runs}, strategy {self.strategy}, donate={self.donate}, "
                f"workspace_bytes={self.workspace}, {self.memory} source block")

    def replay(self):
        """The command that runs this case alone."""
        return (f"mpiexec -n {self.size} python -m benchmarks.soak --seed {self.seed} "
                f"--case {self.index}")


# ------------------------------------------------------------ case generation

@lru_cache(maxsize=64)
def factorisations(n, most=3):
    """Every ordered factorisation of ``n`` into 1 to ``most`` factors (1s included)."""
    return tuple(f for k in range(1, most + 1)
                 for f in itertools.product(range(1, n + 1), repeat=k) if math.prod(f) == n)


def _mesh_axes(rng, n, names):
    return tuple(zip(names, rng.choice(factorisations(n))))


def _ops(dtype):
    return ("sum", "prod") if np.dtype(dtype).kind == "c" else ("sum", "max", "min", "prod")


def _assign(rng, axes, ndim):
    """Dims for ``axes`` (shuffled: their order is major to minor); a quarter replicate."""
    dims = [[] for _ in range(ndim)]
    for a in axes:
        if ndim and rng.random() >= 0.25:
            dims[rng.randrange(ndim)].append(a)
    return dims


def _length(rng, k):
    r = rng.random()
    if r < 0.06:
        return 0
    if r < 0.26:
        return rng.randint(1, max(1, k - 1))        # fewer than the shards: empty blocks
    if r < 0.55:
        return k * rng.randint(1, 3)
    return rng.randint(1, 4 * k + 9)


def _meshes(rng, m):
    """``(src_axes, src_ranks, dst_axes, dst_ranks)`` of a case on ``m`` ranks."""
    src, dst = ("x", "y", "z"), ("a", "b", "c")
    if rng.random() >= 0.35:                        # one mesh on every rank
        return _mesh_axes(rng, m, src), None, None, None
    kind = rng.choice(BETWEEN)
    everyone = list(range(m))
    if kind == "refactor":                          # same ranks, in order: may nest
        return _mesh_axes(rng, m, src), None, _mesh_axes(rng, m, dst), None
    if kind == "reorder":
        first = None if rng.random() < 0.5 else tuple(rng.sample(everyone, m))
        return (_mesh_axes(rng, m, src), first, _mesh_axes(rng, m, dst),
                tuple(rng.sample(everyone, m)))
    a = tuple(rng.sample(everyone, rng.randint(1, m)))
    if kind == "own":                               # a subset mesh and itself
        return _mesh_axes(rng, len(a), src), a, None, None
    b = tuple(rng.sample(everyone, rng.randint(1, m)))
    if rng.random() < 0.3:
        a, b = (None, b) if rng.random() < 0.5 else (a, None)
    size = (lambda r: m if r is None else len(r))
    return _mesh_axes(rng, size(a), src), a, _mesh_axes(rng, size(b), dst), b


def make_case(seed, index, size):
    """Case ``index`` of ``seed`` at ``size`` ranks (pure: no other case matters).

    Examples
    --------
    >>> make_case(1, 7, 5) == make_case(1, 7, 5)
    True
    """
    rng = random.Random(f"mpiredist.soak:{seed}:{index}:{size}")
    m = size
    if size > 1 and rng.random() < 0.2:             # a sub-communicator; 4, 6, 8 likelier
        m = rng.choice([n for n in range(1, size) for _ in range(1 + (n in (4, 6, 8)))])
    src_axes, src_ranks, dst_axes, dst_ranks = _meshes(rng, m)
    dtype = rng.choice(DTYPES + MOVED_ONLY)
    ndim = rng.choices((0, 1, 2, 3), (1, 4, 5, 3))[0]
    names = [n for n, _ in src_axes]
    rng.shuffle(names)
    partial, op = [], "sum"
    if rng.random() < 0.35 and dtype in DTYPES:
        partial = [a for a in names if rng.random() < 0.5] or [names[0]]
        op = rng.choice(_ops(dtype))
    src = Layout(_assign(rng, [a for a in names if a not in partial], ndim), partial, op)
    targets = [n for n, _ in (dst_axes or src_axes)]
    rng.shuffle(targets)
    one_mesh = dst_axes is None and src_ranks is None  # the exchange reduces every axis
    kept = [a for a in partial if one_mesh and rng.random() < 0.3]
    dst = Layout(_assign(rng, [a for a in targets if a not in kept], ndim), kept, op)
    sizes = dict(src_axes + (dst_axes or ()))
    shards = [max(math.prod(sizes[a] for a in src.dims[d]),
                  math.prod(sizes[a] for a in dst.dims[d])) for d in range(ndim)]
    shape = [_length(rng, k) for k in shards]
    workspace = rng.choice(WORKSPACES)
    big = rng.random() < 0.08 and (workspace is None or workspace >= 4096) and ndim
    if big:                                         # pieces cut into parts, many messages
        d = rng.randrange(ndim)
        shape[d] = max(1, shape[d]) * rng.randint(50, 400)
    cap = BIG_ELEMENTS if big else MAX_ELEMENTS
    while math.prod(shape) > cap:
        d = shape.index(max(shape))
        shape[d] = shape[d] // 2
    route, strategy = rng.choice(ROUTES), rng.choice(STRATEGIES)
    donate = rng.random() < 0.4 or route == "distarray_"    # redistribute_ donates
    runs = rng.randint(2, 3) if route == "transfer" else 1
    return Case(seed, index, size, m, src_axes, src_ranks, dst_axes, dst_ranks, tuple(shape),
                dtype, str(src), str(dst), strategy, route, donate, workspace, runs,
                rng.choice(MEMORY))


# ------------------------------------------------------------------ the oracle

def block_box(shape, sizes, layout, coords):
    """``((lo, hi), ...)`` of the block at mesh ``coords`` (DESIGN.md section 2).

    Dim ``d`` over axes ``a1..am``: ``k`` = product of their sizes, ``p`` =
    mixed-radix index of the coordinates (``a1`` most significant), ``c =
    ceil(N / k)``, indices ``[p*c, min((p+1)*c, N))``.
    """
    box = []
    for n, axes in zip(shape, layout.dims):
        k, p = 1, 0
        for a in axes:
            k, p = k * sizes[a], p * sizes[a] + coords[a]
        c = -(-n // k)
        box.append((min(p * c, n), min((p + 1) * c, n)))
    return tuple(box)


def _flat(shape, box):
    """Flat C-order global index of every element of ``box``, as uint64 of its shape."""
    f = np.zeros([hi - lo for lo, hi in box], np.uint64)
    stride = 1
    for d in reversed(range(len(shape))):
        lo, hi = box[d]
        f += (np.arange(lo, hi, dtype=np.uint64) * np.uint64(stride)).reshape(
            [-1 if e == d else 1 for e in range(len(shape))])
        stride *= shape[d]
    return f


def _mix(f, salt):
    """A 64-bit hash of each index (splitmix64), as uint64."""
    with np.errstate(over="ignore"):
        x = f.reshape(-1) * _M1 + np.uint64(salt % 2**64) * _M2
        x ^= x >> np.uint64(31)
        x *= _M3
        x ^= x >> np.uint64(29)
    return x.reshape(f.shape)


def _real(kind, bits, small):
    """Exactly representable values: full range, or small for exact reductions."""
    if kind == "f":
        if small:
            return (bits % 101).astype(np.float64) - 50 + 0.5 * ((bits >> np.uint64(8)) & 1)
        return ((bits >> np.uint64(11)) % np.uint64(2**22)).astype(np.float64) / 4 - 2**19
    if kind == "i":
        return (bits % 101).astype(np.int64) - 50 if small else bits.astype(np.int64)
    return bits % 101 if small else bits


def global_values(dtype, f, salt, small=False):
    """The global array at flat indices ``f``: a hash of the index, in ``dtype``."""
    dtype = np.dtype(dtype)
    bits, small = _mix(f, salt), small or dtype.itemsize < 4 and dtype.kind == "f"
    if dtype.kind == "b":
        values = bits & np.uint64(1)
    elif dtype.kind == "c":
        values = _real("f", bits, small) + 1j * _real("f", _mix(f, salt + 1), small)
    else:
        values = _real(dtype.kind, bits, small)
    return np.asarray(values).astype(dtype).reshape(f.shape)


def partial_values(dtype, op, f, salt, q, classes):
    """Class ``q``'s share (of ``classes``) of the small global values at ``f``.

    One class per element (a hash) holds the value, the others what makes
    the reduction over all classes exactly it, with no partial result out
    of the dtype's range (MPI leaves overflow undefined: Open MPI's AVX
    reductions saturate 8- and 16-bit sums, MPICH wraps): for ``sum`` small
    random integers (unsigned: at most the value over the number of
    classes; the holder the value less their sum), for ``max`` (``min``)
    values at most (at least) it,
    for ``prod`` random units (the holder the value times their inverse).
    bool reduces as MPI's logical or (``sum``, ``max``) or and (``min``,
    ``prod``).
    """
    share = _share(np.dtype(dtype), op, f, salt, q, classes)
    return np.asarray(share).astype(dtype).reshape(f.shape)


def _share(dtype, op, f, salt, q, classes):
    kind, g = dtype.kind, global_values(dtype, f, salt, small=True)
    holder = _mix(f, salt + 2) % np.uint64(classes)
    bits = [_mix(f, salt + 3 + c) for c in range(classes)]
    if kind == "b":
        bit = (bits[q] & np.uint64(1)).astype(bool)
        return np.where(holder == q, g, g & bit if op in ("sum", "max") else g | bit)
    if op in ("max", "min"):
        step = (bits[q] % np.uint64(4)).astype(dtype)
        if op == "max":
            return np.where(holder == q, g, g - (np.minimum(step, g) if kind == "u" else step))
        return np.where(holder == q, g, g + step)
    if op == "sum":
        shares = [_draw_share(dtype, b) for b in bits]
        if kind == "u":
            shares = [np.minimum(share, g // classes) for share in shares]
        rest = np.zeros_like(g)
        for c, share in enumerate(shares):
            rest = rest + np.where(holder == c, 0, share).astype(dtype)
        return np.where(holder == q, g - rest, shares[q]).astype(dtype)
    units = np.array([1, -1, 1j, -1j] if kind == "c" else [1] if kind == "u" else [1, -1],
                     dtype)
    picks = [units[(b % np.uint64(len(units))).astype(np.intp)] for b in bits]
    inverse = np.ones_like(g)
    for c, unit in enumerate(picks):
        inverse = inverse * np.where(holder == c, 1, np.conj(unit)).astype(dtype)
    return np.where(holder == q, g * inverse, picks[q]).astype(dtype)


def _draw_share(dtype, bits):
    """A small random integer of ``dtype`` (0..3 unsigned, -3..3 otherwise)."""
    if dtype.kind == "u":
        return (bits % np.uint64(4)).astype(dtype)
    re = (bits % np.uint64(7)).astype(np.int64) - 3
    if dtype.kind == "c":
        return (re + 1j * ((bits >> np.uint64(8)) % np.uint64(7)).astype(np.int64) - 3j) \
            .astype(dtype)
    return re.astype(dtype)


_NUMPY_OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


def reduce_shares(dtype, op, shares):
    """numpy's reduction of ``shares`` in ``dtype``, as MPI defines ``op`` for it."""
    if np.dtype(dtype) == np.bool_:
        ufunc = np.logical_or if op in ("sum", "max") else np.logical_and
    else:
        ufunc = _NUMPY_OPS[op]
    return ufunc.reduce(np.stack(shares), axis=0, dtype=dtype)


# ---------------------------------------------------------- running and checking

def _device(ranks, rank, n):
    """Device index of communicator ``rank`` on a mesh of ``n`` devices, or None."""
    if ranks is None:
        return rank if rank < n else None
    return ranks.index(rank) if rank in ranks else None


def _coords(axes, device):
    return dict(zip([a for a, _ in axes], np.unravel_index(device, [s for _, s in axes])))


def _differs(got, want, exact):
    """Why ``got`` is not ``want`` (None if it is); bitwise where ``exact``."""
    if not isinstance(got, np.ndarray):
        return f"got {type(got).__name__}, expected an array of shape {want.shape}"
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"got shape {got.shape} {got.dtype}, expected {want.shape} {want.dtype}"
    same = (got.tobytes() == want.tobytes()) if exact else np.array_equal(got, want)
    if same:
        return None
    bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
    if not bad.size:
        return "equal values but other bits (signed zeros?)"
    first = int(bad[0])
    return (f"{bad.size} of {want.size} elements differ (first at flat {first}: got "
            f"{got.reshape(-1)[first]!r}, expected {want.reshape(-1)[first]!r})")


class _Run:
    """One rank's view of one case: its meshes, blocks and expected results."""

    def __init__(self, case, base):
        self.case, self.rank = case, base.Get_rank()
        self.salt = case.seed * 1_000_003 + case.index
        self.src, self.dst = Layout.parse(case.src), Layout.parse(case.dst)
        self.small = bool(self.src.partial)
        n = math.prod(s for _, s in case.src_axes)
        self.src_device = _device(case.src_ranks, self.rank, n)
        axes, ranks = (case.dst_axes, case.dst_ranks) if case.dst_axes else \
            (case.src_axes, case.src_ranks)
        self.dst_axes = axes
        self.dst_device = _device(ranks, self.rank, math.prod(s for _, s in axes))

    def source(self):
        """This rank's source block (its share of the partial sums), or None."""
        if self.src_device is None:
            return None
        c = self.case
        coords = _coords(c.src_axes, self.src_device)
        f = _flat(c.shape, block_box(c.shape, dict(c.src_axes), self.src, coords))
        if not self.src.partial:
            return global_values(c.dtype, f, self.salt)
        sizes = dict(c.src_axes)
        q = 0
        for a in self.src.partial:
            q = q * sizes[a] + int(coords[a])
        classes = math.prod(sizes[a] for a in self.src.partial)
        return partial_values(c.dtype, self.src.op, f, self.salt, q, classes)

    def target_coords(self):
        return None if self.dst_device is None else _coords(self.dst_axes, self.dst_device)

    def expected(self, coords):
        c = self.case
        f = _flat(c.shape, block_box(c.shape, dict(self.dst_axes), self.dst, coords))
        return global_values(c.dtype, f, self.salt, self.small)


def _stored(block, memory):
    """A copy of ``block`` in the case's memory order (C, Fortran, strided, read-only)."""
    if memory == "fortran":
        return np.array(block, order="F")
    if memory == "strided" and block.ndim:
        room = np.zeros(block.shape[:-1] + (2 * block.shape[-1],), block.dtype)
        room[..., ::2] = block
        return room[..., ::2]
    copy = block.copy()
    copy.flags.writeable = memory != "readonly"
    return copy


def _route(mr, case, meshes, source, blocks, tamper):
    """Run the case's route; return ``(results, problems)`` of this rank.

    ``blocks``: the copies of ``source`` that the route passes, taken off the
    list one by one, so that a donated block has no other reference.
    """
    c, (mesh, target) = case, meshes
    kw = dict(strategy=c.strategy, workspace_bytes=c.workspace)
    dst_mesh = target if c.dst_axes is not None else None
    block = None if c.donate else blocks[0]         # kept: checked afterwards
    results, problems = [], []
    if c.route == "redistribute":
        local = blocks.pop()
        results.append(mr.redistribute(local, c.shape, mesh, c.src, c.dst, donate=c.donate,
                                       dst_mesh=dst_mesh, **kw))
        del local
    elif c.route == "transfer":
        with mr.Transfer(c.shape, c.dtype, mesh, c.src, c.dst, donate=c.donate,
                         dst_mesh=dst_mesh, **kw) as t:
            out = None if t.target_shape is None else np.empty(t.target_shape, c.dtype)
            for k in range(c.runs):
                local = blocks.pop() if c.donate else block
                got = t.run(local, out=out)
                del local
                if out is not None and got is not out:
                    problems.append(f"run {k}: Transfer.run(out=out) did not return out")
                results.append(got.copy() if isinstance(got, np.ndarray) else got)
    else:
        local = blocks.pop()
        a = mr.DistArray.from_local(local, mesh, c.src, c.shape)
        del local
        if c.route == "distarray":
            b = a.redistribute(c.dst, donate=c.donate, mesh=dst_mesh, **kw)
            if c.donate and a.local is not None:
                problems.append("the donating DistArray still has a block")
            if not c.donate and a.local is not block:
                problems.append("the source DistArray's block was replaced")
        else:
            b = a.redistribute_(c.dst, mesh=dst_mesh, **kw)
            if b is not a:
                problems.append("redistribute_ did not return its DistArray")
        if b.layout != Layout.parse(c.dst) or b.shape != c.shape:
            problems.append(f"result has layout {b.layout} shape {b.shape}")
        if (b.mesh.axes, b.mesh.ranks) != (target.axes, target.ranks):
            problems.append(f"result has mesh {b.mesh!r}, expected {target!r}")
        results.append(b.local)
    if block is not None and block.tobytes() != source.tobytes():
        problems.append("the kept source block was modified")
    if tamper is not None:
        results = [tamper(r) for r in results]
    return results, problems


def _prepare(mr, case, base):
    """``(run, meshes, source, blocks)`` of this rank (raises only on a bug of the soak)."""
    run = _Run(case, base)
    comm = None if case.comm_size == case.size else base
    mesh = mr.Mesh(dict(case.src_axes), comm=comm, ranks=case.src_ranks)
    target = mesh if case.dst_axes is None else \
        mr.Mesh(dict(case.dst_axes), comm=comm, ranks=case.dst_ranks)
    source = run.source()
    copies = case.runs if case.donate and case.route == "transfer" else 1
    blocks = [None if source is None else _stored(source, case.memory) for _ in range(copies)]
    return run, (mesh, target), source, blocks


def run_case(world, case, comms, tamper=None):
    """Run ``case`` and check it on this rank of ``world``; return its problems (text).

    Collective on ``world``: the ranks agree that every rank prepared its
    blocks (so a bug of the soak cannot leave a rank waiting), then the
    ranks of the case's communicator run it, then a target that keeps
    partial axes is checked by every rank.  ``comms`` maps a communicator
    size to this rank's communicator (None outside it).  ``tamper``, for
    tests of the soak itself, is applied to every result.
    """
    import mpiredist as mr
    from mpi4py import MPI

    base = comms[case.comm_size]
    results, problems, run = [], [], None
    try:
        if base is not None:
            run, meshes, source, blocks = _prepare(mr, case, base)
    except Exception as exc:
        problems.append(f"the soak could not prepare the case: {type(exc).__name__}: {exc}")
    if world.allreduce(int(bool(problems)), op=MPI.MAX):
        return problems or ["another rank could not prepare the case"]
    if base is not None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")     # DonationWarning, BudgetWarning: legal
                results, problems = _route(mr, case, meshes, source, blocks, tamper)
        except Exception as exc:                    # a legal case raises nowhere
            problems.append(f"{type(exc).__name__}: {exc}")
            results = []
    kept = Layout.parse(case.dst).partial
    for k in range(case.runs):
        got = results[k] if k < len(results) else None
        if kept:                                    # collective: every rank, every run
            problems += _check_kept(world, run, got, kept, k)
        elif run is not None and len(results) == case.runs:
            problems += _check(run, got, k)
    return problems


def _check(run, got, k):
    coords = run.target_coords()
    label = f"run {k}: " if run.case.runs > 1 else ""
    if coords is None:
        return [] if got is None else [f"{label}outside the target mesh, got a block"]
    why = _differs(got, run.expected(coords), exact=not run.small)
    return [] if why is None else [f"{label}target block: {why}"]


def _check_kept(world, run, got, kept, k):
    """Reduce each group's target blocks over the kept partial axes and compare."""
    coords = None if run is None else run.target_coords()
    mine = None if coords is None or not isinstance(got, np.ndarray) else \
        (tuple(int(coords[a]) for a in sorted(coords) if a not in kept), got)
    everyone = world.allgather(mine)
    if coords is None:
        return [] if run is None or got is None else [f"run {k}: off the target, got a block"]
    if not isinstance(got, np.ndarray):
        return [f"run {k}: got {type(got).__name__}"]
    sizes = dict(run.dst_axes)
    group = [e[1] for e in everyone if e is not None and e[0] == mine[0]]
    if len(group) != math.prod(sizes[a] for a in kept):
        return [f"run {k}: {len(group)} blocks of this rank's group over {kept} came back"]
    if len({(b.shape, b.dtype) for b in group}) != 1:
        return [f"run {k}: the blocks of a group differ in shape or dtype"]
    total = np.asarray(reduce_shares(run.case.dtype, run.src.op, group))
    why = _differs(total, run.expected(coords), exact=False)
    return [] if why is None else [f"run {k}: target reduced over {kept}: {why}"]


@dataclass
class Summary:
    """What a soak found: counts, failures (rank 0: with every rank's problems), time."""

    seed: int
    ranks: int
    passed: int
    failures: list
    seconds: float


def communicators(world):
    """This rank's communicator of each size m: the first m ranks (collective).

    A dict ``{m: comm or None}`` (None outside); ``world`` itself for its size.
    """
    from mpi4py import MPI

    comms, P, me = {world.Get_size(): world}, world.Get_size(), world.Get_rank()
    for m in range(1, P):
        sub = world.Split(0 if me < m else MPI.UNDEFINED, me)
        comms[m] = None if sub == MPI.COMM_NULL else sub
    return comms


def free_communicators(comms, world):
    """Free the communicators of :func:`communicators` (not ``world``)."""
    for c in comms.values():
        if c is not None and c is not world:
            c.Free()


def soak(world, seed, indices, tamper=None, verbose=False, stream=None, comms=None):
    """Run and check the cases ``indices`` of ``seed`` on ``world`` (collective).

    ``comms``: the communicators of :func:`communicators` to run on (kept);
    by default they are made here and freed at the end.  ``tamper`` (tests
    of the soak) is applied to each result before it is checked.
    """
    from mpi4py import MPI

    stream, me = stream or sys.stdout, world.Get_rank()
    own = comms is None
    comms = communicators(world) if own else comms
    passed, failures, start = 0, [], time.perf_counter()
    try:
        for k in indices:
            case = make_case(seed, k, world.Get_size())
            if verbose and me == 0:
                print(f"case {k}: {case}", file=stream, flush=True)
            problems = run_case(world, case, comms, tamper)
            if not world.allreduce(int(bool(problems)), op=MPI.MAX):
                passed += 1
                continue
            found = world.gather(problems, root=0)
            failures.append((case, {} if found is None else
                             {r: p for r, p in enumerate(found) if p}))
    finally:
        if own:
            free_communicators(comms, world)
    return Summary(seed, world.Get_size(), passed, failures, time.perf_counter() - start)


def _kind(problem):
    """A problem's text without its values (bracketed, quoted, numbers), to count alike ones."""
    text, before = problem, None
    while text != before:
        before, text = text, re.sub(r"\([^()]*\)|\[[^][]*\]|\{[^{}]*\}|'[^']*'", "", text)
    return re.sub(r"\s+", " ", re.sub(r"\d+", "N", text)).strip()


def report(summary, library=""):
    """The text rank 0 prints: one line per failure, then the summary line."""
    lines = []
    for case, problems in summary.failures:
        lines.append(f"FAIL seed {case.seed} case {case.index}: {case}")
        lines.append(f"  replay: {case.replay()}")
        for rank, found in problems.items():
            lines += [f"  rank {rank}: {p}" for p in found]
    kinds = Counter(_kind(p) for _, problems in summary.failures
                    for p in {_kind(p) for found in problems.values() for p in found})
    if kinds:
        lines.append("failures by problem: " + "; ".join(f"{n} x {k!r}"
                                                        for k, n in kinds.most_common()))
    n = summary.passed + len(summary.failures)
    lines.append(f"soak: seed {summary.seed}, {n} case(s) at {summary.ranks} ranks: "
                 f"{summary.passed} passed, {len(summary.failures)} failed in "
                 f"{summary.seconds:.1f} s{'; ' + library if library else ''}")
    return "\n".join(lines)


def main(argv=None, comm=None):
    """Run the soak on ``comm`` (default COMM_WORLD); 0 if every case passed."""
    from mpiredist.runtime.mpi import mpi

    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=100, help="cases 0..N-1 (default 100)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--case", type=int, default=None, help="run only case K of the seed")
    parser.add_argument("--json", default=None, metavar="FILE")
    parser.add_argument("--verbose", action="store_true", help="print each case before it runs")
    args = parser.parse_args(argv)
    MPI = mpi()
    world = comm or MPI.COMM_WORLD
    indices = range(args.cases) if args.case is None else [args.case]
    comms = communicators(world)
    summary = soak(world, args.seed, indices, verbose=args.verbose, comms=comms)
    if world.Get_rank() == 0:
        library = " ".join(MPI.Get_library_version().splitlines()[0].split(",")[0].split())
        print(report(summary, library), flush=True)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"seed": summary.seed, "ranks": summary.ranks, "library": library,
                           "passed": summary.passed, "failed": len(summary.failures),
                           "seconds": summary.seconds,
                           "failures": [{"case": c.index, "description": str(c),
                                         "replay": c.replay(), "problems": p}
                                        for c, p in summary.failures]}, f, indent=1)
    world.Barrier()                     # report first: a crash while freeing must not lose it
    free_communicators(comms, world)
    return 0 if not summary.failures else 1


if __name__ == "__main__":
    sys.exit(abort_on_exception(main))   # a failure on any rank ends the job
