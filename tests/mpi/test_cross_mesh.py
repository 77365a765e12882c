"""Redistribution between meshes and rank groups, against the oracle.

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_cross_mesh.py

Runs at any N (CI: 1, 2, 3, 4, 6, 8); each case is built from N.  Blocks come
from ``oracle`` by device index (a mesh's device ``i`` is communicator rank
``ranks[i]``); a rank outside the source mesh passes None, one outside the
target mesh must get None.
"""

import tracemalloc

import numpy as np
import pytest
from mpi4py import MPI

import mpiredist as mr
import oracle
from helpers import all_ok, need_ranks

COMM = MPI.COMM_WORLD
RANK, P = COMM.Get_rank(), COMM.Get_size()
BOOKKEEPING = 32 << 10          # Python objects of the pieces and rounds


def _device(mesh):
    ranks = mesh.ranks if mesh.ranks is not None else tuple(range(mesh.size))
    return ranks.index(RANK) if RANK in ranks else None


def _lay(text):
    lay = mr.Layout.parse(text)
    return [list(d) for d in lay.dims], list(lay.partial), lay.op


def _source(G, mesh, src):
    device = _device(mesh)
    if device is None:
        return None
    dims, partial, op = _lay(src)
    return oracle.source_blocks(G, list(mesh.axes), dims, partial, op)[device]


def _expected(G, mesh, dst):
    device = _device(mesh)
    if device is None:
        return None
    return oracle.expected(G, list(mesh.axes), _lay(dst)[0], device)


def _check(got, want, what):
    ok = (got is None) == (want is None)
    if ok and want is not None:
        ok = got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got, want)
    all_ok(COMM, ok, f"{what}: rank {RANK} got {None if got is None else got.shape}")


def _mesh(axes, ranks=None):
    return mr.Mesh(axes, ranks=ranks)


def _perm(seed):
    return [int(r) for r in np.random.default_rng(seed).permutation(P)]


