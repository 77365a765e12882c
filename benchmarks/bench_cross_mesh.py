"""Redistribution between meshes: mpiredist against gather/scatter, broadcasts and the bare bytes.

    mpiexec -n 8 python -m benchmarks.bench_cross_mesh [--size 1] [--repeats 5]
        [--cases x01,x03] [--json FILE] [--explain]

The cases are those of ``cross_cases.json`` (packaged in
``mpiredist/bench/data``), each written relative to P, the number of ranks
(:func:`instantiate`; the file's ``about`` gives the little expression
language).  A case that does not fit P (a division that is not whole, an
axis of size 0, a mesh that needs more ranks) is skipped with the reason.
Every rank builds its source block from its box
(:func:`mpiredist.planning.pieces.layout_boxes`) and knows its expected
target block; for each case, interleaved in one loop with a barrier before
each call, it times:

``mpiredist``      ``Transfer(shape, dtype, src_mesh, src, dst,
                   dst_mesh=dst_mesh)`` made once (not timed), then
                   ``t.run(local)``: the refined mesh's collective plan
                   (executor ``out of place`` / ``in place``) where the
                   meshes nest, else the point-to-point ``exchange``;
``gather_scatter`` the whole array gathered on the source mesh's first
                   rank, the root (one ``Gatherv`` of bytes from the first
                   holder of each distinct source block; the root copies a
                   block it holds itself) and reassembled there, then every
                   target block packed and sent with one ``Scatterv`` (the
                   root copies its own);
``bcast``          what RL weight-refit code does: for each distinct source
                   block, one ``Bcast`` from its first holder to every rank,
                   and each target rank copies out what it needs;
``raw``            the bare bytes: one ``Alltoallv`` on contiguous byte
                   buffers (made before timing, filled once) with exactly
                   the per-pair counts of the exchange's totals: target q
                   receives the overlap of each distinct source box with
                   its target box, nothing where q holds that box itself,
                   else all of it from the box's first holder (the
                   exchange splits such a piece among all holders instead,
                   so its pairs differ but its total is the same); no
                   packing, no self part.

"Distinct source block": ranks replicated over a mesh axis hold the same
box; the *first holder* is the lowest rank among them.  A time is the
largest over ranks; the table gives medians over ``--repeats``, and
``x raw`` each against ``raw`` (``-`` where raw moves nothing).  Columns:

``peak B``      bytes newly allocated at the peak of one untimed run
                (tracemalloc, :func:`mpiredist.bench.measure.traced_peak`;
                the result included), max over ranks; raw: its two buffers;
``/(S,T)+W``    the largest over ranks of peak / (max(S, T) + W): S and T
                this rank's source and target block bytes (0 off a mesh),
                W the mpiredist Transfer's ``workspace_bytes`` (the memory
                contract of mpiredist; the other strategies are measured
                against the same figure);
``sent B``      bytes sent to other ranks per run, summed over ranks:
                mpiredist's exchange plan (``t.plan.bytes_total``) or, on
                the refined route, the StepRecords of a run; gather_scatter
                the gathered blocks not on the root plus the target blocks
                not on the root; bcast each broadcast block times P - 1
                (what the other ranks receive); raw its counts;
``check``       every rank's result against its expected block (``ok`` or
                ``FAIL``; rank 0 returns 1 on any FAIL); raw: the received
                bytes against the expected target pieces.

Only rank 0 prints.  ``--explain`` also prints each mpiredist Transfer's
``explain()``.
"""

import argparse
import ast
import json
import math
import operator
import sys
from dataclasses import dataclass
from importlib import resources

import numpy as np

from mpiredist.runtime.failure import abort_on_exception
from mpiredist.core.blocks import sub_index
from mpiredist.planning.pieces import layout_boxes
from mpiredist.runtime.timing import slowest_medians

__all__ = ["Unfit", "CrossCase", "Concrete", "evaluate", "parse_ranks", "load_cross_cases",
           "instantiate", "block_values", "measure", "run", "format_rows", "main"]

