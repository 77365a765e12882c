"""mr.torch.redistribute against DTensor's own redistribute (gloo on the CPU).

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_dtensor.py

Skips without torch.  torch.distributed is initialised with gloo over
127.0.0.1 with MPI's rank and size.  Every case: the result equals DTensor's
own ``redistribute`` where DTensor supports it, and the oracle (numpy
slicing of the full tensor by DTensor's block rule) everywhere, uneven
lengths included; between meshes, where DTensor refuses.
"""

import pytest
from mpi4py import MPI

import mpiredist as mr
from helpers import all_ok, free_port

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402
from torch.distributed.tensor import (DTensor, Partial, Replicate, Shard,  # noqa: E402
                                      distribute_tensor)

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


def _meshes():
    out = [("x", DeviceMesh("cpu", torch.arange(P), mesh_dim_names=("x",)))]
    if P >= 4 and P % 2 == 0:
        out.append(("2d", DeviceMesh("cpu", torch.arange(P).reshape(2, P // 2),
                                     mesh_dim_names=("a", "b"))))
    return out


def _oracle(G, mesh, placements):
    coord = mesh.get_coordinate()
    if coord is None:
        return None
    (box, _), = dtensor_boxes(tuple(G.shape), tuple(mesh.mesh.shape), placements, [coord])
    return G[tuple(slice(lo, hi) for lo, hi in box)]


PAIRS_1D = [([Shard(0)], [Shard(1)]), ([Shard(1)], [Replicate()]), ([Replicate()], [Shard(0)]),
            ([Shard(0)], [Shard(0)]), ([Shard(0)], [Shard(-1)])]
PAIRS_2D = [([Shard(0), Shard(1)], [Shard(1), Shard(0)]),
            ([Shard(0), Shard(0)], [Replicate(), Shard(1)]),
            ([Replicate(), Shard(0)], [Shard(1), Replicate()]),
            ([Shard(1), Replicate()], [Shard(0), Shard(0)])]


@pytest.mark.parametrize("shape", [(2 * P + 1, 7), (5, 3), (1, 2 * P)])
def test_equals_dtensor_redistribute(shape):
    torch.manual_seed(0)
    G = torch.randn(shape)
    for name, mesh in _meshes():
        for src, dst in (PAIRS_1D if name == "x" else PAIRS_2D):
            x = distribute_tensor(G, mesh, src)
            ours = mr.torch.redistribute(x, dst)
            theirs = x.redistribute(mesh, dst)
            want = _oracle(G, mesh, dst)
            ok = (isinstance(ours, DTensor) and tuple(ours.shape) == shape
                  and list(ours.placements) == list(theirs.placements)
                  and ours.stride() == theirs.stride()
                  and ours.device_mesh is mesh and ours.dtype == theirs.dtype
                  and not ours.requires_grad and torch.equal(ours.to_local(), want))
            same = torch.equal(ours.to_local(), theirs.to_local()) if tuple(
                theirs.to_local().shape) == tuple(want.shape) else None
            all_ok(COMM, ok and same is not False,
                   f"{shape} {src} -> {dst} on {name}: oracle {ok}, DTensor {same}")
            all_ok(COMM, torch.equal(ours.full_tensor(), G), "full_tensor of ours")


def test_partial_sums_and_bf16():
    mesh = DeviceMesh("cpu", torch.arange(P), mesh_dim_names=("x",))
    shape = (2 * P + 1, 3)
    parts = [torch.full(shape, float(r + 1)) for r in range(P)]
    x = DTensor.from_local(parts[RANK], mesh, [Partial()], run_check=False)
    ours = mr.torch.redistribute(x, [Shard(0)])
    theirs = x.redistribute(mesh, [Shard(0)])
    all_ok(COMM, torch.equal(ours.to_local(), theirs.to_local()), "Partial -> Shard(0)")
    b = distribute_tensor(torch.arange(float(P * 6)).reshape(P * 2, 3).to(torch.bfloat16),
                          mesh, [Shard(0)])
    got = mr.torch.redistribute(b, [Shard(1)])
    all_ok(COMM, got.dtype == torch.bfloat16 and torch.equal(got.full_tensor(),
                                                              b.full_tensor()), "bf16")


def test_between_meshes_where_dtensor_refuses():
    if P < 2:
        pytest.skip("needs 2 ranks")
    h = P // 2
    train = DeviceMesh("cpu", torch.arange(h), mesh_dim_names=("t",))
    serve = DeviceMesh("cpu", torch.arange(h, P), mesh_dim_names=("s",))
    torch.manual_seed(1)
    G = torch.randn(3 * P + 1, 5)
    x = distribute_tensor(G, train, [Shard(0)]) if RANK < h else None
    if x is not None:
        with pytest.raises(NotImplementedError):     # DTensor: "Cross device mesh comm"
            x.redistribute(serve, [Shard(1)])
    got = mr.torch.redistribute(x, [Shard(1)], device_mesh=serve)
    if RANK < h:
        ok = got is None
    else:
        ok = isinstance(got, DTensor) and torch.equal(got.to_local(), _oracle(G, serve,
                                                                               [Shard(1)]))
    all_ok(COMM, ok, "train -> serve")


def test_errors_on_every_rank():
    mesh = DeviceMesh("cpu", torch.arange(P), mesh_dim_names=("x",))
    x = distribute_tensor(torch.zeros(2 * P, 2), mesh, [Shard(0)])
    if RANK == P - 1:
        x = x.detach().requires_grad_(True)
    if P > 1:       # one rank would run a backward the others never join
        with pytest.raises(mr.MismatchError, match="differentiable"):
            mr.torch.redistribute(x, [Shard(1)])
    y = distribute_tensor(torch.zeros(2 * P, 2), mesh, [Shard(0)])
    with pytest.raises(mr.ShapeError, match="placements for a mesh"):
        mr.torch.redistribute(y, [Shard(1), Shard(0)])


def test_ranks_that_disagree_raise_together():
    # every rank holds a DTensor (the one-agreement path), but one rank asks for
    # other placements: every rank raises, naming what differs and where
    if P < 2:
        pytest.skip("needs 2 ranks")
    mesh = DeviceMesh("cpu", torch.arange(P), mesh_dim_names=("x",))
    x = distribute_tensor(torch.zeros(2 * P, 3), mesh, [Shard(0)])
    dst = [Shard(0)] if RANK == P - 1 else [Shard(1)]
    with pytest.raises(mr.MismatchError, match="target placements.*rank 0 has.*rank "
                       f"{P - 1} has"):
        mr.torch.redistribute(x, dst)
    # and where a rank outside the source mesh learns the source (the longer path)
    inner = DeviceMesh("cpu", torch.arange(P - 1), mesh_dim_names=("x",))
    y = distribute_tensor(torch.ones(2 * P, 3), inner, [Shard(0)]) if RANK < P - 1 else None
    with pytest.raises(mr.ShapeError, match="pass device_mesh="):
        mr.torch.redistribute(y, [Shard(1)])
    got = mr.torch.redistribute(y, [Shard(1)], device_mesh=mesh)
    all_ok(COMM, torch.equal(got.to_local(), _oracle(torch.ones(2 * P, 3), mesh, [Shard(1)])),
           "outside the source mesh")


# ---------------------------------------------------------- CUDA DTensors, faked

@pytest.fixture(params=["aware", "staged"])
def cuda_locals(request, monkeypatch):
    """DTensors whose local tensors are (fake) CUDA tensors: the fake CuPy of
    tests/fakecupy.py installed, ``DTensor.to_local`` handing out its tensor
    as a fake CUDA tensor over the same memory while the context is entered,
    MPI taken as CUDA-aware or not.  mr.torch.redistribute runs on
    COMM_WORLD, whose agreed awareness is forgotten before and after."""
    import contextlib

    import fakecupy
    from mpiredist.runtime.groups import as_group
    before = fakecupy.install()
    monkeypatch.setenv("MPIREDIST_GPU_AWARE", "1" if request.param == "aware" else "0")
    as_group(COMM).kept.pop("gpu", None)
    plain = DTensor.to_local

    @contextlib.contextmanager
    def on_device():
        DTensor.to_local = lambda self, *a, **k: fakecupy.torch_cuda(plain(self, *a, **k))
        try:
            yield
        finally:
            DTensor.to_local = plain
    yield request.param, on_device, fakecupy
    as_group(COMM).kept.pop("gpu", None)
    fakecupy.uninstall(before)


def test_cuda_dtensors(cuda_locals):
    """CUDA DTensors (their local tensors faked over host memory) move by the
    device path, in both modes: the result equals DTensor's own redistribute
    and the oracle; partial sums of bfloat16 equal the host DTensor's bit for
    bit (the same exchange, combined on the device through float32); the
    result is allocated on the device, and the staged mode copies parts
    between the device and the host."""
    name, on_device, fakecupy = cuda_locals
    mesh = DeviceMesh("cpu", torch.arange(P), mesh_dim_names=("x",))
    torch.manual_seed(3)
    G = torch.randn(2 * P + 1, 7)
    for src, dst in PAIRS_1D:
        x = distribute_tensor(G, mesh, src)
        fakecupy.reset()
        with on_device():
            ours = mr.torch.redistribute(x, dst)
        counts = dict(fakecupy.COUNTS)
        want = _oracle(G, mesh, dst)
        theirs = x.redistribute(mesh, dst)
        ok = (isinstance(ours, DTensor) and list(ours.placements) == list(theirs.placements)
              and torch.equal(ours.to_local(), want)
              and torch.equal(ours.to_local(), theirs.to_local()))
        moves = P > 1 and src != dst and src != [Replicate()]   # else all pieces local
        copies = COMM.allreduce(counts.get("to_host", 0) + counts.get("to_device", 0))
        path = counts.get("alloc", 0) >= 1 and (name == "aware" or not moves or copies > 0)
        all_ok(COMM, ok and path, f"{name} {src} -> {dst}: result {ok}, device path {counts}")

    parts = [(torch.randn(2 * P + 3, 5) * 8).to(torch.bfloat16) for _ in range(P)]
    x = DTensor.from_local(parts[RANK], mesh, [Partial()], run_check=False)
    for dst in ([Shard(0)], [Replicate()]):
        host = mr.torch.redistribute(x, dst)
        with on_device():
            got = mr.torch.redistribute(x, dst)
        all_ok(COMM, got.dtype == torch.bfloat16 and torch.equal(
            got.to_local().view(torch.int16), host.to_local().view(torch.int16)),
            f"{name}: bf16 Partial -> {dst} as on the host")
