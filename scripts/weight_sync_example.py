"""Weight sync: move a model's weights from the training ranks to the inference ranks.

    mpirun -n 6 python scripts/weight_sync_example.py                   # MPI
    torchrun --nproc-per-node 6 scripts/weight_sync_example.py          # torch.distributed

The first half of the ranks train: each holds a row slab of every weight
matrix (``[{x}, {}]`` on mesh ``x`` over those ranks).  The other half serve:
each needs a column slab (``[{}, {a}]`` on mesh ``a`` over its ranks), as a
tensor-parallel inference engine shards its linear layers.  One
:class:`~mpiredist.TransferGroup` for the whole state dict, built once and
run at every sync; nothing is gathered on one rank, and every rank
allocates at most its target blocks plus W.  Under torchrun the meshes are
torch ``DeviceMesh``es (``mr.torch.mesh``), the blocks torch tensors, and
the bytes go over gloo (NCCL for CUDA tensors); under mpirun numpy arrays
over MPI.  The script checks every block against numpy and prints the time
and bytes of a sync.  With one rank, the same rank trains and serves.
"""

import os
import time

import numpy as np

import mpiredist as mr
from mpiredist.runtime.failure import abort_on_exception
from mpiredist.runtime.groups import as_group, world_group

LAYERS = {"wq": (1024, 1024), "w_up": (1024, 4096), "w_down": (4096, 1024)}
UNDER_TORCHRUN = "TORCHELASTIC_RUN_ID" in os.environ


def weights(step):
    """The full weights at a training step (every rank can build any block of them)."""
    return {name: (np.arange(np.prod(shape), dtype=np.float32).reshape(shape) % 97 + step)
            for name, shape in LAYERS.items()}


def meshes(size):
    """The training and inference meshes: DeviceMeshes' under torchrun."""
    half = max(1, size // 2)
    train_ranks = list(range(half))
    serve_ranks = list(range(half, size)) if size > 1 else [0]
    if UNDER_TORCHRUN:
        from torch.distributed.device_mesh import DeviceMesh
        return (mr.torch.mesh(DeviceMesh("cpu", train_ranks, mesh_dim_names=("x",))),
                mr.torch.mesh(DeviceMesh("cpu", serve_ranks, mesh_dim_names=("a",))))
    return (mr.Mesh({"x": half}, ranks=train_ranks),
            mr.Mesh({"a": len(serve_ranks)}, ranks=serve_ranks))


def main(comm=None):
    if UNDER_TORCHRUN:
        import torch.distributed as dist
        if not dist.is_initialized():
            dist.init_process_group("gloo")
    world = world_group() if comm is None else as_group(comm)
    size, rank = world.size, world.rank
    train, serve = meshes(size)
    items = {name: (shape, "float32", "[{x}, {}]", "[{}, {a}]") for name, shape in LAYERS.items()}
    ok = True
    with mr.TransferGroup(items, train, dst_mesh=serve) as group:
        for step in (1, 2):                               # two syncs, the same group
            full = weights(step)
            mine = {name: mr.DistArray.from_global(full[name], train, "[{x}, {}]").local
                    for name in LAYERS}
            if UNDER_TORCHRUN:
                import torch
                mine = {k: None if v is None else torch.from_numpy(v) for k, v in mine.items()}
            world.allgather_object(None)                  # a barrier
            start = time.perf_counter()
            got = group.run(mine)
            seconds = max(world.allgather_object(time.perf_counter() - start))
            for name, block in got.items():               # check against numpy
                want = mr.DistArray.from_global(full[name], serve, "[{}, {a}]").local
                ok &= (block is None) == (want is None) and (
                    want is None or np.array_equal(np.asarray(block), want))
            sent = sum(world.allgather_object(group.bytes_sent))
            if rank == 0:
                print(f"sync {step}: {len(got)} weights, {sent / 2**20:.1f} MiB moved, "
                      f"{seconds * 1e3:.1f} ms over {world.library} (training ranks "
                      f"{list(train.device_ranks())} -> inference ranks "
                      f"{list(serve.device_ranks())})")
    ok = all(world.allgather_object(bool(ok)))
    if rank == 0:
        print("every block equals numpy's" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(abort_on_exception(main))   # a failure on any rank ends the job
