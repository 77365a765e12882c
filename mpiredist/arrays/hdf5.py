"""HDF5 input and output of distributed arrays: each rank touches only its block.

One HDF5 dataset holds the global array; rank ``r`` reads or writes only the
hyperslab that ``layout`` gives it (see :mod:`mpiredist.core.blocks`), so no rank
ever holds more than its own block.

Two ways to reach the file, chosen by ``h5py.get_config().mpi``:

- **MPI-IO** (h5py built with ``HDF5_MPI=ON``, see ``scripts/parallel_h5py.sh``):
  the file is opened collectively with ``driver="mpio"``; the dataset is
  created collectively and each rank reads or writes its hyperslab.
- **Serial fallback** (the h5py wheels from PyPI): for reading every rank
  opens the file read-only itself; for writing, rank 0 creates the dataset and
  then the ranks write their hyperslabs in turn, each waiting for a token from
  the previous rank and closing the file before passing it on.

All checks (arguments, file, dataset, layout, local block shapes, dtypes) run
before anything is read or written, and every rank raises together (see
:mod:`mpiredist.runtime.agree`).  Replicated data (mesh axes that the layout does not
use) is written once, by the ranks whose coordinate on those axes is 0.

Atomicity: a **new file** is written to a hidden temporary file in the same
directory and renamed to its final name only when every rank succeeded; on
failure it is removed.  Adding a dataset to an **existing file** writes into
that file directly (its other datasets are kept); a failure then removes the
incomplete dataset, but a dataset replaced with ``overwrite=True`` is gone.
"""

import os
import secrets

import numpy as np

from ..runtime.agree import agree
from ..runtime.groups import as_group
from ..core.blocks import rank_block
from ..core.errors import LayoutError, MeshError, MpiredistError, ShapeError
from ..core.layout import Layout
from ..core.subaxes import expand, rank_digits

__all__ = ["HDF5Error", "read_block", "write_blocks"]



class HDF5Error(MpiredistError, ValueError):
    """An HDF5 file or dataset is missing, unreadable or in the way."""


def _import_h5py():
    """Import h5py, the one place mpiredist does, with a clear message."""
    try:
        import h5py
    except ImportError as exc:
        raise ImportError("h5py is required: pip install mpiredist[hdf5]") from exc
    return h5py


def _resolve_comm(mesh, comm):
    """The group of ``comm`` (default: the mesh's, then the world)."""
    return as_group(mesh.comm if comm is None else comm)


def _use_mpio(h5py, mpio, group):
    available = bool(h5py.get_config().mpi) and hasattr(group, "comm")    # MPI-IO: MPI only
    if mpio and not available:
        raise HDF5Error("mpio=True, but this h5py was built without MPI "
                        "(h5py.get_config().mpi is False); build one with "
                        "scripts/parallel_h5py.sh or pass mpio=None")
    return available if mpio is None else bool(mpio)


def _open(h5py, path, mode, group, mpio):
    """Open ``path``; collective with the MPI-IO driver (on the group's mpi4py
    communicator), else this rank alone."""
    if mpio:
        return h5py.File(path, mode, driver="mpio", comm=group.comm)
    # mpiredist serialises its own writes (token passing), so HDF5's file
    # locks add nothing and fail on file systems without flock (NFS, Lustre).
    if h5py.version.version_tuple >= (3, 5) and \
            h5py.version.hdf5_version_tuple >= (1, 10, 7):
        return h5py.File(path, mode, locking=False)
    return h5py.File(path, mode)


def _check_common(what, mesh, layout, comm, mpio, h5py):
    """Checks every rank makes alike, before touching the file."""
    layout = Layout.parse(layout)
    if layout.partial:
        raise LayoutError(f"{what}: layout {layout} holds partial results over "
                          f"{list(layout.partial)}; a file stores the reduced "
                          "array, so redistribute to a layout without partial "
                          "axes first")
    layout.validate(mesh)
    if mesh.size != comm.size:
        raise MeshError(f"{what}: mesh {mesh} has {mesh.size} ranks but the "
                        f"communicator has {comm.size}")
    return layout, _use_mpio(h5py, mpio, comm)


def _check_shape(global_shape):
    try:
        shape = tuple(int(n) for n in global_shape)
    except (TypeError, ValueError):
        raise ShapeError(f"global shape {global_shape!r} is not a sequence of "
                         "integers") from None
    if any(n < 0 for n in shape) or any(isinstance(n, bool) for n in global_shape):
        raise ShapeError(f"global shape {global_shape!r} must hold non-negative integers")
    return shape


