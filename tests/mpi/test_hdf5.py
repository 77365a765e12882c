"""mpiredist.arrays.hdf5 under MPI: any number of ranks.

    timeout 120 mpiexec -n 4 python -m pytest --with-mpi tests/mpi/test_hdf5.py

Every assertion is agreed across ranks (``helpers.all_ok``), so that a
failure fails on all ranks together instead of leaving some in a collective.
"""

import json
import math
import os
import pathlib
import shutil
import tempfile

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")
MPI = pytest.importorskip("mpi4py.MPI")

from helpers import all_ok  # noqa: E402  (tests/mpi/helpers.py)
import oracle  # noqa: E402
from mpiredist import Layout, Mesh  # noqa: E402
from mpiredist.arrays import hdf5  # noqa: E402
from mpiredist.core.errors import (LayoutError, MeshError, MismatchError,  # noqa: E402
                              RemoteError, ShapeError)
from mpiredist.arrays.hdf5 import HDF5Error, read_block, write_blocks  # noqa: E402
from mpiredist.core.blocks import interval  # noqa: E402
from mpiredist.core.subaxes import prime_factors  # noqa: E402

pytestmark = pytest.mark.mpi

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
MPIO = [False, True] if h5py.get_config().mpi else [False]


# ---------------------------------------------------------------- helpers

def agree(flag, message=""):
    """Assert ``flag`` on every rank; all ranks fail together."""
    all_ok(COMM, flag, message)


def outcome(fn, *args, **kwargs):
    """Run ``fn``; return the exception it raised on this rank, or None."""
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return exc
    return None


def raised_everywhere(error, expected, where=None, remote=RemoteError):
    """Assert every rank raised: ``expected`` on ranks ``where`` (default all), else ``remote``."""
    mine = expected if where is None or RANK in where else remote
    agree(isinstance(error, mine), f"expected {mine.__name__}, got {error!r}")


@pytest.fixture
def shared_dir():
    """A directory every rank sees: made by rank 0, removed after the test."""
    name = tempfile.mkdtemp(prefix="mpiredist-h5-") if RANK == 0 else None
    name = COMM.bcast(name, root=0)
    yield pathlib.Path(name)
    COMM.Barrier()
    if RANK == 0:
        shutil.rmtree(name, ignore_errors=True)


def listing(directory):
    """Sorted names in ``directory`` as rank 0 sees them (same on every rank)."""
    names = sorted(os.listdir(directory)) if RANK == 0 else None
    return COMM.bcast(names, root=0)


def global_array(shape, dtype="float32"):
    return (np.arange(math.prod(shape)) * 3 + 1).astype(dtype).reshape(shape)


def block_of(g, mesh, layout):
    """This rank's block of ``g`` by the independent oracle (tests/oracle.py)."""
    dims = [list(d) for d in Layout.parse(layout).dims]
    return g[oracle.block_slices(g.shape, list(mesh.axes), dims, RANK)]


def whole_file(path, dataset):
    """The dataset as plain h5py reads it on rank 0, broadcast."""
    data = None
    if RANK == 0:
        with h5py.File(path, "r") as f:
            data = f[dataset][()]
    return COMM.bcast(data, root=0)


def round_trip(directory, g, mesh, src, dst, mpio, name="a"):
    path = directory / f"{name}.h5"
    write_blocks(path, name, block_of(g, mesh, src), g.shape, mesh, src, mpio=mpio)
    agree(np.array_equal(whole_file(path, name), g), f"file != global for {src}")
    for layout in (dst, src):
        local, shape, dtype = read_block(path, name, mesh, layout, mpio=mpio)
        agree(shape == g.shape and dtype == g.dtype, f"{shape} {dtype}")
        agree(np.array_equal(local, block_of(g, mesh, layout))
              and local.shape == block_of(g, mesh, layout).shape,
              f"read block of {layout} differs")
    agree(listing(directory) == [f"{name}.h5"], "a temporary file was left")
    if RANK == 0:
        os.remove(path)
    COMM.Barrier()


# ------------------------------------------------- cases.json, scaled down

