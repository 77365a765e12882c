"""mr.save / mr.load round trips: every shared case's mesh and layout, other meshes,
layouts and rank counts, bf16, uneven and empty blocks, partial sums, nested
dicts, subsets, in place; every result against numpy.

    mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_checkpoint.py

N = 1, 2, 3, 4 or 8.
"""

import json
import math
import os
import shutil
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

import mpiredist as mr
from helpers import all_ok
from mpiredist import Layout, Mesh
from mpiredist.bench.cases import load_cases, scaled
from mpiredist.core.subaxes import prime_factors

COMM = MPI.COMM_WORLD
RANK, P = COMM.Get_rank(), COMM.Get_size()


@pytest.fixture
def where():
    """A fresh directory every rank sees, removed after the test."""
    path = tempfile.mkdtemp(prefix="mpiredist-ckpt-") if RANK == 0 else None
    path = COMM.bcast(path)
    yield path
    COMM.Barrier()
    if RANK == 0:
        shutil.rmtree(path, ignore_errors=True)


def block(G, mesh, layout):
    """This rank's block of ``G`` (None off the mesh), by the oracle's rule."""
    import oracle
    layout = Layout.parse(layout)
    if mesh.ranks is not None and RANK not in mesh.ranks:
        return None
    device = RANK if mesh.ranks is None else mesh.ranks.index(RANK)
    return G[oracle.block_slices(G.shape, list(mesh.axes),
                                 [list(d) for d in layout.dims], device)]


def same(got, want):
    return (got is None and want is None) or (
        got is not None and want is not None and got.shape == want.shape
        and got.dtype == want.dtype and np.array_equal(np.asarray(got), want))


def shrunk(axes, size):
    """The case mesh with axis sizes cut to ``size`` ranks, or None."""
    if math.prod(axes.values()) == size:
        return Mesh(axes)
    sizes = dict.fromkeys(axes, 1)
    for f in sorted(prime_factors(size), reverse=True):
        for name in axes:
            if sizes[name] * f <= axes[name]:
                sizes[name] *= f
                break
        else:
            return None
    return Mesh(sizes)


def source(G, mesh, layout, rng):
    """A DistArray of ``G`` in ``layout``, partial sums included."""
    import oracle
    layout = Layout.parse(layout)
    if not layout.partial:
        return mr.DistArray.from_global(G, mesh, layout)
    blocks = oracle.partial_blocks(G, list(mesh.axes), [list(d) for d in layout.dims],
                                   list(layout.partial), layout.op, rng)
    return mr.DistArray.from_local(blocks[RANK], mesh, layout, G.shape)


CASES = load_cases()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.short_id)
def test_cases_round_trip(where, case):
    small = scaled(case, 64)
    rng = np.random.default_rng(0)
    G = rng.integers(-30, 30, size=small.shape).astype(np.float32)
    mesh = shrunk(case.mesh, P)
    if mesh is not None:
        src, dst = case.src, case.dst.without_partial()
    else:                       # the case's axes do not fit P ranks: its pattern on x=P
        mesh = Mesh({"x": P})
        src = Layout([("x",)] + [()] * (G.ndim - 1))
        dst = Layout([()] * (G.ndim - 1) + [("x",)])
    path = os.path.join(where, "ck")
    mr.save(path, {"g": source(G, mesh, src, rng)})
    line = Mesh({"z": P})
    out = mr.load(path, {"g": (mesh, dst)})
    all_ok(COMM, same(out["g"].local, block(G, mesh, dst)), f"{case.id}: {src} -> {dst}")
    last = Layout([()] * (G.ndim - 1) + [("z",)])
    out = mr.load(path, {"g": (line, last)})
    all_ok(COMM, same(out["g"].local, block(G, line, last)), f"{case.id}: -> {last} on z={P}")
    whole = mr.load(path, {"g": np.zeros_like(G)})["g"]
    all_ok(COMM, np.array_equal(whole, G), f"{case.id}: replicated target")
    ck = mr.checkpoint.open(path)
    all_ok(COMM, ck.shape("g") == G.shape and np.array_equal(ck.read("g"), G),
           f"{case.id}: checkpoint.open")


