"""Run the benchmark suite: every strategy on the same data, side by side.

The suite and the mesh mapping are plain arithmetic (no MPI); running it
(:func:`run_suite`) needs mpi4py, imported on first use.

Per case, on every rank:

1. plan each strategy once (``xla`` from :mod:`mpiredist.bench.xla`, the
   others from :mod:`mpiredist.planning.planner`); ``raw`` is sized from the
   ``collectives`` plan (:func:`make_raw`); ``inplace`` and ``donated`` run
   what :func:`mpiredist.redistribute` runs in place: the default plan, or
   ``planner.plan(..., allow_exchange=False)`` where an exchange cannot run
   in place (any exchange when donated; a later one when not);
2. start :mod:`tracemalloc` (:func:`~mpiredist.bench.measure.tracing`), then
   build the global array from a seed (the same on every rank), keep this
   rank's source block and its expected target block, drop the rest;
3. one untimed warm-up run per strategy, checked against the expected block
   (``raw``: the received bytes against the sent pattern), and one untimed
   run under :func:`~mpiredist.bench.measure.traced_peak` (E); then stop
   tracemalloc, so that the timed runs do not pay for it;
4. ``repeats`` rounds; each round runs every strategy once, in an order
   shuffled each round (A/B interleaving, :func:`_orders`), with a barrier
   before each timed run.  A run's time is the largest over ranks.

Timed runs call a Transfer of the prebuilt plan (``Transfer.from_plan``;
``inplace``: the one-buffer strategy of :mod:`mpiredist.runtime.memory` with W =
:func:`mpiredist.planning.budget.default_workspace`) on the prebuilt plan, so planning
and the argument check of :func:`mpiredist.redistribute` (one small
collective) are outside the timing, equally for every strategy.  ``donated``
gives the executor a fresh copy of the source block, made before the barrier
of each run (warm-up, memory and timed), so the copy is never timed nor
counted in E.

Why tracemalloc starts before the blocks: numpy reports its buffers to
tracemalloc when they are allocated, freed or reallocated.  ``donated`` grows
its block with ``realloc``; if that block was allocated before tracing began,
tracemalloc has no record of it and counts the reallocated block at its full
new size T instead of the growth T - S.  So every block a measured call may
reallocate (the donated copies) is allocated while tracemalloc is tracing,
and tracing runs without a break from before the blocks exist to the end of
the memory runs (stopping tracemalloc forgets every record).
"""

import gc
import math
import time
import zlib
from contextlib import ExitStack
from dataclasses import dataclass, replace

import numpy as np

from ..planning import planner
from ..core.blocks import rank_block
from ..core.errors import MeshError, MpiredistError, PlanError
from ..core.mesh import Mesh
from ..core.subaxes import expand, prime_factors, rank_digits
from .cases import Case, load_cases, scaled
from .measure import rss_peak, settled, traced_peak, tracing
from ..planning.model import predict
from ..planning.profile import current
from .tables import grow_mesh
from .rawpacked import RawPacked

__all__ = ["STRATEGIES", "INPLACE", "Entry", "map_mesh", "suite", "global_array",
           "source_block", "target_block", "Raw", "make_raw", "run_suite"]

# Pages and interpreter noise allowed on top of the contract in the RSS figure.
RSS_NOISE = 1 << 20

STRATEGIES = ("collectives", "into_out", "inplace", "donated", "xla", "replicate", "direct",
              "raw", "raw_packed")
REFERENCES = ("raw", "raw_packed")       # sized from the collectives plan, not planned
# Run in one buffer (mpiredist.runtime.memory.OneBuffer) on the collectives plan without
# exchange steps.
INPLACE = ("inplace", "donated")
# The collectives plan, run into a preallocated ``out=`` array.
INTO_OUT = "into_out"

