"""Bad checkpoints never load silently, and a failed save leaves nothing half-visible.

    mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_checkpoint_failures.py

Every error is a CheckpointError (or its remote twin) on every rank, naming
the array and the file; errors found before reading leave the targets as
they were.  The full-disk test mounts an 8 MiB tmpfs (root only; skipped
elsewhere).
"""

import json
import os
import shutil
import subprocess
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

import mpiredist as mr
from helpers import all_ok
from mpiredist import Mesh

COMM = MPI.COMM_WORLD
RANK, P = COMM.Get_rank(), COMM.Get_size()
SENTINEL = -7.0


@pytest.fixture
def where():
    path = tempfile.mkdtemp(prefix="mpiredist-ckfail-") if RANK == 0 else None
    path = COMM.bcast(path)
    yield path
    COMM.Barrier()
    if RANK == 0:
        shutil.rmtree(path, ignore_errors=True)


def saved(where, name="ck"):
    """A checkpoint of two arrays (their global values are returned)."""
    rng = np.random.default_rng(5)
    W = rng.standard_normal((64, 48)).astype(np.float32)
    B = rng.standard_normal(48).astype(np.float32)
    mesh = Mesh({"x": P})
    path = os.path.join(where, name)
    mr.save(path, {"w": mr.DistArray.from_global(W, mesh, "[{x}, {}]"), "b": B, "n": 3})
    return path, W, B


def fresh_target(shape):
    mesh = Mesh({"x": P})
    return mr.DistArray.from_global(np.full(shape, SENTINEL, dtype=np.float32), mesh,
                                    "[{}, {x}]")


def raises_everywhere(run, *words):
    """Run ``run()``; True on this rank if it raised a CheckpointError naming ``words``."""
    try:
        run()
    except mr.CheckpointError as exc:
        text = str(exc)
        return all(w in text for w in words), text
    except Exception as exc:            # noqa: BLE001 - reported as a failure
        return False, f"{type(exc).__name__}: {exc}"
    return False, "nothing raised"


def untouched(t):
    return bool(np.all(t.local == SENTINEL))


def edit_on_rank0(fn):
    if RANK == 0:
        fn()
    COMM.Barrier()


@pytest.mark.mpi(min_size=1)
def test_missing_name_shape_dtype(where):
    path, W, _ = saved(where)
    t = fresh_target(W.shape)
    ok, text = raises_everywhere(lambda: mr.load(path, {"w": t, "nope": np.zeros(3)}),
                                 "nope", path)
    all_ok(COMM, ok and untouched(t), f"missing name: {text}")
    other = fresh_target((64, 47))
    ok, text = raises_everywhere(lambda: mr.load(path, {"w": other}), "'w'", "shape")
    all_ok(COMM, ok and untouched(other), f"other shape: {text}")
    ok, text = raises_everywhere(lambda: mr.load(path, {"b": np.zeros(48, np.float64)}),
                                 "'b'", "dtype", "<f8")
    all_ok(COMM, ok, f"other dtype: {text}")
    ok, text = raises_everywhere(lambda: mr.load(path, {"gone": None}), "gone")
    all_ok(COMM, ok, f"missing value: {text}")


@pytest.mark.mpi(min_size=1)
def test_not_a_checkpoint_and_unknown_version(where):
    empty = os.path.join(where, "empty")
    edit_on_rank0(lambda: os.makedirs(empty))
    ok, text = raises_everywhere(lambda: mr.load(empty, {"w": np.zeros(3)}), empty,
                                 "not a checkpoint")
    all_ok(COMM, ok, f"empty directory: {text}")
    ok, text = raises_everywhere(lambda: mr.load(os.path.join(where, "none"), {"w": None}),
                                 "does not exist")
    all_ok(COMM, ok, f"missing path: {text}")
    path, W, _ = saved(where)
    pointer = os.path.join(path, "mpiredist.json")

    def newer():
        with open(pointer) as f:
            doc = json.load(f)
        doc["version"] = 99
        with open(pointer, "w") as f:
            json.dump(doc, f)
    edit_on_rank0(newer)
    t = fresh_target(W.shape)
    ok, text = raises_everywhere(lambda: mr.load(path, {"w": t}), "version 99", pointer)
    all_ok(COMM, ok and untouched(t), f"unknown version: {text}")
    plain = os.path.join(where, "plain")
    edit_on_rank0(lambda: (os.makedirs(plain), open(os.path.join(plain, "x"), "w").close()))
    ok, text = raises_everywhere(lambda: mr.save(plain, {"a": np.zeros(2)}), plain,
                                 "refusing")
    all_ok(COMM, ok and os.listdir(plain) == ["x"], f"save into a foreign directory: {text}")


@pytest.mark.mpi(min_size=1)
def test_truncated_file_raises_before_reading(where):
    path, W, _ = saved(where)
    files = sorted(f for f in os.listdir(os.path.join(path, "gen-000001"))
                   if f.endswith(".bin"))
    victim = os.path.join(path, "gen-000001", files[-1])
    edit_on_rank0(lambda: os.truncate(victim, os.path.getsize(victim) - 10))
    t = fresh_target(W.shape)
    ok, text = raises_everywhere(lambda: mr.load(path, {"w": t}), victim, "truncated", "'w'")
    all_ok(COMM, ok and untouched(t), f"truncated: {text}")


