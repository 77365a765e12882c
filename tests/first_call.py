"""Probe: the first call of a route in a fresh process, measured with tracemalloc.

    mpiexec -n 4 python tests/first_call.py ROUTE

``ROUTE`` is ``redistribute``, ``transfer`` (the first run of a Transfer made
before), ``distarray`` (``DistArray.redistribute``) or ``between`` (between
two meshes).  The process imports mpiredist and mpi4py, makes the objects a
user makes first, then measures E, the bytes newly allocated at the peak of
the one call, on every rank.  Rank 0 prints one JSON line with the largest E
and the bound max(S, T) + W (W the default workspace).  Blocks are 128 KiB.
"""

import json
import sys
import tracemalloc

import numpy as np

import mpiredist as mr
from mpi4py import MPI


def main(route):
    comm = MPI.COMM_WORLD
    P = comm.size
    cols = 256
    rows = 128 * 1024 // 4 // cols * P          # 128 KiB float32 blocks
    shape = (rows, cols)
    mesh = mr.Mesh({"x": P})
    src, dst, dst_mesh = "[{x}, {}]", "[{}, {x}]", None
    block = np.ones((rows // P, cols), np.float32)
    if route == "transfer":
        t = mr.Transfer(shape, "float32", mesh, src, dst)
    elif route == "distarray":
        a = mr.DistArray.from_local(block, mesh, src, shape)
    elif route == "between":
        dst_mesh, dst = mr.Mesh({"a": P}, ranks=list(reversed(range(P)))), "[{}, {a}]"
    comm.Barrier()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    if route == "redistribute":
        out = mr.redistribute(block, shape, mesh, src, dst)
    elif route == "transfer":
        out = t.run(block)
    elif route == "distarray":
        out = a.redistribute(dst).local
    elif route == "between":
        out = mr.redistribute(block, shape, mesh, src, dst, dst_mesh=dst_mesh)
    else:
        raise SystemExit(f"unknown route {route!r}")
    used = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    big = max(block.nbytes, out.nbytes)
    bound = big + big // 4 + (1 << 20)
    used = comm.allreduce(used, op=MPI.MAX)
    if comm.rank == 0:
        print(json.dumps({"route": route, "E": used, "bound": bound, "ranks": P}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
