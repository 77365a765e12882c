"""A fresh MPI job that saves or checks a checkpoint (run by tests/test_checkpoint_jobs.py).

    mpiexec -n N python tests/checkpoint_job.py save PATH SEED [KILL_RANK KILL_AFTER]
    mpiexec -n M python tests/checkpoint_job.py check PATH SEED

``save`` writes the state of ``SEED`` from a mesh of N ranks; with
``KILL_RANK`` that rank SIGKILLs itself after ``KILL_AFTER`` of its writes
(os.pwrite) while saving.  ``check`` loads it on M ranks in other layouts
and exits 0 only if every rank's blocks equal numpy's.
"""

import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import mpiredist as mr

COMM = MPI.COMM_WORLD


def state(seed):
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((512, 384)).astype(np.float32),
            "e": rng.standard_normal((3001, 64)).astype(np.float32),
            "b": rng.standard_normal(384).astype(np.float32)}


def main(mode, path, seed, *kill):
    arrays = state(int(seed))
    mesh = mr.Mesh({"x": COMM.size})
    if mode == "save":
        if kill and COMM.rank == int(kill[0]):
            left = [int(kill[1])]
            write = os.pwrite

            def dying(fd, data, offset):
                if left[0] <= 0:
                    os.kill(os.getpid(), signal.SIGKILL)
                left[0] -= 1
                return write(fd, data, offset)
            os.pwrite = dying
        mr.save(path, {"model": {k: mr.DistArray.from_global(v, mesh, "[{x}" + ", {}" *
                                                             (v.ndim - 1) + "]")
                                 for k, v in arrays.items()}, "seed": int(seed)})
        return 0
    out = mr.load(path, {"model": {"w": (mesh, "[{}, {x}]"), "e": (mesh, "[{x}, {}]"),
                                   "b": np.zeros(384, np.float32)}, "seed": None})
    ok = out["seed"] == int(seed)
    for name, layout in (("w", "[{}, {x}]"), ("e", "[{x}, {}]")):
        want = mr.DistArray.from_global(arrays[name], mesh, layout).local
        ok = ok and np.array_equal(out["model"][name].local, want)
    ok = ok and np.array_equal(out["model"]["b"], arrays["b"])
    ok = COMM.allreduce(int(ok), op=MPI.MIN)
    if COMM.rank == 0:
        print("CHECK", "OK" if ok else "WRONG", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