MAPPING_RULE = (
    "cases: a case runs on its own mesh when that mesh has as many devices as there are "
    "ranks.  Otherwise it is mapped onto N = comm.size devices, keeping its axis "
    "names, layouts and (scaled) global shape: if N is the mesh size times or "
    "divided by a power of two, the rule of --plan-only (bench.model.grow_mesh: "
    "grow every axis evenly, minor axes first; shrink by halving the largest axis, "
    "minor first on ties); otherwise the prime factors of N, largest first, each "
    "multiply the axis whose new/original size ratio is smallest (the minor axis on "
    "ties).  Axes may end with size 1.  Without --cases the suite is the shared "
    "cases on their own mesh, or, when none has N devices, every shared case mapped; "
    "--cases runs the named cases, mapped where needed.  XLA's plan exists only on "
    "a case's own mesh.")


@dataclass(frozen=True)
class Entry:
    """One case of the suite as it runs: ``case`` carries the mesh and shape used."""

    case: Case
    shared: bool        # from cases.json (XLA's plan may exist)
    native: bool        # on the case's own mesh (else mapped)

    @property
    def label(self):
        return self.case.short_id if self.shared else self.case.id


def map_mesh(mesh, ranks):
    """``mesh`` (dict name -> size) mapped onto ``ranks`` devices (MAPPING_RULE)."""
    size = math.prod(mesh.values())
    if ranks < 1:
        raise MeshError(f"cannot map mesh {Mesh(mesh)} onto {ranks} devices")
    if size == ranks:
        return dict(mesh)
    big, small = max(size, ranks), min(size, ranks)
    ratio = big // small
    if big % small == 0 and ratio & (ratio - 1) == 0:
        try:
            return grow_mesh(mesh, ranks)
        except MeshError:
            pass                  # an odd-sized mesh cannot halve: use the prime rule
    names, original = list(mesh), list(mesh.values())
    sizes = [1] * len(names)
    if not names:
        raise MeshError(f"a mesh without axes cannot hold {ranks} devices")
    for p in sorted(prime_factors(ranks), reverse=True):
        i = min(range(len(names)), key=lambda i: (sizes[i] / original[i], -i))
        sizes[i] *= p
    return dict(zip(names, sizes))


def select_cases(case_ids, shared_cases):
    if case_ids is None:
        return None
    out = []
    for cid in case_ids:
        found = [c for c in shared_cases if cid in (c.id, c.short_id)]
        if not found:
            known = ", ".join(c.short_id for c in shared_cases)
            raise PlanError(f"--cases: no shared case {cid!r}; the cases are {known}")
        out.extend(c for c in found if c not in out)
    return out


def suite(ranks, case_ids=None, scale=1, user=None):
    """The cases to run on ``ranks`` ranks, as :class:`Entry` (MAPPING_RULE).

    ``case_ids``: None (the default suite), or ids / numbers (``"c04"``);
    an empty list runs only ``user``, a :class:`Case` that must have
    ``ranks`` devices.
    """
    shared_cases = load_cases()
    chosen = select_cases(case_ids, shared_cases)
    if chosen is None:
        chosen = [c for c in shared_cases if math.prod(c.mesh.values()) == ranks]
        if not chosen:
            chosen = shared_cases
    entries = []
    for c in chosen:
        c = scaled(c, scale) if scale != 1 else c
        native = math.prod(c.mesh.values()) == ranks
        entries.append(Entry(c if native else replace(c, mesh=map_mesh(c.mesh, ranks)),
                             True, native))
    if user is not None:
        if math.prod(user.mesh.values()) != ranks:
            raise MeshError(f"--mesh {Mesh(user.mesh)} has {math.prod(user.mesh.values())} "
                            f"devices but the benchmark runs on {ranks} ranks")
        entries.append(Entry(user, False, True))
    return entries


# --------------------------------------------------------------------- data

def _seed(case_id, seed):
    return np.random.default_rng([seed, zlib.crc32(case_id.encode())])