def _block(global_shape, mesh, layout, rank):
    """This rank's per-dim ``(start, stop)`` of ``global_shape``."""
    return rank_block(global_shape, expand(layout, mesh), rank_digits(mesh, rank))


def _slices(block):
    return tuple(slice(a, b) for a, b in block)


def _block_shape(block):
    return tuple(b - a for a, b in block)


def _writes(mesh, layout, rank):
    """True if ``rank`` writes: coordinate 0 on every mesh axis the layout leaves out."""
    used = set(layout.axes_used())
    return all(c == 0 for name, c in zip(mesh.names, mesh.coords(rank))
               if name not in used)


def _to_host(local):
    if isinstance(local, np.ndarray):
        return local
    if hasattr(local, "__cuda_array_interface__") and hasattr(local, "get"):
        return local.get()  # CuPy: HDF5 writes from host memory
    return np.asarray(local)


def _probe(h5py, path, dataset):
    """What is at ``path``/``dataset`` (run on rank 0; never raises).

    Returns ``(kind, shape, dtype, message)`` with kind one of ``nofile``,
    ``nodir``, ``nothdf5``, ``nodataset``, ``group``, ``dataset``, ``error``.
    """
    try:
        if not os.path.exists(path):
            parent = os.path.dirname(path) or "."
            return ("nofile" if os.path.isdir(parent) else "nodir"), None, None, ""
        if not h5py.is_hdf5(path):
            return "nothdf5", None, None, ""
        with _open(h5py, path, "r", None, False) as f:
            obj = f.get(dataset, getclass=True)
            if obj is None:
                return "nodataset", None, None, ""
            if obj is not h5py.Dataset:
                return "group", None, None, ""
            dset = f[dataset]
            return "dataset", dset.shape, dset.dtype, ""
    except Exception as exc:  # report it on every rank instead of hanging
        return "error", None, None, f"{type(exc).__name__}: {exc}"


def _probe_all(comm, h5py, path, dataset):
    """Rank 0 probes the file; every rank gets the same answer."""
    if comm.rank == 0:
        found = _probe(h5py, os.fspath(path), dataset)
    else:
        found = None
    return comm.allgather_object(found)[0]


def read_block(path, dataset, mesh, layout, comm=None, *, mpio=None):
    """Read this rank's block of ``dataset`` in the HDF5 file ``path``.

    Collective over ``comm``: every rank of the mesh calls it with the same
    arguments, and each reads only its own hyperslab.  Chunked and compressed
    datasets are read like any other.

    Parameters
    ----------
    path : str or os.PathLike
        The HDF5 file, on a file system that every rank sees.
    dataset : str
        Name of the dataset in the file, e.g. ``"x"`` or ``"group/x"``.
    mesh : Mesh
        The mesh; its size must equal the size of the communicator.
    layout : Layout or str
        How the array is split over ``mesh``; no partial axes.
    comm : mpi4py.MPI.Comm or Group, optional
        Defaults to ``mesh.comm``, then ``MPI.COMM_WORLD``.
    mpio : bool, optional
        Use the MPI-IO driver; default: when h5py was built with MPI.

    Returns
    -------
    local : numpy.ndarray
        This rank's block (possibly empty), in C order.
    global_shape : tuple of int
    dtype : numpy.dtype

    Raises
    ------
    HDF5Error
        The file or dataset is missing or unreadable (on every rank).
    LayoutError, MeshError
        The layout is partial or does not fit the mesh or the dataset's rank;
        the mesh does not match the communicator.

    Examples
    --------
    Any number of ranks, e.g. 4::

        local, shape, dtype = read_block("a.h5", "a", Mesh({"x": 4}), "[{x}, {}]")
    """
    what = f"read_block({os.fspath(path)!r}, {dataset!r})"
    h5py = _import_h5py()
    comm = _resolve_comm(mesh, comm)
    rank = comm.rank
    error = None
    try:
        layout, mpio = _check_common(what, mesh, layout, comm, mpio, h5py)
    except ValueError as exc:
        error = exc
    agree(comm, what, error, dict(path=os.fspath(path), dataset=dataset, mesh=mesh,
                                  layout=layout, mpio=mpio))

    kind, shape, dtype, message = _probe_all(comm, h5py, path, dataset)
    if kind != "dataset":
        raise _file_error(what, kind, path, dataset, message)
    try:
        layout.validate(mesh, len(shape))  # same verdict on every rank
    except LayoutError as exc:
        raise LayoutError(f"{what}: dataset of shape {shape}: {exc}") from None

    block = _block(shape, mesh, layout, rank)
    local, error = None, None
    try:
        local = _read(h5py, path, dataset, block, dtype, comm, mpio)
    except Exception as exc:
        error = HDF5Error(f"{what}: rank {rank} failed to read its block "
                          f"{_slices(block)}: {type(exc).__name__}: {exc}")
    agree(comm, what, error)
    return local, tuple(shape), dtype


