"""Array backends (``mpiredist.core.backend``), without MPI: which library an
array belongs to, its native view (no copy) and the way back, dtypes."""

import sys

import numpy as np
import pytest

import fakecupy
import mpiredist as mr
from mpiredist.core.backend import Backend, as_dtype, backend_of, dtype_of
from mpiredist.planning import planner


class HostDLPack:
    """A host array of an unknown library that speaks DLPack and the array API."""

    def __init__(self, a):
        self._a = a
        self.shape, self.dtype = a.shape, a.dtype

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()

    def __array_namespace__(self):
        return Namespace


class Namespace:
    @staticmethod
    def from_dlpack(x):
        return HostDLPack(np.from_dlpack(x))


class DeviceDLPack(HostDLPack):
    def __dlpack_device__(self):
        return (2, 0)       # kDLCUDA


def test_numpy_is_itself():
    a = np.arange(6.0)
    b = backend_of(a)
    assert b == Backend("numpy", False) and b.native(a) is a and b.wrap(a) is a
    assert repr(b) == "Backend('numpy', device=False)" and str(b) == "numpy (host)"
    with pytest.raises(AttributeError):
        b.name = "torch"


def test_unknown_objects_are_refused():
    with pytest.raises(mr.ShapeError, match="must be an array.*list"):
        backend_of([1, 2, 3])
    with pytest.raises(mr.ShapeError, match="DLPack device"):
        backend_of(DeviceDLPack(np.zeros(2)))


def test_host_dlpack_round_trip_without_copy():
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    x = HostDLPack(a)
    b = backend_of(x)
    assert b.name == "dlpack" and not b.device
    view = b.native(x)
    assert isinstance(view, np.ndarray) and np.shares_memory(view, a)
    back = b.wrap(view)
    assert isinstance(back, HostDLPack) and np.shares_memory(back._a, a)


def test_fake_device_arrays():
    before = fakecupy.install()
    try:
        d = fakecupy.asarray(np.arange(4.0))
        assert backend_of(d) == Backend("cupy", True)
        obj = fakecupy.CudaObject(np.arange(3.0))
        b = backend_of(obj)
        assert b == Backend("cuda", True) and dtype_of(obj) == np.float64
        view = b.native(obj)
        assert isinstance(view, fakecupy.ndarray) and view.ctypes.data == obj._host.ctypes.data
    finally:
        fakecupy.uninstall(before)


try:
    import ml_dtypes
    import torch
except ImportError:         # the torch extra: pip install torch==2.13.0+cpu ml_dtypes
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch and ml_dtypes not installed")
TORCH_DTYPES = [] if torch is None else [torch.float32, torch.bfloat16, torch.int64, torch.bool]


@needs_torch
def test_torch_dtypes():
    assert as_dtype(torch.float32) == np.float32 and as_dtype(torch.int8) == np.int8
    assert as_dtype(torch.bfloat16) == np.dtype(ml_dtypes.bfloat16)
    assert as_dtype(torch.complex64) == np.complex64 and as_dtype("f8") == np.float64
    assert dtype_of(torch.zeros(2, dtype=torch.float16)) == np.float16


@needs_torch
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_torch_views_are_not_copies(dtype):
    t = torch.zeros(3, 4, dtype=dtype)
    b = backend_of(t)
    assert b == Backend("torch", False)
    view = b.native(t)
    assert isinstance(view, np.ndarray) and view.ctypes.data == t.data_ptr()
    assert view.dtype == as_dtype(dtype)
    back = b.wrap(view)
    assert isinstance(back, torch.Tensor) and back.dtype == dtype
    assert back.data_ptr() == t.data_ptr()


@needs_torch
def test_torch_refusals():
    with pytest.raises(mr.ShapeError, match="requires grad.*detach"):
        backend_of(torch.zeros(2, requires_grad=True)).native(torch.zeros(2, requires_grad=True))


def test_planner_reduces_what_numpy_can_add():
    for dtype in (np.float16, "f4"):
        planner.plan((4, 4), dtype, mr.Mesh("x=2"), "[{}, {}] sum{x}", "[{x}, {}]")
    if torch is not None:
        planner.plan((4, 4), torch.bfloat16, mr.Mesh("x=2"), "[{}, {}] sum{x}", "[{x}, {}]")
    planner.plan((4, 4), np.float16, mr.Mesh("x=2"), "[{}, {}] max{x}", "[{}, {}]")
    with pytest.raises(mr.ShapeError, match="dtype <U2 has no reduction"):
        planner.plan((4, 4), "U2", mr.Mesh("x=2"), "[{}, {}] sum{x}", "[{x}, {}]")
    with pytest.raises(mr.ShapeError, match="not defined for complex"):
        planner.plan((4, 4), "c8", mr.Mesh("x=2"), "[{}, {}] max{x}", "[{x}, {}]")


@needs_torch
def test_float64_tensor_without_ml_dtypes_imported():
    """A process that never imported ml_dtypes: a float64 tensor comes back as
    float64 (a test of bfloat16 as ``dtype == bfloat16-or-None`` took None,
    which numpy reads as float64, and returned four times as many bfloat16)."""
    import subprocess
    code = ("import sys, torch, numpy as np\n"
            "from mpiredist.core.backend import backend_of\n"
            "t = torch.arange(4, dtype=torch.float64)\n"
            "b = backend_of(t)\n"
            "back = b.wrap(b.native(t))\n"
            "assert 'ml_dtypes' not in sys.modules\n"
            "assert back.dtype == torch.float64 and back.shape == (4,), (back.dtype, back.shape)\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize("ufunc", [np.add, np.multiply, np.maximum, np.minimum])
@pytest.mark.parametrize("device", [False, True])
def test_bfloat16_bits_combine_as_numpy_adds_bfloat16(ufunc, device):
    """On the device bfloat16 is held as int16 bits: its combiner gives numpy's
    ml_dtypes result bit for bit, on every pair of bit patterns drawn (ties,
    overflow to inf, subnormals, infinities; a NaN result is a NaN), on the
    fake CuPy's arrays too, into ``out=`` the first operand."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from mpiredist.core.backend import combiner
    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(3)
    n = 1 << 18
    a = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    b = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    b[::2] = a[::2] + rng.integers(-64, 64, n // 2).astype(np.uint16)    # near: rounding
    a[:4], b[:4] = [0x7F7F, 0x0001, 0x3F80, 0xFF80], [0x7F7F, 0x8001, 0x3380, 0x7F80]
    with np.errstate(all="ignore"):
        want = ufunc(a.view(bf16), b.view(bf16)).view(np.uint16)
        assert combiner(ufunc, bf16, False) is ufunc       # host arrays: numpy itself
        f = combiner(ufunc, bf16, True)
        assert combiner(ufunc, bf16, True) is f and combiner(ufunc, np.float32, True) is ufunc
        acc = a.view(np.int16).copy()
        part = b.view(np.int16)
        if device:
            acc, part = fakecupy.asarray(acc), fakecupy.asarray(part)
        got = f(acc, part, out=acc)
    got = np.asarray(got).view(np.uint16)
    assert got is not None and acc.dtype == np.int16
    nan = np.isnan(want.view(bf16))
    assert np.array_equal(np.isnan(got.view(bf16)), nan)
    assert np.array_equal(got[~nan], want[~nan]), np.flatnonzero(got[~nan] != want[~nan])[:5]
