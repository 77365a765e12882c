"""Donated blocks that differ between ranks: every rank takes the same path.

Each of these hung or crashed before the Transfer agreed on the blocks: a
rank whose block owned its memory resized it while another, whose block was
a view, filled a new buffer (different MPI calls); a read-only block raised
on one rank mid-collective; a donated block was reallocated under a live
view (SIGSEGV).  Now every rank either returns the oracle's result or raises
the same ValueError subclass with its source intact.

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_donation.py
"""

import warnings

import numpy as np
import pytest
from mpi4py import MPI

import mpiredist as mr
import oracle
from mpiredist.planning.budget import default_workspace, fresh_buffer_fits
from helpers import all_array_equal, all_ok, need_ranks

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
MESH = mr.Mesh({"x": SIZE})
SRC, DST = "[{x}, {}]", "[{}, {x}]"


def _global(shape, dtype="float32"):
    return np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)


def _block(g, layout, rank=RANK):
    dims = [list(d) for d in mr.Layout.parse(layout).dims]
    return np.ascontiguousarray(oracle.local_block(g, list(MESH.axes), dims, rank))


def _redistribute(local, shape, src=SRC, dst=DST, **kwargs):
    """``(result, DonationWarning raised?)`` of mr.redistribute on this rank."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = mr.redistribute(local, shape, MESH, src, dst, **kwargs)
    return out, any(issubclass(w.category, mr.DonationWarning) for w in caught)


def _fresh(shape, src, dst, dtype="float32"):
    """True where the donated run takes a new buffer anyway (the block is only read)."""
    plan = mr.plan(shape, dtype, MESH, src, dst)
    return fresh_buffer_fits(plan, default_workspace(plan))


def _view_into_larger(block):
    """A C-contiguous view of ``block``'s values inside a larger buffer."""
    big = np.empty(block.size + 7, dtype=block.dtype)
    view = big[3:3 + block.size].reshape(block.shape)
    view[...] = block
    return view


def _agreed(flag, what):
    """Assert that ``flag`` is the same on every rank (one path for all); return it."""
    flags = COMM.allgather(bool(flag))
    all_ok(COMM, len(set(flags)) == 1, f"{what}: ranks differ: {flags}")
    return flags[0]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("shape", [(4 * SIZE + 1, 6), (512, 512)], ids=["uneven", "even"])
def test_owned_block_on_rank_0_views_elsewhere(shape):
    """Views need no realloc when the block holds the run (even shape): donated on
    every rank; an uneven block that must grow: copied on every rank."""
    need_ranks(COMM, 2)
    g = _global(shape)
    mine = _block(g, SRC)
    local = mine.copy() if RANK == 0 else _view_into_larger(mine)
    out, warned = _redistribute(local, shape, donate=True)
    all_array_equal(COMM, out, _block(g, DST), "result")
    if _agreed(warned, "DonationWarning"):
        all_ok(COMM, np.array_equal(local, mine), "a copied donation leaves the blocks")
    all_ok(COMM, _agreed(warned, "w") == (shape[0] % SIZE != 0), "donated exactly when even")


@pytest.mark.mpi(min_size=2)
def test_read_only_block_on_one_rank():
    need_ranks(COMM, 2)
    shape = (3 * SIZE + 2, 5)
    g = _global(shape)
    local = _block(g, SRC)
    if RANK == SIZE - 1:
        local.flags.writeable = False
    kept = local.copy()
    out, warned = _redistribute(local, shape, donate=True)
    all_array_equal(COMM, out, _block(g, DST), "result")
    all_ok(COMM, warned, "a DonationWarning on every rank")
    all_ok(COMM, RANK != SIZE - 1 or np.array_equal(local, kept), "read-only block unchanged")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dst", [DST, "[{}, {}]"], ids=["transpose", "gather"])
def test_fortran_order_on_some_ranks(dst):
    need_ranks(COMM, 2)
    shape = (2 * SIZE + 1, 7)
    g = _global(shape)
    mine = _block(g, SRC)
    local = np.asfortranarray(mine) if RANK % 2 else mine.copy()
    out, warned = _redistribute(local, shape, dst=dst, donate=True)
    all_array_equal(COMM, out, _block(g, dst), "result")
    all_ok(COMM, warned, "a DonationWarning on every rank")
    all_ok(COMM, np.array_equal(local, mine), "blocks left as they were")


