"""mpiredist.arrays.hdf5 in one process: a mesh of size 1, no mpiexec needed."""

import os
import sys

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")

from mpiredist import Layout, Mesh  # noqa: E402
from mpiredist.arrays import hdf5  # noqa: E402
from mpiredist.core.errors import LayoutError, MeshError, ShapeError  # noqa: E402
from mpiredist.arrays.hdf5 import HDF5Error, read_block, write_blocks  # noqa: E402

MESH1 = Mesh({"x": 1})
MESH11 = Mesh({"x": 1, "y": 1})
MPIO = [False, True] if h5py.get_config().mpi else [False]


def _files(directory):
    return sorted(os.listdir(directory))


def _global(shape, dtype="float32"):
    return np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)


@pytest.mark.parametrize("mpio", MPIO)
@pytest.mark.parametrize("shape, layout, mesh", [
    ((12, 10), "[{x}, {}]", MESH1),
    ((12, 10), "[{}, {x}]", MESH1),
    ((12, 10), "[{}, {}]", MESH1),
    ((7, 5), "[{x,y}, {}]", MESH11),
    ((6, 6, 6), "[{x}, {y}, {}]", MESH11),
    ((0, 4), "[{x}, {}]", MESH1),
    ((), "[]", MESH1),
])
def test_round_trip(tmp_path, shape, layout, mesh, mpio):
    g = _global(shape)
    path = tmp_path / "a.h5"
    write_blocks(path, "a", g, shape, mesh, layout, mpio=mpio)
    local, gshape, dtype = read_block(path, "a", mesh, Layout.parse(layout), mpio=mpio)
    assert gshape == shape and dtype == np.float32
    assert isinstance(local, np.ndarray) and local.shape == shape
    np.testing.assert_array_equal(local, g)
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["a"][()], g)
    assert _files(tmp_path) == ["a.h5"]  # the temporary file is gone


def test_reads_file_of_plain_h5py_chunked_gzip(tmp_path):
    g = _global((13, 9), "int64")
    path = tmp_path / "plain.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("grp/z", data=g, chunks=(4, 4), compression="gzip")
    local, shape, dtype = read_block(str(path), "grp/z", MESH1, "[{}, {x}]")
    assert (shape, dtype) == ((13, 9), np.dtype("int64"))
    np.testing.assert_array_equal(local, g)


def test_adding_dataset_keeps_others_and_overwrite_replaces(tmp_path):
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f["keep"] = np.arange(3)
    write_blocks(path, "new", np.ones((2, 2)), (2, 2), MESH1, "[{x}, {}]")
    with pytest.raises(HDF5Error, match="overwrite=True"):
        write_blocks(path, "new", np.zeros((2, 2)), (2, 2), MESH1, "[{x}, {}]")
    write_blocks(path, "new", np.full((3,), 7, "i2"), (3,), MESH1, "[{x}]",
                 overwrite=True)
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["keep"][()], np.arange(3))
        np.testing.assert_array_equal(f["new"][()], np.full((3,), 7, "i2"))
        assert f["new"].dtype == np.int16
    assert _files(tmp_path) == ["a.h5"]


@pytest.mark.parametrize("make, dataset, message", [
    (None, "a", "does not exist"),
    ("plain", "b", "has no dataset 'b'"),
    ("plain", "g", "is a group"),
    ("text", "a", "is not an HDF5 file"),
])
def test_read_file_errors(tmp_path, make, dataset, message):
    path = tmp_path / "f.h5"
    if make == "plain":
        with h5py.File(path, "w") as f:
            f["a"] = np.zeros(3)
            f.create_group("g")
    elif make == "text":
        path.write_text("not hdf5")
    with pytest.raises(HDF5Error, match=message):
        read_block(path, dataset, MESH1, "[{x}]")