STRATEGIES = ("mpiredist", "gather_scatter", "bcast", "raw")
DEFAULT_SIZE = 1.0
FILE = "cross_cases.json"


# ------------------------------------------------------------------ cases

class Unfit(ValueError):
    """A case that does not fit this number of ranks; the message says why."""


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_CALLS = {"min": min, "max": max}


def evaluate(expr, P):
    """The integer ``expr`` (an int or a string in P) at ``P`` ranks.

    Integers, ``P``, ``+ - * // %``, unary minus, parentheses, ``min`` and
    ``max``, and ``/``, which must divide exactly (else :class:`Unfit`).

    >>> evaluate("P/2", 8), evaluate("3*P//4", 6), evaluate("max(1, P-3)", 2)
    (4, 4, 1)
    """
    if isinstance(expr, bool):
        raise ValueError(f"expression {expr!r} is not an integer")
    if isinstance(expr, int):
        return expr
    if not isinstance(expr, str):
        raise ValueError(f"expression {expr!r} is neither an integer nor a string")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"expression {expr!r} does not parse") from None

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name) and node.id == "P":
            return P
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Div):
                if b == 0 or a % b:
                    raise Unfit(f"{expr} = {a}/{b} is not a whole number at P={P}")
                return a // b
            if type(node.op) in _BINARY:
                if b == 0 and isinstance(node.op, (ast.FloorDiv, ast.Mod)):
                    raise Unfit(f"{expr} divides by zero at P={P}")
                return _BINARY[type(node.op)](a, b)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in _CALLS and node.args and not node.keywords:
            return _CALLS[node.func.id](ev(a) for a in node.args)
        raise ValueError(f"expression {expr!r}: {ast.dump(node)} is not allowed "
                         "(integers, P, + - * / // %, parentheses, min, max)")

    return ev(tree)


def _split_top(text):
    """``text`` split at the commas outside parentheses."""
    parts, depth, cur = [], 0, []
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def parse_ranks(spec, P):
    """Ranks of a spec at ``P`` ranks: None for ``"all"`` (or None), else a tuple.

    Items are comma-separated: an expression (one rank) or ``A:B[:S]``, the
    ranks ``range(A, B, S)``.

    >>> parse_ranks("P-1:-1:-1", 4), parse_ranks("0, P/2:P", 4), parse_ranks("all", 4)
    ((3, 2, 1, 0), (0, 2, 3), None)
    """
    if spec is None or (isinstance(spec, str) and spec.strip() == "all"):
        return None
    if isinstance(spec, list):
        return tuple(evaluate(x, P) for x in spec)
    if isinstance(spec, int) and not isinstance(spec, bool):
        return (spec,)
    out = []
    for item in _split_top(str(spec)):
        bounds = item.split(":")
        if len(bounds) == 1:
            out.append(evaluate(item, P))
        elif len(bounds) in (2, 3):
            start, stop = evaluate(bounds[0], P), evaluate(bounds[1], P)
            step = evaluate(bounds[2], P) if len(bounds) == 3 else 1
            if step == 0:
                raise ValueError(f"ranks {spec!r}: step 0 in {item!r}")
            out.extend(range(start, stop, step))
        else:
            raise ValueError(f"ranks {spec!r}: expected A or A:B[:S], found {item!r}")
    return tuple(out)


@dataclass(frozen=True)
class CrossCase:
    """One case of ``cross_cases.json``, still relative to P."""

    id: str
    description: str
    shape: tuple
    dtype: str
    src: dict
    dst: dict

    @property
    def short_id(self):
        """The case number, e.g. ``"x03"`` for ``"x03_train_to_infer"``."""
        return self.id.split("_")[0]

    @classmethod
    def from_dict(cls, spec):
        for side in ("src", "dst"):
            missing = {"mesh", "layout"} - set(spec[side])
            if missing:
                raise ValueError(f"case {spec['id']}: {side} lacks {sorted(missing)}")
        return cls(spec["id"], spec.get("description", ""), tuple(spec["shape"]),
                   spec.get("dtype", "float32"), dict(spec["src"]), dict(spec["dst"]))