@pytest.mark.mpi(min_size=1)
def test_corrupted_byte_fails_the_array_and_loads_the_rest(where):
    path, W, B = saved(where)
    with open(os.path.join(path, "gen-000001", "index.json")) as f:
        doc = json.load(f)
    piece = next(a for a in doc["arrays"] if a["path"] == ["w"])["pieces"][0]
    victim = os.path.join(path, "gen-000001", piece["file"])

    def flip():
        with open(victim, "r+b") as f:
            f.seek(piece["offset"] + 5)
            byte = f.read(1)
            f.seek(piece["offset"] + 5)
            f.write(bytes([byte[0] ^ 0x40]))
    edit_on_rank0(flip)
    t = fresh_target(W.shape)
    b = np.zeros_like(B)
    ok, text = raises_everywhere(lambda: mr.load(path, {"w": t, "b": b}), "'w'", victim,
                                 "checksum", "failed")
    all_ok(COMM, ok, f"corruption: {text}")
    all_ok(COMM, np.array_equal(b, B), "the other array is loaded in full")
    ck = mr.checkpoint.open(path)
    ok, text = raises_everywhere(lambda: ck.read("w"), "checksum")
    all_ok(COMM, ok, f"checkpoint.open read: {text}")


def _mount(size):
    where = tempfile.mkdtemp(prefix="mpiredist-tmpfs-")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", where],
                          capture_output=True, text=True)
    if done.returncode:
        os.rmdir(where)
        return None, done.stderr.strip()
    return where, ""


@pytest.mark.mpi(min_size=1)
def test_full_disk_raises_everywhere_and_keeps_the_earlier_checkpoint():
    where, why = _mount("8m") if RANK == 0 else (None, "")
    where, why = COMM.bcast((where, why))
    if where is None:
        pytest.skip(f"cannot mount a tmpfs here: {why}")
    try:
        mesh = Mesh({"x": P})
        path = os.path.join(where, "ck")
        small = np.arange(1000, dtype=np.float32)
        mr.save(path, {"s": small})
        big = np.ones((3072, 1024), dtype=np.float32)           # 12 MiB > 8 MiB
        ok, text = raises_everywhere(
            lambda: mr.save(path, {"s": small * 2,
                                   "big": mr.DistArray.from_global(big, mesh, "[{x}, {}]")}),
            "No space left", "nothing was published")
        all_ok(COMM, ok, f"full disk: {text}")
        COMM.Barrier()
        all_ok(COMM, sorted(os.listdir(path)) == ["gen-000001", "mpiredist.json"],
               f"left behind: {sorted(os.listdir(path))}")
        back = mr.load(path, {"s": np.zeros(1000, np.float32)})["s"]
        all_ok(COMM, np.array_equal(back, small), "the earlier checkpoint loads")
        with pytest.raises(mr.CheckpointError):
            mr.load(path, {"big": (mesh, "[{x}, {}]")})
    finally:
        COMM.Barrier()
        if RANK == 0:
            subprocess.run(["umount", where], check=False)
            os.rmdir(where)


@pytest.mark.mpi(min_size=1)
def test_one_rank_trouble_before_data_moves_raises_on_every_rank(where, monkeypatch):
    """What only one rank meets before anything is written or read (a bad W
    there, an OSError or a truncated DCP zip there) is raised on every rank by
    the first agreement: no rank is left waiting in a collective."""
    import struct

    from mpiredist.checkpoint import api
    path, W, B = saved(where)
    last = RANK == P - 1
    mesh = Mesh({"x": P})
    state = {"w": mr.DistArray.from_global(W, mesh, "[{x}, {}]")}

    def bad_w():
        mr.save(os.path.join(where, "w"), state, workspace_bytes=-1 if last else None)
    ok, text = raises_any(bad_w, "workspace_bytes")
    all_ok(COMM, ok, text)

    def bad_w_load():
        mr.load(path, {"w": fresh_target(W.shape)}, workspace_bytes=-1 if last else None)
    ok, text = raises_any(bad_w_load, "workspace_bytes")
    all_ok(COMM, ok, text)

    def denied(where):
        raise PermissionError(13, "Permission denied", where)
    if last:
        monkeypatch.setattr(api, "_next_generation", denied)
    ok, text = raises_everywhere(lambda: mr.save(os.path.join(where, "x"), state),
                                 "PermissionError")
    all_ok(COMM, ok, text)
    monkeypatch.undo()

    def truncated(where):
        raise struct.error("unpack requires a buffer of 22 bytes")
    if last:
        monkeypatch.setattr(api, "read_any", truncated)
    target = fresh_target(W.shape)
    ok, text = raises_everywhere(lambda: mr.load(path, {"w": target}), "error")
    all_ok(COMM, ok and untouched(target), text)


def raises_any(run, *words):
    """Like :func:`raises_everywhere`, for any mpiredist error (a bad argument is
    a ShapeError, and its twin on the other ranks)."""
    try:
        run()
    except mr.MpiredistError as exc:
        text = str(exc)
        return all(w in text for w in words), text
    except Exception as exc:            # noqa: BLE001 - reported as a failure
        return False, f"{type(exc).__name__}: {exc}"
    return False, "nothing raised"
