"""The public API over torch.distributed under torchrun: no MPI anywhere.

    timeout 600 torchrun --nproc-per-node N -m pytest -q -p no:cacheprovider \\
        tests/torchrun/test_transport_torchrun.py

Plans with every step kind (all-gather, all-to-all, reduce-scatter,
all-reduce, permute, slice, a mixed plan) over the job's TorchGroup, on
meshes of any worker count, against the oracle (tests/oracle.py); an
mpiredist Mesh of a DeviceMesh (``mr.torch.mesh``) whose axes run on the
DeviceMesh's own process groups, with Transfer, TransferGroup, DistArray
and redistribute on torch tensors (bfloat16 too); the weight sync of
``scripts/weight_sync_example.py``; and the memory of a move within
max(S, T) + W + 1 MiB by tracemalloc and by the resident set.
"""

import os
import tracemalloc

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from helpers import all_ok  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402

import mpiredist as mr  # noqa: E402
from mpiredist.runtime.groups import mesh_groups, world_group  # noqa: E402
from mpiredist.runtime.torchdist import TorchGroup  # noqa: E402

import oracle  # noqa: E402

P = dist.get_world_size() if dist.is_initialized() else 1
RANK = dist.get_rank() if dist.is_initialized() else 0
NOISE = 1 << 20


def test_the_job_runs_on_torch_distributed(comm):
    import sys
    group = world_group()
    all_ok(comm, isinstance(group, TorchGroup) and group.size == P and group.rank == RANK
           and "mpi4py" not in sys.modules, f"{group!r}; mpi4py imported: "
           f"{'mpi4py' in sys.modules}")


def _cases():
    """(mesh axes, shape, src dims, src partial, op, dst dims, a step kind the plan has)."""
    # lengths past the point where the planner takes a single exchange instead
    # of a collective for tiny arrays (at 8 ranks, 17 rows: an exchange)
    out = [([("x", P)], (2 * P + 1, 6), [[], []], (), "sum", [["x"], []], "slice"),
           ([("x", P)], (64 * P + 1, 6), [["x"], []], (), "sum", [[], []], "all_gather"),
           ([("x", P)], (64 * P + 1, 16 * P - 1), [["x"], []], (), "sum", [[], ["x"]],
            "all_to_all" if P > 1 else None),
           ([("x", P)], (3 * P, 4), [[], []], ("x",), "sum", [["x"], []],
            "reduce_scatter" if P > 1 else None),
           ([("x", P)], (5, 3), [[], []], ("x",), "max", [[], []],
            "all_reduce" if P > 1 else None)]
    if P % 2 == 0 and P >= 4:
        h = P // 2
        out += [([("x", 2), ("y", h)], (4 * P, 6), [["x", "y"], []], (), "sum",
                 [["y", "x"], []], "permute"),
                ([("x", 2), ("y", h)], (5, 2 * P + 1, 3), [["x"], ["y"], []], (), "sum",
                 [[], ["x"], ["y"]], None)]
    return out


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[-1] or "mixed")
@pytest.mark.parametrize("dtype", ["int64", "float32"])
def test_every_step_kind(comm, case, dtype):
    axes, shape, src, partial, op, dst, kind = case
    mesh = mr.Mesh(dict(axes))
    rng = np.random.default_rng(7)
    G = oracle.global_array(shape, dtype, rng)
    blocks = oracle.source_blocks(G, axes, src, partial, op, rng)
    records = []
    with mr.Transfer(shape, dtype, mesh, oracle.layout_text(src, partial, op),
                     oracle.layout_text(dst)) as t:
        ops = [s.op for s in t.plan.steps]
        out = t.run(torch.from_numpy(blocks[RANK].copy()), records=records)
    want = oracle.expected(G, axes, dst, RANK)
    ok = isinstance(out, torch.Tensor) and np.array_equal(out.numpy(), want)
    ok = ok and (kind is None or kind in ops)
    all_ok(comm, ok, f"{case}: plan {ops}")
    if kind not in (None, "slice"):
        calls = sum(comm.allgather(sum(r.calls for r in records if r.op == kind)))
        all_ok(comm, calls > 0, f"no transport call recorded for {kind}")


