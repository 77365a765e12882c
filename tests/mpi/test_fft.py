"""mpiredist.arrays.fft and scripts/fft_example.py under MPI: any number of ranks.

    timeout 300 mpiexec -n 4 python -m pytest -q --with-mpi tests/mpi/test_fft.py

Results are gathered and compared with numpy.fft on the global array, on
every rank (``helpers.all_ok``).  Uneven shapes leave some ranks with empty
blocks at 3 and 4 ranks.
"""

import importlib.util
import os
import tempfile

import numpy as np
import pytest
from helpers import all_ok, need_ranks

from mpiredist import Layout, Mesh
from mpiredist.arrays.distarray import DistArray
from mpiredist.core.errors import LayoutError, MeshError, ShapeError
from mpiredist.arrays.fft import fft2, fftn, fftn3, ifft2, ifftn, ifftn3

pytestmark = pytest.mark.mpi

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def data(shape, dtype="float64", seed=0):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        g = g + 1j * rng.standard_normal(shape)
    return g.astype(dtype)


def close(actual, expected, rtol=1e-10):
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return False
    scale = max(float(np.abs(expected).max(initial=0.0)), 1.0)
    return float(np.abs(actual - expected).max(initial=0.0)) <= rtol * scale


def mesh1d(comm):
    return Mesh({"x": comm.size})


@pytest.mark.parametrize("shape", [(10, 7), (8, 8), (3, 5), (1, 4), (5, 1), (2, 9)])
@pytest.mark.parametrize("dtype", ["float64", "complex128"])
def test_fft2_matches_numpy(comm, shape, dtype):
    g = data(shape, dtype)
    a = DistArray.from_global(g, mesh1d(comm), "[{x}, {}]")
    before = a.local.copy()
    F = fft2(a)
    all_ok(comm, F.layout == Layout.parse("[{}, {x}]") and F.shape == shape,
           f"fft2 layout {F.layout}, shape {F.shape}")
    all_ok(comm, close(F.gather(), np.fft.fft2(g)), f"fft2 {shape} {dtype}")
    all_ok(comm, np.array_equal(a.local, before), "fft2 modified its input")


def test_fft2_float32_and_norm(comm):
    g = data((9, 6), "float32")
    a = DistArray.from_global(g, mesh1d(comm), "[{x}, {}]")
    F = fft2(a)
    all_ok(comm, close(F.gather(), np.fft.fft2(g), rtol=1e-5), "float32 fft2")
    F = fft2(DistArray.from_global(g.astype("f8"), mesh1d(comm), "[{x}, {}]"), norm="ortho")
    all_ok(comm, close(F.gather(), np.fft.fft2(g.astype("f8"), norm="ortho")), "ortho")


def test_fft2_out_layout_and_inverse(comm):
    g = data((10, 7), "complex128", seed=1)
    a = DistArray.from_global(g, mesh1d(comm), "[{x}, {}]")
    F = fft2(a, out_layout="[{x}, {}]")
    all_ok(comm, F.layout == Layout.parse("[{x}, {}]"), str(F.layout))
    want = DistArray.from_global(np.fft.fft2(g), mesh1d(comm), "[{x}, {}]")
    all_ok(comm, close(F.local, want.local), "out_layout blocks")
    back = ifft2(F)
    all_ok(comm, back.layout == Layout.parse("[{}, {x}]"), str(back.layout))
    all_ok(comm, close(back.gather(), g), "ifft2(fft2(a)) == a")
    back = ifftn(fft2(a))      # from the transposed output straight back
    all_ok(comm, back.layout == Layout.parse("[{x}, {}]") and close(back.gather(), g),
           f"ifftn of the transposed output: {back.layout}")


@pytest.mark.parametrize("shape", [(9, 6, 5), (4, 4, 4), (2, 3, 7), (5, 1, 3)])
def test_fftn3_matches_numpy(comm, shape):
    g = data(shape, seed=2)
    a = DistArray.from_global(g, mesh1d(comm), "[{x}, {}, {}]")
    F = fftn3(a)
    all_ok(comm, F.layout == Layout.parse("[{}, {x}, {}]"), str(F.layout))
    all_ok(comm, close(F.gather(), np.fft.fftn(g)), f"fftn3 {shape}")
    back = ifftn3(fftn3(a, out_layout="[{x}, {}, {}]"))
    all_ok(comm, close(back.gather(), g.astype(complex)), "ifftn3 round trip")