@dataclass(frozen=True)
class Concrete:
    """A case at P ranks: shape, dtype, and per side (axes, ranks or None, layout)."""

    case: CrossCase
    P: int
    shape: tuple
    dtype: np.dtype
    src_axes: tuple
    src_ranks: tuple
    src: object
    dst_axes: tuple
    dst_ranks: tuple
    dst: object

    def meshes(self, comm=None):
        from mpiredist.core.mesh import Mesh
        return (Mesh(self.src_axes, comm, self.src_ranks),
                Mesh(self.dst_axes, comm, self.dst_ranks))


def load_cross_cases():
    """The cases of ``cross_cases.json`` (packaged with mpiredist), in file order."""
    text = resources.files("mpiredist.bench").joinpath("data", FILE).read_text(encoding="utf-8")
    return [CrossCase.from_dict(c) for c in json.loads(text)["cases"]]


def _side(case, which, P):
    from mpiredist.core.layout import Layout
    spec = getattr(case, which)
    axes = tuple((str(name), evaluate(size, P)) for name, size in spec["mesh"].items())
    for name, size in axes:
        if size < 1:
            raise Unfit(f"{which} axis {name} would have size {size}")
    n = math.prod(s for _, s in axes)
    ranks = parse_ranks(spec.get("ranks"), P)
    if ranks is None:
        if n != P:
            raise Unfit(f"{which} mesh of {n} devices over all {P} ranks")
    else:
        if len(ranks) != n:
            raise Unfit(f"{which} mesh of {n} devices given {len(ranks)} ranks {list(ranks)}")
        if any(not 0 <= r < P for r in ranks):
            raise Unfit(f"{which} ranks {list(ranks)} outside 0..{P - 1}")
        if len(set(ranks)) != len(ranks):
            raise Unfit(f"{which} ranks {list(ranks)} repeat")
    layout = spec["layout"]
    layout = Layout.from_dict(layout) if isinstance(layout, dict) else Layout.parse(layout)
    if layout.partial:
        raise ValueError(f"case {case.id}: partial layouts are not supported here")
    return axes, ranks, layout


def instantiate(case, P, size=1.0):
    """``case`` at ``P`` ranks and ``--size`` (a :class:`Concrete`), or :class:`Unfit`.

    Each length is multiplied by ``size ** (1 / ndim)`` (rounded, at least 1),
    so the bytes scale by about ``size``.
    """
    shape = tuple(evaluate(n, P) for n in case.shape)
    if any(n < 0 for n in shape):
        raise Unfit(f"shape {list(shape)} has a negative length")
    f = size ** (1 / max(1, len(shape)))
    shape = tuple(max(1, round(n * f)) if n else 0 for n in shape)
    sa, sr, sl = _side(case, "src", P)
    da, dr, dl = _side(case, "dst", P)
    c = Concrete(case, P, shape, np.dtype(case.dtype), sa, sr, sl, da, dr, dl)
    sm, dm = c.meshes()
    layout_boxes(shape, sm, sl, P)           # a layout that does not fit its mesh: an error
    layout_boxes(shape, dm, dl, P)
    return c


def select(cases, ids):
    """The cases named by ``ids`` (full ids or numbers), in file order; KeyError if unknown."""
    if not ids:
        return list(cases)
    known = {k for c in cases for k in (c.id, c.short_id)}
    bad = [i for i in ids if i not in known]
    if bad:
        raise KeyError(f"no cross-mesh case {', '.join(bad)}; the cases are "
                       f"{', '.join(c.short_id for c in cases)}")
    return [c for c in cases if c.id in ids or c.short_id in ids]


# ------------------------------------------------------------------ data

