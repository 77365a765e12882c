"""Assertion helpers for MPI tests that agree across ranks.

A plain ``assert`` that fails on one rank leaves the other ranks waiting
in their next collective until the run times out.  These helpers are
themselves collective: call them on every rank of ``comm``, in the same
order, and either all ranks pass or all ranks fail with the same message.
"""

import contextlib
import json
import os
import socket
import tempfile

import numpy
import pytest


def all_ok(comm, flag, msg=""):
    """Assert that `flag` is true on every rank of `comm`; collective.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        Communicator whose ranks all call this function.
    flag : bool
        This rank's verdict.
    msg : str
        What was checked; the failure names the ranks where it was false.

    Raises
    ------
    AssertionError
        On every rank, when `flag` is false on at least one rank.
    """
    flags = comm.allgather(bool(flag))
    if not all(flags):
        bad = [rank for rank, ok in enumerate(flags) if not ok]
        mine = "" if flag else " (including this rank)"
        raise AssertionError(f"{msg or 'check'} failed on rank(s) {bad} of "
                             f"{comm.size}{mine}; this is rank {comm.rank}")


class TorchComm:
    """The few methods of an mpi4py communicator that these helpers and the
    tests use, over torch.distributed (under torchrun, where no MPI is)."""

    def __init__(self, group):
        self.group, self.rank, self.size = group, group.rank, group.size

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def allgather(self, obj):
        return self.group.allgather_object(obj)

    def bcast(self, obj, root=0):
        return self.allgather(obj)[root]

    def Barrier(self):
        self.allgather(None)

    def Dup(self):
        """A fresh group over the same ranks (a mesh's ``comm``)."""
        return self.group.dup()


def job_comm():
    """The job's ranks as a communicator: ``MPI.COMM_WORLD`` under an MPI
    launcher, a :class:`TorchComm` of torch.distributed's default group under
    torchrun (``mpiredist.runtime.groups.world_group`` decides alike)."""
    from mpiredist.runtime.groups import world_group
    from mpiredist.runtime.torchdist import TorchGroup
    group = world_group()
    if isinstance(group, TorchGroup):
        return TorchComm(group)
    from mpi4py import MPI
    return MPI.COMM_WORLD


def count_limit_lowered(below=1 << 20):
    """True when ``MPIREDIST_COUNT_LIMIT`` (CI's stages for counts beyond 2 GiB)
    lowers MPI's count limit under ``below`` bytes: then buckets are capped and
    items that would share one may move alone."""
    value = os.environ.get("MPIREDIST_COUNT_LIMIT", "").strip()
    return value != "" and int(value) < below


def all_array_equal(comm, actual, expected, msg=""):
    """Assert that `actual` equals `expected` (shape, dtype, values) on every rank.

    A mismatch is described on the rank where it occurs; every rank raises.
    """
    actual = numpy.asarray(actual)
    expected = numpy.asarray(expected)
    ok = (actual.shape == expected.shape and actual.dtype == expected.dtype
          and numpy.array_equal(actual, expected))
    detail = ""
    if not ok:
        detail = (f": rank {comm.rank} has shape {actual.shape} dtype {actual.dtype}, "
                  f"expected shape {expected.shape} dtype {expected.dtype}")
    all_ok(comm, ok, (msg or "arrays differ") + detail)


def free_port(comm):
    """A free TCP port of 127.0.0.1 chosen by rank 0, the same on every rank of
    `comm` (for gloo's and JAX's coordinators)."""
    port = None
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    return comm.bcast(port)


def need_ranks(comm, n):
    """Skip the calling test, on every rank, when `comm` has fewer than `n` ranks."""
    if comm.size < n:
        pytest.skip(f"needs at least {n} MPI ranks, running with {comm.size}")


@contextlib.contextmanager
def shared_path(comm, suffix=".json"):
    """A temporary file name, the same on every rank, removed on exit (collective)."""
    path = None
    if comm.rank == 0:
        fd, path = tempfile.mkstemp(suffix=suffix, prefix="mpiredist-test-")
        os.close(fd)
    path = comm.bcast(path)
    try:
        yield path
    finally:
        comm.Barrier()
        if comm.rank == 0:
            os.unlink(path)


def run_json(comm, main, argv):
    """Run ``main(argv + ["--json", F], comm=comm)`` on every rank (collective).

    Returns ``(rc, document)``: the JSON file rank 0 wrote, the same on every
    rank; the file is removed.
    """
    with shared_path(comm) as path:
        rc = main(list(argv) + ["--json", path], comm=comm)
        doc = None
        if comm.rank == 0:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        doc = comm.bcast(doc)                 # rank 0 wrote it; others may not see it
    return rc, doc
