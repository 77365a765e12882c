"""torch CPU tensors, bfloat16 and float16: tensors in, tensors out, against the oracle.

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_torch.py

Skips without torch (``pip install torch==2.13.0+cpu ml_dtypes``; the
``torch`` extra).  Any N (CI: 2 and 3).  Partial sums of bfloat16 and
float16, which MPI cannot reduce, are combined by numpy in a fixed order:
the reduce-scatter member m adds its own part first, then those of members
m + 1, m + 2, ... (mod g), rounding after each addition; that reference is
computed here from the float32 values and compared bit for bit.
"""

import numpy as np
import pytest
from mpi4py import MPI

import mpiredist as mr
import oracle
from helpers import all_ok, count_limit_lowered

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

COMM = MPI.COMM_WORLD
RANK, P = COMM.Get_rank(), COMM.Get_size()
MESH = [("x", P)]
BF16 = np.dtype(ml_dtypes.bfloat16)
TORCH = {"f4": torch.float32, "i8": torch.int64, "bf16": torch.bfloat16, "f2": torch.float16,
         "u1": torch.uint8, "c8": torch.complex64}

CASES = [  # (global shape, dtype, src, dst)
    ((7, 5), "f4", "[{x}, {}]", "[{}, {x}]"),
    ((5, 3, 4), "i8", "[{}, {x}, {}]", "[{x}, {}, {}]"),
    ((9, 4), "bf16", "[{x}, {}]", "[{}, {x}]"),
    ((6, 5), "f2", "[{x}, {}]", "[{}, {}]"),
    ((3, 7), "u1", "[{}, {}]", "[{x}, {}]"),
    ((4, 4), "c8", "[{}, {x}]", "[{x}, {}]"),
]


def _lay(text):
    lay = mr.Layout.parse(text)
    return [list(d) for d in lay.dims], list(lay.partial), lay.op


def _global(shape, dtype, seed):
    G = oracle.global_array(shape, np.dtype("f4" if dtype == "bf16" else dtype),
                            np.random.default_rng(seed))
    return G.astype(BF16) if dtype == "bf16" else G


def _tensor(a):
    """A torch tensor of numpy ``a`` (bfloat16 through its bits)."""
    a = np.ascontiguousarray(a)
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def _numpy(t):
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16)
    return t.numpy()


def _same(got, want, dtype):
    return (isinstance(got, torch.Tensor) and got.dtype == TORCH[dtype]
            and tuple(got.shape) == want.shape
            and np.array_equal(_numpy(got).view(np.uint8), np.ascontiguousarray(want)
                               .view(np.uint8)))


@pytest.mark.parametrize("shape,dtype,src,dst", CASES)
def test_tensors_in_tensors_out(shape, dtype, src, dst):
    mesh = mr.Mesh(f"x={P}")
    G = _global(shape, dtype, 1)
    local = _tensor(oracle.local_block(G, MESH, _lay(src)[0], RANK))
    before = local.clone()
    got = mr.redistribute(local, shape, mesh, src, dst)
    want = oracle.expected(G, MESH, _lay(dst)[0], RANK)
    all_ok(COMM, _same(got, want, dtype), f"{dtype} {src} -> {dst}")
    all_ok(COMM, torch.equal(local, before), "the source tensor is not written")


def test_transfer_out_tensor_and_dtype():
    mesh = mr.Mesh(f"x={P}")
    shape, src, dst = (2 * P + 1, 3), "[{x}, {}]", "[{}, {x}]"
    G = _global(shape, "bf16", 2)
    t = mr.Transfer(shape, torch.bfloat16, mesh, src, dst)      # a torch dtype
    out = torch.empty(t.target_shape, dtype=torch.bfloat16)
    got = t.run(_tensor(oracle.local_block(G, MESH, _lay(src)[0], RANK)), out=out)
    want = oracle.expected(G, MESH, _lay(dst)[0], RANK)
    all_ok(COMM, got is out and _same(out, want, "bf16"), "out= a tensor is filled and returned")
    t.free()


def test_non_contiguous_tensor_and_distarray():
    mesh = mr.Mesh(f"x={P}")
    shape = (4, 2 * P)
    G = _global(shape, "f4", 3)
    block = oracle.local_block(G, MESH, [[], ["x"]], RANK)
    strided = _tensor(block.T.copy()).T            # a transposed view: not contiguous
    assert not strided.is_contiguous()
    a = mr.DistArray.from_local(strided, mesh, "[{}, {x}]", shape)
    b = a.redistribute("[{x}, {}]")
    want = oracle.expected(G, MESH, [["x"], []], RANK)
    all_ok(COMM, _same(b.local, want, "f4") and b.dtype == np.float32, "DistArray of a tensor")
    all_ok(COMM, _same(b.gather(), G, "f4"), "gather of a tensor DistArray")