def block_values(shape, box, dtype):
    """The global array's values at ``box``: a hash of the flat index, exact in float32."""
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    dims = tuple(hi - lo for lo, hi in box)
    flat = np.zeros(dims, np.int64)
    for d, (lo, hi) in enumerate(box):
        idx = np.arange(lo, hi, dtype=np.int64) * strides[d]
        flat += idx.reshape((-1,) + (1,) * (len(box) - d - 1))
    return ((flat * 40503) % 16777213).astype(dtype)


def _size(box):
    return 0 if box is None else math.prod(hi - lo for lo, hi in box)


class Geometry:
    """Every rank's boxes and the first holder of each distinct source box (pure)."""

    def __init__(self, c):
        P = c.P
        self.shape, self.itemsize = c.shape, c.dtype.itemsize
        sm, dm = c.meshes()
        self.sboxes = layout_boxes(c.shape, sm, c.src, P)
        self.tboxes = layout_boxes(c.shape, dm, c.dst, P)
        holders = {}
        for r, box in enumerate(self.sboxes):
            if box is not None:
                holders.setdefault(box, []).append(r)
        self.holders = holders
        # (first holder, box), in rank order; empty boxes move nothing
        self.blocks = sorted((rs[0], box) for box, rs in holders.items() if _size(box))
        self.replicated = any(len(rs) > 1 for box, rs in holders.items() if _size(box))
        self.root = sm.device_ranks()[0]
        self.P = P

    def pairs(self):
        """``counts[p][q]``: bytes p sends q in ``raw`` (its pieces: ``(p, q, box)``)."""
        P = self.P
        counts = np.zeros((P, P), np.int64)
        pieces = []
        for q, tbox in enumerate(self.tboxes):
            if not _size(tbox):
                continue
            for h, box in self.blocks:
                if q in self.holders[box]:
                    continue
                part = _overlap(box, tbox)
                if part is not None:
                    counts[h, q] += _size(part) * self.itemsize
                    pieces.append((h, q, part))
        return counts, pieces


def _overlap(a, b):
    out = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b))
    return None if any(lo >= hi for lo, hi in out) else out


def _bytes(a):
    return a.reshape(-1).view(np.uint8)


# ------------------------------------------------------------ strategies

class Mpiredist:
    """``Transfer`` between the meshes, made once; a run is ``t.run(local)``."""

    name = "mpiredist"

    def __init__(self, comm, c, geo, local):
        import mpiredist as mr
        sm, dm = c.meshes(comm)
        self.t = mr.Transfer(c.shape, c.dtype, sm, c.src, c.dst, dst_mesh=dm)
        self.local = local
        self.route = self.t.executor
        self.records = []

    def run(self):
        return self.t.run(self.local)

    def first(self):
        """The checked run: on the refined route it also collects StepRecords."""
        if self.route == "exchange":
            return self.t.run(self.local)
        self.records = []
        return self.t.run(self.local, records=self.records)

    def bytes_sent(self, comm):
        if self.route == "exchange":
            return int(self.t.plan.bytes_total)
        return int(comm.allreduce(sum(r.bytes_sent for r in self.records)))

    def free(self):
        self.t.free()


class _Reference:
    """What the reference strategies share: no separate first run, counted
    bytes, nothing to free."""

    def first(self):
        return self.run()

    def bytes_sent(self, comm):
        return self.sent

    def free(self):
        pass