def _cases():
    here = pathlib.Path(__file__).resolve()
    paths = [base / "shared" / "cases.json" for base in (here.parents[2], here.parents[3])]
    paths.append(here.parents[2] / "mpiredist" / "bench" / "data" / "cases.json")  # packaged copy
    for path in paths:
        if path.exists():
            return json.loads(path.read_text())["cases"]
    return []


CASES = _cases()


def _small_shape(shape):
    if any(n % 2 for n in shape):
        return (7, 5)  # keep uneven cases uneven
    return (12, 10) if len(shape) == 2 else (6,) * len(shape)


def _shrunk_mesh(axes, size):
    """The case mesh with axis sizes cut down to ``size`` ranks, or None."""
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


def _on_1d(layout, first):
    """The analogous layout on mesh ``{"x": P}``: the case's first axis becomes x."""
    return Layout(tuple(("x",) if first in d else () for d in layout.dims))


def _variants(case):
    src = Layout.from_dict(case["src"]).without_partial()
    dst = Layout.from_dict(case["dst"]).without_partial()
    mesh = _shrunk_mesh(case["mesh"], SIZE)
    if mesh is not None:
        yield "case", mesh, src, dst
    first = next(iter(case["mesh"]))
    yield "1d", Mesh({"x": SIZE}), _on_1d(src, first), _on_1d(dst, first)


@pytest.mark.skipif(not CASES, reason="shared/cases.json not found beside the repository")
@pytest.mark.parametrize("mpio", MPIO, ids=lambda m: "mpio" if m else "serial")
@pytest.mark.parametrize("case", CASES, ids=lambda c: c["id"])
def test_cases_round_trip(shared_dir, case, mpio):
    shape = _small_shape(case["shape"])
    g = global_array(shape)
    ran = 0
    for kind, mesh, src, dst in _variants(case):
        round_trip(shared_dir, g, mesh, src, dst, mpio, name=f"{kind}_src")
        round_trip(shared_dir, g, mesh, dst, src, mpio, name=f"{kind}_dst")
        ran += 1
    agree(ran >= 1, "no variant ran")


