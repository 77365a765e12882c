"""mr.save / mr.load with DTensors, and mr.load of checkpoints written by torch's DCP.

    mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_checkpoint_torch.py

Skips without torch.  torch.distributed runs gloo over 127.0.0.1 with MPI's
rank and size (as tests/mpi/test_dtensor.py).  Every result against the
global tensor sliced by DTensor's own block rule.
"""

import os
import shutil
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

import mpiredist as mr
from helpers import all_ok, free_port
from mpiredist import Mesh

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
from torch.distributed.tensor import Replicate, Shard, distribute_tensor  # noqa: E402

from mpiredist.core.placements import dtensor_boxes  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, P = COMM.Get_rank(), COMM.Get_size()


@pytest.fixture(scope="module", autouse=True)
def gloo():
    if not dist.is_initialized():
        port = free_port(COMM)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=RANK,
                                world_size=P)
    yield


@pytest.fixture
def where():
    path = tempfile.mkdtemp(prefix="mpiredist-cktorch-") if RANK == 0 else None
    path = COMM.bcast(path)
    yield path
    COMM.Barrier()
    if RANK == 0:
        shutil.rmtree(path, ignore_errors=True)


def _oracle(G, mesh, placements):
    coord = mesh.get_coordinate()
    (box, _), = dtensor_boxes(tuple(G.shape), tuple(mesh.mesh.shape), placements, [coord])
    return G[tuple(slice(lo, hi) for lo, hi in box)]


def _meshes():
    out = [DeviceMesh("cpu", torch.arange(P), mesh_dim_names=("x",))]
    if P >= 4 and P % 2 == 0:
        out.append(DeviceMesh("cpu", torch.arange(P).reshape(2, P // 2),
                              mesh_dim_names=("a", "b")))
    return out


def _placements(mesh):
    if mesh.ndim == 1:
        return [Shard(0)], [Shard(1)]
    return [Shard(0), Replicate()], [Replicate(), Shard(1)]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dtensors_round_trip_in_place(where, dtype):
    torch.manual_seed(0)
    G = torch.randn(2 * P + 3, 3 * P + 1).to(dtype)
    path = os.path.join(where, "ck")
    for mesh in _meshes():
        src, dst = _placements(mesh)
        mr.save(path, {"model": {"w": distribute_tensor(G, mesh, src)}})
        target = distribute_tensor(torch.zeros_like(G), mesh, dst)
        local = target.to_local()
        out = mr.load(path, {"model": {"w": target}})
        all_ok(COMM, out["model"]["w"] is target and torch.equal(target.to_local(),
                                                                 _oracle(G, mesh, dst))
               and target.to_local().data_ptr() == local.data_ptr(),
               f"DTensor {src} -> {dst} on {tuple(mesh.mesh.shape)}")
        line = Mesh({"x": P})
        back = mr.load(path, {"model": {"w": (line, "[{}, {x}]")}})["model"]["w"]
        want = mr.DistArray.from_global(G.float().numpy(), line, "[{}, {x}]").local
        all_ok(COMM, np.array_equal(np.asarray(back.local, dtype=np.float32), want),
               "DTensor save -> DistArray load")


@pytest.mark.mpi(min_size=2)
def test_partial_dtensor_reduced_before_saving(where):
    from torch.distributed.tensor import DTensor, Partial
    mesh = DeviceMesh("cpu", torch.arange(P), mesh_dim_names=("x",))
    part = torch.arange(20, dtype=torch.float32).reshape(4, 5) * (RANK + 1)
    x = DTensor.from_local(part, mesh, [Partial()], run_check=False)
    path = os.path.join(where, "ck")
    mr.save(path, {"p": x})
    back = mr.load(path, {"p": torch.zeros(4, 5)})["p"]
    want = torch.arange(20, dtype=torch.float32).reshape(4, 5) * (P * (P + 1) // 2)
    all_ok(COMM, torch.equal(back, want), "Partial DTensor saved as its sum")


@pytest.mark.mpi(min_size=1)
def test_torch_tensors_replicated_bf16(where):
    t = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4) / 3
    path = os.path.join(where, "ck")
    mr.save(path, {"t": t})
    back = torch.zeros(3, 4, dtype=torch.bfloat16, requires_grad=True)
    out = mr.load(path, {"t": back})
    all_ok(COMM, out["t"] is back and torch.equal(back.detach(), t),
           "torch bf16 tensor round trip, into a tensor that requires grad")


@pytest.mark.mpi(min_size=1)
def test_loads_a_dcp_checkpoint_by_range(where):
    torch.manual_seed(1)
    mesh = _meshes()[-1]
    src, dst = _placements(mesh)
    W = torch.randn(4 * P + 2, 24)
    E = torch.randn(37, 2 * P).to(torch.bfloat16)
    path = os.path.join(where, "dcp")
    dcp.save({"model": {"w": distribute_tensor(W, mesh, src),
                        "e": distribute_tensor(E, mesh, src)},
              "step": 42, "rep": torch.arange(5.0)}, checkpoint_id=path)
    COMM.Barrier()
    line = Mesh({"x": P})
    out = mr.load(path, {"model": {"w": (line, "[{}, {x}]"),
                                   "e": distribute_tensor(torch.zeros_like(E), mesh, dst)},
                         "step": None, "rep": np.zeros(5, np.float32)})
    want = mr.DistArray.from_global(W.numpy(), line, "[{}, {x}]").local
    all_ok(COMM, np.array_equal(out["model"]["w"].local, want), "DCP -> DistArray")
    all_ok(COMM, torch.equal(out["model"]["e"].to_local(), _oracle(E, mesh, dst)),
           "DCP -> DTensor, bf16")
    all_ok(COMM, out["step"] == 42 and np.array_equal(out["rep"], np.arange(5.0)),
           f"DCP values: {out['step']!r}")
    ck = mr.checkpoint.open(path)
    all_ok(COMM, ck.kind == "dcp" and np.array_equal(ck.read("model.w", [(1, 5), (2, 9)]),
                                                    W.numpy()[1:5, 2:9]),
           "checkpoint.open on DCP")
    with pytest.raises(mr.CheckpointError, match="model.nope"):
        mr.load(path, {"model": {"nope": (line, "[{x}]")}})