def global_array(shape, dtype, rng):
    """A deterministic global array of ``shape`` and ``dtype`` from ``rng``."""
    dtype = np.dtype(dtype)
    shape = tuple(shape)
    if dtype.kind == "f":
        work = dtype if dtype.itemsize in (4, 8) else np.float32
        return rng.random(shape, dtype=work).astype(dtype, copy=False)
    if dtype.kind == "c":
        return (rng.random(shape) + 1j * rng.random(shape)).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 100, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    n = math.prod(shape)
    return np.frombuffer(rng.bytes(n * dtype.itemsize), dtype=dtype).reshape(shape).copy()


def _box(g, mesh, layout, rank):
    box = rank_block(g.shape, expand(layout, mesh), rank_digits(mesh, rank))
    return g[tuple(slice(lo, hi) for lo, hi in box)]


def _holds_value(mesh, partial, rank):
    coords = dict(zip(mesh.names, mesh.coords(rank)))
    return all(coords[a] == 0 for a in partial)


def _partial_block(g, mesh, layout, rank):
    block = np.ascontiguousarray(_box(g, mesh, layout, rank))
    if not layout.partial or layout.op in ("max", "min"):
        return block                      # max/min of equal values: the value
    if _holds_value(mesh, layout.partial, rank):
        return block
    return np.ones_like(block) if layout.op == "prod" else np.zeros_like(block)


def source_block(g, mesh, layout, rank):
    """This rank's source block of ``g``; partial axes: coordinate 0 holds ``g``.

    The others hold the identity of the reduction (0 for sum, 1 for prod; for
    max and min every rank holds ``g``), so the reduced array is ``g`` exactly.
    """
    return _partial_block(g, mesh, layout, rank)


def target_block(g, mesh, layout, rank):
    """The block ``rank`` must end with (same rule for partial axes that stay)."""
    return _partial_block(g, mesh, layout, rank)


# ---------------------------------------------------------------------- raw

class Raw:
    """The limit: one bare MPI collective of the plan's bytes, no planning.

    ``op`` is chosen from the dominant step (most bytes) of the
    ``collectives`` plan, on that step's sub-communicator (the whole mesh for
    ``exchange`` and ``permute``), and sized so that each rank sends the
    whole plan's ``bytes_sent_per_rank`` to other ranks:

    ===================== =============================================
    all_to_all, exchange  Alltoall of ``ceil(B / (G-1))`` bytes per peer
    all_gather            Allgather of ``ceil(B / (G-1))`` bytes
    permute               Sendrecv of ``B`` bytes (ring shift by one)
    all_reduce            Allreduce of n elements, ``2 n (G-1)/G = B``
    reduce_scatter        Reduce_scatter_block, ``m (G-1) = B`` elements
    no communication      nothing (``op`` ``none``)
    ===================== =============================================

    Buffers are contiguous and allocated here, once; the send buffer holds a
    pattern that :meth:`check` verifies on the receive side.
    """

    def __init__(self, op, comm=None, send=None, recv=None, bytes_sent=0, mpi=None):
        self.op, self.comm, self.send, self.recv = op, comm, send, recv
        self.bytes_sent, self._mpi = bytes_sent, mpi

    def run(self, local=None, records=None):
        """One bare collective (``local`` and ``records`` are ignored)."""
        c, MPI = self.comm, self._mpi
        if self.op == "Alltoall":
            c.Alltoall(self.send, self.recv)
        elif self.op == "Allgather":
            c.Allgather(self.send, self.recv)
        elif self.op == "Sendrecv":
            g, me = c.Get_size(), c.Get_rank()
            c.Sendrecv(self.send, (me + 1) % g, recvbuf=self.recv, source=(me - 1) % g)
        elif self.op == "Allreduce":
            c.Allreduce(self.send, self.recv, op=MPI.SUM)
        elif self.op == "Reduce_scatter_block":
            c.Reduce_scatter_block(self.send, self.recv, op=MPI.SUM)

    def check(self):
        """True if the last run delivered what the pattern says."""
        if self.op == "none":
            return True
        g, me = self.comm.Get_size(), self.comm.Get_rank()
        if self.op in ("Allreduce", "Reduce_scatter_block"):
            return bool(np.all(self.recv == g))
        if self.op == "Sendrecv":
            return bool(np.all(self.recv == _pattern((me - 1) % g, 0)))
        blocks = self.recv.reshape(g, -1)
        return all(np.all(blocks[q] == _pattern(q, me if self.op == "Alltoall" else 0))
                   for q in range(g))

    def __repr__(self):
        size = None if self.comm is None else self.comm.Get_size()
        return f"Raw({self.op!r}, group={size}, bytes_sent={self.bytes_sent})"


