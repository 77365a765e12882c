"""Data, meshes and comparison shared by the analytics tests (tests/mpi/test_analytics_*.py)."""

import numpy as np

from mpiredist import Mesh


def meshes(size, two_d_layouts=("[{x}, {y}]", "[{y,x}, {}]")):
    """Meshes of ``size`` devices with the layouts to try on each."""
    out = [(Mesh({"x": size}), ["[{x}, {}]", "[{}, {x}]", "[{}, {}]"])]
    if size % 2 == 0 and size > 2:
        out.append((Mesh({"x": 2, "y": size // 2}), list(two_d_layouts)))
    return out


def data(shape, dtype="float64", seed=0, bound=20):
    """A seeded global array; integers in ``[-bound, bound)``."""
    rng = np.random.default_rng(seed)
    kind = np.dtype(dtype).kind
    if kind in "iu":
        return rng.integers(-bound, bound, size=shape).astype(dtype)
    if kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def close(actual, expected, exact=False, tol=1e-10):
    """Same shape and dtype, and equal (``exact``) or close, NaNs equal."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return False
    if exact:
        return bool(np.array_equal(actual, expected))
    return bool(np.allclose(actual, expected, rtol=tol, atol=tol, equal_nan=True))
