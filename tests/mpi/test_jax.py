"""JAX CPU arrays (process-local) through mpiredist: JAX in, JAX out, against the oracle.

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_jax.py

Skips without JAX (``pip install jax``; the ``jax`` extra).  JAX arrays are
immutable: they are read through a read-only DLPack view (bfloat16 through
``numpy.asarray``, also without a copy) and the result comes back through
``jax.numpy.from_dlpack`` (which copies into JAX's own buffer); ``out=`` a
JAX array is refused as read-only, on every rank.
"""

import os

import numpy as np
import pytest
from mpi4py import MPI

import mpiredist as mr
import oracle
from helpers import all_ok

os.environ.setdefault("JAX_PLATFORMS", "cpu")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

COMM = MPI.COMM_WORLD
RANK, P = COMM.Get_rank(), COMM.Get_size()
MESH = [("x", P)]


def _lay(text):
    return [list(d) for d in mr.Layout.parse(text).dims]


@pytest.mark.parametrize("dtype", ["float32", "int32", "bfloat16"])
@pytest.mark.parametrize("src,dst", [("[{x}, {}]", "[{}, {x}]"), ("[{}, {}]", "[{x}, {}]")])
def test_jax_in_jax_out(dtype, src, dst):
    mesh = mr.Mesh(f"x={P}")
    shape = (2 * P + 1, 5)
    G = oracle.global_array(shape, np.dtype("f4"), np.random.default_rng(1)).astype(
        jnp.dtype(dtype))
    local = jnp.asarray(np.ascontiguousarray(oracle.local_block(G, MESH, _lay(src), RANK)))
    got = mr.redistribute(local, shape, mesh, src, dst)
    want = oracle.expected(G, MESH, _lay(dst), RANK)
    ok = (isinstance(got, jax.Array) and got.dtype == want.dtype and got.shape == want.shape
          and np.array_equal(np.asarray(got), want))
    all_ok(COMM, ok, f"jax {dtype} {src} -> {dst}")
    a = mr.DistArray.from_local(local, mesh, src, shape).redistribute(dst)
    all_ok(COMM, isinstance(a.local, jax.Array) and np.array_equal(np.asarray(a.local), want),
           "DistArray of a jax array")


def test_jax_bf16_partial_sum_and_read_only_out():
    mesh = mr.Mesh(f"x={P}")
    shape = (2 * P, 3)
    part = jnp.full(shape, RANK + 1, dtype=jnp.bfloat16)
    got = mr.redistribute(part, shape, mesh, "[{}, {}] sum{x}", "[{x}, {}]")
    all_ok(COMM, isinstance(got, jax.Array) and got.dtype == jnp.bfloat16
           and bool((got == P * (P + 1) // 2).all()), "bf16 partial sum of jax arrays")
    t = mr.Transfer(shape, "f4", mesh, "[{x}, {}]", "[{}, {x}]")
    with pytest.raises(mr.ShapeError, match="read-only"):
        t.run(jnp.zeros((2, 3), jnp.float32), out=jnp.zeros(t.target_shape, jnp.float32))
    t.free()
