"""Multi-process JAX arrays (one CPU device per process, gloo) in and out of DistArrays.

    JAX_PLATFORMS=cpu timeout 300 mpiexec -n N python -m pytest -q --with-mpi \\
        tests/mpi/test_jax_processes.py

Run alone: ``jax.distributed.initialize`` must come before any other use of
JAX in the process, so a session that ran another JAX test first skips this
module with that reason (CI runs it in a stage of its own).  Every case
against the oracle (numpy slicing of the full array by the layout rules).
"""

import os

import numpy as np
import pytest
from mpi4py import MPI

import mpiredist as mr
import oracle
from helpers import all_ok, free_port

os.environ.setdefault("JAX_PLATFORMS", "cpu")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
from jax.sharding import Mesh as JaxMesh  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()


@pytest.fixture(scope="module", autouse=True)
def processes():
    port = free_port(COMM)
    error = None
    try:
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                                   num_processes=SIZE, process_id=RANK)
    except RuntimeError as exc:          # JAX already in use in this process
        error = str(exc)
    errors = COMM.allgather(error)
    if any(errors):
        pytest.skip(f"jax.distributed.initialize must come first in the process: run this "
                    f"module alone ({next(e for e in errors if e)[:120]})")
    assert len(jax.devices()) == SIZE and jax.process_index() == RANK
    yield
    jax.distributed.shutdown()


def _global(shape, dtype=np.float32):
    return oracle.global_array(shape, np.dtype(dtype), np.random.default_rng(7))


def _jax_array(G, jmesh, spec):
    sharding = NamedSharding(jmesh, spec)
    index = sharding.addressable_devices_indices_map(G.shape)[jax.local_devices()[0]]
    block = jax.device_put(np.ascontiguousarray(G[index]), jax.local_devices()[0])
    return jax.make_array_from_single_device_arrays(G.shape, sharding, [block])


def _meshes():
    out = [("x", (SIZE,))]
    if SIZE % 2 == 0 and SIZE > 2:
        out.append((("x", "y"), (2, SIZE // 2)))
    return out


@pytest.mark.parametrize("names,sizes", _meshes())
def test_from_jax_redistribute_to_jax(names, sizes):
    names = (names,) if isinstance(names, str) else names
    jmesh = JaxMesh(np.array(jax.devices()).reshape(sizes), names)
    rows = 2 * SIZE
    G = _global((rows, 2 * SIZE))
    x = _jax_array(G, jmesh, P(names[0]))
    a = mr.DistArray.from_jax(x)
    mesh_axes = list(zip(names, sizes))
    src = mr.Layout.from_partition_spec(P(names[0]), 2)
    assert a.layout == src and a.shape == G.shape and a.mesh.names == names
    all_ok(COMM, isinstance(a.local, jax.Array) and np.array_equal(
        np.asarray(a.local), oracle.local_block(G, mesh_axes, [list(d) for d in src.dims],
                                                RANK)), "from_jax block")
    # to every rank its columns (and, on a 2-D mesh, rows by the other axis)
    dst = mr.Layout.from_partition_spec(P(None, names[0]) if len(names) == 1
                                        else P(names[1], names[0]), 2)
    b = a.redistribute(dst)
    want = oracle.expected(G, mesh_axes, [list(d) for d in dst.dims], RANK)
    all_ok(COMM, isinstance(b.local, jax.Array) and np.array_equal(np.asarray(b.local), want),
           "redistributed block")
    y = b.to_jax()
    ok = (isinstance(y, jax.Array) and y.shape == G.shape
          and y.sharding.spec == dst.to_partition_spec()
          and np.array_equal(np.asarray(y.addressable_shards[0].data), want))
    all_ok(COMM, ok, "to_jax")
    # a cross-process JAX computation on the result: the sum of the whole array
    total = float(jax.jit(jnp.sum)(y))
    all_ok(COMM, np.isclose(total, float(G.sum()), rtol=1e-5), "jit over processes")


def test_errors_on_every_rank():
    jmesh = JaxMesh(np.array(jax.devices()), ("x",))
    G = _global((2 * SIZE, 3))
    x = _jax_array(G, jmesh, P("x"))
    with pytest.raises(mr.ShapeError, match="not the JAX mesh"):
        mr.DistArray.from_jax(x, mesh=mr.Mesh({"y": SIZE}))
    if SIZE > 1:
        with pytest.raises(mr.LayoutError, match="shard"):
            mr.DistArray.from_jax(x, spec=P(None, None))    # a spec the shards do not follow
    with pytest.raises(mr.ShapeError, match="takes a jax.Array"):
        mr.DistArray.from_jax(np.ones(3) if RANK == SIZE - 1 else x)
    if SIZE > 1:
        uneven = mr.DistArray.from_global(_global((2 * SIZE + 1, 3)), mr.Mesh({"x": SIZE}),
                                          "[{x}, {}]")
        with pytest.raises(mr.ShapeError, match="evenly"):
            uneven.to_jax()
