"""Weight sync: move a model's weights from the training ranks to the inference ranks.

    mpirun -n 6 python scripts/weight_sync_example.py

The first half of the ranks train: each holds a row slab of every weight
matrix (``[{x}, {}]`` on mesh ``x`` over those ranks).  The other half serve:
each needs a column slab (``[{}, {a}]`` on mesh ``a`` over its ranks), as a
tensor-parallel inference engine shards its linear layers.  One Transfer
per weight shape, built once and run at every sync; nothing is gathered on
one rank, and every rank allocates at most its target block plus W.  The
script checks every block against numpy and prints the time and bytes of a
sync.  With one rank, the same rank trains and serves.
"""

import time

import numpy as np
from mpi4py import MPI

import mpiredist as mr
from mpiredist.runtime.failure import abort_on_exception

LAYERS = {"wq": (1024, 1024), "w_up": (1024, 4096), "w_down": (4096, 1024)}


def weights(step):
    """The full weights at a training step (every rank can build any block of them)."""
    return {name: (np.arange(np.prod(shape), dtype=np.float32).reshape(shape) % 97 + step)
            for name, shape in LAYERS.items()}


def _bytes_moved(plan, size):
    """All ranks' bytes: an exchange plan's total, or a collective plan's per rank x ranks."""
    total = getattr(plan, "bytes_total", None)
    return plan.bytes_sent_per_rank * size if total is None else total


def main(comm=MPI.COMM_WORLD):
    size, rank = comm.Get_size(), comm.Get_rank()
    half = max(1, size // 2)
    train = mr.Mesh({"x": half}, ranks=range(half))
    serve = mr.Mesh({"a": max(1, size - half)}, ranks=range(half, size) if size > 1 else [0])
    transfers = {name: mr.Transfer(shape, "float32", train, "[{x}, {}]", "[{}, {a}]",
                                   dst_mesh=serve) for name, shape in LAYERS.items()}
    ok = True
    for step in (1, 2):                               # two syncs, the same Transfers
        full = weights(step)
        mine = {}
        for name, t in transfers.items():             # this rank's training shard, or None
            a = mr.DistArray.from_global(full[name], train, "[{x}, {}]")
            mine[name] = a.local
        comm.Barrier()
        start = time.perf_counter()
        got = {name: t.run(mine[name]) for name, t in transfers.items()}
        seconds = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
        for name, block in got.items():               # check against numpy
            want = mr.DistArray.from_global(full[name], serve, "[{}, {a}]").local
            ok &= (block is None) == (want is None) and (want is None or
                                                          np.array_equal(block, want))
        sent = sum(_bytes_moved(t.plan, size) for t in transfers.values())
        if rank == 0:
            print(f"sync {step}: {len(got)} weights, {sent / 2**20:.1f} MiB moved, "
                  f"{seconds * 1e3:.1f} ms (training ranks {list(train.ranks)} -> "
                  f"inference ranks {list(serve.ranks)})")
    for t in transfers.values():
        t.free()
    ok = comm.allreduce(bool(ok), op=MPI.LAND)
    if rank == 0:
        print("every block equals numpy's" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(abort_on_exception(main))   # a failure on any rank ends the job
