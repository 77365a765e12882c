"""mr.torch.redistribute under torchrun, against DTensor's own redistribute.

    timeout 600 torchrun --nproc-per-node N -m pytest -q -p no:cacheprovider \\
        tests/torchrun/test_dtensor_torchrun.py

Every shared case gives what DTensor gives (values, placements, shape,
strides, dtype; bfloat16 and int64 too), on 1-D and 2-D device meshes,
with uneven lengths and empty shards; partial sources (sum, avg, both);
partial targets that keep a source's partial dims; strided shards (FSDP2
over TP) against an oracle of torch.chunk; gradients equal to DTensor's;
moves between device meshes (which DTensor refuses); and the errors,
raised on every rank before anything moves.  The oracle of a block is
``torch.chunk`` applied mesh dim by mesh dim (independent of mpiredist's
rule).
"""

import itertools

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from helpers import all_ok  # noqa: E402
from torch.distributed.tensor import (DeviceMesh, DTensor, Partial, Replicate,  # noqa: E402
                                      Shard, distribute_tensor)
from torch.distributed.tensor.placement_types import _StridedShard  # noqa: E402

import mpiredist as mr  # noqa: E402

P = dist.get_world_size() if dist.is_initialized() else 1
RANK = dist.get_rank() if dist.is_initialized() else 0


