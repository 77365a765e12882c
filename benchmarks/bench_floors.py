"""Floors: bare MPI against bare MPI plus the copies that a layout change or
one buffer cannot avoid, on this machine.

    mpiexec -n 8 python -m benchmarks.bench_floors [--mib 8] [--repeats 15] [--json FILE]

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
``kept permute``   mpiredist's own permute of the same bytes: a Transfer of
                   ``[{a,b},{}]`` to ``[{b,a},{}]`` on a two-axis mesh of the
                   ranks, run into a preallocated ``out=`` array
``donated permute`` the same Transfer with ``donate=True``, given a fresh copy
                   of the block each run (made before the barrier), so it
                   runs in the block's own memory within W
                   (the two permute rows need a rank count with two factors
                   above 1; they are left out otherwise)

``pack+alltoall / alltoall`` is what any strided all-to-all pays against
``raw``, and ``copy+sendrecv / sendrecv`` what any one-buffer permute pays
against one out of place: read them against the benchmark's targets
(collectives at most 1.6x raw, donated at most 1.3x out of place), and
``donated permute / kept permute`` against the second.  Every call's result
is checked once before the timing.  Only rank 0 prints.
"""

import argparse
import json
import math
import sys
import time

import numpy as np

from mpiredist.runtime.failure import abort_on_exception
from mpiredist.runtime.timing import slowest_median

__all__ = ["Floors", "main"]

KINDS = ("alltoall", "pack+alltoall", "sendrecv", "copy+sendrecv", "copy")
PERMUTES = ("kept permute", "donated permute")
RATIOS = (("pack+alltoall", "alltoall", 1.6), ("copy+sendrecv", "sendrecv", 1.3),
          ("donated permute", "kept permute", 1.3))


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


def permute_mesh(size):
    """``{"a": p, "b": size // p}`` with ``p`` the smallest prime factor of
    ``size``, or None when ``size`` has no two factors above 1."""
    p = next((k for k in range(2, size) if size % k == 0), None)
    return None if p is None or size // p < 2 else {"a": p, "b": size // p}


class Permutes:
    """mpiredist's permute of a ``(n, n)`` array, kept and donated (collective)."""

    def __init__(self, comm, n):
        import mpiredist as mr

        axes = permute_mesh(comm.Get_size())
        mesh = mr.Mesh(axes, comm)
        self.sizes, self.rank = (axes["a"], axes["b"]), comm.Get_rank()
        shape, src, dst = (n, n), "[{a,b},{}]", "[{b,a},{}]"
        self.kept = mr.Transfer(shape, np.float32, mesh, src, dst)
        self.given = mr.Transfer(shape, np.float32, mesh, src, dst, donate=True)
        rows = n // comm.Get_size()
        self.block = (np.arange(rows * n, dtype=np.float32)
                      + comm.Get_rank() * rows * n).reshape(rows, n)
        self.out = np.empty(self.kept.target_shape, np.float32)

    def check(self):
        """True if kept and donated runs both give this rank its target rows:
        chunk ``b * A + a`` of ``arange`` (mesh coordinates ``(a, b)``, the
        first axis of a layout's set the major one)."""
        kept = self.kept.run(self.block, out=self.out).copy()
        given = self.given.run(self.block.copy())
        a_size, b_size = self.sizes
        a, b = divmod(self.rank, b_size)
        want = np.arange(kept.size, dtype=np.float32) + (b * a_size + a) * kept.size
        want = want.reshape(kept.shape)
        return bool(np.array_equal(kept, want) and np.array_equal(given, want))

    def times(self, comm):
        """Seconds of one kept and one donated run, the slowest rank's (collective)."""
        from mpi4py import MPI

        out = []
        for fn in (lambda a: self.kept.run(a, out=self.out), self.given.run):
            a = self.block if fn is not self.given.run else self.block.copy()
            comm.Barrier()
            t0 = time.perf_counter()
            fn(a)
            out.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        return out

    def free(self):
        self.kept.free()
        self.given.free()


def measure(comm, mib, repeats):
    """``{kind: median seconds}`` and whether every result was right (collective)."""
    from mpi4py import MPI

    floors = Floors(comm, mib)
    permutes = Permutes(comm, floors.n) if permute_mesh(comm.Get_size()) else None
    ok = bool(floors.check()) and (permutes is None or permutes.check())
    ok = comm.allreduce(ok, op=MPI.LAND)
    calls = floors.calls()
    times = {k: [] for k in KINDS + (PERMUTES if permutes else ())}
    for _ in range(repeats):            # interleaved, the same order on every rank
        for k in KINDS:
            times[k].append(slowest_median(comm, calls[k], 1))
        if permutes is not None:
            for k, t in zip(PERMUTES, permutes.times(comm)):
                times[k].append(t)
    if permutes is not None:
        permutes.free()
    row = {k: float(np.median(v)) for k, v in times.items()}
    return {"ranks": comm.Get_size(), "block_bytes": floors.block.nbytes, "correct": ok,
            "median_s": row,
            "ratios": {f"{a}/{b}": row[a] / row[b] for a, b, _ in RATIOS if a in row}}


def format_result(result):
    """The table as text."""
    lines = [f"floors, {result['ranks']} ranks, {result['block_bytes'] / 2**20:.2f} MiB "
             f"blocks, medians (max over ranks); results "
             f"{'correct' if result['correct'] else 'WRONG'}"]
    lines += [f"  {k:15} {result['median_s'][k] * 1e3:8.2f} ms"
              for k in KINDS + PERMUTES if k in result["median_s"]]
    for a, b, target in RATIOS:
        ratio = result["ratios"].get(f"{a}/{b}")
        if ratio is None:
            continue
        lines.append(f"  {a} / {b} = {ratio:.2f} (target for the strategy it bounds: "
                     f"{target})")
    return "\n".join(lines)


def main(argv=None, comm=None):
    """Measure the floors on ``comm`` (default COMM_WORLD); 0 when the results are right."""
    from mpiredist.runtime.mpi import mpi

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_floors",
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
    sys.exit(abort_on_exception(main))   # a failure on any rank ends the job