def _cases():
    """``(name, shape, src mesh, src, dst mesh, dst)`` for this rank count."""
    half = max(1, P // 2)
    out = [
        ("same ranks, permuted", (P + 3, 5), _mesh({"x": P}), "[{x}, {}]",
         _mesh({"a": P}, _perm(1)), "[{}, {a}]"),
        ("shrink to one rank", (7, P + 1), _mesh({"x": P}), "[{}, {x}]",
         _mesh({"a": 1}, [P - 1]), "[{}, {}]"),
        ("grow from one rank, replicated", (5, 6), _mesh({"x": 1}, [0]), "[{}, {}]",
         _mesh({"a": P}), "[{}, {}]"),
        ("partial sums to permuted ranks", (6, 4), _mesh({"x": P}), "[{}, {}] sum{x}",
         _mesh({"a": P}, _perm(2)), "[{a}, {}]"),
        ("empty blocks", (1, 2), _mesh({"x": P}), "[{x}, {}]",
         _mesh({"a": P}, _perm(3)), "[{}, {a}]"),
        ("zero-length dim", (0, 3), _mesh({"x": P}), "[{x}, {}]",
         _mesh({"a": 1}, [0]), "[{}, {}]"),
        ("3-D uneven", (3, P + 2, 5), _mesh({"x": P}), "[{}, {x}, {}]",
         _mesh({"a": P}, list(reversed(range(P)))), "[{a}, {}, {}]"),
    ]
    if P >= 2:
        out += [
            ("disjoint halves", (9, 7), _mesh({"x": half}, range(half)), "[{x}, {}]",
             _mesh({"a": P - half}, range(half, P)), "[{}, {a}]"),
            ("overlapping groups", (8, 5), _mesh({"x": P - 1}, range(P - 1)), "[{x}, {}]",
             _mesh({"a": P - 1}, range(1, P)), "[{}, {a}]"),
            ("grow with replication, 2-D", (6, 5), _mesh({"x": 1}, [P - 1]), "[{}, {}]",
             _mesh({"a": 2, "b": half}, range(2 * half)), "[{b}, {}]"),
        ]
    if P >= 3:
        out.append(("ranks outside both meshes", (5, 4), _mesh({"x": 1}, [0]), "[{}, {}]",
                    _mesh({"a": 1}, [1]), "[{}, {}]"))
    if P % 2 == 0 and P > 2:
        out.append(("same ranks, nested axes", (P + 1, 6), _mesh({"x": P}), "[{x}, {}]",
                    _mesh({"a": 2, "b": P // 2}), "[{b}, {a}]"))
        out.append(("same ranks, nested axes, partial", (5, 6), _mesh({"x": P}),
                    "[{}, {}] sum{x}", _mesh({"a": 2, "b": P // 2}), "[{b}, {a}]"))
    if P == 6:
        out.append(("same ranks, axes that do not nest", (7, 5), _mesh({"x": 2, "y": 3}),
                    "[{x}, {y}]", _mesh({"a": 3, "b": 2}), "[{a,b}, {}]"))
    return out


CASES = _cases()
DTYPES = ["float64", "int32", "complex64"]


@pytest.mark.mpi
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_oracle(case, dtype):
    name, shape, m1, src, m2, dst = case
    G = (np.arange(int(np.prod(shape))).reshape(shape) % 23).astype(dtype)
    local = _source(G, m1, src)
    out = mr.redistribute(local, shape, m1, src, dst, dst_mesh=m2, workspace_bytes=256)
    _check(out, _expected(G, m2, dst), name)


@pytest.mark.mpi
@pytest.mark.parametrize("case", CASES[:4], ids=[c[0] for c in CASES[:4]])
def test_transfer_runs_twice_and_distarray(case):
    name, shape, m1, src, m2, dst = case
    G = (np.arange(int(np.prod(shape))).reshape(shape) % 7).astype("float32")
    local = _source(G, m1, src)
    with mr.Transfer(shape, "float32", m1, src, dst, dst_mesh=m2) as t:
        first = t.run(local)
        out = None if first is None else np.full_like(first, -1)
        again = t.run(local, out=out)
        text = t.explain()
    _check(first, _expected(G, m2, dst), name)
    _check(again, _expected(G, m2, dst), name + " (out=)")
    all_ok(COMM, out is None or again is out, "run(out=) returns out")
    all_ok(COMM, "mesh" in text, "explain names the meshes")
    if not mr.Layout.parse(src).partial:
        a = mr.DistArray.from_local(local, m1, src, shape)
        b = a.redistribute(dst, mesh=m2)
        _check(b.local, _expected(G, m2, dst), name + " (DistArray)")
        all_ok(COMM, b.mesh == m2 and b.shape == shape, "DistArray keeps shape, takes mesh")


@pytest.mark.mpi
def test_records_of_a_run_between_meshes():
    """One "exchange" record: between disjoint halves every element crosses once,
    so the bytes sent over all ranks are the array's, and MPI calls move them."""
    need_ranks(COMM, 2)
    half = P // 2
    m1, m2 = _mesh({"x": half}, range(half)), _mesh({"a": P - half}, range(half, P))
    shape = (9, 7)
    G = np.arange(63, dtype="float32").reshape(shape)
    recs = []
    with mr.Transfer(shape, "float32", m1, "[{x}, {}]", "[{}, {a}]", dst_mesh=m2) as t:
        got = t.run(_source(G, m1, "[{x}, {}]"), records=recs)
    _check(got, _expected(G, m2, "[{}, {a}]"), "records run")
    all_ok(COMM, [r.op for r in recs] == ["exchange"], f"rank {RANK}: records {recs}")
    sent = COMM.allreduce(recs[0].bytes_sent if recs else 0)
    calls = COMM.allreduce(recs[0].calls if recs else 0)
    all_ok(COMM, sent == G.nbytes and calls >= 2, f"bytes sent {sent}, calls {calls}")


@pytest.mark.mpi
def test_memory_within_bound():
    """E <= max(S, T) + W per rank, with S = 0 off the source mesh, T = 0 off the target."""
    need_ranks(COMM, 2)
    shape = (512, 300)
    m1, m2 = _mesh({"x": P}), _mesh({"a": P}, list(reversed(range(P))))
    src, dst = "[{x}, {}]", "[{}, {a}]"
    G = np.arange(int(np.prod(shape)), dtype="float64").reshape(shape)
    w = 64 << 10
    tracemalloc.start()
    try:
        local = _source(G, m1, src)
        COMM.Barrier()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = mr.redistribute(local, shape, m1, src, dst, dst_mesh=m2, workspace_bytes=w)
        used = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    _check(out, _expected(G, m2, dst), "memory case")
    s = 0 if local is None else local.nbytes
    t = 0 if out is None else out.nbytes
    all_ok(COMM, used <= max(s, t) + w + BOOKKEEPING,
           f"E = {used} > max(S={s}, T={t}) + W={w} + {BOOKKEEPING}")


def _raises_everywhere(call, error=ValueError):
    try:
        call()
    except error as exc:
        got = type(exc).__name__
    else:
        got = None
    all_ok(COMM, got is not None, f"every rank raises {error.__name__}, this one: {got}")


@pytest.mark.mpi
def test_errors_raise_on_every_rank():
    shape = (4, 4)
    G = np.zeros(shape)
    whole = _mesh({"x": P})
    _raises_everywhere(lambda: mr.Transfer(shape, "f8", whole, "[{x},{}]", "[{},{}]",
                                           dst_mesh=_mesh({"a": 2}, [0, 0])), mr.MeshError)
    _raises_everywhere(lambda: mr.Transfer(shape, "f8", whole, "[{x},{}]", "[{},{}]",
                                           dst_mesh=_mesh({"a": 1}, [P])), mr.MeshError)
    other = COMM.Dup()
    try:
        _raises_everywhere(lambda: mr.Transfer(
            shape, "f8", whole, "[{x},{}]", "[{},{}]",
            dst_mesh=mr.Mesh({"a": P}, comm=other)), mr.MeshError)
    finally:
        other.Free()
    one = _mesh({"x": 1}, [0])
    # a rank outside the source mesh passing an array, or a member passing None
    bad = G if RANK == P - 1 else (G if RANK == 0 else None)
    if P > 1:
        _raises_everywhere(lambda: mr.redistribute(bad, shape, one, "[{},{}]", "[{},{}]",
                                                   dst_mesh=whole))
    _raises_everywhere(lambda: mr.redistribute(None, shape, one, "[{},{}]", "[{},{}]",
                                               dst_mesh=whole))
    # ranks that disagree on the shape, or a block of another dtype
    wrong = (4, 4 + (RANK == P - 1)) if P > 1 else (4, 4)
    if P > 1:
        _raises_everywhere(lambda: mr.Transfer(wrong, "f8", whole, "[{x},{}]", "[{},{}]",
                                               dst_mesh=_mesh({"a": 1}, [0])))
    mine = _source(G, whole, "[{x},{}]")
    if RANK == P - 1:
        mine = mine.astype("f4")
    if P > 1:
        _raises_everywhere(lambda: mr.redistribute(mine, shape, whole, "[{x},{}]", "[{},{}]",
                                                   dst_mesh=_mesh({"a": 1}, [0])))
    # a partial target that only the exchange could reach
    if P > 1:
        _raises_everywhere(lambda: mr.Transfer(
            shape, "f8", whole, "[{},{}] sum{x}", "[{},{}] sum{a}",
            dst_mesh=_mesh({"a": P}, list(reversed(range(P))))), mr.LayoutError)
    all_ok(COMM, mr.redistribute(_source(G, whole, "[{x},{}]"), shape, whole, "[{x},{}]",
                                 "[{},{}]", dst_mesh=_mesh({"a": 1}, [0])) is not None
           or RANK != 0, "still usable after the errors")


RSS_NOISE = 1 << 20             # pages and interpreter noise the RSS figure may add


@pytest.mark.mpi
@pytest.mark.parametrize("which", ["permuted", "disjoint halves"])
def test_memory_within_bound_rss(which):
    """The same bound as the OS sees it (MPI's buffers included), 4-8 MiB blocks."""
    from mpiredist.bench.measure import rss_environment_missing, rss_peak, rss_supported
    need_ranks(COMM, 2)
    if not rss_supported() or rss_environment_missing():
        pytest.skip("needs /proc and " + " ".join(rss_environment_missing())
                    + " from process start (scripts/test.sh sets them)")
    half = P // 2
    if which == "permuted":
        m1, m2 = _mesh({"x": P}), _mesh({"a": P}, list(reversed(range(P))))
    else:
        m1, m2 = _mesh({"x": half}, range(half)), _mesh({"a": P - half}, range(half, P))
    shape = (1024 * m1.size, 1024 + 3)
    src, dst = "[{x}, {}]", "[{}, {a}]"
    with mr.Transfer(shape, "float64", m1, src, dst, dst_mesh=m2) as t:
        w = t.workspace_bytes
        for _ in range(2):                              # a warm-up run, then the measured one
            device = _device(m1)
            local = None
            if device is not None:
                box = oracle.block_slices(shape, list(m1.axes), _lay(src)[0], device)
                local = np.ones(tuple(s.stop - s.start for s in box))
            COMM.Barrier()
            with rss_peak() as e:
                out = t.run(local)
            s = 0 if local is None else local.nbytes
            tt = 0 if out is None else out.nbytes
            del out, local
    used = e.bytes
    all_ok(COMM, used is not None and used <= max(s, tt) + w + RSS_NOISE,
           f"{which}: RSS growth {used} B > max(S={s}, T={tt}) + W={w} + 1 MiB")


@pytest.mark.mpi
def test_auto_ranks():
    """ranks="auto": the target order that moves the least; DistArray reports it."""
    from mpiredist.planning.crossmesh import relabel
    shape = (2 * P + 1, 3)
    m1 = _mesh({"x": P}, list(reversed(range(P))))
    G = np.arange(int(np.prod(shape)), dtype="float64").reshape(shape)
    a = mr.DistArray.from_local(_source(G, m1, "[{x}, {}]"), m1, "[{x}, {}]", shape)
    b = a.redistribute("[{a}, {}]", mesh=mr.Mesh({"a": P}, ranks="auto"))
    chosen = relabel(shape, m1, mr.Layout.parse("[{x}, {}]"), mr.Mesh({"a": P}, ranks="auto"),
                     mr.Layout.parse("[{a}, {}]"), P)
    p = mr.plan(shape, "float64", m1, "[{x}, {}]", "[{a}, {}]",
                dst_mesh=mr.Mesh({"a": P}, ranks="auto"))
    moved = getattr(p, "bytes_total", None)
    moved = p.bytes_sent_per_rank if moved is None else moved
    all_ok(COMM, b.mesh == chosen and moved == 0, f"chose {b.mesh}, moving {moved} B")
    _check(b.local, _expected(G, chosen, "[{a}, {}]"), "auto ranks")


@pytest.mark.mpi
def test_weight_sync_example():
    """scripts/weight_sync_example.py (README's worked example) checks itself."""
    import runpy
    from pathlib import Path
    script = Path(__file__).resolve().parents[2] / "scripts" / "weight_sync_example.py"
    main = runpy.run_path(str(script))["main"]
    all_ok(COMM, main(COMM) == 0, "weight sync example")
