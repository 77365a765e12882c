#!/usr/bin/env python
"""End-to-end HeAT-style example: HDF5 in, distributed 3-D FFT, spectrum out.

    mpirun -n 4 python scripts/fft_example.py [--shape 64,64,64] [--out DIR]

1. Write a 3-D field to ``DIR/field.h5`` (each rank writes its slab with
   :func:`mpiredist.arrays.hdf5.write_blocks`).
2. Read it back split along dim 0 (:func:`mpiredist.arrays.hdf5.read_block`,
   HeAT's ``ht.load_hdf5(..., split=0)``).
3. ``F = fftn3(a)``: FFT along dims 1, 2; all-to-all to split 1; FFT along
   dim 0.  ``F`` stays split along dim 1.
4. Power spectrum ``P[k2] = sum over k0, k1 of |F|^2``: elementwise ufuncs
   on the DistArray, a partial sum over dims 0 and 1 (partial over the mesh
   axis, which shards dim 1), then a reduce-scatter to split 0.
5. Write ``|F|`` and the spectrum to ``DIR/spectrum.h5``.
6. Rank 0 checks against ``numpy.fft.fftn`` of the gathered field (and the
   files written), prints errors and timings next to numpy on one rank.

Exit status 0 when every check passes.  Any number of ranks (1 too); files
go to a temporary directory, removed at the end, unless ``--out`` is given.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.dirname(HERE) not in sys.path:   # run from a checkout without install
    sys.path.insert(0, os.path.dirname(HERE))

from mpiredist.runtime.failure import abort_on_exception
from mpiredist import Mesh, ops  # noqa: E402
from mpiredist.core.blocks import interval  # noqa: E402
from mpiredist.arrays.distarray import DistArray  # noqa: E402
from mpiredist.arrays.fft import fftn3  # noqa: E402
from mpiredist.arrays.heat import layout_for_split  # noqa: E402
from mpiredist.arrays.hdf5 import read_block, write_blocks  # noqa: E402

TOLERANCE = {np.dtype("float64"): 1e-10, np.dtype("float32"): 1e-4}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="64,64,64",
                        help="global shape n0,n1,n2 (default 64,64,64)")
    parser.add_argument("--out", default=None,
                        help="directory for field.h5 and spectrum.h5 (kept); "
                             "default: a temporary directory, removed")
    parser.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    parser.add_argument("--repeat", type=int, default=3,
                        help="timed repetitions of the FFT and the spectrum; the "
                             "best is reported (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        args.shape = tuple(int(n) for n in args.shape.split(","))
    except ValueError:
        parser.error(f"--shape {args.shape!r}: expected three integers like 64,64,64")
    if len(args.shape) != 3 or min(args.shape) < 1:
        parser.error(f"--shape {args.shape}: expected three positive lengths")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


def field_rows(shape, start, stop, dtype, seed):
    """Rows ``[start, stop)`` of the test field: the same whatever the rank count."""
    n0, n1, n2 = shape
    i1 = np.arange(n1)[:, None]
    i2 = np.arange(n2)[None, :]
    out = np.empty((stop - start, n1, n2), dtype=dtype)
    for k, i0 in enumerate(range(start, stop)):
        wave = np.cos(2 * np.pi * (3 * i0 / n0 + 2 * i1 / n1 + 5 * i2 / n2))
        noise = np.random.default_rng([seed, i0]).standard_normal((n1, n2))
        out[k] = wave + 0.1 * noise
    return out


def spectrum(F):
    """Power spectrum over the last dim: sum of ``|F|^2`` over dims 0 and 1.

    Returns ``(|F|, spectrum)``.  On a DistArray the ufuncs run on the local
    blocks (``ops.elementwise(np.abs, F)`` is ``np.abs(F)`` once DistArray
    has ``__array_ufunc__``) and the sum is partial over the mesh axis that
    shards dim 1; :func:`mpiredist.arrays.ops.reduce` finishes it.
    """
    if isinstance(F, DistArray):
        mag = ops.elementwise(np.abs, F)
        power = ops.elementwise(np.multiply, mag, mag)
        return mag, ops.sum(power, axis=(0, 1))
    mag = np.abs(F)
    return mag, np.multiply(mag, mag).sum(axis=(0, 1))


class Timer:
    """Wall times of named phases, each started and ended at a barrier."""

    def __init__(self, comm):
        self.comm, self.times = comm, {}

    def __call__(self, name):
        timer = self

        class _Phase:
            def __enter__(self):
                timer.comm.Barrier()
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                timer.comm.Barrier()
                elapsed = time.perf_counter() - self.t0
                timer.times[name] = min(elapsed, timer.times.get(name, np.inf))

        return _Phase()


def gather_to_root(comm, local, axis):
    """The global array on rank 0 (None elsewhere) from blocks split along ``axis``."""
    blocks = comm.gather(local, root=0)
    return np.concatenate(blocks, axis=axis) if comm.Get_rank() == 0 else None


def _shared_dir(comm, out):
    if out is not None:
        if comm.Get_rank() == 0:
            os.makedirs(out, exist_ok=True)
        comm.Barrier()
        return out, False
    path = tempfile.mkdtemp(prefix="mpiredist-fft-") if comm.Get_rank() == 0 else None
    return comm.bcast(path, root=0), True


def run(args, comm):
    """The example; returns (ok, report lines) on rank 0, (ok, []) elsewhere."""
    rank, size = comm.Get_rank(), comm.Get_size()
    mesh = Mesh({"x": size}, comm)
    split0 = layout_for_split(0, 3, "x")
    shape, dtype = args.shape, np.dtype(args.dtype)
    directory, temporary = _shared_dir(comm, args.out)
    field_path = os.path.join(directory, "field.h5")
    out_path = os.path.join(directory, "spectrum.h5")
    t = Timer(comm)
    try:
        with t("write field"):
            lo, hi = interval(shape[0], size, rank)
            block = field_rows(shape, lo, hi, dtype, args.seed)
            write_blocks(field_path, "field", block, shape, mesh, split0, overwrite=True)
        with t("read (split 0)"):
            local, gshape, _ = read_block(field_path, "field", mesh, split0)
            a = DistArray.from_local(local, mesh, split0, gshape)
        for _ in range(args.repeat):
            with t("fftn3"):
                F = fftn3(a)
            with t("spectrum + reduce"):
                mag, partial = spectrum(F)
                spec = ops.reduce(partial, "[{x}]")   # reduce-scatter
        with t("write |F|, spectrum"):
            write_blocks(out_path, "magnitude", mag.local, mag.shape, mesh, mag.layout,
                         overwrite=True)
            write_blocks(out_path, "spectrum", spec.local, spec.shape, mesh, spec.layout,
                         overwrite=True)

        g = gather_to_root(comm, a.local, 0)          # split 0
        F_all = gather_to_root(comm, F.local, 1)      # split 1
        spec_all = gather_to_root(comm, spec.local, 0)
        ok, lines = True, []
        if rank == 0:
            try:   # the other ranks wait in bcast: never leave them hanging
                ok, lines = _check(args, g, F_all, spec_all, out_path, t.times, size,
                                   str(F.layout), str(partial.layout))
            except Exception as exc:
                ok, lines = False, [f"check failed: {type(exc).__name__}: {exc}"]
        ok = comm.bcast(ok, root=0)
        return ok, lines
    finally:
        comm.Barrier()
        if temporary and rank == 0:
            shutil.rmtree(directory, ignore_errors=True)


def _check(args, g, F_all, spec_all, out_path, times, size, f_layout, p_layout):
    import h5py

    best = np.inf
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        F_ref = np.fft.fftn(g)
        _, spec_ref = spectrum(F_ref)
        best = min(best, time.perf_counter() - t0)
    with h5py.File(out_path, "r") as f:
        mag_file, spec_file = f["magnitude"][...], f["spectrum"][...]

    scale = max(float(np.abs(F_ref).max()), 1.0)
    pscale = max(float(np.abs(spec_ref).max()), 1.0)
    errors = {
        "F": float(np.abs(F_all - F_ref).max()) / scale,
        "|F| file": float(np.abs(mag_file - np.abs(F_ref)).max()) / scale,
        "spectrum": float(np.abs(spec_all - spec_ref).max()) / pscale,
        "spectrum file": float(np.abs(spec_file - spec_ref).max()) / pscale,
    }
    abs_err = float(np.abs(F_all - F_ref).max())
    tol = TOLERANCE[np.dtype(args.dtype)]
    ok = all(e <= tol for e in errors.values()) and F_all.dtype == F_ref.dtype

    compute = times["fftn3"] + times["spectrum + reduce"]
    n0, n1, n2 = args.shape
    lines = [f"fft_example: {n0}x{n1}x{n2} {args.dtype} on {size} rank(s), mesh x={size}"]
    for name, value in times.items():
        lines.append(f"  {name:<22s} {value * 1e3:9.2f} ms")
    lines += [
        f"  F layout {f_layout}, partial spectrum {p_layout}, reduced [{{x}}]",
        f"  distributed compute (fftn3 + spectrum, {size} ranks): {compute * 1e3:9.2f} ms",
        f"  numpy on one rank   (fftn  + spectrum):          {best * 1e3:9.2f} ms",
        f"  max abs error of F: {abs_err:.3e}",
        "  max error / max |reference|: " + ", ".join(
            f"{k} {v:.2e}" for k, v in errors.items()) + f" (tolerance {tol:.0e})",
        "  OK" if ok else "  FAILED",
    ]
    return ok, lines


def main(argv=None, comm=None):
    """Run the example; return 0 if every check passed, else 1 (every rank)."""
    if comm is None:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    args = parse_args(argv)
    ok, lines = run(args, comm)
    if comm.Get_rank() == 0:
        print("\n".join(lines), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(abort_on_exception(main))   # a failure on any rank ends the job