@pytest.mark.parametrize("dtype", ["f4", "bf16"])
def test_between_meshes_tensor(dtype):
    """The ranks outside the source mesh learn the dtype from the others
    (bfloat16 by its name: its ``str`` is ``'<V2'``, plain void)."""
    if P < 2:
        pytest.skip("needs 2 ranks")
    src_mesh = mr.Mesh("x=1", ranks=[0])
    dst_mesh = mr.Mesh(f"x={P}")
    shape = (2 * P + 1, 3)
    G = _global(shape, dtype, 4)
    local = _tensor(G) if RANK == 0 else None
    got = mr.redistribute(local, shape, src_mesh, "[{}, {}]", "[{x}, {}]", dst_mesh=dst_mesh)
    want = oracle.expected(G, MESH, [["x"], []], RANK)
    all_ok(COMM, _same(got, want, dtype), "a tensor on every rank, also outside the source")


def test_weight_sync_group_of_tensors():
    """A TransferGroup from training ranks to inference ranks with tensors: the
    ranks outside the source mesh pass None and still get tensors (they
    learn the library after the agreement; it raised MismatchError)."""
    if P < 2:
        pytest.skip("needs 2 ranks")
    half = max(1, P // 2)
    train = mr.Mesh(f"t={half}", ranks=list(range(half)))
    serve = mr.Mesh(f"s={P - half}", ranks=list(range(half, P)))
    items = {"w": ((4 * P + 1, 6), "float32", "[{t}, {}]", "[{}, {s}]"),
             "b": ((6,), "bfloat16", "[{}]", "[{s}]")}
    G = {"w": _global((4 * P + 1, 6), "f4", 6), "b": _global((6,), "bf16", 7)}
    blocks = None
    if RANK < half:
        blocks = {"w": _tensor(oracle.source_blocks(G["w"], [("t", half)], [["t"], []], [],
                                                    "sum")[RANK]),
                  "b": _tensor(G["b"])}
    got = mr.redistribute_many(blocks, {n: it[0] for n, it in items.items()}, train,
                               {n: it[2] for n, it in items.items()},
                               {n: it[3] for n, it in items.items()}, dst_mesh=serve)
    if RANK < half:
        ok = all(got[n] is None for n in items)
    else:
        me = RANK - half
        ok = (_same(got["w"], oracle.expected(G["w"], [("s", P - half)], [[], ["s"]], me), "f4")
              and _same(got["b"], oracle.expected(G["b"], [("s", P - half)], [["s"]], me),
                        "bf16"))
    all_ok(COMM, ok, "weight sync of tensors: tensors on the inference ranks, None elsewhere")


def _parts(shape, dtype, seed):
    """Every rank's partial block (the same on all ranks: rank k's is parts[k])."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape) * 8).astype(dtype) for _ in range(P)]


def _fixed_order(parts, start, op=np.add):
    acc = parts[start].copy()
    for j in range(1, P):
        acc = op(acc, parts[(start + j) % P])
    return acc


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)])
def test_partial_sums_in_fixed_order(dtype):
    """Reduce-scatter: each member's rows, summed in the fixed order, bit for bit."""
    mesh = mr.Mesh(f"x={P}")
    shape = (3 * P + 1, 5)
    parts = _parts(shape, dtype, 5)
    got = mr.redistribute(parts[RANK], shape, mesh, "[{}, {}] sum{x}", "[{x}, {}]")
    rows = oracle.block_slices(shape, MESH, [["x"], []], RANK)
    want = _fixed_order([p[rows] for p in parts], RANK)
    all_ok(COMM, got.dtype == dtype and np.array_equal(got.view(np.uint16),
                                                       want.view(np.uint16)),
           f"{dtype} sum equals the fixed-order sum")
    close = np.allclose(got.astype(np.float32), sum(p.astype(np.float32) for p in parts)[rows],
                        rtol=0.05, atol=0.5)
    all_ok(COMM, close, "near the float32 sum")


@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_bf16_tensor_reductions_replicated(op):
    """All-reduce of bf16 tensors: equal bit for bit on every replica, each element
    the fixed-order combination of some member's order (max/min: exact)."""
    mesh = mr.Mesh(f"x={P}")
    shape = (2 * P + 3, 4)
    parts = _parts(shape, BF16, 6)
    ufunc = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
    got = mr.redistribute(_tensor(parts[RANK]), shape, mesh, f"[{{}}, {{}}] {op}{{x}}",
                          "[{}, {}]")
    bits = _numpy(got).view(np.uint16)
    every = COMM.allgather(bits)
    all_ok(COMM, all(np.array_equal(b, every[0]) for b in every), "replicas bitwise equal")
    orders = [_fixed_order(parts, m, ufunc).view(np.uint16) for m in range(P)]
    ok = np.logical_or.reduce([bits == o for o in orders]).all()
    if op != "sum":
        ok = ok and np.array_equal(bits, ufunc.reduce(np.stack(parts)).view(np.uint16))
    all_ok(COMM, got.dtype == torch.bfloat16 and ok, f"bf16 {op}")


def test_errors_on_every_rank():
    if P < 2:
        pytest.skip("needs 2 ranks")
    mesh = mr.Mesh(f"x={P}")
    shape, src, dst = (2 * P, 3), "[{x}, {}]", "[{}, {x}]"
    block = np.zeros((2, 3), np.float32)
    with pytest.raises(mr.MismatchError, match="kind"):       # numpy on rank 0, torch elsewhere
        mr.redistribute(block if RANK == 0 else torch.zeros(2, 3), shape, mesh, src, dst)
    grad = torch.zeros(2, 3, requires_grad=RANK == 1)
    with pytest.raises(mr.ShapeError, match="requires grad"):
        mr.redistribute(grad, shape, mesh, src, dst)
    t = mr.Transfer((2 * P, 2 * P), torch.float32, mesh, src, dst)      # blocks (2, 2P) -> (2P, 2)
    strided = torch.empty(2 * P, 4)[:, ::2]                               # not contiguous
    with pytest.raises(mr.ShapeError, match="C-contiguous"):
        t.run(torch.zeros(2, 2 * P), out=strided if RANK == 1 else torch.empty(2 * P, 2))
    with pytest.raises(mr.ShapeError, match="out is a numpy"):
        t.run(torch.zeros(2, 2 * P), out=np.empty((2 * P, 2), np.float32) if RANK == 0
              else torch.empty(2 * P, 2))
    t.free()
    with pytest.raises(mr.ShapeError, match="has no reduction"):
        mr.redistribute(np.zeros(shape, "U2"), shape, mesh, "[{}, {}] sum{x}", dst)


@pytest.mark.parametrize("src,dst", [("[{x}, {}]", "[{}, {x}]"), ("[{}, {x}]", "[{x}, {}]"),
                                     ("[{}, {}] sum{x}", "[{x}, {}]")])
def test_memory_contract_for_tensors(src, dst):
    """Tensors are viewed, not copied: the call's growth of the peak resident set
    (torch and MPI included) stays within max(S, T) + W plus 1 MiB, and what
    tracemalloc sees within the bound, as for numpy blocks."""
    import tracemalloc

    from mpiredist.bench.measure import rss_environment_missing, rss_peak, rss_supported
    from mpiredist.planning.budget import default_workspace
    mesh = mr.Mesh(f"x={P}")
    shape = (512 * P, 512)                          # 1 MiB float32 blocks
    plan = mr.plan(shape, torch.float32, mesh, src, dst)
    limit = max(plan.src_local_bytes, plan.dst_local_bytes) + default_workspace(plan)
    block = mr.Transfer(shape, torch.float32, mesh, src, dst).source_shape
    local = torch.from_numpy(np.ones(block, np.float32))
    mr.redistribute(local, shape, mesh, src, dst)                    # warm-up
    tracemalloc.start()
    got = mr.redistribute(local, shape, mesh, src, dst)
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    del got
    all_ok(COMM, traced <= limit + (64 << 10), f"tracemalloc {traced} B > {limit} B")
    if rss_supported() and not rss_environment_missing():
        COMM.Barrier()
        with rss_peak() as e:
            got = mr.redistribute(local, shape, mesh, src, dst)
        used = COMM.allreduce(e.bytes, op=MPI.MAX)
        all_ok(COMM, isinstance(got, torch.Tensor) and used <= limit + (1 << 20),
               f"RSS growth {used} B > {limit} B + 1 MiB")


# ---------------------------------------------------------- CUDA tensors, faked

@pytest.fixture(params=["aware", "staged"])
def device(request, monkeypatch):
    """The fake CuPy of tests/fakecupy.py installed, MPI taken as CUDA-aware or
    not, on a fresh duplicate of COMM_WORLD (awareness is agreed per
    communicator)."""
    import fakecupy
    before = fakecupy.install()
    monkeypatch.setenv("MPIREDIST_GPU_AWARE", "1" if request.param == "aware" else "0")
    comm = COMM.Dup()
    yield request.param, comm, fakecupy
    comm.Free()
    fakecupy.uninstall(before)


def _host_values(t):
    """A (fake) CUDA tensor's values as numpy, through its host memory."""
    return _numpy(t.as_subclass(torch.Tensor))


def _same_values(got, want, dtype):
    return (isinstance(got, torch.Tensor) and got.dtype == TORCH[dtype]
            and tuple(got.shape) == want.shape
            and np.array_equal(_host_values(got).view(np.uint8),
                               np.ascontiguousarray(want).view(np.uint8)))


@pytest.mark.parametrize("dtype", ["bf16", "f4"])
def test_cuda_tensors(device, dtype):
    """torch CUDA tensors (faked over host memory): torch in, torch out, the same
    dtype, in both modes; bfloat16, which CuPy lacks, moves as its int16 bits
    and comes back as bfloat16.  Through redistribute, a Transfer into an
    ``out=`` tensor, between meshes, and a group; every result bit for bit
    against the oracle, the sources unchanged."""
    name, comm, fakecupy = device
    mesh = mr.Mesh(f"x={P}", comm=comm)
    shape, src, dst = (2 * P + 1, 6), "[{x}, {}]", "[{}, {x}]"
    G = _global(shape, dtype, 11)
    mine = oracle.local_block(G, MESH, _lay(src)[0], RANK)
    want = oracle.expected(G, MESH, _lay(dst)[0], RANK)
    local = fakecupy.torch_cuda(_tensor(mine))
    assert local.device.type == "cuda"
    got = mr.redistribute(local, shape, mesh, src, dst)
    all_ok(COMM, _same_values(got, want, dtype), f"{name} {dtype}: redistribute")
    all_ok(COMM, np.array_equal(_host_values(local).view(np.uint8),
                                np.ascontiguousarray(mine).view(np.uint8)), "source unchanged")

    t = mr.Transfer(shape, TORCH[dtype], mesh, src, dst)
    out = fakecupy.torch_cuda(torch.empty(t.target_shape, dtype=TORCH[dtype]))
    all_ok(COMM, t.run(local, out=out) is out and _same_values(out, want, dtype),
           f"{name} {dtype}: Transfer into out=")
    t.free()

    if P > 1:       # a weight sync: rank 0 holds it all, the others get tensors
        one = mr.Mesh("x=1", ranks=[0], comm=comm)
        whole = fakecupy.torch_cuda(_tensor(G)) if RANK == 0 else None
        got = mr.redistribute(whole, shape, one, "[{}, {}]", dst, dst_mesh=mesh)
        all_ok(COMM, _same_values(got, want, dtype), f"{name} {dtype}: between meshes")

    items = {"a": (shape, TORCH[dtype], src, dst), "b": (shape, TORCH[dtype], dst, src)}
    with mr.TransferGroup(items, mesh) as g:
        back = oracle.local_block(G, MESH, _lay(dst)[0], RANK)
        got = g.run({"a": local, "b": fakecupy.torch_cuda(_tensor(back))})
    all_ok(COMM, _same_values(got["a"], want, dtype) and _same_values(got["b"], mine, dtype),
           f"{name} {dtype}: a group")


@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("dtype", ["bf16", "f2"])
def test_cuda_partial_sums_in_fixed_order(device, dtype, op):
    """Partial sums of bfloat16 and float16 CUDA tensors, which MPI cannot
    reduce, combined on the device in a fixed order, bit for bit as the host
    combines them (numpy; the device holds bfloat16 as int16 bits and adds
    them through float32): a reduce-scatter (also in pipelined parts within a
    small W), an all-reduce, between meshes and in a group, in both modes.
    The reduce-scatter sum is also the fixed-order sum; the sources are
    unchanged."""
    name, comm, fakecupy = device
    mesh = mr.Mesh(f"x={P}", comm=comm)
    shape, src = (16 * P + 3, 96), f"[{{}}, {{}}] {op}{{x}}"
    parts = _parts(shape, BF16 if dtype == "bf16" else np.dtype(np.float16), 7)
    host, cuda = _tensor(parts[RANK]), fakecupy.torch_cuda(_tensor(parts[RANK]))
    before = _host_values(cuda).copy()
    rows = oracle.block_slices(shape, MESH, [["x"], []], RANK)
    for dst, w, mine in (("[{x}, {}]", None, rows), ("[{x}, {}]", 8192, rows),
                         ("[{}, {}]", None, slice(None))):
        got = mr.redistribute(cuda, shape, mesh, src, dst, workspace_bytes=w)
        if name == "staged" and op == "sum":
            # one exchange from the source layout: the classes in order 0, 1, ...
            want = _fixed_order([p[mine] for p in parts], 0)
        else:           # the plan's steps, as for host tensors
            want = _numpy(mr.redistribute(host, shape, mesh, src, dst, workspace_bytes=w))
        all_ok(COMM, _same_values(got, want, dtype),
               f"{name} {dtype} {op} -> {dst}, W={w}: as the host combines")
    if op == "sum" and name == "aware":
        fixed = _fixed_order([p[rows] for p in parts], RANK)
        got = mr.redistribute(cuda, shape, mesh, src, "[{x}, {}]")
        all_ok(COMM, _same_values(got, fixed, dtype), f"{name}: the fixed-order sum")

    other = mr.Mesh(f"a={P}", ranks=[int(r) for r in np.random.default_rng(2).permutation(P)],
                    comm=comm)
    want = mr.redistribute(host, shape, mesh, src, "[{a}, {}]", dst_mesh=other)
    got = mr.redistribute(cuda, shape, mesh, src, "[{a}, {}]", dst_mesh=other)
    all_ok(COMM, _same_values(got, _numpy(want), dtype), f"{name} {dtype} {op}: between meshes")

    items = {"w": (shape, TORCH[dtype], src, "[{x}, {}]"),
             "v": ((2 * P, 3), TORCH[dtype], "[{x}, {}]", "[{}, {}]")}
    small = _tensor(_global((2 * P, 3), dtype, 4)[2 * RANK:2 * RANK + 2])
    for w in (None, 4096):     # 4 KiB: "w" moves alone, as an exchange
        with mr.TransferGroup(items, mesh, workspace_bytes=w) as g:
            alone = "item 'w' alone" in g.explain()
            # a lowered count limit (MPIREDIST_COUNT_LIMIT, the CI's >2 GiB stages;
            # here under 1 MiB, more than "w" sends and receives) caps a bucket's
            # bytes, and may leave "w" alone without a small W too
            assert alone == (P > 1) if w is not None else (not alone or count_limit_lowered())
            want = g.run({"w": host, "v": small})
            got = g.run({"w": cuda, "v": fakecupy.torch_cuda(small)})
        all_ok(COMM, all(_same_values(got[k], _numpy(want[k]), dtype) for k in items),
               f"{name} {dtype} {op}: a group, W={w}")
    all_ok(COMM, np.array_equal(_host_values(cuda).view(np.uint8), before.view(np.uint8)),
           "the source is unchanged")


def test_cupy_bits_of_bf16(device):
    """CuPy has no bfloat16: a bfloat16 Transfer takes CuPy int16 arrays (the
    bits) and returns int16; another dtype is refused, naming what the device
    holds."""
    name, comm, fakecupy = device
    mesh = mr.Mesh(f"x={P}", comm=comm)
    shape, src, dst = (3 * P, 2), "[{x}, {}]", "[{}, {}]"
    G = _global(shape, "bf16", 12)
    bits = fakecupy.asarray(np.ascontiguousarray(
        oracle.local_block(G, MESH, [["x"], []], RANK)).view(np.int16))
    got = mr.Transfer(shape, BF16, mesh, src, dst).run(bits)
    all_ok(COMM, isinstance(got, fakecupy.ndarray) and got.dtype == np.int16
           and np.array_equal(got.view(np.ndarray), G.view(np.int16)), f"{name}: int16 bits")
    with pytest.raises(mr.ShapeError, match=r"expected bfloat16 \(on the device: its bits "
                                            r"as int16\)"):
        mr.Transfer(shape, BF16, mesh, src, dst).run(fakecupy.asarray(
            np.zeros(bits.shape, np.float32)))