class GatherScatter(_Reference):
    """Gatherv of every distinct source block to the root, reassemble, Scatterv."""

    name = "gather_scatter"

    def __init__(self, comm, c, geo, local):
        self.comm, self.geo, self.local, self.dtype = comm, geo, local, c.dtype
        rank, root, item = comm.rank, geo.root, c.dtype.itemsize
        P = comm.size
        # the root gathers a block it holds from itself, others from their first holder
        self.blocks = [(root if root in geo.holders[box] else h, box) for h, box in geo.blocks]
        self.send_own = any(h == rank != root for h, _ in self.blocks)
        g = np.zeros(P, np.int64)
        for h, box in self.blocks:
            if h != root:
                g[h] = _size(box) * item
        s = np.zeros(P, np.int64)
        for q, box in enumerate(geo.tboxes):
            if q != root:
                s[q] = _size(box) * item
        self.gcounts, self.gdispls = g, np.concatenate([[0], np.cumsum(g)[:-1]])
        self.scounts, self.sdispls = s, np.concatenate([[0], np.cumsum(s)[:-1]])
        self.sent = int(g.sum() + s.sum())
        self.empty = np.empty(0, np.uint8)

    def run(self):
        from mpi4py import MPI
        comm, geo, rank, root = self.comm, self.geo, self.comm.rank, self.geo.root
        B = MPI.BYTE
        send = [_bytes(self.local), B] if self.send_own else [self.empty, B]
        out = None
        tbox = geo.tboxes[rank]
        if rank == root:
            buf = np.empty(int(self.gcounts.sum()), np.uint8)
            comm.Gatherv(send, [buf, (self.gcounts, self.gdispls), B], root)
            whole = np.empty(geo.shape, self.dtype)
            for h, box in self.blocks:
                dims = tuple(b - a for a, b in box)
                if h == root:
                    whole[tuple(slice(a, b) for a, b in box)] = self.local
                else:
                    at = int(self.gdispls[h])
                    whole[tuple(slice(a, b) for a, b in box)] = \
                        buf[at:at + int(self.gcounts[h])].view(self.dtype).reshape(dims)
            del buf
            pack = np.empty(int(self.scounts.sum()), np.uint8)
            for q, box in enumerate(geo.tboxes):
                if q != root and self.scounts[q]:
                    at = int(self.sdispls[q])
                    dst = pack[at:at + int(self.scounts[q])].view(self.dtype)
                    dst.reshape(tuple(b - a for a, b in box))[...] = \
                        whole[tuple(slice(a, b) for a, b in box)]
            if tbox is not None:
                out = whole[tuple(slice(a, b) for a, b in tbox)].copy()
            del whole
            comm.Scatterv([pack, (self.scounts, self.sdispls), B], [self.empty, B], root)
        else:
            comm.Gatherv(send, None, root)
            if tbox is not None:
                out = np.empty(tuple(b - a for a, b in tbox), self.dtype)
                comm.Scatterv(None, [_bytes(out), B], root)
            else:
                comm.Scatterv(None, [self.empty, B], root)
        return out



class Bcast(_Reference):
    """One Bcast per distinct source block from its first holder; targets copy out."""

    name = "bcast"

    def __init__(self, comm, c, geo, local):
        self.comm, self.geo, self.local, self.dtype = comm, geo, local, c.dtype
        self.sent = sum(_size(box) for _, box in geo.blocks) * c.dtype.itemsize * (comm.size - 1)

    def run(self):
        from mpi4py import MPI
        comm, geo, rank = self.comm, self.geo, self.comm.rank
        tbox = geo.tboxes[rank]
        out = None if tbox is None else np.empty(tuple(b - a for a, b in tbox), self.dtype)
        for h, box in geo.blocks:
            buf = self.local if rank == h else np.empty(tuple(b - a for a, b in box), self.dtype)
            comm.Bcast([_bytes(buf), MPI.BYTE], root=h)
            if out is not None:
                part = _overlap(box, tbox)
                if part is not None:
                    out[sub_index(tbox, part)] = buf[sub_index(box, part)]
            del buf
        return out