def meshes(p):
    """A few meshes of ``p`` devices."""
    out = [Mesh({"x": p})]
    for a in range(2, p):
        if p % a == 0:
            out.append(Mesh({"x": a, "y": p // a}))
    return out


def layouts(mesh, ndim, rng):
    """A random layout of ``ndim`` dims on ``mesh`` (some axes unused)."""
    dims = [[] for _ in range(ndim)]
    for axis in mesh.names:
        d = int(rng.integers(-1, ndim))
        if d >= 0:
            dims[d].append(axis)
    return Layout([tuple(d) for d in dims])


try:
    from hypothesis import given, settings, strategies as st
except ImportError:           # pragma: no cover
    given = None


if given is not None:
    @pytest.mark.mpi(min_size=1)
    @settings(max_examples=15)
    @given(seed=st.integers(0, 2**31 - 1), shape=st.lists(st.integers(0, 40), min_size=1,
                                                         max_size=3))
    def test_property_any_pair(seed, shape):
        rng = np.random.default_rng(seed)
        where = tempfile.mkdtemp(prefix="mpiredist-prop-") if RANK == 0 else None
        where = COMM.bcast(where)
        try:
            shape = tuple(shape)
            dtype = [np.float32, np.int16, np.float64, np.uint8][seed % 4]
            G = rng.integers(0, 100, size=shape).astype(dtype)
            choices = meshes(P)
            m1 = choices[int(rng.integers(len(choices)))]
            m2 = choices[int(rng.integers(len(choices)))]
            l1, l2 = layouts(m1, len(shape), rng), layouts(m2, len(shape), rng)
            path = os.path.join(where, "ck")
            mr.save(path, {"g": mr.DistArray.from_global(G, m1, l1)})
            out = mr.load(path, {"g": (m2, l2)})
            all_ok(COMM, same(out["g"].local, block(G, m2, l2)),
                   f"{shape} {np.dtype(dtype)}: {l1} on {m1} -> {l2} on {m2}")
        finally:
            COMM.Barrier()
            if RANK == 0:
                shutil.rmtree(where, ignore_errors=True)


@pytest.mark.mpi(min_size=1)
def test_bfloat16_round_trip(where):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    G = (np.arange(33 * 20).reshape(33, 20) / 7).astype(bf16)
    mesh = Mesh({"x": P})
    path = os.path.join(where, "ck")
    mr.save(path, {"w": mr.DistArray.from_global(G, mesh, "[{x}, {}]")})
    out = mr.load(path, {"w": (mesh, "[{}, {x}]")})
    all_ok(COMM, same(out["w"].local, block(G, mesh, "[{}, {x}]")), "bf16 values")
    with open(os.path.join(path, "gen-000001", "index.json")) as f:
        doc = json.load(f)
    all_ok(COMM, doc["arrays"][0]["dtype"] == "bfloat16", "dtype name in the index")


@pytest.mark.mpi(min_size=1)
def test_uneven_and_empty_blocks(where):
    mesh = Mesh({"x": P})
    path = os.path.join(where, "ck")
    G = np.arange(3 * 5, dtype=np.int64).reshape(3, 5)          # empty blocks past rank 2
    E = np.zeros((0, 4), dtype=np.float32)                       # no elements at all
    S = np.array(7.5)                                            # 0-d
    mr.save(path, {"g": mr.DistArray.from_global(G, mesh, "[{x}, {}]"),
                   "e": mr.DistArray.from_global(E, mesh, "[{}, {x}]"), "s": S})
    out = mr.load(path, {"g": (mesh, "[{}, {x}]"), "e": (mesh, "[{x}, {}]"),
                         "s": np.zeros(())})
    all_ok(COMM, same(out["g"].local, block(G, mesh, "[{}, {x}]")), "uneven")
    all_ok(COMM, same(out["e"].local, block(E, mesh, "[{x}, {}]")), "empty")
    all_ok(COMM, out["s"].shape == () and float(out["s"]) == 7.5, "0-d")


@pytest.mark.mpi(min_size=2)
def test_partial_sums_reduced_before_saving(where):
    rng = np.random.default_rng(3)
    G = rng.integers(-20, 20, size=(16, 6)).astype(np.float64)
    for mesh, layout in ((Mesh({"x": P}), "[{}, {}] sum{x}"),
                         (Mesh({"x": 2, "y": P // 2}) if P % 2 == 0 else Mesh({"x": P}),
                          "[{x}, {}] sum{y}" if P % 2 == 0 else "[{}, {}] max{x}")):
        path = os.path.join(where, "ck")
        mr.save(path, {"p": source(G, mesh, layout, rng)})
        out = mr.load(path, {"p": np.zeros_like(G)})
        all_ok(COMM, np.array_equal(out["p"], G), f"{layout}: saved the reduced array")


@pytest.mark.mpi(min_size=1)
def test_nested_dicts_subsets_values_in_place(where):
    rng = np.random.default_rng(1)
    mesh = Mesh({"x": P})
    W = rng.standard_normal((24, 16)).astype(np.float32)
    B = rng.standard_normal(16).astype(np.float32)
    state = {"model": {"layers.0": {"w": mr.DistArray.from_global(W, mesh, "[{x}, {}]"),
                                    "b": B}},
             "opt": {"step": 12, "lr": 0.5, "betas": [0.9, 0.99], "name": "adam",
                     "none": None}}
    path = os.path.join(where, "ck")
    mr.save(path, state)
    target = mr.DistArray.from_global(np.zeros_like(W), mesh, "[{}, {x}]")
    before = target.local.__array_interface__["data"][0]
    out = mr.load(path, {"model": {"layers.0": {"w": target}}, "opt": {"step": None,
                                                                      "betas": None}})
    all_ok(COMM, out["model"]["layers.0"]["w"] is target
           and target.local.__array_interface__["data"][0] == before
           and same(target.local, block(W, mesh, "[{}, {x}]")), "in place into a DistArray")
    all_ok(COMM, out["opt"] == {"step": 12, "betas": [0.9, 0.99]}, f"values: {out['opt']}")
    all_ok(COMM, set(out) == {"model", "opt"} and set(out["model"]["layers.0"]) == {"w"},
           "only the subset asked for")
    ck = mr.checkpoint.open(path)
    all_ok(COMM, ck.names == ["model.layers.0.b", "model.layers.0.w"]
           and ck.values["opt.name"] == "adam" and ck.values["opt.none"] is None,
           f"open: {ck.names} {ck.values}")


@pytest.mark.mpi(min_size=2)
def test_save_from_a_sub_mesh_load_on_all(where):
    G = np.arange(40 * 6, dtype=np.float32).reshape(40, 6)
    half = Mesh({"x": P // 2 or 1}, ranks=list(range(P // 2 or 1)))
    a = mr.DistArray.from_global(G, half, "[{x}, {}]")
    path = os.path.join(where, "ck")
    mr.save(path, {"g": a})
    everyone = Mesh({"y": P})
    out = mr.load(path, {"g": (everyone, "[{y}, {}]")})
    all_ok(COMM, same(out["g"].local, block(G, everyone, "[{y}, {}]")), "sub-mesh save")
    rest = Mesh({"z": P - (P // 2)}, ranks=list(range(P // 2, P)))
    out = mr.load(path, {"g": (rest, "[{}, {z}]")})
    all_ok(COMM, same(out["g"].local, block(G, rest, "[{}, {z}]")), "load on other ranks")


@pytest.mark.mpi(min_size=1)
def test_replicated_writes_are_balanced(where):
    """Each distinct box is written once, and a big one by all its replicas."""
    mesh = Mesh({"x": P})
    G = np.ones((1024, 512), dtype=np.float32)          # 2 MiB, replicated on every rank
    path = os.path.join(where, "ck")
    mr.save(path, {"g": mr.DistArray.from_global(G, mesh, "[{}, {}]")})
    with open(os.path.join(path, "gen-000001", "index.json")) as f:
        doc = json.load(f)
    pieces = doc["arrays"][0]["pieces"]
    rows = sorted((p["box"][0][0], p["box"][0][1]) for p in pieces)
    covered = sum(b - a for a, b in rows)
    files = {p["file"] for p in pieces}
    all_ok(COMM, covered == 1024 and len(files) == P and all(
        r[1] == s[0] for r, s in zip(rows, rows[1:])), f"pieces {rows} in {files}")
    sizes = [doc["files"][f] for f in files]
    all_ok(COMM, max(sizes) - min(sizes) <= 2 * G.nbytes // P // 8 + 4096,
           f"file sizes {sizes}")