def _read(h5py, path, dataset, block, dtype, comm, mpio):
    empty = any(a == b for a, b in block)
    if not mpio and empty:
        return np.empty(_block_shape(block), dtype=dtype)
    with _open(h5py, path, "r", comm, mpio) as f:  # collective when mpio
        if empty:
            return np.empty(_block_shape(block), dtype=dtype)
        return np.asarray(f[dataset][_slices(block)])  # a fresh C-order array


def _file_error(what, kind, path, dataset, message=""):
    path = os.fspath(path)
    text = {
        "nofile": f"file {path!r} does not exist",
        "nodir": f"the directory of {path!r} does not exist",
        "nothdf5": f"{path!r} is not an HDF5 file",
        "nodataset": f"file {path!r} has no dataset {dataset!r}",
        "group": f"{dataset!r} in file {path!r} is a group, not a dataset",
        "exists": f"file {path!r} already has a dataset {dataset!r}; pass "
                  "overwrite=True to replace it",
        "error": f"cannot open {path!r}: {message}",
    }[kind]
    return HDF5Error(f"{what}: {text}")


def write_blocks(path, dataset, local, global_shape, mesh, layout, comm=None,
                 overwrite=False, *, mpio=None):
    """Write the global array, given as one block per rank, to ``path``.

    Collective over ``comm``.  Creates ``path`` (atomically: a temporary file
    renamed when every rank succeeded) or adds ``dataset`` to an existing
    HDF5 file, keeping its other datasets.  Ranks holding replicas (same
    block) write it once.

    Parameters
    ----------
    path : str or os.PathLike
        The HDF5 file, on a file system that every rank sees.
    dataset : str
        Name of the dataset to create; intermediate groups are created.
    local : array_like
        This rank's block of the global array under ``layout`` (numpy or CuPy).
    global_shape : sequence of int
    mesh : Mesh
    layout : Layout or str
        No partial axes: reduce partial results before writing.
    comm : mpi4py.MPI.Comm or Group, optional
        Defaults to ``mesh.comm``, then ``MPI.COMM_WORLD``.
    overwrite : bool
        Replace ``dataset`` if the file already has it.
    mpio : bool, optional
        Use the MPI-IO driver; default: when h5py was built with MPI.

    Raises
    ------
    ShapeError
        A rank's local block does not have the shape its layout gives it (the
        message names the rank), or its dtype cannot be stored in HDF5.
    MismatchError
        Ranks pass different dtypes, shapes, layouts or names.
    HDF5Error
        The dataset exists and ``overwrite`` is false; the path is not an HDF5
        file; or writing failed on some rank (nothing is left behind for a
        new file).
    LayoutError, MeshError, RemoteError
        As for :func:`read_block`; ``RemoteError`` on ranks whose own input
        was fine.

    Examples
    --------
    Two ranks::

        mesh = Mesh({"x": 2})
        block = np.full((2, 3), comm.rank, dtype="f4")
        write_blocks("a.h5", "a", block, (4, 3), mesh, "[{x}, {}]")
    """
    what = f"write_blocks({os.fspath(path)!r}, {dataset!r})"
    h5py = _import_h5py()
    comm = _resolve_comm(mesh, comm)
    rank = comm.rank
    local = _to_host(local)
    error, shape, block = None, global_shape, None
    try:
        if not isinstance(dataset, str) or not dataset.strip("/"):
            raise HDF5Error(f"{what}: dataset name must be a non-empty string")
        layout, mpio = _check_common(what, mesh, layout, comm, mpio, h5py)
        shape = _check_shape(global_shape)
        layout.validate(mesh, len(shape))
        block = _block(shape, mesh, layout, rank)
        _check_local(what, local, block, rank, layout, shape, mesh, h5py)
    except ValueError as exc:
        error = exc
    agree(comm, what, error, dict(path=os.fspath(path), dataset=dataset, shape=shape,
                                  dtype=local.dtype, mesh=mesh, layout=layout,
                                  overwrite=bool(overwrite), mpio=mpio))

    new, target = _plan_target(comm, h5py, path, dataset, overwrite, what)
    writer = _writes(mesh, layout, rank) and all(a < b for a, b in block)
    write = _write_mpio if mpio else _write_serial
    error = write(h5py, target, new, dataset, shape, local, block, writer, comm)
    if error is not None:
        error = HDF5Error(f"{what}: rank {rank} failed: {type(error).__name__}: {error}")

    failed = any(comm.allgather_object(error is not None))
    if failed and rank == 0:
        _clean_up(h5py, target, new, dataset)
    if not failed and new and rank == 0:
        error = _publish(target, os.fspath(path), what)
    agree(comm, what, error)  # also: nobody returns before the rename


