"""Device moves at realistic sizes, against the device's own copy and a host round trip.

    mpiexec -n 2 python scripts/gpu_sizes.py [--fake] [--sizes 1,4,16,64,256] [--repeats 5]
        [--json FILE]

Run by ``scripts/gpu_check.sh`` under each MPI it is given.  Every rank
uses device 0 (the ranks share one GPU).  For each pattern on the mesh
``x=P`` -- ``all_to_all`` (rows to columns), ``all_gather`` (rows to
whole), ``reduce_scatter`` (partial sums to rows) -- and each size (MiB of
the source block per rank, float32 CuPy arrays), each mode:

- ``aware``: device buffers handed to MPI (only where the library says it
  is CUDA-aware, ``MPIX_Query_cuda_support``; else a skipped row);
- ``staged``: through host rings in parts within W (``MPIREDIST_GPU_AWARE=0``);
- ``host``: the caller's own whole-block round trip (to the host, a numpy
  redistribution, back to the device);
- ``floor``: a device-to-device copy of the rank's block (``cupy.copyto``),
  the device's own limit for moving those bytes;

it checks the result against numpy, the device memory the move allocates
(a CuPy memory hook over its pool) against max(S, T) + W, the bytes
mpiredist copied between host and device
(:data:`mpiredist.core.backend.HOST_DEVICE_BYTES`: none when aware), and
the median time of the slowest rank.  The summary gives, from 16 MiB per
rank up, staged against the round trip (the issue's target: staged at
least as fast), and from 64 MiB up aware against the floor (target: at
least 30 % of the copy's speed).  ``--fake`` runs on a CPU with the fake
CuPy of ``tests/fakecupy.py`` (no memory figures; its "device" is host
memory).  Exit status 1 if any result is wrong or any device peak exceeds
its bound.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "tests"), os.path.join(HERE, "..")]

PATTERNS = {"all_to_all": ("[{x}, {}]", "[{}, {x}]"),
            "all_gather": ("[{x}, {}]", "[{}, {}]"),
            "reduce_scatter": ("[{}, {}] sum{x}", "[{x}, {}]")}
COLUMNS = 1024      # float32 columns: a row is 4 KiB


def _shape(pattern, mib, p):
    """The global shape whose source block on each of ``p`` ranks is ``mib`` MiB."""
    rows = max(1, int(mib * (1 << 20)) // (4 * COLUMNS))
    return (rows, COLUMNS) if pattern == "reduce_scatter" else (rows * p, COLUMNS)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake", action="store_true", help="the fake CuPy, on a CPU")
    parser.add_argument("--sizes", default="1,4,16,64,256", help="MiB per rank")
    parser.add_argument("--patterns", default=",".join(PATTERNS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.fake:
        import fakecupy
        fakecupy.install()
    import cupy
    from mpi4py import MPI

    import mpiredist as mr
    from mpiredist.core import backend
    from mpiredist.planning.budget import default_workspace
    from mpiredist.runtime.mpi import cuda_aware, cuda_aware_hint

    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    if not args.fake:
        cupy.cuda.Device(0).use()
    aware = bool(comm.allreduce(int(args.fake or cuda_aware()), op=MPI.MIN))
    rows, bad = [], 0

    def sync():
        if not args.fake:
            cupy.cuda.get_current_stream().synchronize()

    def timed(fn):
        fn()                                    # warm: plans, buffers
        times = []
        for _ in range(args.repeats):
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        return statistics.median(times)

    def device_peak(fn):
        if args.fake:
            return fn(), None
        from gpu_check import peak_meter
        with peak_meter(cupy) as meter:
            out = fn()
            sync()
        return out, meter.peak

    for pattern in args.patterns.split(","):
        src, dst = PATTERNS[pattern]
        for mib in (float(s) for s in args.sizes.split(",")):
            shape = _shape(pattern, mib, p)
            mesh = mr.Mesh({"x": p})
            G = (np.arange(shape[0] * shape[1], dtype=np.float32).reshape(shape) % 1021)
            host_src = (G if pattern == "reduce_scatter" else
                        mr.DistArray.from_global(G, mesh, src).local)
            host_src = np.ascontiguousarray(host_src / p if pattern == "reduce_scatter"
                                            else host_src)
            want = mr.DistArray.from_global(G, mesh, dst).local
            plan = mr.plan(shape, "f4", mesh, src, dst)
            bound = max(plan.src_local_bytes, plan.dst_local_bytes) + default_workspace(plan)
            local = cupy.asarray(host_src)
            times = {}
            for mode in ("floor", "aware", "staged", "host"):
                if mode == "aware" and not aware:
                    rows.append(dict(pattern=pattern, mib=mib, mode=mode, result="skip",
                                     note="MPI not CUDA-aware " + cuda_aware_hint()))
                    continue
                if mode == "floor":
                    out = cupy.empty_like(local)
                    times[mode] = timed(lambda: cupy.copyto(out, local))
                    rows.append(dict(pattern=pattern, mib=mib, mode=mode, result="ok",
                                     ms=times[mode] * 1e3))
                    continue
                os.environ["MPIREDIST_GPU_AWARE"] = "0" if mode == "staged" else "1"
                sub = comm.Dup()                # CUDA-awareness is agreed per communicator
                on = mr.Mesh({"x": p}, comm=sub)
                if mode == "host":
                    def run():
                        back = mr.redistribute(cupy.asnumpy(local), shape, on, src, dst)
                        return cupy.asarray(back)
                else:
                    def run():
                        return mr.redistribute(local, shape, on, src, dst)
                times[mode] = timed(run)
                before = backend.HOST_DEVICE_BYTES[0]
                got, peak = device_peak(run)
                touched = backend.HOST_DEVICE_BYTES[0] - before
                ok = np.allclose(cupy.asnumpy(got), want, rtol=1e-5, atol=1e-3)
                within = peak is None or peak <= bound
                flags = comm.allgather((bool(ok), bool(within), peak, touched))
                sub.Free()
                good = all(f[0] for f in flags)
                inside = all(f[1] for f in flags)
                peaks = [f[2] for f in flags if f[2] is not None]
                bad += (not good) + (not inside)
                rows.append(dict(pattern=pattern, mib=mib, mode=mode,
                                 result="ok" if good else "WRONG", ms=times[mode] * 1e3,
                                 peak_mib=max(peaks) / 2**20 if peaks else None,
                                 bound_mib=bound / 2**20, within=inside,
                                 host_mib=max(f[3] for f in flags) / 2**20
                                 if mode != "host" else None))
            del local
    summary = _summary(rows)
    if rank == 0:
        print(f"gpu_sizes: {p} ranks, {'fake CuPy (CPU)' if args.fake else 'GPU 0'}, MPI "
              f"{MPI.Get_library_version().splitlines()[0].strip()}, CUDA-aware: {aware}, "
              f"median of {args.repeats} (slowest rank)")
        print(f"{'pattern':15} {'MiB':>6} {'mode':7} {'result':6} {'ms':>9} {'GB/s':>7} "
              f"{'dev MiB':>8} {'bound':>8} {'host MiB':>8}")
        for r in rows:
            ms = r.get("ms")
            rate = "-" if not ms else f"{r['mib'] * 2**20 / (ms * 1e-3) / 1e9:.1f}"
            fmt = (lambda v: "-" if v is None else f"{v:.2f}")
            print(f"{r['pattern']:15} {r['mib']:>6g} {r['mode']:7} {r['result']:6} "
                  f"{'-' if ms is None else f'{ms:.2f}':>9} {rate:>7} "
                  f"{fmt(r.get('peak_mib')):>8} {fmt(r.get('bound_mib')):>8} "
                  f"{fmt(r.get('host_mib')):>8} {r.get('note', '')}")
        for line in summary["lines"]:
            print(line)
        print("gpu_sizes: " + ("PASSED" if not bad else f"FAILED ({bad} problems)"))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(ranks=p, fake=args.fake, aware=aware, rows=rows,
                               mpi=MPI.Get_library_version().splitlines()[0].strip(),
                               summary=summary), f, indent=1)
    return 1 if bad else 0


def _summary(rows):
    """The targets: staged against the round trip from 16 MiB, aware against
    the floor from 64 MiB (per pattern and size)."""
    at = {}
    for r in rows:
        if r.get("ms"):
            at.setdefault((r["pattern"], r["mib"]), {})[r["mode"]] = r["ms"]
    staged = {k: m["host"] / m["staged"] for k, m in at.items()
              if k[1] >= 16 and "host" in m and "staged" in m}
    aware = {k: m["floor"] / m["aware"] for k, m in at.items()
             if k[1] >= 64 and "floor" in m and "aware" in m}
    lines = []
    if staged:
        worst = min(staged.values())
        lines.append(f"staged vs whole-block round trip, 16 MiB/rank and up: round trip / "
                     f"staged {worst:.2f} at worst over {len(staged)} rows (target >= 1: "
                     f"{'met' if worst >= 1 else 'missed'})")
    if aware:
        worst = min(aware.values())
        lines.append(f"aware vs device copy, 64 MiB/rank and up: {100 * worst:.0f} % of the "
                     f"copy's speed at worst over {len(aware)} rows (target >= 30 %: "
                     f"{'met' if worst >= 0.3 else 'missed'})")
    return dict(lines=lines, staged={f"{k[0]} {k[1]:g}": v for k, v in staged.items()},
                aware={f"{k[0]} {k[1]:g}": v for k, v in aware.items()})


if __name__ == "__main__":
    sys.exit(main())
