"""Device arrays on a CPU: the fake CuPy of ``tests/fakecupy.py``, in both modes.

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_device.py

``aware``: the MPI library is taken as CUDA-aware (``MPIREDIST_GPU_AWARE=1``),
device buffers go to MPI directly and the runtime allocates on the device;
``staged``: it is not (``MPIREDIST_GPU_AWARE=0``), every run goes through
host memory, and no device buffer reaches MPI.  Each mode runs on a fresh
duplicate of COMM_WORLD, since the ranks agree on CUDA-awareness once per
communicator.  Results against the oracle; any N (CI: 2 and 3).
"""

import warnings

import numpy as np
import pytest
from mpi4py import MPI

import fakecupy
import mpiredist as mr
import oracle
from helpers import all_ok

COMM = MPI.COMM_WORLD
RANK, P = COMM.Get_rank(), COMM.Get_size()

CASES = [  # (global shape, dtype, src, dst)
    ((7, 5), "f8", "[{x}, {}]", "[{}, {x}]"),
    ((5, 3, 4), "i4", "[{}, {x}, {}]", "[{x}, {}, {}]"),
    ((6, 4), "f4", "[{x}, {}]", "[{}, {}]"),
    ((9,), "u1", "[{}]", "[{x}]"),
]


@pytest.fixture(params=["aware", "staged"])
def mode(request, monkeypatch):
    before = fakecupy.install()
    monkeypatch.setenv("MPIREDIST_GPU_AWARE", "1" if request.param == "aware" else "0")
    comm = COMM.Dup()
    fakecupy.reset()
    yield request.param, comm
    comm.Free()
    fakecupy.uninstall(before)


def _lay(text):
    lay = mr.Layout.parse(text)
    return [list(d) for d in lay.dims], list(lay.partial), lay.op


def _device_block(G, mesh, text):
    dims, partial, op = _lay(text)
    host = oracle.source_blocks(G, list(mesh.axes), dims, partial, op)[RANK]
    return fakecupy.asarray(host)


def _same(got, want):
    return (isinstance(got, fakecupy.ndarray) and got.shape == want.shape
            and got.dtype == want.dtype and np.array_equal(got.view(np.ndarray), want))


@pytest.mark.parametrize("shape,dtype,src,dst", CASES)
def test_redistribute_device_arrays(mode, shape, dtype, src, dst):
    name, comm = mode
    mesh = mr.Mesh(f"x={P}", comm=comm)
    G = oracle.global_array(shape, np.dtype(dtype), np.random.default_rng(1))
    local = _device_block(G, mesh, src)
    before = local.copy()
    fakecupy.reset()
    got = mr.redistribute(local, shape, mesh, src, dst)
    want = oracle.expected(G, list(mesh.axes), _lay(dst)[0], RANK)
    all_ok(COMM, _same(got, want), f"{name} {src} -> {dst}: a device array of the target")
    all_ok(COMM, np.array_equal(local.view(np.ndarray), before.view(np.ndarray)),
           "the source is not written")
    counts = dict(fakecupy.COUNTS)
    moves = src != "[{}]" and P > 1    # a local slice: no buffer, no MPI
    if name == "staged":        # parts through host rings; on the device the result
        # (one allocation) and the copy of a part for a strided place in it; every
        # part is one copy to the host where it leaves, one to the device where it lands
        up, down = (COMM.allreduce(counts.get(k, 0)) for k in ("to_host", "to_device"))
        ok = up == down and (up > 0) == moves and counts.get("alloc") == 1 \
            and counts.get("alloc_bytes") <= 2 * want.nbytes
    else:                       # on the device: no host round trip
        ok = not counts.get("to_host") and not counts.get("to_device") \
            and (counts.get("alloc", 0) >= 1 and counts.get("sync", 0) >= 1) == moves
    all_ok(COMM, ok, f"{name}: copies and allocations {counts}")