class Raw(_Reference):
    """One bare ``Alltoallv`` of the exchange's per-pair bytes (see the module doc)."""

    name = "raw"

    def __init__(self, comm, c, geo, local):
        rank = comm.rank
        counts, pieces = geo.pairs()
        self.comm, self.sent = comm, int(counts.sum())
        self.scounts, self.rcounts = counts[rank].copy(), counts[:, rank].copy()
        self.sdispls = np.concatenate([[0], np.cumsum(self.scounts)[:-1]])
        self.rdispls = np.concatenate([[0], np.cumsum(self.rcounts)[:-1]])
        self.send = np.empty(int(self.scounts.sum()), np.uint8)
        self.recv = np.empty(int(self.rcounts.sum()), np.uint8)
        self.mine = [(h, q, part) for h, q, part in pieces if h == rank or q == rank]
        sbox = geo.sboxes[rank]
        for h, q, part in self.mine:            # fill once, so that the check means something
            if h == rank:
                at = int(self.sdispls[q])
                view = self.send[at:at + int(self.scounts[q])].view(c.dtype)
                view.reshape(tuple(b - a for a, b in part))[...] = local[sub_index(sbox, part)]
        self.dtype, self.tbox = c.dtype, geo.tboxes[rank]

    def run(self):
        from mpi4py import MPI
        B = MPI.BYTE
        self.comm.Alltoallv([self.send, (self.scounts, self.sdispls), B],
                            [self.recv, (self.rcounts, self.rdispls), B])

    def check(self, expected):
        """True if every received piece is the expected target's bytes there."""
        rank = self.comm.rank
        for h, q, part in self.mine:
            if q == rank:
                at = int(self.rdispls[h])
                got = self.recv[at:at + _size(part) * self.dtype.itemsize].view(self.dtype)
                if not np.array_equal(got, expected[sub_index(self.tbox, part)].reshape(-1)):
                    return False
        return True

    def free(self):
        self.send = self.recv = None


KINDS = {k.name: k for k in (Mpiredist, GatherScatter, Bcast, Raw)}


# ------------------------------------------------------------ measuring

def _same(got, want):
    if want is None:
        return got is None
    return got is not None and got.shape == want.shape and got.dtype == want.dtype \
        and np.array_equal(got, want)


def measure(comm, c, repeats, explain=False):
    """The rows of one case (collective): one per strategy, agreed on every rank."""
    from mpi4py import MPI

    from mpiredist.bench.measure import traced_peak

    geo = Geometry(c)
    rank = comm.rank
    sbox, tbox = geo.sboxes[rank], geo.tboxes[rank]
    local = None if sbox is None else block_values(c.shape, sbox, c.dtype)
    expected = None if tbox is None else block_values(c.shape, tbox, c.dtype)
    S = 0 if local is None else local.nbytes
    T = 0 if expected is None else expected.nbytes

    made, checks, peaks, text = {}, {}, {}, None
    for name in STRATEGIES:
        if name == "raw":
            with traced_peak() as e:                  # raw's peak: its two buffers
                made[name] = Raw(comm, c, geo, local)
                made[name].first()
            peaks[name] = e.bytes
            checks[name] = made[name].check(expected)
            continue
        made[name] = KINDS[name](comm, c, geo, local)
        out = made[name].first()                      # warm-up, checked
        checks[name] = _same(out, expected)
        del out
        with traced_peak() as e:
            out = made[name].run()
        peaks[name] = e.bytes
        del out
    t = made["mpiredist"].t
    W = int(t.workspace_bytes)
    if explain:
        text = t.explain()

    medians = slowest_medians(comm, {k: made[k].run for k in STRATEGIES}, repeats,
                              seed=None)     # interleaved, the same order everywhere
    sent = {k: made[k].bytes_sent(comm) for k in STRATEGIES}
    route = made["mpiredist"].route
    for k in STRATEGIES:
        made[k].free()
    raw_moves = sent["raw"] > 0 and medians["raw"] > 0
    rows = []
    sm, dm = c.meshes()
    for k in STRATEGIES:
        ok = comm.allreduce(bool(checks[k]), op=MPI.LAND)
        rows.append({
            "case": c.case.id, "strategy": k, "route": route,
            "shape": list(c.shape), "dtype": str(c.dtype),
            "src_mesh": str(sm), "src": str(c.src), "dst_mesh": str(dm), "dst": str(c.dst),
            "source_replicated": geo.replicated,
            "median_s": medians[k],
            "ratio_to_raw": medians[k] / medians["raw"] if raw_moves else None,
            "peak_bytes": int(comm.allreduce(peaks[k], op=MPI.MAX)),
            "peak_ratio": float(comm.allreduce(peaks[k] / max(1, max(S, T) + W), op=MPI.MAX)),
            "workspace_bytes": W,
            "block_bytes": int(comm.allreduce(max(S, T), op=MPI.MAX)),
            "bytes_sent": int(sent[k]),
            "check": "ok" if ok else "FAIL"})
    return rows, text