def _two_d():
    if not (P % 2 == 0 and P >= 4):
        pytest.skip("needs a 2-D mesh: an even number of workers, at least 4")
    dm = DeviceMesh("cpu", torch.arange(P).reshape(2, P // 2), mesh_dim_names=("dp", "tp"))
    return dm, mr.torch.mesh(dm)


def test_a_mesh_of_a_device_mesh_runs_on_its_groups(comm):
    dm, mesh = _two_d()
    ok = mesh.axes == (("dp", 2), ("tp", P // 2)) and mesh.comm is None
    groups = mesh_groups(mesh)
    for dim, name in enumerate(("dp", "tp")):
        axis = tuple(s for s in groups.digits if s.name == name)
        ok = ok and groups.sub(axis).pg is dm.get_group(dim)
    all_ok(comm, ok, "the mesh's axis groups are the DeviceMesh's")


def test_transfer_distarray_and_redistribute_on_torch_tensors(comm):
    dm, mesh = _two_d()
    G = torch.arange(3 * P * (2 * P + 1), dtype=torch.float32).reshape(3 * P, 2 * P + 1) % 7
    G = G.to(torch.bfloat16)
    a = mr.DistArray.from_global(G, mesh, "[{dp,tp}, {}]")
    b = a.redistribute("[{tp}, {dp}]")
    ok = isinstance(b.local, torch.Tensor) and b.local.dtype == torch.bfloat16
    ok = ok and torch.equal(torch.as_tensor(b.gather()), G)
    out = mr.redistribute(a.local, tuple(G.shape), mesh, "[{dp,tp}, {}]", "[{}, {tp}]")
    want = mr.DistArray.from_global(G, mesh, "[{}, {tp}]").local
    ok = ok and torch.equal(out, want)
    all_ok(comm, ok, "bfloat16 torch tensors over a DeviceMesh's mesh")


def test_weight_sync_of_a_state_dict_between_device_meshes(comm):
    """scripts/weight_sync_example.py (a TransferGroup from a training
    DeviceMesh to an inference DeviceMesh) checks itself."""
    import runpy
    from pathlib import Path
    script = Path(__file__).resolve().parents[2] / "scripts" / "weight_sync_example.py"
    main = runpy.run_path(str(script))["main"]
    all_ok(comm, main() == 0, "weight sync example")


@pytest.mark.parametrize("how", ["tracemalloc", "rss"])
def test_memory_within_the_bound(comm, how):
    from mpiredist.bench.measure import (rss_environment_missing, rss_peak, rss_supported,
                                         traced_peak)
    if how == "rss" and (not rss_supported() or rss_environment_missing()):
        pytest.skip("needs /proc and " + " ".join(rss_environment_missing()))
    from torch.distributed.tensor import Shard, distribute_tensor
    dm = DeviceMesh("cpu", torch.arange(P), mesh_dim_names=("x",))
    n = 1024 + 7
    x = distribute_tensor(torch.ones(n, n), dm, [Shard(0)])
    s = x.to_local().nbytes
    w = 1 << 20
    for _ in range(2):                  # a warm-up, then the measured move
        comm.Barrier()
        if how == "rss":
            with rss_peak() as e:
                y = mr.torch.redistribute(x, [Shard(1)], workspace_bytes=w)
        else:
            tracemalloc.start()
            try:
                with traced_peak() as e:
                    y = mr.torch.redistribute(x, [Shard(1)], workspace_bytes=w)
            finally:
                tracemalloc.stop()
        t = y.to_local().nbytes
        del y
    bound = max(s, t) + w + NOISE
    all_ok(comm, e.bytes is not None and e.bytes <= bound,
           f"{how}: E = {e.bytes} B > max(S, T) + W + 1 MiB = {bound} B")
    if os.environ.get("MPIREDIST_VERBOSE"):
        print(f"rank {RANK}: {how} E = {e.bytes / 2**20:.2f} MiB, bound {bound / 2**20:.2f}")