def _meshes():
    out = [("1d", (P,), ("x",))]
    if P % 2 == 0 and P >= 4:
        out.append(("2d", (2, P // 2), ("dp", "tp")))
    return out


def _device_mesh(shape, names, ranks=None):
    ranks = torch.arange(P) if ranks is None else torch.tensor(ranks)
    return DeviceMesh("cpu", ranks.reshape(shape), mesh_dim_names=names)


def _chunk(t, n, dim, k):
    """torch.chunk's chunk ``k`` of ``n`` along ``dim``, or an empty slice."""
    parts = torch.chunk(t, n, dim=dim) if t.shape[dim] else ()
    if k < len(parts):
        return parts[k]
    return t.narrow(dim, t.shape[dim], 0)


def _oracle(G, mesh_shape, placements, coord):
    """This device's block of ``G`` under DTensor's rule, from torch.chunk."""
    t = G
    for m, p in enumerate(placements):
        n, k = mesh_shape[m], coord[m]
        if type(p) is _StridedShard:
            d = p.dim % G.ndim
            t = torch.cat([_chunk(piece, n, d, k) for piece in
                           _chunk_all(t, p.split_factor, d)], dim=d)
        elif isinstance(p, Shard):
            t = _chunk(t, n, p.dim % G.ndim, k)
    return t.contiguous()


def _chunk_all(t, n, dim):
    return [_chunk(t, n, dim, k) for k in range(n)]


def _coord(mesh):
    return tuple(int(c) for c in mesh.get_coordinate())


def _global(shape, dtype):
    g = torch.arange(1, 1 + int(torch.tensor(shape).prod()), dtype=torch.float64)
    return (g % 13).reshape(shape).to(dtype)        # small integers: sums exact in bf16


def _source(G, mesh, placements):
    """A DTensor of ``G`` with ``placements``.  On a Partial(sum) mesh dim of n
    devices device 0 holds (2 - n) x its block and the others the block, so
    that the sums are G; on a Partial(avg) dim every device holds the block."""
    coord, shape = _coord(mesh), tuple(mesh.mesh.shape)
    local = _oracle(G, shape, placements, coord).clone()
    for m, p in enumerate(placements):
        if isinstance(p, Partial) and p.reduce_op == "sum" and coord[m] == 0:
            local = local * (2 - shape[m])
    return DTensor.from_local(local, mesh, placements, run_check=False,
                              shape=G.shape, stride=G.stride())


def _same(ours, theirs, strides=True):
    """Why ``ours`` differs from DTensor's ``theirs`` (None if it does not).
    ``strides`` False for gradients: DTensor's gradient of an S(0) -> S(1)
    move claims strides (8, 1) for a (9, 5) tensor, a quirk of its own."""
    if tuple(ours.placements) != tuple(theirs.placements):
        return f"placements {ours.placements} != {theirs.placements}"
    if ours.shape != theirs.shape or (strides and ours.stride() != theirs.stride()):
        return f"shape/stride {ours.shape}{ours.stride()} != {theirs.shape}{theirs.stride()}"
    a, b = ours.to_local(), theirs.to_local()
    if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
        return f"local {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"
    return None


def _placements(ndim, partial=True):
    kinds = [Replicate(), Shard(0), Shard(1)] + ([Partial()] if partial else [])
    return list(itertools.product(kinds, repeat=ndim))


@pytest.mark.parametrize("name, mesh_shape, names", _meshes())
@pytest.mark.parametrize("shape", [lambda: (2 * P + 1, 3), lambda: (3, 2 * P - 1),
                                   lambda: (2, 8)], ids=["tall", "wide", "empty-shards"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_every_case_equals_dtensor(comm, name, mesh_shape, names, shape, dtype):
    if name == "2d" and dtype != torch.float32:
        pytest.skip("2-D meshes in float32 (dtypes are checked on 1-D)")
    mesh = _device_mesh(mesh_shape, names)
    G = _global(shape(), dtype)
    bad = []
    for src in _placements(len(mesh_shape)):
        x = _source(G, mesh, list(src))
        for dst in _placements(len(mesh_shape), partial=False):
            theirs = x.redistribute(mesh, list(dst))
            ours = mr.torch.redistribute(x, list(dst))
            why = _same(ours, theirs)
            if why:
                bad.append(f"{src} -> {dst}: {why}")
    all_ok(comm, not bad, "; ".join(bad[:3]))


def test_partial_averages_and_sums(comm):
    mesh1 = _device_mesh((P,), ("x",))
    G = _global((2 * P + 3, 4), torch.float32)
    bad = []
    local = G * (RANK + 1)                              # averages over x: G (P + 1) / 2
    x = DTensor.from_local(local, mesh1, [Partial("avg")], run_check=False)
    for dst in ([Replicate()], [Shard(0)], [Shard(1)]):
        why = _same(mr.torch.redistribute(x, dst), x.redistribute(mesh1, dst))
        if why:
            bad.append(f"avg -> {dst}: {why}")
    if P % 2 == 0 and P >= 4:
        mesh2 = _device_mesh((2, P // 2), ("dp", "tp"))
        for src in ([Partial("sum"), Partial("avg")], [Partial("avg"), Partial("sum")],
                    [Partial("avg"), Partial("avg")]):
            x = DTensor.from_local(local, mesh2, src, run_check=False)
            for dst in ([Replicate(), Replicate()], [Shard(0), Shard(1)],
                        [Replicate(), Shard(0)]):
                why = _same(mr.torch.redistribute(x, dst), x.redistribute(mesh2, dst))
                if why:
                    bad.append(f"{src} -> {dst}: {why}")
    all_ok(comm, not bad, "; ".join(bad[:3]))


def test_partial_targets_that_keep_a_partial_dim(comm):
    if not (P % 2 == 0 and P >= 4):
        pytest.skip("needs a 2-D mesh: an even number of workers, at least 4")
    mesh = _device_mesh((2, P // 2), ("dp", "tp"))
    local = _global((3, 4), torch.float32) * (RANK + 1)
    bad = []
    for src, dst in [([Partial(), Shard(0)], [Partial(), Shard(1)]),
                     ([Shard(0), Partial()], [Replicate(), Partial()]),
                     ([Partial(), Partial()], [Partial(), Replicate()]),
                     ([Partial(), Partial()], [Replicate(), Partial()]),
                     ([Partial("max"), Shard(1)], [Partial("max"), Replicate()])]:
        x = DTensor.from_local(local, mesh, src, run_check=False)
        why = _same(mr.torch.redistribute(x, dst), x.redistribute(mesh, dst))
        if why:
            bad.append(f"{src} -> {dst}: {why}")
    all_ok(comm, not bad, "; ".join(bad[:3]))


@pytest.mark.parametrize("src, dst", [
    ([Shard(0), Replicate()], [Shard(0), Partial()]),      # creates a partial
    ([Partial(), Shard(0)], [Shard(0), Partial()]),        # moves one
    ([Partial("sum"), Shard(0)], [Partial("avg"), Shard(0)]),   # changes its op
])
def test_partial_targets_dtensor_refuses(comm, src, dst):
    if not (P % 2 == 0 and P >= 4):
        pytest.skip("needs a 2-D mesh")
    mesh = _device_mesh((2, P // 2), ("dp", "tp"))
    x = _source(_global((P, P), torch.float32), mesh, src)
    with pytest.raises(RuntimeError, match="Can not redistribute") as theirs:
        x.redistribute(mesh, dst)
    with pytest.raises(mr.PlacementError, match="Can not redistribute") as ours:
        mr.torch.redistribute(x, dst)
    all_ok(comm, isinstance(ours.value, RuntimeError) and isinstance(theirs.value, RuntimeError),
           "the class DTensor raises")


def _strided_cases():
    out = [("1d", (P,), ("x",), [_StridedShard(0, split_factor=2)], [Shard(0)]),
           ("1d", (P,), ("x",), [Shard(1)], [_StridedShard(1, split_factor=3)]),
           ("1d", (P,), ("x",), [_StridedShard(0, split_factor=3)],
            [_StridedShard(1, split_factor=2)])]
    if P % 2 == 0 and P >= 4:
        fsdp_tp = [_StridedShard(0, split_factor=P // 2), Shard(0)]
        out += [("2d", (2, P // 2), ("dp", "tp"), fsdp_tp, [Replicate(), Shard(0)]),
                ("2d", (2, P // 2), ("dp", "tp"), [Replicate(), Shard(1)], fsdp_tp),
                ("2d", (2, P // 2), ("dp", "tp"), [Shard(0), _StridedShard(0, split_factor=3)],
                 [Shard(1), Shard(0)])]
    return out


@pytest.mark.parametrize("name, mesh_shape, names, src, dst", _strided_cases(),
                         ids=lambda v: str(v) if isinstance(v, list) else None)
@pytest.mark.parametrize("rows", [lambda: 4 * P, lambda: 4 * P + 5], ids=["even", "uneven"])
def test_strided_shards(comm, name, mesh_shape, names, src, dst, rows):
    mesh = _device_mesh(mesh_shape, names)
    G = _global((rows(), 2 * P + 1), torch.float32)
    coord = _coord(mesh)
    x = DTensor.from_local(_oracle(G, mesh_shape, src, coord), mesh, src, run_check=False,
                           shape=G.shape, stride=G.stride())
    got = mr.torch.redistribute(x, dst)
    want = _oracle(G, mesh_shape, dst, coord)
    ok = torch.equal(got.to_local(), want) and tuple(got.placements) == tuple(dst)
    # the oracle is DTensor's own rule: its gather of the source is G
    ok = ok and torch.equal(x.full_tensor(), G)
    all_ok(comm, ok, f"{src} -> {dst}: {tuple(got.to_local().shape)} vs {tuple(want.shape)}")


_GRAD_CASES = [([Shard(0)], [Replicate()]), ([Replicate()], [Shard(0)]),
               ([Shard(0)], [Shard(1)]), ([Partial()], [Replicate()]),
               ([Partial()], [Shard(0)]), ([Shard(1)], [Shard(1)])]


@pytest.mark.parametrize("src, dst", _GRAD_CASES, ids=str)
@pytest.mark.parametrize("dtypes", [(None, None), (torch.bfloat16, None),
                                    (torch.bfloat16, torch.float64)], ids=str)
def test_gradients_equal_dtensor(comm, src, dst, dtypes):
    mesh = _device_mesh((P,), ("x",))
    G = _global((2 * P + 1, 5), torch.float32)
    forward, backward = dtypes
    kw = {k: v for k, v in (("forward_dtype", forward), ("backward_dtype", backward)) if v}
    grads = []
    for move in (lambda x: mr.torch.redistribute(x, dst, **kw),
                 lambda x: x.redistribute(mesh, dst, **kw)):
        leaf = _oracle(G, (P,), src, (RANK,)).clone().requires_grad_(True)
        x = DTensor.from_local(leaf, mesh, src, run_check=False, shape=G.shape,
                               stride=G.stride())
        seen = []
        x.register_hook(seen.append)        # the gradient the move's backward returns
        y = move(x)
        weights = torch.arange(y.to_local().numel(), dtype=y.dtype).reshape(y.to_local().shape)
        (y.to_local() * weights).sum().backward()
        grads.append((tuple(y.placements), y.dtype, seen[0]))
    (pl_a, dt_a, ga), (pl_b, dt_b, gb) = grads
    ok = pl_a == pl_b and dt_a == dt_b and _same(ga, gb, strides=False) is None
    all_ok(comm, ok, f"{src} -> {dst} {dtypes}: {_same(ga, gb, strides=False)}")


def test_gradient_placements_of_a_2d_move(comm):
    if not (P % 2 == 0 and P >= 4):
        pytest.skip("needs a 2-D mesh")
    mesh = _device_mesh((2, P // 2), ("dp", "tp"))
    G = _global((2 * P, P + 1), torch.float32)
    out = []
    for move in (lambda x: mr.torch.redistribute(x, [Replicate(), Shard(1)]),
                 lambda x: x.redistribute(mesh, [Replicate(), Shard(1)])):
        x = distribute_tensor(G, mesh, [Shard(0), Shard(0)]).requires_grad_(True)
        move(x).to_local().sum().backward()
        out.append(x.grad)
    why = _same(out[0], out[1], strides=False)
    all_ok(comm, why is None, f"{why}")


def test_between_device_meshes_where_dtensor_refuses(comm):
    if P < 2:
        pytest.skip("needs 2 workers")
    half = P // 2
    train = _device_mesh((half,), ("dp",), list(range(half)))
    serve = _device_mesh((P - half,), ("tp",), list(range(half, P)))
    G = _global((3 * P + 1, 2 * P + 3), torch.bfloat16)
    x = distribute_tensor(G, train, [Shard(0)]) if RANK < half else None
    if x is not None:
        with pytest.raises(NotImplementedError):
            x.redistribute(serve, [Shard(1)])
    got = mr.torch.redistribute(x, [Shard(1)], device_mesh=serve)
    if RANK < half:
        ok = got is None
    else:
        want = _oracle(G, (P - half,), [Shard(1)], (RANK - half,))
        ok = isinstance(got, DTensor) and torch.equal(got.to_local(), want) \
            and got.dtype == torch.bfloat16
    all_ok(comm, ok, "train -> serve")


def test_errors_on_every_rank(comm):
    mesh = _device_mesh((P,), ("x",))
    x = distribute_tensor(torch.zeros(2 * P, 2), mesh, [Shard(0)])
    with pytest.raises(mr.PlacementError, match="placements is needed"):
        mr.torch.redistribute(x, None)
    with pytest.raises(mr.ShapeError, match="placements for a mesh"):
        mr.torch.redistribute(x, [Shard(1), Shard(0)])
    with pytest.raises(mr.ShapeError, match="no dim 2"):
        mr.torch.redistribute(x, [Shard(2)])
    ints = DTensor.from_local(torch.ones(2, 2, dtype=torch.int64), mesh, [Partial("avg")],
                              run_check=False)
    with pytest.raises(mr.PlacementError, match="average of integers"):
        mr.torch.redistribute(ints, [Replicate()])
    if P > 1:       # one rank asks for other placements: every rank says where
        dst = [Shard(0)] if RANK == P - 1 else [Shard(1)]
        with pytest.raises(mr.MismatchError, match="target placements"):
            mr.torch.redistribute(x, dst)
    got = mr.torch.redistribute(x, [Shard(1)])       # nobody was left behind
    all_ok(comm, tuple(got.placements) == (Shard(1),), "a correct call after the errors")