@pytest.mark.mpi
def test_live_view_of_a_donated_block_that_must_grow():
    rows = 1024 * SIZE                  # 4 MiB float32 blocks that grow SIZE-fold
    shape = (rows, 1024)
    local = np.empty((rows // SIZE, 1024), dtype=np.float32)
    local[...] = np.arange(RANK * (rows // SIZE), (RANK + 1) * (rows // SIZE))[:, None]
    view = local[::7]                   # the caller still holds a view of the memory
    before = view.copy()
    out, warned = _redistribute(local, shape, dst="[{}, {}]", donate=True)
    want = np.broadcast_to(np.arange(rows, dtype=np.float32)[:, None], shape)
    all_array_equal(COMM, out, want, "result")
    all_ok(COMM, np.array_equal(view, before), "the live view still reads its values")
    fresh = _fresh(shape, SRC, "[{}, {}]")
    all_ok(COMM, warned or SIZE == 1 or fresh,
           "a DonationWarning (the block must grow, and no new buffer fits the bound)")


@pytest.mark.mpi
@pytest.mark.parametrize("donate", [False, True], ids=["kept", "donated"])
def test_non_contiguous_source(donate):
    shape = (2 * SIZE + 3, 8)
    g = _global(shape, "float64")
    mine = _block(g, SRC)
    big = np.zeros((mine.shape[0], 2 * mine.shape[1]), dtype=mine.dtype)
    big[:, ::2] = mine
    local = big[:, ::2]                 # strided: not contiguous at all
    out, _ = _redistribute(local, shape, donate=donate)
    all_array_equal(COMM, out, _block(g, DST), "result")
    all_ok(COMM, np.array_equal(local, mine), "source unchanged")


@pytest.mark.mpi
def test_exclusive_blocks_are_donated_and_may_grow():
    shape = (4 * SIZE, 16)
    g = _global(shape)
    local = _block(g, SRC)
    with warnings.catch_warnings():
        warnings.simplefilter("error", mr.DonationWarning)   # honoured: no warning
        out = mr.redistribute(local, shape, MESH, SRC, "[{}, {}]", donate=True)
    all_array_equal(COMM, out, g, "result")
    # the donated memory was used: the result lives in it (grown by realloc), or it
    # was given back (a new buffer took the live data); a silent copy does neither
    all_ok(COMM, local.size == 0 or np.shares_memory(out, local),
           f"the donated block ({local.size} elements) is neither the result's memory "
           "nor released")


@pytest.mark.mpi
def test_a_second_name_in_a_wrapper_makes_a_growing_donation_a_copy():
    shape = (4 * SIZE, 16)
    g = _global(shape)
    local = _block(g, SRC)
    kept = local.copy()
    out, warned = _redistribute(local, shape, dst="[{}, {}]", donate=True)
    all_array_equal(COMM, out, g, "result")
    fresh = _fresh(shape, SRC, "[{}, {}]")
    all_ok(COMM, _agreed(warned, "warned") or SIZE == 1 or fresh,
           "a DonationWarning (must grow, and no new buffer fits the bound)")
    all_ok(COMM, np.array_equal(local, kept), "the block is unchanged (copied or only read)")


@pytest.mark.mpi
def test_distarray_donation_with_a_view_kept_by_the_caller():
    shape = (3 * SIZE + 1, 4)
    g = _global(shape)
    a = mr.DistArray.from_global(g, MESH, SRC)
    view = a.local[:1]
    before = view.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mr.DonationWarning)
        b = a.redistribute("[{}, {}]", donate=True)
    all_array_equal(COMM, b.local, g, "result")
    all_ok(COMM, np.array_equal(view, before), "the caller's view is intact")
    all_ok(COMM, a.local is None, "the donating DistArray gave up its block")


@pytest.mark.mpi
def test_distarray_redistribute_in_place_and_error_keeps_block():
    shape = (2 * SIZE + 1, 3)
    g = _global(shape)
    a = mr.DistArray.from_global(g, MESH, SRC)
    block = a.local
    with pytest.raises(mr.LayoutError):
        a.redistribute("[{}, {q}]", donate=True)
    all_ok(COMM, a.local is block and a.local.shape == block.shape,
           "a call that raised leaves the block in place")
    a.redistribute_(DST)
    all_array_equal(COMM, a.local, _block(g, DST), "redistribute_ result")