@pytest.mark.parametrize("limit", [None, 4096])
def test_staged_in_parts_within_the_workspace(monkeypatch, limit):
    """Not CUDA-aware: a block many times W moves in parts through host rings.

    Host memory (traced, less the fake device's own allocations) stays within
    W; every part is one copy to the host and one to the device; the device
    holds the block, the result and at most one part more.  Under a count
    limit of 4 KiB the parts are tiny and many: the Python objects of the
    pieces (one per peer and side) must fit W beside the rings too (at 8
    ranks they did not: 132696 B)."""
    if P < 2:
        pytest.skip("needs 2 ranks")
    import tracemalloc
    before = fakecupy.install()
    monkeypatch.setenv("MPIREDIST_GPU_AWARE", "0")
    if limit is not None:
        monkeypatch.setenv("MPIREDIST_COUNT_LIMIT", str(limit))
    comm = COMM.Dup()
    try:
        mesh = mr.Mesh(f"x={P}", comm=comm)
        shape, src, dst, w = (512 * P, 128), "[{x}, {}]", "[{}, {x}]", 128 << 10
        G = oracle.global_array(shape, np.dtype("f8"), np.random.default_rng(8))
        want = oracle.expected(G, [("x", P)], [[], ["x"]], RANK)
        local = _device_block(G, mesh, src)
        t = mr.Transfer(shape, "f8", mesh, src, dst, workspace_bytes=w)
        # the exchange is made on the first run; the first runs also leave caches of
        # their own (about 35 KB here when a low count limit cuts 4 KiB parts): warm up
        for _ in range(3):
            t.run(local)
        fakecupy.reset()
        tracemalloc.start()
        got = t.run(local)
        host = tracemalloc.get_traced_memory()[1] - fakecupy.COUNTS["alloc_bytes"]
        tracemalloc.stop()
        counts = dict(fakecupy.COUNTS)
        all_ok(COMM, _same(got, want), "staged in parts: the result")
        sent = local.nbytes - want.nbytes // P          # what leaves this rank
        all_ok(COMM, counts.get("to_host", 0) >= max(2, sent // (w // 2)),
               f"staged in parts: {counts} for {sent} B sent with W = {w} B")
        all_ok(COMM, host <= w, f"host memory {host} B > W {w} B")
        all_ok(COMM, counts.get("alloc") == 1 and
               counts["alloc_bytes"] <= want.nbytes + w // 2,
               f"device: the result and at most a part ({counts})")
        t.free()
    finally:
        comm.Free()
        fakecupy.uninstall(before)


def test_device_partial_sums_and_out(mode):
    name, comm = mode
    mesh = mr.Mesh(f"x={P}", comm=comm)
    shape, src, dst = (6, 4), "[{}, {}] sum{x}", "[{x}, {}]"
    G = oracle.global_array(shape, np.dtype("f8"), np.random.default_rng(2))
    local = _device_block(G, mesh, src)
    t = mr.Transfer(shape, "f8", mesh, src, dst)
    out = fakecupy.empty(t.target_shape, np.float64)
    got = t.run(local, out=out)
    want = oracle.expected(G, list(mesh.axes), _lay(dst)[0], RANK)
    all_ok(COMM, got is out and np.allclose(out.view(np.ndarray), want, rtol=1e-12),
           f"{name}: sum into out=")
    t.free()


def test_cuda_array_interface_object(mode):
    """A device array of no known library (as Numba's) comes back as a CuPy array."""
    name, comm = mode
    mesh = mr.Mesh(f"x={P}", comm=comm)
    shape, src, dst = (5, 3), "[{x}, {}]", "[{}, {x}]"
    G = oracle.global_array(shape, np.dtype("f4"), np.random.default_rng(3))
    host = np.ascontiguousarray(oracle.source_blocks(G, [("x", P)], [["x"], []])[RANK])
    got = mr.redistribute(fakecupy.CudaObject(host), shape, mesh, src, dst)
    want = oracle.expected(G, [("x", P)], [[], ["x"]], RANK)
    all_ok(COMM, _same(got, want), f"{name}: __cuda_array_interface__ object")


def test_between_meshes_device(mode):
    """A rank outside the source mesh passes None and still gets a device array."""
    name, comm = mode
    if P < 2:
        pytest.skip("needs 2 ranks")
    src_mesh = mr.Mesh("x=1", ranks=[0], comm=comm)
    dst_mesh = mr.Mesh(f"x={P}", comm=comm)
    shape = (2 * P + 1, 3)
    G = oracle.global_array(shape, np.dtype("f8"), np.random.default_rng(4))
    local = fakecupy.asarray(G) if RANK == 0 else None
    got = mr.redistribute(local, shape, src_mesh, "[{}, {}]", "[{x}, {}]", dst_mesh=dst_mesh)
    want = oracle.expected(G, [("x", P)], [["x"], []], RANK)
    all_ok(COMM, _same(got, want), f"{name}: between meshes, a device array on every rank")


def test_mixed_host_and_device_raises_everywhere(mode):
    name, comm = mode
    if P < 2:
        pytest.skip("needs 2 ranks")
    mesh = mr.Mesh(f"x={P}", comm=comm)
    block = np.zeros((3, 2))
    local = fakecupy.asarray(block) if RANK == 1 else block
    with pytest.raises(mr.MismatchError, match="kind"):
        mr.redistribute(local, (3 * P, 2), mesh, "[{x}, {}]", "[{}, {x}]")


def test_staging_forbidden_raises_everywhere(monkeypatch):
    before = fakecupy.install()
    monkeypatch.setenv("MPIREDIST_GPU_AWARE", "0")
    monkeypatch.setenv("MPIREDIST_GPU_STAGING", "0")
    comm = COMM.Dup()
    try:
        mesh = mr.Mesh(f"x={P}", comm=comm)
        local = fakecupy.zeros((2, 3), np.float32)
        with pytest.raises(mr.ShapeError, match="not CUDA-aware"):
            mr.redistribute(local, (2 * P, 3), mesh, "[{x}, {}]", "[{}, {x}]")
        # host arrays are not affected
        got = mr.redistribute(np.ones((2, 3)), (2 * P, 3), mesh, "[{x}, {}]", "[{}, {}]")
        all_ok(COMM, got.shape == (2 * P, 3) and (got == 1).all(), "host run")
    finally:
        comm.Free()
        fakecupy.uninstall(before)


def test_the_hint_names_intel_mpis_offload_settings(monkeypatch):
    """Under Intel MPI without I_MPI_OFFLOAD the error says how to turn it on;
    under another library, or with it set, there is no hint."""
    from mpiredist.runtime import mpi
    monkeypatch.delenv("I_MPI_OFFLOAD", raising=False)
    intel = "Intel" in mpi.mpi().Get_library_version()
    hint = mpi.cuda_aware_hint()
    all_ok(COMM, ("I_MPI_OFFLOAD=1 I_MPI_OFFLOAD_MODE=cuda" in hint) == intel,
           f"hint {hint!r} under {mpi.mpi().Get_library_version()[:40]!r}")
    monkeypatch.setenv("I_MPI_OFFLOAD", "1")
    all_ok(COMM, mpi.cuda_aware_hint() == "", "no hint once offload is on")


def test_cuda_awareness_is_agreed(monkeypatch):
    """One rank that says its MPI is not CUDA-aware makes every rank stage."""
    from mpiredist.runtime.devices import gpu_support
    from mpiredist.runtime.groups import as_group
    monkeypatch.setenv("MPIREDIST_GPU_AWARE", "1" if RANK else "0")
    comm = COMM.Dup()
    try:
        group = as_group(comm)
        all_ok(COMM, gpu_support(group) == (False, True), f"agreed: {gpu_support(group)}")
    finally:
        comm.Free()


def test_device_budget_and_donation_warnings(mode):
    """Device arrays run out of place: past the contract a BudgetWarning names the
    excess before anything runs; a donated device block says why it was not taken."""
    name, comm = mode
    if P < 2:
        pytest.skip("needs 2 ranks")
    mesh = mr.Mesh(f"x={P}", comm=comm)
    shape, src, dst = (64 * P, 64 * P), "[{x}, {}]", "[{}, {x}]"
    G = oracle.global_array(shape, np.dtype("f8"), np.random.default_rng(5))
    want = oracle.expected(G, [("x", P)], [[], ["x"]], RANK)
    local = _device_block(G, mesh, src)
    if name == "aware":
        # with W = 0, this reduce-scatter out of place exceeds max(S, T) at 2 ranks
        from mpiredist.planning.budget import choose
        part = _device_block(G, mesh, "[{}, {}] sum{x}")
        fits = choose(mr.plan(shape, "f8", mesh, "[{}, {}] sum{x}", "[{x}, {}]"), False, 0,
                      True).budget
        past = fits.out_of_place_peak > fits.limit
        assert past or P > 2
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got = mr.redistribute(part, shape, mesh, "[{}, {}] sum{x}", "[{x}, {}]",
                                  workspace_bytes=0)
        told = [w for w in seen if issubclass(w.category, mr.BudgetWarning)
                and "device arrays run out of place" in str(w.message)
                and "exceeds" in str(w.message)]
        all_ok(COMM, len(told) == int(past), f"a BudgetWarning iff past the contract ({fits})")
        rows = oracle.expected(G, [("x", P)], [["x"], []], RANK)
        all_ok(COMM, np.allclose(got.view(np.ndarray), rows, rtol=1e-12),
               "the run past the contract is still right")
    with pytest.warns(mr.DonationWarning, match="device arrays run out of place"):
        got = mr.redistribute(local, shape, mesh, src, dst, donate=True)
    all_ok(COMM, _same(got, want), f"{name}: donated device block")


GROUP = {   # name: (global shape, dtype, src, dst)
    "w": ((3 * P + 1, 4), "f4", "[{x}, {}]", "[{}, {x}]"),
    "b": ((5,), "i8", "[{}]", "[{x}]"),
    "g": ((4, 2 * P), "f8", "[{}, {}] sum{x}", "[{}, {x}]"),
    "big": ((32 * P, 16), "f8", "[{x}, {}]", "[{}, {x}]"),
}


@pytest.mark.parametrize("workspace", [None, 2048], ids=["buckets", "small-W"])
def test_group_of_device_arrays(mode, workspace):
    """A TransferGroup of device arrays: results on the device, right, in both
    modes; CUDA-aware, the pieces never leave the device (no copy to the
    host); staged, they go through host memory (copies to the host); with a
    small W the big item moves alone, in parts."""
    name, comm = mode
    mesh = mr.Mesh(f"x={P}", comm=comm)
    rng = np.random.default_rng(8)
    G, blocks = {}, {}
    for n, (shape, dtype, src, dst) in GROUP.items():
        G[n] = oracle.global_array(shape, np.dtype(dtype), rng)
        blocks[n] = _device_block(G[n], mesh, src)
    with mr.TransferGroup(GROUP, mesh, workspace_bytes=workspace) as g:
        text = g.explain()
        fakecupy.reset()
        got = g.run(blocks)
    to_host = fakecupy.COUNTS["to_host"]
    ok = all(_same(got[n], oracle.expected(G[n], [("x", P)], _lay(GROUP[n][3])[0], RANK))
             for n in GROUP)
    all_ok(COMM, ok, f"{name}, W={workspace}: device group results")
    if P > 1:
        all_ok(COMM, to_host > 0 if name == "staged" else to_host == 0,
               f"{name}: {to_host} copies to the host")
    if workspace is not None and P > 1:
        all_ok(COMM, "item 'big' alone" in text, f"the big item moves alone: {text}")


def test_group_run_on_host_then_device_then_host(mode):
    """One group run with host blocks, then device blocks, then host again:
    the bucket buffer follows the blocks' memory where MPI is CUDA-aware, and
    the pieces' views of it with it (a stale view would unpack the last
    run's bytes).  Every run against the oracle, with other values each time."""
    name, comm = mode
    mesh = mr.Mesh(f"x={P}", comm=comm)
    with mr.TransferGroup(GROUP, mesh) as g:
        for seed, device in ((1, False), (2, True), (3, False)):
            rng = np.random.default_rng(seed)
            G = {n: oracle.global_array(shape, np.dtype(dtype), rng)
                 for n, (shape, dtype, _, _) in GROUP.items()}
            blocks = {n: _device_block(G[n], mesh, GROUP[n][2]) for n in GROUP}
            if not device:
                blocks = {n: fakecupy.asnumpy(b) for n, b in blocks.items()}
            got = g.run(blocks)
            want = {n: oracle.expected(G[n], [("x", P)], _lay(GROUP[n][3])[0], RANK)
                    for n in GROUP}
            ok = all(_same(got[n], want[n]) if device else
                     not isinstance(got[n], fakecupy.ndarray)
                     and got[n].dtype == want[n].dtype and np.array_equal(got[n], want[n])
                     for n in GROUP)
            all_ok(COMM, ok, f"{name}: run {seed} ({'device' if device else 'host'})")


def test_group_between_meshes_device(mode):
    """A weight sync of device arrays: the ranks outside the source mesh pass
    None and get device arrays (the library learnt after the agreement)."""
    name, comm = mode
    if P < 2:
        pytest.skip("needs 2 ranks")
    src_mesh = mr.Mesh("t=1", ranks=[0], comm=comm)
    dst_mesh = mr.Mesh(f"s={P - 1}", ranks=list(range(1, P)), comm=comm)
    items = {"w": ((3 * P, 5), "f8", "[{}, {}]", "[{}, {s}]")}
    G = oracle.global_array((3 * P, 5), np.dtype("f8"), np.random.default_rng(6))
    with mr.TransferGroup(items, src_mesh, dst_mesh) as g:
        got = g.run({"w": fakecupy.asarray(G)} if RANK == 0 else None)
    ok = got["w"] is None if RANK == 0 else _same(
        got["w"], oracle.expected(G, [("s", P - 1)], [[], ["s"]], RANK - 1))
    all_ok(COMM, ok, f"{name}: device arrays on the inference ranks")
