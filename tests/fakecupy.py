"""A fake CuPy over host memory: mpiredist's device paths, run on a CPU.

mpi4py tests its GPU buffer handling the same way (objects that expose
``__cuda_array_interface__`` over host memory).  :func:`install` registers
this module as ``cupy``; its ``ndarray`` is a numpy subclass whose class
says it belongs to ``cupy`` and which exposes ``__cuda_array_interface__``,
so mpiredist treats it as device memory: the device variant, the stream
synchronisation, CUDA-awareness and staging through host memory.  MPI
reads its memory through the buffer protocol (it is host memory), which is
what a CUDA-aware MPI does with a device pointer.

:data:`COUNTS` counts what a real GPU would make expensive: copies to the
host (``asnumpy``, ``ndarray.get``), copies to the device (``asarray`` of a
host array, ``ndarray.set``), device allocations (``empty``, ``zeros``,
``ascontiguousarray`` that copies; ``alloc_bytes`` their bytes, with those
of ``asarray`` copies) and stream synchronisations.  Like CuPy, ``get``
takes a C-contiguous numpy ``out=`` and ``set`` needs a contiguous array.

:class:`CudaObject` is a device array of no known library (as a Numba
device array is): only ``__cuda_array_interface__``, no buffer protocol.

Like CuPy, it has no bfloat16 (nor any other numpy dtype of kind ``V``):
making or viewing a device array of one raises TypeError.
:func:`torch_cuda` fakes a torch CUDA tensor over a CPU tensor's memory
(its ``device`` says ``cuda``; DLPack hands out the host memory), so that
the torch device paths run too; a tensor made from a device array
(``torch.from_dlpack``) is a CPU tensor again.
"""

import collections
import ctypes
import sys
import types

import numpy as np

COUNTS = collections.Counter()


def reset():
    COUNTS.clear()


def _refuse(dtype):
    if np.dtype(dtype).kind == "V":
        raise TypeError(f"Unsupported dtype {np.dtype(dtype)}")      # as CuPy: no bfloat16


class ndarray(np.ndarray):
    """Device memory, faked: a numpy array that says it is a CuPy array."""

    def __array_finalize__(self, obj):
        _refuse(self.dtype)

    def view(self, *args, **kwargs):
        made = super().view(*args, **kwargs)
        if isinstance(made, ndarray):
            _refuse(made.dtype)
        return made

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                "data": (self.ctypes.data, not self.flags.writeable),
                "strides": None if self.flags.c_contiguous else self.strides}

    def get(self, out=None):
        COUNTS["to_host"] += 1
        if out is None:
            return np.array(self.view(np.ndarray), copy=True)
        if type(out) is not np.ndarray or not out.flags.c_contiguous:
            raise TypeError("get(out=): a C-contiguous numpy array, as CuPy needs")
        np.copyto(out, self.view(np.ndarray))
        return out

    def set(self, host):
        if not self.flags.c_contiguous:
            raise RuntimeError("Cannot set to non-contiguous array")    # as CuPy
        COUNTS["to_device"] += 1
        np.copyto(self.view(np.ndarray), host)


ndarray.__module__ = "cupy"


def _device(host):
    return host.view(ndarray)


def asarray(obj, dtype=None):
    if isinstance(obj, ndarray):
        return obj if dtype is None else obj.astype(dtype).view(ndarray)
    if hasattr(obj, "__cuda_array_interface__"):        # zero copy, as CuPy does
        cai = obj.__cuda_array_interface__
        dt = np.dtype(cai["typestr"])
        n = int(np.prod(cai["shape"])) * dt.itemsize
        raw = (ctypes.c_ubyte * n).from_address(cai["data"][0]) if n else bytearray(0)
        return _device(np.frombuffer(raw, dtype=dt).reshape(cai["shape"]))
    COUNTS["to_device"] += 1
    made = np.array(obj, dtype=dtype, copy=True)
    COUNTS["alloc_bytes"] += made.nbytes
    return _device(made)


def asnumpy(a):
    return a.get() if isinstance(a, ndarray) else np.asarray(a)


def _made(host):
    COUNTS["alloc"] += 1
    COUNTS["alloc_bytes"] += host.nbytes
    return _device(host)


def empty(shape, dtype=float):
    return _made(np.empty(shape, dtype))


def zeros(shape, dtype=float):
    return _made(np.zeros(shape, dtype))


def empty_like(a):
    return empty(a.shape, a.dtype)


def copyto(dst, src):
    """A device-to-device copy (``cupy.copyto``)."""
    np.copyto(dst.view(np.ndarray), np.asarray(src).view(np.ndarray))


def ascontiguousarray(a):
    if a.flags.c_contiguous:
        return a
    return _made(np.ascontiguousarray(a))


def from_dlpack(obj):
    return _device(np.from_dlpack(obj))


class _Stream:
    def synchronize(self):
        COUNTS["sync"] += 1


cuda = types.SimpleNamespace(get_current_stream=lambda: _Stream())


class CudaObject:
    """A device array of no known library: ``__cuda_array_interface__`` only."""

    def __init__(self, host):
        self._host = host

    @property
    def __cuda_array_interface__(self):
        h = self._host
        return {"shape": h.shape, "typestr": h.dtype.str, "version": 3,
                "data": (h.ctypes.data, False), "strides": None}

    @property
    def shape(self):
        return self._host.shape

    @property
    def dtype(self):
        return self._host.dtype


def torch_cuda(tensor):
    """A torch tensor that says it is on ``cuda:0``, over ``tensor``'s (host)
    memory: what the torch device paths see of a CUDA tensor."""
    import torch

    class FakeCudaTensor(torch.Tensor):
        @property
        def device(self):
            return torch.device("cuda", 0)

        @property
        def is_cuda(self):
            return True

        def __dlpack__(self, *args, **kwargs):
            return self.as_subclass(torch.Tensor).__dlpack__(*args, **kwargs)

        def __dlpack_device__(self):
            return (2, 0)           # kDLCUDA, device 0

    return torch.Tensor._make_subclass(FakeCudaTensor, tensor)


def install():
    """Register this module as ``cupy`` (returns the module that was there, or None)."""
    before = sys.modules.get("cupy")
    sys.modules["cupy"] = sys.modules[__name__]
    return before


def uninstall(before):
    if before is None:
        sys.modules.pop("cupy", None)
    else:
        sys.modules["cupy"] = before
