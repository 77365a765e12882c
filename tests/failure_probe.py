"""Probe: a failure on one rank in the middle of a loop of Transfer runs.

    mpiexec -n 4 python tests/failure_probe.py MODE

``MODE``: ``fault`` (``MPIREDIST_FAULT`` set by the caller raises inside
mpiredist on one rank), ``sigkill`` (rank 1 kills itself with SIGKILL in the
sixth run), ``between`` (as ``fault``, between two runs instead: the user's
own exception, which only ``python -m mpi4py`` or the launcher can end),
``finalize`` (``MPI.Finalize`` with live Transfers, freed after it),
``limited`` (a run whose bound does not fit the memory left under the
limits of the process: ``MemoryBudgetError`` on every rank, printed;
with ``MPIREDIST_PROBE_ULIMIT=1`` the probe sets its own ``RLIMIT_AS``
first, as ``ulimit -v`` would).
With ``MPIREDIST_ON_FAILURE=raise`` the rank that failed prints what it
caught and aborts the job itself (status 3), as a program that handles
failures would.  Prints ``done`` on rank 0 if the loop ends normally.
"""

import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import mpiredist as mr
from mpiredist.runtime.failure import delivered


def limited(comm):
    """A 160 MiB block whose run may allocate 160 + 41 MiB, under a limit that
    leaves about 140 MiB: every rank raises MemoryBudgetError before data moves."""
    if os.environ.get("MPIREDIST_PROBE_ULIMIT") == "1":
        import resource
        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))
        resource.setrlimit(resource.RLIMIT_AS, (size + (300 << 20), resource.RLIM_INFINITY))
    rows = 160 * (1 << 20) // 4 // 1024
    shape = (rows * comm.size, 1024)
    t = mr.Transfer(shape, "float32", mr.Mesh({"x": comm.size}), "[{x}, {}]", "[{}, {x}]")
    block = np.ones(t.source_shape, np.float32)
    try:
        t.run(block)
        print(f"rank {comm.rank} ran", flush=True)
    except mr.MemoryBudgetError as exc:
        print(f"rank {comm.rank} {type(exc).__name__}: {exc}", flush=True)


def main(mode):
    comm = MPI.COMM_WORLD
    if mode == "limited":
        return limited(comm)
    P = comm.size
    shape = (64 * P, 256)
    t = mr.Transfer(shape, "float32", mr.Mesh({"x": P}), "[{x}, {}]", "[{}, {x}]")
    block = np.ones(t.source_shape, np.float32)
    if mode == "fault":
        print(f"rank {comm.rank} starts")     # not flushed: block-buffered in a pipe
    for i in range(20):
        if mode == "sigkill" and i == 5 and comm.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "between" and i == 5 and comm.rank == 2:
            raise ValueError("the user's own error between two runs, on rank 2")
        try:
            t.run(block)
        except Exception as exc:  # noqa: BLE001 - MPIREDIST_ON_FAILURE=raise
            print(f"rank {comm.rank} caught {type(exc).__name__}: {exc}")
            delivered(sys.stdout)       # flushed and read, else the launcher may drop it
            comm.Abort(3)
    if mode == "finalize":
        cached = mr.redistribute(block, shape, mr.Mesh({"x": P}), "[{x}, {}]", "[{}, {x}]")
        between = mr.Transfer(shape, "float32", mr.Mesh({"x": P}), "[{x}, {}]", "[{}, {a}]",
                              dst_mesh=mr.Mesh({"a": P}, ranks=list(reversed(range(P)))))
        between.run(block)
        rank = comm.rank
        MPI.Finalize()                  # t, between and redistribute's cache still live
        t.free()
        between.free()
        del cached
        if rank == 0:
            print("done", flush=True)
        return
    if comm.rank == 0:
        print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
