"""The torch.distributed transport on CUDA tensors over NCCL: every operation once.

    torchrun --nproc-per-node 1 scripts/nccl_check.py [--fake]

Run by ``scripts/gpu_check.sh`` on a machine with a GPU (NCCL cannot put
two ranks on one GPU before NCCL 2.30, so one rank: every collective runs,
over a group of one).  Each operation of
:class:`~mpiredist.runtime.torchdist.TorchGroup` -- all-to-all (even and
with counts), all-gather, all-reduce, reduce-scatter, send/receive, the
agreement's bitwise OR (an all-gather on NCCL), an object all-gather, a
split -- on CuPy arrays over CUDA memory, checked against numpy; then a
CUDA DTensor through ``mr.torch.redistribute`` and a Transfer of CUDA
tensors on ``mr.torch.mesh``, checked, with no byte staged through the host
(:data:`mpiredist.core.backend.HOST_DEVICE_BYTES`).  ``--fake``: gloo and
host arrays on a CPU (the same calls, so that the script keeps working
where no GPU is).  Prints one line per operation and ``nccl_check: PASSED``
or ``FAILED``; exit status 1 on any failure.
"""

import argparse
import os
import sys
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..")]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake", action="store_true", help="gloo and host arrays, on a CPU")
    args = parser.parse_args(argv)
    import torch
    import torch.distributed as dist

    import mpiredist as mr
    from mpiredist.core import backend
    from mpiredist.runtime.groups import world_group

    if args.fake:
        dist.init_process_group("gloo")
        xp, device = np, "cpu"
    else:
        import cupy
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        cupy.cuda.Device(local_rank).use()
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
        xp, device = cupy, "cuda"
    group = world_group()
    n, me = group.size, group.rank
    results = []

    def check(name, fn):
        try:
            ok = bool(fn())
            results.append((name, "ok" if ok else "WRONG", ""))
        except Exception as exc:        # noqa: BLE001 - reported, counted as a failure
            results.append((name, "ERROR", f"{type(exc).__name__}: {exc}"))
            traceback.print_exc()

    def host(a):
        return a if xp is np else xp.asnumpy(a)

    def sync():
        if xp is not np:
            xp.cuda.get_current_stream().synchronize()

    base = np.arange(4 * n, dtype=np.float32) + 100 * me

    def alltoall():
        out = xp.empty(4 * n, xp.float32)
        group.alltoall(xp.asarray(base), out)
        sync()
        want = np.concatenate([np.arange(4 * me, 4 * me + 4) + 100 * r for r in range(n)])
        return np.array_equal(host(out), want)

    def alltoallv():
        counts = [4] * n
        out = xp.empty(4 * n, xp.float32)
        group.alltoallv(xp.asarray(base), [c * 4 for c in counts], out,
                        [c * 4 for c in counts])
        sync()
        return np.array_equal(host(out)[:4], np.arange(4 * me, 4 * me + 4))

    def allgather():
        out = xp.empty((n, 3), xp.float32)
        own = xp.full(3, float(me), xp.float32)
        group.allgather(own, out, [12] * n)
        sync()
        return np.array_equal(host(out), np.repeat(np.arange(n, dtype=np.float32), 3)
                              .reshape(n, 3))

    def allreduce():
        out = xp.empty(5, xp.float32)
        group.allreduce(xp.ones(5, xp.float32), out, "sum")
        sync()
        return np.array_equal(host(out), np.full(5, n, np.float32))

    def reduce_scatter():
        out = xp.empty(2, xp.float32)
        group.reduce_scatter(xp.ones(2 * n, xp.float32), out, [2] * n, "sum")
        sync()
        return np.array_equal(host(out), np.full(2, n, np.float32))

    def sendrecv():
        out = xp.empty(6, xp.float32)
        group.sendrecv(xp.arange(6, dtype=xp.float32), me, out, me)
        sync()
        return np.array_equal(host(out), np.arange(6, dtype=np.float32))

    def bitwise_or():
        words = np.array([1 << me, 0, 7], dtype=np.uint64)
        group.bitwise_or(words)
        return words[0] == (1 << n) - 1 and words[2] == 7

    def objects():
        return group.allgather_object(("rank", me)) == [("rank", r) for r in range(n)]

    def split():
        sub = group.split(0, me)
        try:
            return sub.size == n and sub.rank == me
        finally:
            sub.free()

    for name, fn in [("alltoall", alltoall), ("alltoallv", alltoallv), ("allgather", allgather),
                     ("allreduce", allreduce), ("reduce_scatter", reduce_scatter),
                     ("sendrecv", sendrecv), ("bitwise_or (agreement)", bitwise_or),
                     ("allgather_object", objects), ("split", split)]:
        check(name, fn)

    def dtensor():
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import Shard, distribute_tensor
        dm = DeviceMesh(device, list(range(n)), mesh_dim_names=("x",))
        g = torch.arange(5.0 * 7, device=device).reshape(5, 7)
        x = distribute_tensor(g, dm, [Shard(0)])
        before = backend.HOST_DEVICE_BYTES[0]
        y = mr.torch.redistribute(x, [Shard(1)])
        staged = backend.HOST_DEVICE_BYTES[0] - before
        return (y.to_local().device.type == device and torch.equal(y.full_tensor(), g)
                and staged == 0)

    def transfer():
        from torch.distributed.device_mesh import DeviceMesh
        mesh = mr.torch.mesh(DeviceMesh(device, list(range(n)), mesh_dim_names=("x",)))
        g = torch.arange(6.0 * n * 4, device=device).reshape(6 * n, 4).to(torch.bfloat16)
        a = mr.DistArray.from_global(g, mesh, "[{x}, {}]")
        before = backend.HOST_DEVICE_BYTES[0]
        b = a.redistribute("[{}, {x}]")
        staged = backend.HOST_DEVICE_BYTES[0] - before
        return b.local.device.type == device and b.local.dtype == torch.bfloat16 and \
            torch.equal(torch.as_tensor(b.gather()).to(device), g) and staged == 0

    check("mr.torch.redistribute (DTensor)", dtensor)
    check("Transfer on mr.torch.mesh (bfloat16)", transfer)
    if me == 0:
        print(f"nccl_check: {n} rank(s), {group.library}, device buffers to the transport: "
              f"{bool(group.device_aware)}")
        for name, result, note in results:
            print(f"  {name:38} {result:6} {note}")
    bad = sum(r != "ok" for _, r, _ in results)
    if me == 0:
        print("nccl_check: " + ("PASSED" if not bad else f"FAILED ({bad} problems)"))
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
