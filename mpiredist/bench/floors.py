"""Floors: bare MPI against bare MPI plus the copies that a layout change or
one buffer cannot avoid, on this machine.

    mpiexec -n 8 python -m mpiredist.bench.floors [--mib 8] [--repeats 15] [--json FILE]

Every rank holds a float32 block of about ``--mib`` MiB.  Interleaved in one
loop, with a barrier before each call, the slowest rank timed, medians:

``alltoall``       ``Alltoall`` between preallocated contiguous buffers: the
                   benchmark's ``raw`` for an all-to-all
``pack+alltoall``  the source ``(b, N)`` block's column pieces ``(b, b)``
                   (``b = N / ranks``) copied into a preallocated send
                   buffer, then the same ``Alltoall``: the least a
                   transposing all-to-all (c01, c13) copies, memory unbounded
``sendrecv``       the block sent to rank + 1 and the block of rank - 1
                   received into a preallocated buffer: ``raw`` for a permute
``copy+sendrecv``  the block copied aside, then sent from the copy while
                   the incoming block lands in the block's own memory: the
                   least a one-buffer permute copies when its result starts
                   where its source did (each byte is copied aside before it
                   is sent, or received aside and copied in)
``copy``           one copy of the block

``pack+alltoall / alltoall`` is what any strided all-to-all pays against
``raw``, and ``copy+sendrecv / sendrecv`` what any one-buffer permute pays
against one out of place: read them against the benchmark's targets
(collectives at most 1.6x raw, donated at most 1.3x out of place).  Every
call's result is checked once after the timing.  Only rank 0 prints.
"""

import argparse
import json
import math
import sys

import numpy as np

from .timing import slowest_median

__all__ = ["Floors", "main"]

KINDS = ("alltoall", "pack+alltoall", "sendrecv", "copy+sendrecv", "copy")
RATIOS = (("pack+alltoall", "alltoall", 1.6), ("copy+sendrecv", "sendrecv", 1.3))


class Floors:
    """The buffers and calls of one rank (collective to construct: none)."""

    def __init__(self, comm, mib):
        size, me = comm.Get_size(), comm.Get_rank()
        n = max(size, int(math.sqrt(mib * (1 << 20) * size / 4)) // size * size)
        self.comm, self.n, self.b = comm, n, n // size
        self.block = (np.arange(self.b * n, dtype=np.float32) + me * self.b * n).reshape(self.b, n)
        self.keep = self.block.copy()           # the source, for the checks
        self.send = np.empty((size, self.b, self.b), np.float32)
        self.recv = np.empty_like(self.send)
        self.aside = np.empty_like(self.block)
        self.dest, self.source = (me + 1) % size, (me - 1) % size

    def calls(self):
        return {"alltoall": self.alltoall, "pack+alltoall": self.pack_alltoall,
                "sendrecv": self.sendrecv, "copy+sendrecv": self.copy_sendrecv,
                "copy": self.copy}

    def alltoall(self):
        self.comm.Alltoall(self.send, self.recv)

    def pack_alltoall(self):
        b = self.b
        for m in range(self.send.shape[0]):
            self.send[m] = self.keep[:, m * b:(m + 1) * b]
        self.comm.Alltoall(self.send, self.recv)

    def sendrecv(self):
        self.comm.Sendrecv(self.keep, self.dest, 11, self.aside, self.source, 11)

    def copy_sendrecv(self):
        np.copyto(self.aside, self.block)
        self.comm.Sendrecv(self.aside, self.dest, 12, self.block, self.source, 12)

    def copy(self):
        np.copyto(self.aside, self.keep)

    def check(self):
        """True if the last calls moved what they should (run each once first)."""
        size, me, b, n = self.comm.Get_size(), self.comm.Get_rank(), self.b, self.n
        self.block[...] = self.keep
        self.pack_alltoall()
        rows = np.arange(b * n, dtype=np.float32).reshape(b, n)
        want = np.stack([rows[:, me * b:(me + 1) * b] + m * b * n for m in range(size)])
        ok = np.array_equal(self.recv, want)
        self.copy_sendrecv()
        ok &= np.array_equal(self.block, rows + self.source * b * n)
        self.sendrecv()
        ok &= np.array_equal(self.aside, rows + self.source * b * n)
        self.block[...] = self.keep
        return ok


def measure(comm, mib, repeats):
    """``{kind: median seconds}`` and whether every result was right (collective)."""
    from mpi4py import MPI

    floors = Floors(comm, mib)
    ok = comm.allreduce(bool(floors.check()), op=MPI.LAND)
    calls = floors.calls()
    times = {k: [] for k in KINDS}
    for _ in range(repeats):            # interleaved, the same order on every rank
        for k in KINDS:
            times[k].append(slowest_median(comm, calls[k], 1))
    row = {k: float(np.median(v)) for k, v in times.items()}
    return {"ranks": comm.Get_size(), "block_bytes": floors.block.nbytes, "correct": ok,
            "median_s": row,
            "ratios": {f"{a}/{b}": row[a] / row[b] for a, b, _ in RATIOS}}


def format_result(result):
    """The table as text."""
    lines = [f"floors, {result['ranks']} ranks, {result['block_bytes'] / 2**20:.2f} MiB "
             f"blocks, medians (max over ranks); results "
             f"{'correct' if result['correct'] else 'WRONG'}"]
    lines += [f"  {k:15} {result['median_s'][k] * 1e3:8.2f} ms" for k in KINDS]
    for a, b, target in RATIOS:
        ratio = result["ratios"][f"{a}/{b}"]
        lines.append(f"  {a} / {b} = {ratio:.2f} (target for the strategy it bounds: "
                     f"{target})")
    return "\n".join(lines)


def main(argv=None, comm=None):
    """Measure the floors on ``comm`` (default COMM_WORLD); 0 when the results are right."""
    from ..runtime.comm import mpi

    parser = argparse.ArgumentParser(prog="python -m mpiredist.bench.floors",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=8.0, help="block size per rank, MiB")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    comm = comm or mpi().COMM_WORLD
    result = measure(comm, args.mib, args.repeats)
    if comm.Get_rank() == 0:
        print(format_result(result))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(result, f, indent=1)
    return 0 if result["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
