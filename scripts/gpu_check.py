"""The device check: CuPy arrays and torch CUDA tensors through mpiredist, on one GPU.

    mpiexec -n 2 python scripts/gpu_check.py [--fake] [--scale 64] [--repeats 5]

Run by ``scripts/gpu_check.sh`` (which installs the MPI wheel it is given).
Every rank uses device 0 (one GPU shared by 2-4 ranks).  For each shared
case folded onto the ranks at hand (its mesh axes shrunk to P devices,
lengths divided by ``--scale``), each library (CuPy; torch CUDA when torch
has CUDA) and each mode:

- ``staged``: ``MPIREDIST_GPU_AWARE=0``, in parts through host rings within W;
- ``aware``: device buffers to MPI, only where the MPI library says it is
  CUDA-aware (``MPIX_Query_cuda_support``), else reported as skipped;
- ``host``: the caller's own round trip (copy to the host, numpy
  redistribute, copy back), for comparison;

it checks the result against the numpy oracle of ``tests/oracle.py``, the
device memory the call allocates (CuPy: a counting allocator over its pool;
torch: ``torch.cuda.max_memory_allocated``) against the contract
max(S, T) + W, and the median time.  Then a TransferGroup of three arrays,
and bfloat16 torch CUDA tensors (which move as their int16 bits): a reshard,
a reduce-scatter and an all-reduce of partial sums of integers (exact in
bfloat16, so against the oracle), and a max; and a CUDA DTensor through
``mr.torch.redistribute`` (gloo over the same ranks; skipped, with the
reason, where no CUDA DeviceMesh can be made).  ``--fake`` runs on a CPU
with the fake CuPy of ``tests/fakecupy.py`` and its fake CUDA tensors (no
memory figures), so that the script is kept working where no GPU is.  Exit
status 1 if any result is wrong or any device peak exceeds its bound.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "tests"), os.path.join(HERE, "..")]


def fold(mesh, p):
    """``mesh`` (axis -> size, power-of-two sizes) shrunk to ``p`` devices, or None."""
    sizes = dict(mesh)
    while np.prod(list(sizes.values())) > p:
        axis = max(sizes, key=lambda a: sizes[a])
        if sizes[axis] % 2:
            return None
        sizes[axis] //= 2
    return sizes if np.prod(list(sizes.values())) == p else None


def peak_meter(cupy):
    """A CuPy memory hook that tracks the device bytes taken from the pool while
    it is active (``with meter:``) and their peak (``meter.peak``)."""
    class Peak(cupy.cuda.MemoryHook):
        name = "mpiredist-peak"

        def __init__(self):
            self.now = self.peak = 0

        def malloc_postprocess(self, **kw):
            self.now += kw["mem_size"]
            self.peak = max(self.peak, self.now)

        def free_postprocess(self, **kw):
            self.now -= kw["mem_size"]
    return Peak()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake", action="store_true", help="the fake CuPy, on a CPU")
    parser.add_argument("--scale", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", default="", help="comma-separated case ids (default all)")
    args = parser.parse_args(argv)

    if args.fake:
        import fakecupy
        fakecupy.install()
    import cupy
    from mpi4py import MPI

    import mpiredist as mr
    import oracle
    from mpiredist.bench.cases import load_cases, scaled
    from mpiredist.planning.budget import default_workspace
    from mpiredist.planning.pieces import layout_boxes
    from mpiredist.runtime.mpi import cuda_aware

    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    try:
        import ml_dtypes
        import torch
        has_torch = (not args.fake) and torch.cuda.is_available()
    except ImportError:
        torch, has_torch = None, False
    if not args.fake:
        cupy.cuda.Device(0).use()
    # the fake's device memory is host memory: any MPI reads it as a CUDA-aware one would
    aware = 1 if args.fake else comm.allreduce(int(cuda_aware()), op=MPI.MIN)
    wanted = {c for c in args.cases.split(",") if c}
    rows, bad = [], 0

    def to_device(a, lib):
        if lib == "torch":
            return torch.from_numpy(np.ascontiguousarray(a)).cuda()
        return cupy.asarray(np.ascontiguousarray(a))

    def to_host(a, lib):
        return a.cpu().numpy() if lib == "torch" else cupy.asnumpy(a)

    def sync(lib):
        if args.fake:
            return
        (torch.cuda.synchronize() if lib == "torch" else
         cupy.cuda.get_current_stream().synchronize())

    for case in load_cases():
        if wanted and case.id not in wanted and case.short_id not in wanted:
            continue
        sizes = fold(case.mesh, p)
        if sizes is None:
            continue
        c = scaled(case, args.scale)
        axes = list(sizes.items())
        G = oracle.global_array(c.shape, np.dtype("f4"), np.random.default_rng(7))
        dims = [list(d) for d in c.src.dims]
        src_host = oracle.source_blocks(G, axes, dims, list(c.src.partial), c.src.op)[rank]
        want = oracle.expected(G, axes, [list(d) for d in c.dst.dims], rank)
        plan = mr.plan(c.shape, "f4", mr.Mesh(",".join(f"{a}={n}" for a, n in axes)), c.src,
                       c.dst)
        bound = max(plan.src_local_bytes, plan.dst_local_bytes) + default_workspace(plan)
        for lib in ["cupy"] + (["torch"] if has_torch else []):
            for mode in ("staged", "aware", "host"):
                if mode == "aware" and not aware:
                    rows.append((case.short_id, lib, mode, "skip", "-", "-", "MPI not CUDA-aware"))
                    continue
                os.environ["MPIREDIST_GPU_AWARE"] = "1" if mode == "aware" else "0"
                sub = comm.Dup()            # CUDA-awareness is agreed per communicator
                mesh = mr.Mesh(",".join(f"{a}={n}" for a, n in axes), comm=sub)
                local = to_device(src_host, lib)
                times, peak = [], None

                def once():
                    if mode == "host":
                        out = mr.redistribute(to_host(local, lib), c.shape, mesh, c.src, c.dst)
                        return to_device(out, lib)
                    return mr.redistribute(local, c.shape, mesh, c.src, c.dst)
                got = once()                                        # warm: plan, buffers
                for _ in range(args.repeats):
                    sub.Barrier()
                    t0 = time.perf_counter()
                    got = once()
                    sync(lib)
                    times.append(time.perf_counter() - t0)
                del got
                if not args.fake and mode != "host":
                    if lib == "torch":
                        torch.cuda.synchronize()
                        base = torch.cuda.memory_allocated()
                        torch.cuda.reset_peak_memory_stats()
                        got = once()
                        sync(lib)
                        peak = torch.cuda.max_memory_allocated() - base
                    else:
                        with peak_meter(cupy) as meter:
                            got = once()
                            sync(lib)
                        peak = meter.peak
                else:
                    got = once()
                ok = np.array_equal(to_host(got, lib), want)
                within = peak is None or peak <= bound
                flags = comm.allgather((ok, within, peak))
                all_ok = all(f[0] for f in flags)
                all_within = all(f[1] for f in flags)
                peaks = [f[2] for f in flags if f[2] is not None]
                bad += (not all_ok) + (not all_within)
                sub.Free()
                rows.append((case.short_id, lib, mode, "ok" if all_ok else "WRONG",
                             f"{statistics.median(times) * 1e3:.2f}",
                             f"{max(peaks) / 2**20:.2f}" if peaks else "-",
                             f"bound {bound / 2**20:.2f} MiB" + ("" if all_within else
                                                                  " EXCEEDED")))
    # many arrays in one TransferGroup (state-dict-like: weights, a bias, a partial sum)
    items = {"w": ((64 * p + 3, 48), "float32", "[{x}, {}]", "[{}, {x}]"),
             "b": ((96,), "float32", "[{}]", "[{x}]"),
             "g": ((32, 8 * p), "float32", "[{}, {}] sum{x}", "[{}, {x}]")}
    G = {n: oracle.global_array(it[0], np.dtype("f4"), np.random.default_rng(9))
         for n, it in items.items()}
    for lib in ["cupy"] + (["torch"] if has_torch else []):
        for mode in ("staged", "aware"):
            if mode == "aware" and not aware:
                rows.append(("group", lib, mode, "skip", "-", "-", "MPI not CUDA-aware"))
                continue
            os.environ["MPIREDIST_GPU_AWARE"] = "1" if mode == "aware" else "0"
            sub = comm.Dup()
            mesh = mr.Mesh(f"x={p}", comm=sub)
            blocks = {}
            for n, (shape, _, src, _) in items.items():
                lay = mr.Layout.parse(src)
                blocks[n] = to_device(oracle.source_blocks(
                    G[n], [("x", p)], [list(d) for d in lay.dims], list(lay.partial),
                    lay.op)[rank], lib)
            times = []
            with mr.TransferGroup(items, mesh) as g:
                got = g.run(blocks)                                 # warm
                for _ in range(args.repeats):
                    sub.Barrier()
                    t0 = time.perf_counter()
                    got = g.run(blocks)
                    sync(lib)
                    times.append(time.perf_counter() - t0)
            ok = all(np.array_equal(to_host(got[n], lib), oracle.expected(
                G[n], [("x", p)], [list(d) for d in mr.Layout.parse(it[3]).dims], rank))
                for n, it in items.items())
            all_good = all(comm.allgather(ok))
            bad += not all_good
            sub.Free()
            rows.append(("group", lib, mode, "ok" if all_good else "WRONG",
                         f"{statistics.median(times) * 1e3:.2f}", "-",
                         f"TransferGroup of {len(items)} arrays"))
    # records of a device run that is one exchange (staged through host rings on
    # one mesh; between meshes, staged or not): one "exchange" record whose MPI
    # calls moved the data; between disjoint halves every byte crosses once
    if p >= 2:
        os.environ["MPIREDIST_GPU_AWARE"] = "1" if aware else "0"
        sub = comm.Dup()
        half = p // 2
        shape = (8 * p + 1, 6)
        G = oracle.global_array(shape, np.dtype("f4"), np.random.default_rng(5))
        one = mr.Mesh(f"x={p}", comm=sub)
        runs = [("between meshes", mr.Mesh(f"x={half}", ranks=range(half), comm=sub),
                 mr.Mesh(f"a={p - half}", ranks=range(half, p), comm=sub), "[{}, {a}]")]
        if not aware:
            runs.insert(0, ("one mesh, staged", one, one, "[{}, {x}]"))
        for note, m1, m2, dst in runs:
            src_box, dst_box = (layout_boxes(shape, m, mr.Layout.parse(lay), p)[rank]
                                for m, lay in ((m1, "[{x}, {}]"), (m2, dst)))
            local = None if src_box is None else cupy.asarray(
                np.ascontiguousarray(G[tuple(slice(a, b) for a, b in src_box)]))
            recs = []
            with mr.Transfer(shape, "float32", m1, "[{x}, {}]", dst, dst_mesh=m2) as t:
                got = t.run(local, records=recs)
            ok = (dst_box is None and got is None) or (got is not None and np.array_equal(
                cupy.asnumpy(got), G[tuple(slice(a, b) for a, b in dst_box)]))
            ok = ok and [r.op for r in recs] == ["exchange"]
            sent = comm.allreduce(recs[0].bytes_sent if recs else 0)
            calls = comm.allreduce(recs[0].calls if recs else 0)
            ok = all(comm.allgather(ok)) and calls > 0 and (
                m1 is one or sent == G.nbytes)
            bad += not ok
            rows.append(("recs", "cupy", "aware" if aware else "staged",
                         "ok" if ok else "WRONG", "-", "-",
                         f"records, {note}: {sent} B sent, {calls} MPI calls"))
        sub.Free()
    # bfloat16 torch CUDA tensors: CuPy has none, so they move as their int16
    # bits, and partial sums of them are combined through float32 on the device
    if torch is not None and (has_torch or args.fake):
        if args.fake:
            import fakecupy

        def bf16_device(a):
            t = torch.from_numpy(np.ascontiguousarray(a, np.float32)).to(torch.bfloat16)
            return fakecupy.torch_cuda(t) if args.fake else t.cuda()

        shape = (16 * p + 3, 40)
        rng = np.random.default_rng(5)
        # integer parts: sums exact in bfloat16, so every order gives the oracle's value
        ints = [rng.integers(-8, 9, shape).astype(np.float32) for _ in range(p)]
        reals = [rng.standard_normal(shape).astype(np.float32) for _ in range(p)]
        for src, dst, parts, combine in (
                ("[{x}, {}]", "[{}, {x}]", None, None),
                ("[{}, {}] sum{x}", "[{x}, {}]", ints, sum),
                ("[{}, {}] sum{x}", "[{}, {}]", ints, sum),
                ("[{}, {}] max{x}", "[{x}, {}]", reals, np.maximum.reduce)):
            if parts is None:
                G = reals[0]
                mine = oracle.local_block(G, [("x", p)], [["x"], []], rank)
            else:
                parts = [a.astype(ml_dtypes.bfloat16).astype(np.float32) for a in parts]
                G, mine = combine(parts), parts[rank]
            want = oracle.expected(G, [("x", p)], [list(d) for d in mr.Layout.parse(dst).dims],
                                   rank).astype(ml_dtypes.bfloat16).astype(np.float32)
            for mode in ("staged", "aware"):
                if mode == "aware" and not aware:
                    rows.append(("bf16", "torch", mode, "skip", "-", "-", "MPI not CUDA-aware"))
                    continue
                os.environ["MPIREDIST_GPU_AWARE"] = "1" if mode == "aware" else "0"
                sub = comm.Dup()
                mesh = mr.Mesh(f"x={p}", comm=sub)
                local, times = bf16_device(mine), []
                got = mr.redistribute(local, shape, mesh, src, dst)      # warm
                for _ in range(args.repeats):
                    sub.Barrier()
                    t0 = time.perf_counter()
                    got = mr.redistribute(local, shape, mesh, src, dst)
                    sync("torch")
                    times.append(time.perf_counter() - t0)
                ok = (isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
                      and (args.fake or got.is_cuda)
                      and np.array_equal(got.float().cpu().numpy(), want))
                all_good = all(comm.allgather(ok))
                bad += not all_good
                sub.Free()
                rows.append(("bf16", "torch", mode, "ok" if all_good else "WRONG",
                             f"{statistics.median(times) * 1e3:.2f}", "-",
                             f"bfloat16 {src} -> {dst}"))
    # a CUDA DTensor through mr.torch.redistribute (gloo over the same ranks as
    # MPI; COMM_WORLD, whose CUDA-awareness is agreed once: one mode)
    if has_torch:
        mode = "aware" if aware else "staged"
        os.environ["MPIREDIST_GPU_AWARE"] = "1" if aware else "0"
        try:
            import socket

            import torch.distributed as dist
            from torch.distributed.device_mesh import DeviceMesh
            from torch.distributed.tensor import DTensor, Shard
            if not dist.is_initialized():
                port = None
                if rank == 0:
                    with socket.socket() as s:
                        s.bind(("127.0.0.1", 0))
                        port = s.getsockname()[1]
                port = comm.bcast(port)
                dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                        rank=rank, world_size=p)
            dmesh = DeviceMesh("cuda", torch.arange(p), mesh_dim_names=("x",))
        except Exception as exc:        # no CUDA DeviceMesh here: say why, not a failure
            rows.append(("dtens", "torch", mode, "skip", "-", "-",
                         f"no CUDA DeviceMesh ({type(exc).__name__}: {exc})"[:90]))
        else:
            shape = (8 * p + 3, 6 * p + 1)
            G = oracle.global_array(shape, np.dtype("f4"), np.random.default_rng(13))
            mine = oracle.local_block(G, [("x", p)], [["x"], []], rank)
            want = oracle.expected(G, [("x", p)], [[], ["x"]], rank)
            x = DTensor.from_local(torch.from_numpy(np.ascontiguousarray(mine)).cuda(), dmesh,
                                   [Shard(0)], run_check=False, shape=torch.Size(shape),
                                   stride=(shape[1], 1))
            times, ok = [], False
            try:
                got = mr.torch.redistribute(x, [Shard(1)])                  # warm
                for _ in range(args.repeats):
                    comm.Barrier()
                    t0 = time.perf_counter()
                    got = mr.torch.redistribute(x, [Shard(1)])
                    sync("torch")
                    times.append(time.perf_counter() - t0)
                local = got.to_local()
                ok = local.is_cuda and np.array_equal(local.cpu().numpy(), want)
                note = "DTensor Shard(0) -> Shard(1), CUDA in and out"
            except Exception as exc:        # a wrong or failing run: counted as a problem
                note = f"{type(exc).__name__}: {exc}"[:90]
            all_good = all(comm.allgather(ok))
            bad += not all_good
            rows.append(("dtens", "torch", mode, "ok" if all_good else "WRONG",
                         f"{statistics.median(times) * 1e3:.2f}" if times else "-", "-", note))
    if rank == 0:
        print(f"gpu_check: {p} ranks, {'fake CuPy (CPU)' if args.fake else 'GPU 0'}, "
              f"MPI {MPI.Get_library_version().splitlines()[0].strip()}, CUDA-aware: "
              f"{bool(aware)}, scale {args.scale}, median of {args.repeats}")
        print(f"{'case':5} {'lib':6} {'mode':7} {'result':6} {'ms':>9} {'dev MiB':>8}  note")
        for r in rows:
            print(f"{r[0]:5} {r[1]:6} {r[2]:7} {r[3]:6} {r[4]:>9} {r[5]:>8}  {r[6]}")
        by = {}
        for r in rows:
            if r[3] == "ok" and r[4] != "-":
                by.setdefault((r[0], r[1]), {})[r[2]] = float(r[4])
        ratios = [m["host"] / m["staged"] for m in by.values() if "host" in m and "staged" in m]
        if ratios:
            print(f"host round trip / staged: geomean "
                  f"{float(np.exp(np.mean(np.log(ratios)))):.2f} over {len(ratios)} cases")
        aw = [m["staged"] / m["aware"] for m in by.values() if "aware" in m and "staged" in m]
        if aw:
            print(f"staged / CUDA-aware: geomean {float(np.exp(np.mean(np.log(aw)))):.2f}")
        print("gpu_check: " + ("PASSED" if not bad else f"FAILED ({bad} problems)"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