def _check_local(what, local, block, rank, layout, shape, mesh, h5py):
    expected = _block_shape(block)
    if tuple(local.shape) != expected:
        raise ShapeError(f"{what}: rank {rank} passed a local block of shape "
                         f"{tuple(local.shape)}, but layout {layout} of global "
                         f"shape {shape} on mesh {mesh} gives rank {rank} "
                         f"the block {expected}")
    try:
        h5py.h5t.py_create(local.dtype, logical=True)
    except (TypeError, ValueError) as exc:
        raise ShapeError(f"{what}: dtype {local.dtype} of rank {rank}'s block "
                         f"cannot be stored in HDF5: {exc}") from None


def _plan_target(comm, h5py, path, dataset, overwrite, what):
    """Decide, on rank 0, where to write; every rank raises or gets ``(new, target)``."""
    kind, _, _, message = _probe_all(comm, h5py, path, dataset)
    if kind == "dataset" and not overwrite:
        kind = "exists"
    if kind in ("nodir", "nothdf5", "group", "exists", "error"):
        if kind == "nothdf5":
            message = "refusing to replace a file that is not HDF5"
        raise _file_error(what, kind, path, dataset, message)
    if kind != "nofile":
        return False, os.fspath(path)
    name = None
    if comm.rank == 0:
        head, tail = os.path.split(os.fspath(path))
        name = os.path.join(head, f".{tail}.tmp-{secrets.token_hex(6)}")
    return True, comm.allgather_object(name)[0]


def _write_hyperslab(dset, block, local):
    dset[_slices(block)] = local


def _create(f, dataset, shape, dtype):
    if dataset in f:  # overwrite=True, checked before
        del f[dataset]
    return f.create_dataset(dataset, shape=shape, dtype=dtype)


def _write_mpio(h5py, target, new, dataset, shape, local, block, writer, comm):
    """Collective create, then each writer writes its hyperslab (MPI-IO)."""
    try:
        f = _open(h5py, target, "w-" if new else "r+", comm, True)
    except Exception as exc:
        return exc
    error = None
    try:
        dset = _create(f, dataset, shape, local.dtype)
        if writer:
            _write_hyperslab(dset, block, local)
    except Exception as exc:
        error = exc
    try:
        f.close()  # collective
    except Exception as exc:
        error = error or exc
    return error


def _write_serial(h5py, target, new, dataset, shape, local, block, writer, comm):
    """Rank 0 creates; then ranks write in turn, passing a token (serial h5py)."""
    rank, size = comm.rank, comm.size
    token = np.zeros(1, dtype=np.int8)  # 1: an earlier rank failed
    if rank > 0:
        comm.wait_all([comm.irecv(token, rank - 1)])
    error = None
    if not token[0] and (rank == 0 or writer):
        try:
            with _open(h5py, target, "w-" if new and rank == 0 else "r+", comm, False) as f:
                dset = _create(f, dataset, shape, local.dtype) if rank == 0 else f[dataset]
                if writer:
                    _write_hyperslab(dset, block, local)
        except Exception as exc:
            error = exc
            token[0] = 1
    if rank + 1 < size:
        comm.wait_all([comm.isend(token, rank + 1)])
    return error


def _clean_up(h5py, target, new, dataset):
    """Remove what a failed write left: the temporary file or the dataset."""
    try:
        if new:
            if os.path.exists(target):
                os.remove(target)
        else:
            with _open(h5py, target, "r+", None, False) as f:
                if dataset in f:
                    del f[dataset]
    except Exception:
        pass  # best effort; the write error is what gets raised


def _publish(tmp, path, what):
    """Give the finished temporary file its final name without clobbering."""
    try:
        try:
            os.link(tmp, path)  # fails if ``path`` appeared meanwhile
        except FileExistsError:
            os.remove(tmp)
            return HDF5Error(f"{what}: {path!r} was created by someone else "
                             "while writing; left it untouched")
        except OSError:  # no hard links on this file system
            os.replace(tmp, path)
            return None
        os.remove(tmp)
    except OSError as exc:
        if os.path.exists(tmp):
            os.remove(tmp)
        return HDF5Error(f"{what}: cannot rename the finished file to {path!r}: {exc}")
    return None