def test_read_layout_errors(tmp_path):
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        f["a"] = np.zeros((3, 4))
    with pytest.raises(LayoutError, match=r"shape \(3, 4\): layout \[\{x\}\] has 1 dimension"):
        read_block(path, "a", MESH1, "[{x}]")
    with pytest.raises(LayoutError, match="partial"):
        read_block(path, "a", MESH11, "[{x}, {}] sum{y}")
    with pytest.raises(LayoutError, match="'z'"):
        read_block(path, "a", MESH1, "[{z}, {}]")
    with pytest.raises(MeshError, match="2 ranks but the communicator has 1"):
        read_block(path, "a", Mesh({"x": 2}), "[{x}, {}]")


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(local=np.zeros((3, 4)), layout="[{x}]"), LayoutError, "1 dimension"),
    (dict(layout="[{x}, {}] sum{y}", mesh=MESH11), LayoutError, "partial"),
    (dict(local=np.zeros((3, 3))), ShapeError, r"rank 0 passed a local block of shape \(3, 3\)"),
    (dict(local=np.zeros((3, 4), dtype=object)), ShapeError, "cannot be stored"),
    (dict(mesh=Mesh({"x": 3})), MeshError, "3 ranks"),
    (dict(global_shape=(3, -4)), ShapeError, "non-negative"),
    (dict(dataset=""), HDF5Error, "non-empty"),
])
def test_write_errors_leave_nothing(tmp_path, kwargs, error, message):
    args = dict(path=tmp_path / "w.h5", dataset="a", local=np.zeros((3, 4)),
                global_shape=(3, 4), mesh=MESH1, layout="[{x}, {}]")
    args.update(kwargs)
    with pytest.raises(error, match=message):
        write_blocks(**args)
    assert _files(tmp_path) == []


def test_write_refuses_to_replace_non_hdf5_file_or_group(tmp_path):
    text = tmp_path / "t.h5"
    text.write_text("precious")
    with pytest.raises(HDF5Error, match="not an HDF5 file"):
        write_blocks(text, "a", np.zeros(2), (2,), MESH1, "[{x}]", overwrite=True)
    assert text.read_text() == "precious"
    path = tmp_path / "g.h5"
    with h5py.File(path, "w") as f:
        f.create_group("g")
    with pytest.raises(HDF5Error, match="is a group"):
        write_blocks(path, "g", np.zeros(2), (2,), MESH1, "[{x}]", overwrite=True)
    with pytest.raises(HDF5Error, match="directory"):
        write_blocks(tmp_path / "no" / "x.h5", "a", np.zeros(2), (2,), MESH1, "[{x}]")


def test_failed_write_removes_temporary_file(tmp_path, monkeypatch):
    def fail(dset, block, local):
        raise OSError("disk full")
    monkeypatch.setattr(hdf5, "_write_hyperslab", fail)
    with pytest.raises(HDF5Error, match="rank 0 failed: OSError: disk full"):
        write_blocks(tmp_path / "a.h5", "a", np.ones(4), (4,), MESH1, "[{x}]")
    assert _files(tmp_path) == []


def test_failed_write_into_existing_file_removes_dataset(tmp_path, monkeypatch):
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f["keep"] = np.arange(2)
    monkeypatch.setattr(hdf5, "_write_hyperslab",
                        lambda *a: (_ for _ in ()).throw(OSError("boom")))
    with pytest.raises(HDF5Error, match="boom"):
        write_blocks(path, "new", np.ones(4), (4,), MESH1, "[{x}]")
    with h5py.File(path, "r") as f:
        assert sorted(f) == ["keep"]


def test_mpio_true_without_parallel_h5py_is_an_error(tmp_path):
    if h5py.get_config().mpi:
        pytest.skip("this h5py has MPI; the error is for serial builds")
    with pytest.raises(HDF5Error, match="without MPI"):
        write_blocks(tmp_path / "a.h5", "a", np.ones(2), (2,), MESH1, "[{x}]", mpio=True)
    assert _files(tmp_path) == []


def test_missing_h5py_has_a_clear_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "h5py", None)
    with pytest.raises(ImportError, match=r"pip install mpiredist\[hdf5\]"):
        read_block("x.h5", "a", MESH1, "[{x}]")


def test_cupy_like_block_is_copied_to_host(tmp_path):
    class FakeDevice:
        __cuda_array_interface__ = {}

        def __init__(self, a):
            self.a = a

        def get(self):
            return self.a
    g = _global((4, 2))
    write_blocks(tmp_path / "c.h5", "c", FakeDevice(g), (4, 2), MESH1, "[{x}, {}]")
    local, _, _ = read_block(tmp_path / "c.h5", "c", MESH1, "[{x}, {}]")
    np.testing.assert_array_equal(local, g)
