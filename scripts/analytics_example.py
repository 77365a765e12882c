"""HeAT-style analytics on mpiredist: PCA of a dataset read from HDF5.

    mpirun -n 4 python scripts/analytics_example.py [--rows 100000] [--cols 16]

Writes a random dataset to an HDF5 file (collectively), loads it split by
rows, standardises it, forms the covariance ``z.T @ z / (n - 1)``, takes the
eigendecomposition of that small matrix on every rank, projects onto the
leading components, saves the projection, prints each step's time and
checks every result against numpy (the checks read the whole file on every
rank: keep the dataset small enough for that).
"""

import argparse
import os
import tempfile
import time

import numpy as np
from mpi4py import MPI

import mpiredist as mr
from mpiredist.runtime.failure import abort_on_exception
from mpiredist.arrays.distarray import DistArray


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=20000)
    p.add_argument("--cols", type=int, default=12)
    p.add_argument("--components", type=int, default=3)
    p.add_argument("--dir", default=None, help="directory for the HDF5 files")
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    mesh = mr.Mesh({"x": comm.size})
    rows = "[{x}, {}]"
    folder = comm.bcast(args.dir or (tempfile.mkdtemp() if comm.rank == 0 else None))
    path = os.path.join(folder, "analytics.h5")
    times = {}

    def step(name, fn):
        comm.Barrier()
        t = time.perf_counter()
        out = fn()
        comm.Barrier()
        times[name] = time.perf_counter() - t
        if comm.rank == 0:
            print(f"{name:<14} {times[name] * 1e3:9.2f} ms", flush=True)
        return out

    rng = np.random.default_rng(0)
    mix = rng.standard_normal((args.cols, args.cols))
    g = (rng.standard_normal((args.rows, args.cols)) @ mix * 3 + 50).astype(np.float64)
    step("write", lambda: DistArray.from_global(g, mesh, rows).save_hdf5(path, "data",
                                                                          overwrite=True))
    x = step("load", lambda: DistArray.load_hdf5(path, "data", mesh, rows))
    z = step("standardise", lambda: (x - x.mean(0)) / x.std(0))
    cov = step("covariance", lambda: (z.T @ z) / (args.rows - 1))
    full = step("gather cov", cov.gather)
    w, v = step("eigh", lambda: np.linalg.eigh(full))
    top = np.ascontiguousarray(v[:, ::-1][:, :args.components])
    proj = step("project", lambda: z @ top)
    step("save", lambda: proj.save_hdf5(path, "projection", overwrite=True))

    # checks against numpy
    import h5py
    with h5py.File(path, "r") as f:
        saved = f["projection"][...]
    zg = (g - g.mean(0)) / g.std(0)
    cg = zg.T @ zg / (args.rows - 1)
    wg, vg = np.linalg.eigh(cg)
    pg = zg @ vg[:, ::-1][:, :args.components]
    ok = (np.allclose(z.gather(), zg) and np.allclose(full, cg) and np.allclose(w, wg)
          and np.allclose(np.abs(saved), np.abs(pg), atol=1e-8))   # eigenvector signs
    ok = comm.allreduce(ok, op=MPI.LAND)
    if comm.rank == 0:
        print(f"projection {proj.shape} in layout {proj.layout}; covariance layout "
              f"{cov.layout}; check against numpy: {'ok' if ok else 'FAILED'}")
        if args.dir is None:
            os.remove(path)
            os.rmdir(folder)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(abort_on_exception(main))   # a failure on any rank ends the job