def test_fftn_pencils_on_2d_mesh(comm):
    need_ranks(comm, 4)
    if comm.size % 2:
        pytest.skip("needs an even number of ranks for a 2 x n mesh")
    mesh = Mesh({"x": 2, "y": comm.size // 2})
    g = data((6, 5, 7), "complex128", seed=3)
    a = DistArray.from_global(g, mesh, "[{x}, {y}, {}]")
    F = fftn(a)
    all_ok(comm, F.layout == Layout.parse("[{}, {x}, {y}]"), str(F.layout))
    all_ok(comm, close(F.gather(), np.fft.fftn(g)), "pencil fftn")
    back = ifftn(F, out_layout=a.layout)
    all_ok(comm, close(back.local, a.local), "pencil round trip")


def test_fftn_any_layout_and_dims(comm):
    mesh = mesh1d(comm)
    for text, shape in (("[{}, {x}]", (7, 10)), ("[{}, {}]", (4, 3)),
                        ("[{}]", (11,)), ("[{}, {x}, {}, {}]", (3, 5, 2, 4))):
        g = data(shape, seed=4)
        F = fftn(DistArray.from_global(g, mesh, text))
        all_ok(comm, close(F.gather(), np.fft.fftn(g)), f"fftn {text} {shape}")


def test_fft_errors(comm):
    mesh = mesh1d(comm)
    a2 = DistArray.from_global(data((4, 6)), mesh, "[{}, {x}]")
    with pytest.raises(LayoutError, match=r"expected layout \[\{x\}, \{\}\]"):
        fft2(a2)
    a3 = DistArray.from_global(data((4, 6, 2)), mesh, "[{x}, {}, {}]")
    with pytest.raises(ShapeError, match="2-D"):
        fft2(a3)
    with pytest.raises(ShapeError, match="3-D"):
        fftn3(DistArray.from_global(data((4, 6)), mesh, "[{x}, {}]"))
    with pytest.raises(ShapeError, match="zero-length"):
        fft2(DistArray.from_global(np.zeros((0, 3)), mesh, "[{x}, {}]"))
    from mpiredist.arrays import ops
    with pytest.raises(LayoutError, match="partial"):
        fftn(ops.sum(a3, 0))
    with pytest.raises(LayoutError, match="every dim"):
        fftn(DistArray.from_global(data((4,)), mesh, "[{x}]"))


def test_fft2_needs_1d_mesh(comm):
    need_ranks(comm, 4)
    if comm.size % 2:
        pytest.skip("needs an even number of ranks for a 2 x n mesh")
    mesh = Mesh({"x": 2, "y": comm.size // 2})
    a = DistArray.from_global(data((4, 6)), mesh, "[{x}, {}]")
    with pytest.raises(MeshError, match="1-D mesh"):
        fft2(a)


# ----------------------------------------------------------- the example

def _load_example():
    path = os.path.join(REPO, "scripts", "fft_example.py")
    spec = importlib.util.spec_from_file_location("fft_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fft_example_main(comm, capsys):
    pytest.importorskip("h5py")
    example = _load_example()
    directory = tempfile.mkdtemp(prefix="mpiredist-fft-test-") if comm.rank == 0 else None
    directory = comm.bcast(directory, root=0)
    try:
        rc = example.main(["--shape", "9,6,5", "--out", directory, "--repeat", "1"], comm)
        out = capsys.readouterr().out
        all_ok(comm, rc == 0, f"fft_example.main returned {rc}: {out}")
        all_ok(comm, comm.rank != 0 or "OK" in out, out)
        all_ok(comm, os.path.exists(os.path.join(directory, "spectrum.h5")),
               "spectrum.h5 not written")
        rc = example.main(["--shape", "5,4,3", "--dtype", "float32", "--repeat", "1"], comm)
        all_ok(comm, rc == 0, "float32 run, temporary directory")
    finally:
        comm.Barrier()
        if comm.rank == 0:
            import shutil
            shutil.rmtree(directory, ignore_errors=True)