def run(comm, ids=None, size=DEFAULT_SIZE, repeats=5, explain=False, say=print):
    """``(rows, skipped)`` of every selected case at ``comm.size`` ranks (collective)."""
    rows, skipped = [], []
    for case in select(load_cross_cases(), ids):
        try:
            c = instantiate(case, comm.size, size)
        except Unfit as exc:
            skipped.append({"case": case.id, "reason": str(exc)})
            if comm.rank == 0:
                say(f"skip {case.id} at P={comm.size}: {exc}")
            continue
        got, text = measure(comm, c, repeats, explain)
        rows += got
        if text and comm.rank == 0:
            say(text)
    return rows, skipped


def _mib(n):
    return f"{n / (1 << 20):.1f}"


def format_rows(rows):
    """The table as text (rank 0 prints it): a line per case, then one row per strategy."""
    from mpiredist.bench.report import table

    lines, seen = [], []
    for r in rows:
        if r["case"] not in seen:
            seen.append(r["case"])
            lines.append(f"{r['case'].split('_')[0]}  {r['shape']} {r['dtype']}  "
                         f"{r['src_mesh']} {r['src']} -> {r['dst_mesh']} {r['dst']}  "
                         f"(mpiredist: {r['route']}; max(S,T) {_mib(r['block_bytes'])} MiB, "
                         f"W {_mib(r['workspace_bytes'])} MiB)")
    head = ("case", "strategy", "median s", "x raw", "peak MiB", "/(S,T)+W", "sent MiB",
            "check")
    cells = [(r["case"].split("_")[0], r["strategy"], f"{r['median_s']:.4f}",
              "-" if r["ratio_to_raw"] is None else f"{r['ratio_to_raw']:.2f}",
              _mib(r["peak_bytes"]), f"{r['peak_ratio']:.2f}", _mib(r["bytes_sent"]),
              r["check"]) for r in rows]
    lines.append(table(cells, head, ["left", "left"] + ["right"] * 5 + ["left"]))
    return "\n".join(lines)


def main(argv=None, comm=None):
    """Run the cross-mesh table on ``comm`` (default COMM_WORLD); 0 if every check is ok."""
    from mpiredist.runtime.mpi import mpi

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_cross_mesh",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=float, default=DEFAULT_SIZE,
                        help="bytes relative to the cases' ~8 MiB source blocks "
                             f"(default {DEFAULT_SIZE})")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", default=None, help="comma-separated case ids (x01,x03)")
    parser.add_argument("--json", default=None, metavar="FILE")
    parser.add_argument("--explain", action="store_true",
                        help="also print each mpiredist Transfer's explain()")
    args = parser.parse_args(argv)
    if args.size <= 0 or args.repeats < 1:
        parser.error("--size must be positive and --repeats at least 1")
    ids = [i.strip() for i in args.cases.split(",") if i.strip()] if args.cases else None
    try:
        select(load_cross_cases(), ids)
    except KeyError as exc:
        parser.error(exc.args[0])
    comm = comm or mpi().COMM_WORLD
    if comm.rank == 0:
        print(f"cross-mesh redistribution, {comm.size} ranks, --size {args.size:g}, "
              f"medians of {args.repeats} (max over ranks)")
    rows, skipped = run(comm, ids, args.size, args.repeats, args.explain)
    if comm.rank == 0:
        print(format_rows(rows))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"ranks": comm.size, "size": args.size, "repeats": args.repeats,
                           "rows": rows, "skipped": skipped}, f, indent=1)
    return 0 if all(r["check"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(abort_on_exception(main))   # a failure on any rank ends the job