def _pattern(sender, peer):
    return (7 * sender + 13 * peer + 1) % 251


def make_raw(plan, groups):
    """The :class:`Raw` limit of ``plan`` (a ``collectives`` plan) on the mesh's
    MPI communicators (``groups``: its :class:`~mpiredist.runtime.groups.MeshGroups`)."""
    from ..runtime.mpi import mpi

    MPI = mpi()
    steps = [s for s in plan.steps if s.op != "slice" and s.bytes_sent_per_rank > 0]
    total = plan.bytes_sent_per_rank
    if not steps or total == 0:
        return Raw("none")
    dom = max(steps, key=lambda s: s.bytes_sent_per_rank)
    comm = (groups.group if dom.op in ("exchange", "permute") else groups.sub(dom.axes)).comm
    g, me = comm.Get_size(), comm.Get_rank()
    if g == 1:
        return Raw("none")
    u8 = np.uint8
    if dom.op in ("all_to_all", "exchange"):
        c = -(-total // (g - 1))
        send = np.concatenate([np.full(c, _pattern(me, p), u8) for p in range(g)])
        return Raw("Alltoall", comm, send, np.empty(g * c, u8), c * (g - 1), MPI)
    if dom.op == "all_gather":
        c = -(-total // (g - 1))
        return Raw("Allgather", comm, np.full(c, _pattern(me, 0), u8), np.empty(g * c, u8),
                   c * (g - 1), MPI)
    if dom.op == "permute":
        return Raw("Sendrecv", comm, np.full(total, _pattern(me, 0), u8),
                   np.empty(total, u8), total, MPI)
    dtype = plan.dtype if np.dtype(plan.dtype).kind in "fiuc" else np.dtype(np.float32)
    size = np.dtype(dtype).itemsize
    if dom.op == "all_reduce":
        n = -(-total * g // (2 * size * (g - 1)))
        return Raw("Allreduce", comm, np.ones(n, dtype), np.empty(n, dtype),
                   2 * n * size * (g - 1) // g, MPI)
    if dom.op == "reduce_scatter":
        m = -(-total // (size * (g - 1)))
        return Raw("Reduce_scatter_block", comm, np.ones(g * m, dtype), np.empty(m, dtype),
                   m * size * (g - 1), MPI)
    raise PlanError(f"no raw collective for step op {dom.op!r}")


# ---------------------------------------------------------------------- run

def _plans(entry, strategies, dtype):
    """``(plans, runnable, {strategy: why skipped})``; ``raw`` is sized from the
    ``collectives`` plan, which is built for it even if not run; ``inplace``
    and ``donated`` get the plan redistribute would run in place
    (:func:`_in_place_plan`)."""
    c = entry.case
    plans, skipped = {}, {}
    wanted = list(strategies)
    if any(r in wanted for r in REFERENCES) and "collectives" not in wanted:
        wanted.append("collectives")
    for s in wanted:
        if s in REFERENCES:
            continue
        try:
            if s == "xla":
                if not (entry.shared and entry.native):
                    skipped[s] = ("XLA's plan exists only on a shared case's own mesh, "
                                  "not on a mapped one" if entry.shared else
                                  "XLA's plan exists only for the shared cases")
                    continue
                from .xla import xla_plan
                plans[s] = xla_plan(c.id, c.shape, dtype)
            elif s in INPLACE or s == INTO_OUT:
                plans[s] = planner.plan(c.shape, dtype, c.mesh, c.src, c.dst, "collectives")
            else:
                plans[s] = planner.plan(c.shape, dtype, c.mesh, c.src, c.dst, s)
        except MpiredistError as exc:
            skipped[s] = f"not planned: {exc}"
    for r in REFERENCES:
        if r not in strategies:
            continue
        if "collectives" not in plans:
            skipped[r] = "no collectives plan to size it from"
        elif r == "raw_packed" and plans["collectives"].src.partial:
            skipped[r] = "a partial source: its reduction is not one Alltoallv"
        else:
            plans[r] = None
    runnable = [s for s in strategies if s in plans]
    return plans, runnable, {s: skipped[s] for s in strategies if s in skipped}


def agree_names(comm, names):
    """The strategies every rank can run (plans are deterministic; insurance).

    Raises MismatchError on every rank if ranks plan under different machine
    profiles (their plans, and so their MPI calls, would differ).
    """
    from ..core.errors import MismatchError
    from ..planning.profile import current

    everyone = comm.allgather((tuple(names), current().key))
    if len({key for _, key in everyone}) > 1:
        raise MismatchError("ranks plan under different machine profiles "
                            "(MPIREDIST_PROFILE or the calibrate file differ)")
    return [n for n in names if all(n in other for other, _ in everyone)]


def _same(out, expected):
    return (out is not None and tuple(out.shape) == tuple(expected.shape)
            and out.dtype == expected.dtype and bool(np.array_equal(out, expected)))


def _limit(name, s, t, workspace):
    """The memory contract (docs/semantics.md): ``max(S,T) + W``, or ``max(0, T-S) + W`` donated."""
    return (max(0, t - s) if name == "donated" else max(s, t)) + workspace


def _runner(name, plan, src, mesh, raw, packed=None):
    """``(prepare, transfer or raw, plan run, executor)`` for strategy ``name``.

    Every strategy but the references runs through a Transfer of its plan
    (``mr.Transfer.from_plan``), exactly as :func:`mpiredist.redistribute`
    would run it (the Transfer chooses how from the plan and the memory
    contract): ``donated`` donates, ``into_out`` runs into one ``out=``
    array; ``inplace`` runs the kept source in one buffer even where out of
    place would fit (``Transfer.from_plan(..., executor="in place")``).  ``prepare`` (not timed) returns the block
    a run gets: ``src`` itself, or for ``donated`` a fresh copy that the run
    may resize and overwrite.
    """
    from ..runtime.transfer import Transfer

    if name == "raw":
        return (lambda: None), raw, None, "raw MPI"
    if name == "raw_packed":
        return (lambda: src), packed, None, "raw MPI packed"
    if name == "inplace":
        t = Transfer.from_plan(plan, mesh, executor="in place")
        return (lambda: src), t, t.plan, t.executor
    donate = name == "donated"
    t = Transfer.from_plan(plan, mesh, donate=donate)
    if name == INTO_OUT:
        return (lambda: src), _IntoOut(t), t.plan, t.executor
    prepare = (lambda: src.copy(order="C")) if donate else (lambda: src)
    return prepare, t, t.plan, t.executor


class _IntoOut:
    """A Transfer run into one ``out=`` array, allocated once with the Transfer
    (as a loop of repeated redistributions would; the Transfer then keeps its
    pack buffers between runs too)."""

    def __init__(self, transfer):
        self.transfer = transfer
        self.out = np.empty(transfer.target_shape, transfer.plan.dtype)

    def run(self, local, records=None):
        return self.transfer.run(local, out=self.out, records=records)

    def free(self):
        self.transfer.free()


def run_case(entry, strategies, repeats, dtype, comm, seed=0, progress=None):
    """Run one case; return ``(records, skipped)`` (identical on every rank)."""
    from ..planning.budget import default_workspace
    from ..runtime.groups import MeshGroups, base_group
    from ..runtime.mpi import mpi

    MPI = mpi()
    c = entry.case
    plans, runnable, skipped = _plans(entry, strategies, dtype)
    names = agree_names(comm, runnable)
    for n in runnable:
        if n not in names:
            skipped[n] = "could not be planned on some rank"
    mesh = Mesh(c.mesh, comm)
    rank = comm.Get_rank()
    with ExitStack() as traced:
        traced.enter_context(tracing())     # before any block exists (module doc)
        g = global_array(c.shape, dtype, _seed(c.id, seed))
        src = source_block(g, mesh, c.src, rank)
        expected = target_block(g, mesh, c.dst, rank)
        del g
        mc = MeshGroups(mesh, base_group(mesh))
        try:
            runs, executors = {}, {}
            raw = make_raw(plans["collectives"], mc) if "raw" in names else None
            packed = (RawPacked(plans["collectives"], mc.group.comm) if "raw_packed" in names
                      else None)
            for n in names:
                prepare, call, ran, executors[n] = _runner(n, plans.get(n), src, mesh, raw,
                                                           packed)
                runs[n] = prepare, call
                if ran is not None:
                    plans[n] = ran
            sent, correct, peak, over, limit = {}, {}, {}, {}, {}
            for n in names:                         # warm-up, checked
                prepare, call = runs[n]
                records, a = [], prepare()
                comm.Barrier()
                out = call.run(a, records=records)   # a: the only name
                correct[n] = raw.check() if n == "raw" else _same(out, expected)
                sent[n] = (raw.bytes_sent if n == "raw" else packed.bytes_sent
                           if n == "raw_packed" else sum(r.bytes_sent for r in records))
                del out, a
                _tick(progress, entry, n)
            for n in names:                         # measured memory, untimed
                ref = plans[n] if n not in REFERENCES else plans["collectives"]
                limit[n] = _limit(n, src.nbytes, expected.nbytes, default_workspace(ref))
                peak[n] = _measured(runs[n], comm, traced_peak)
                over[n] = int(peak[n] > limit[n])
                _tick(progress, entry, n)
            traced.close()                          # RSS and timed runs run untraced
            rss = {}
            for n in names:                         # resident-set growth, untimed
                e = _measured(runs[n], comm, rss_peak)
                rss[n] = -1 if e is None else e
                _tick(progress, entry, n)
            times = np.zeros((len(names), repeats))
            orders = _orders(len(names), repeats, _seed(c.id, seed))
            for r in range(repeats):                # A/B interleaved, shuffled order
                for k in range(len(names)):
                    i = orders[r][k]
                    prepare, call = runs[names[i]]
                    a = prepare()
                    comm.Barrier()
                    t0 = time.perf_counter()
                    out = call.run(a)
                    times[i, r] = time.perf_counter() - t0
                    if r == repeats - 1 and names[i] != "raw":
                        correct[names[i]] &= _same(out, expected)
                    del out, a
                    _tick(progress, entry, names[i])
            comm.Barrier()
            for n in names:
                if n not in REFERENCES:
                    runs[n][1].free()
        finally:
            mc.free()
    worst = np.empty_like(times)
    comm.Allreduce(times, worst, op=MPI.MAX)
    ints = np.array([[sent[n], peak[n], int(not correct[n]), limit[n], over[n], rss[n]]
                     for n in names], dtype=np.int64)
    top = np.empty_like(ints)
    comm.Allreduce(ints.reshape(-1), top.reshape(-1), op=MPI.MAX)
    return [dict(_record(entry, n, plans, raw, worst[i], top[i], comm.Get_size(), dtype,
                         packed),
                 executor=executors[n]) for i, n in enumerate(names)], skipped


def _measured(run, comm, meter):
    """What ``meter`` (:func:`traced_peak` or :func:`rss_peak`) reports for one
    untimed run; the block is a name of this function alone (donations honoured)."""
    prepare, call = run
    a = prepare()
    gc.collect()
    comm.Barrier()
    with meter() as e:
        out = call.run(a)
    del out, a
    return e.bytes


def _orders(n, repeats, rng):
    """The order of the ``n`` strategies in each timed round: shuffled per round
    (the same on every rank), so that no strategy always follows the same one.

    A rotation keeps neighbours fixed, and what ran just before biases a run
    (memory the allocator kept or returned): measured with the rotation, two
    runs of one plan differed by 30-40 % on c06 at every repeat.
    """
    return [rng.permutation(n).tolist() for _ in range(repeats)]


def _tick(progress, entry, name):
    if progress is not None:
        progress.step(f"{entry.label} {name}")


def _record(entry, name, plans, raw, times, reduced, ranks, dtype, packed=None):
    from ..planning.budget import default_workspace

    c = entry.case
    ref = plans[name] if name not in REFERENCES else plans.get("collectives")
    sent, peak, bad, limit, over, rss = (int(v) for v in reduced)
    big = max(ref.src_local_bytes, ref.dst_local_bytes) if ref is not None else 0
    median = float(np.median(times)) if len(times) else float("nan")
    return {
        "case": c.id, "label": entry.label, "strategy": name, "ranks": ranks,
        "mesh": str(Mesh(c.mesh)), "mapped": not entry.native, "shape": list(c.shape),
        "dtype": str(np.dtype(dtype)), "src": str(c.src), "dst": str(c.dst),
        "repeats": len(times), "times_s": [float(t) for t in times],
        "median_s": median,
        "predicted_s": None if name in REFERENCES else predict(ref, current()).seconds,
        "min_s": float(np.min(times)) if len(times) else median,
        "max_s": float(np.max(times)) if len(times) else median,
        "bytes_sent_per_rank": sent,
        "plan_bytes_sent_per_rank": (raw.bytes_sent if name == "raw" else sent
                                     if name == "raw_packed" else ref.bytes_sent_per_rank),
        "lower_bound_bytes_per_rank": ref.lower_bound_bytes_per_rank,
        "src_local_bytes": ref.src_local_bytes, "dst_local_bytes": ref.dst_local_bytes,
        "plan_peak_local_bytes": None if name in REFERENCES else ref.peak_local_bytes,
        "peak_bytes": peak, "peak_over_max": peak / big if big else 0.0,
        "rss_bytes": rss if rss >= 0 else None,
        "rss_over_max": (rss / big if big else 0.0) if rss >= 0 else None,
        "rss_within_limit": (rss <= limit + RSS_NOISE) if rss >= 0 else None,
        "donated": name == "donated", "workspace_bytes": default_workspace(ref),
        "limit_bytes": limit,
        "limit_over_max": limit / big if big else 0.0, "within_limit": not over,
        "correct": not bad,
        "gbps": sent / median / 1e9 if median > 0 else 0.0,
        "ops": ([raw.op] if name == "raw" else ["Alltoallv"] if name == "raw_packed"
                else [s.op for s in ref.steps]),
        "note": ref.note if name not in REFERENCES else "",
    }


def count_runs(entries, strategies, repeats):
    """Runs :func:`run_suite` will make at most (for the progress bar)."""
    return len(entries) * len(strategies) * (repeats + 3)


def run_suite(entries, strategies, repeats, dtype, comm, seed=0, progress=None):
    """Run every entry; return ``(records, skipped)`` (lists, same on every rank).

    ``skipped`` lists ``{"case", "strategy", "reason"}`` for the strategies
    that do not apply to a case (e.g. ``xla`` on a mapped mesh).
    """
    records, skipped = [], []
    with settled():
        for entry in entries:
            recs, skip = run_case(entry, strategies, repeats, dtype, comm, seed, progress)
            records.extend(recs)
            for s, why in skip.items():
                skipped.append({"case": entry.case.id, "label": entry.label, "strategy": s,
                                "reason": why})
                if progress is not None:
                    progress.skip(repeats + 3)
    return records, skipped