def _meshes():
    if SIZE % 2 == 0 and SIZE > 2:
        return [Mesh({"x": SIZE}), Mesh({"x": 2, "y": SIZE // 2})]
    return [Mesh({"x": SIZE}), Mesh({"x": 1, "y": SIZE})]


@pytest.mark.parametrize("mpio", MPIO, ids=lambda m: "mpio" if m else "serial")
@pytest.mark.parametrize("shape", [(7, 5), (3, 5), (2, 5), (0, 4)])
def test_uneven_and_empty_blocks(shared_dir, shape, mpio):
    g = global_array(shape, "int32")
    pairs = [("[{x}, {}]", "[{}, {x}]"), ("[{x,y}, {}]", "[{}, {y,x}]"),
             ("[{y}, {x}]", "[{}, {}]")]
    ran = 0
    for i, mesh in enumerate(_meshes()):
        for j, (src, dst) in enumerate(pairs):
            if "y" in src + dst and "y" not in mesh.names:
                continue
            round_trip(shared_dir, g, mesh, src, dst, mpio, name=f"u{i}{j}")
            ran += 1
    agree(ran >= 4, f"only {ran} layout pairs ran")


@pytest.mark.parametrize("mpio", MPIO, ids=lambda m: "mpio" if m else "serial")
@pytest.mark.parametrize("chunked", [False, True], ids=["contiguous", "chunked_gzip"])
def test_reads_file_written_by_plain_h5py(shared_dir, chunked, mpio):
    g = global_array((13, 9), "float64")
    path = shared_dir / "plain.h5"
    if RANK == 0:
        with h5py.File(path, "w") as f:
            opts = dict(chunks=(4, 3), compression="gzip", compression_opts=4) if chunked else {}
            f.create_dataset("grp/data", data=g, **opts)
    COMM.Barrier()
    mesh = Mesh({"x": SIZE})
    for layout in ("[{x}, {}]", "[{}, {x}]", "[{}, {}]"):
        local, shape, dtype = read_block(path, "grp/data", mesh, layout, mpio=mpio)
        agree(shape == (13, 9) and dtype == np.float64, f"{shape} {dtype}")
        agree(np.array_equal(local, block_of(g, mesh, layout)), f"block of {layout}")


@pytest.mark.parametrize("mpio", MPIO, ids=lambda m: "mpio" if m else "serial")
def test_replicas_are_written_once(shared_dir, monkeypatch, mpio):
    calls = []
    real = hdf5._write_hyperslab
    monkeypatch.setattr(hdf5, "_write_hyperslab",
                        lambda dset, block, local: (calls.append(block), real(dset, block, local)))
    mesh = _meshes()[1]
    g = global_array((8, 6))

    def nonempty(n, k):  # distinct non-empty blocks of a dim of n in k shards
        return sum(1 for p in range(k) if interval(n, k, p)[0] < interval(n, k, p)[1])
    cases = (("[{}, {}]", 1), ("[{x}, {}]", nonempty(8, mesh.axis_size("x"))),
             ("[{}, {y}]", nonempty(6, mesh.axis_size("y"))))
    for i, (layout, blocks) in enumerate(cases):
        calls.clear()
        name = f"r{i}"
        write_blocks(shared_dir / "r.h5", name, block_of(g, mesh, layout), g.shape,
                     mesh, layout, mpio=mpio)
        agree(COMM.allreduce(len(calls)) == blocks, f"{layout}: writes != {blocks}")
        agree(np.array_equal(whole_file(shared_dir / "r.h5", name), g), layout)


@pytest.mark.parametrize("mpio", MPIO, ids=lambda m: "mpio" if m else "serial")
def test_existing_file_keeps_other_datasets(shared_dir, mpio):
    path = shared_dir / "e.h5"
    if RANK == 0:
        with h5py.File(path, "w") as f:
            f["keep"] = np.arange(5)
    COMM.Barrier()
    mesh, layout = Mesh({"x": SIZE}), "[{x}, {}]"
    g = global_array((5, 3))
    write_blocks(path, "new/a", block_of(g, mesh, layout), g.shape, mesh, layout, mpio=mpio)
    err = outcome(write_blocks, path, "new/a", block_of(g, mesh, layout), g.shape,
                  mesh, layout, mpio=mpio)
    raised_everywhere(err, HDF5Error)
    agree("overwrite=True" in str(err), str(err))
    write_blocks(path, "new/a", block_of(2 * g, mesh, layout), g.shape, mesh, layout,
                 overwrite=True, mpio=mpio)
    agree(np.array_equal(whole_file(path, "keep"), np.arange(5)), "keep lost")
    agree(np.array_equal(whole_file(path, "new/a"), 2 * g), "overwrite")
    agree(listing(shared_dir) == ["e.h5"], "stray files")


# ------------------------------------------------------------ error cases

@pytest.fixture
def small_file(shared_dir):
    path = shared_dir / "s.h5"
    if RANK == 0:
        with h5py.File(path, "w") as f:
            f["a"] = global_array((6, 4))
            f.create_group("g")
    COMM.Barrier()
    return path


@pytest.mark.parametrize("dataset, layout, mesh, error, text", [
    ("a", "[{x}]", None, LayoutError, "has 1 dimension"),
    ("a", "[{x}, {}] sum{y}", "2d", LayoutError, "partial"),
    ("a", "[{z}, {}]", None, LayoutError, "'z'"),
    ("a", "[{x}, {}]", "big", MeshError, "communicator"),
    ("nope", "[{x}, {}]", None, HDF5Error, "no dataset 'nope'"),
    ("g", "[{x}, {}]", None, HDF5Error, "is a group"),
])
def test_read_errors_raise_on_every_rank(small_file, dataset, layout, mesh, error, text):
    mesh = {None: Mesh({"x": SIZE}), "2d": Mesh({"x": SIZE, "y": 1}),
            "big": Mesh({"x": SIZE + 1})}[mesh]
    err = outcome(read_block, small_file, dataset, mesh, layout)
    raised_everywhere(err, error)
    agree(text in str(err), str(err))


def test_read_missing_file_raises_on_every_rank(shared_dir):
    err = outcome(read_block, shared_dir / "missing.h5", "a", Mesh({"x": SIZE}), "[{x}]")
    raised_everywhere(err, HDF5Error)
    agree("does not exist" in str(err), str(err))


def _write_args(shared_dir, **change):
    mesh = Mesh({"x": SIZE})
    args = dict(path=shared_dir / "w.h5", dataset="a", global_shape=(8, 4), mesh=mesh,
                layout="[{x}, {}]")
    args["local"] = block_of(global_array((8, 4)), mesh, args["layout"])
    args.update(change)
    return args


@pytest.mark.parametrize("change, error, text", [
    (dict(layout="[{x}]"), LayoutError, "1 dimension"),
    (dict(layout="[{x}, {}] sum{y}", mesh=Mesh({"x": SIZE, "y": 1})), LayoutError, "partial"),
    (dict(mesh=Mesh({"x": SIZE, "y": 2})), MeshError, "communicator"),
])
def test_write_errors_raise_on_every_rank(shared_dir, change, error, text):
    err = outcome(write_blocks, **_write_args(shared_dir, **change))
    raised_everywhere(err, error)
    agree(text in str(err), str(err))
    agree(listing(shared_dir) == [], "something was written")


def test_wrong_local_shape_names_the_rank(shared_dir):
    bad = SIZE - 1
    args = _write_args(shared_dir)
    if RANK == bad:
        args["local"] = np.zeros((9, 9), dtype="float32")
    err = outcome(write_blocks, **args)
    raised_everywhere(err, ShapeError, where={bad})
    agree(f"rank {bad}" in str(err), str(err))
    agree(listing(shared_dir) == [], "something was written")


@pytest.mark.mpi(min_size=2)
def test_dtype_mismatch_across_ranks(shared_dir):
    args = _write_args(shared_dir)
    if RANK == SIZE - 1:
        args["local"] = args["local"].astype("float64")
    err = outcome(write_blocks, **args)
    raised_everywhere(err, MismatchError)
    agree("dtype" in str(err) and "float64" in str(err), str(err))
    agree(listing(shared_dir) == [], "something was written")


@pytest.mark.mpi(min_size=2)
def test_dataset_name_mismatch_across_ranks(shared_dir):
    err = outcome(write_blocks, **_write_args(shared_dir, dataset=f"a{RANK % 2}"))
    raised_everywhere(err, MismatchError)
    agree(listing(shared_dir) == [], "something was written")


def test_existing_dataset_without_overwrite(small_file):
    before = whole_file(small_file, "a")
    err = outcome(write_blocks, **_write_args(small_file.parent, path=small_file))
    raised_everywhere(err, HDF5Error)
    agree(np.array_equal(whole_file(small_file, "a"), before), "dataset was changed")


@pytest.mark.parametrize("mpio", MPIO, ids=lambda m: "mpio" if m else "serial")
@pytest.mark.parametrize("existing", [False, True], ids=["new_file", "existing_file"])
def test_failure_while_writing_leaves_nothing(shared_dir, monkeypatch, existing, mpio):
    bad = SIZE - 1
    path = shared_dir / "w.h5"
    if existing and RANK == 0:
        with h5py.File(path, "w") as f:
            f["keep"] = np.arange(4)
    COMM.Barrier()
    if RANK == bad:
        def fail(dset, block, local):
            raise OSError("disk full")
        monkeypatch.setattr(hdf5, "_write_hyperslab", fail)
    args = _write_args(shared_dir)
    agree(args["local"].size > 0, "the failing rank must have something to write")
    err = outcome(write_blocks, **args, mpio=mpio)
    raised_everywhere(err, HDF5Error, where={bad})
    agree(f"rank {bad}" in str(err), str(err))
    agree(listing(shared_dir) == (["w.h5"] if existing else []), "leftovers")
    if existing:
        names = None
        if RANK == 0:
            with h5py.File(path, "r") as f:
                names = sorted(f)
        agree(COMM.bcast(names, root=0) == ["keep"], "incomplete dataset left")
