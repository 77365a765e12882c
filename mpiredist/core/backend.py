"""Array backends: the libraries whose arrays mpiredist takes, and what it needs of them.

Inside, the runtime works on two kinds of *native* arrays only: numpy arrays
(host memory) and CuPy arrays (device memory, passed to mpi4py through
``__cuda_array_interface__``).  At the public boundary
(:meth:`mpiredist.Transfer.run`) a caller's array is viewed as a native one
by its :class:`Backend`, without copying, and the result is handed back in
the caller's library, on the same device, with the same dtype:

==========  ==========================================  ===============================
backend     arrays                                      native view (no copy)
==========  ==========================================  ===============================
``numpy``   ``numpy.ndarray``                           itself
``torch``   ``torch.Tensor`` on the CPU                 ``Tensor.numpy()``
``cupy``    ``cupy.ndarray``                            itself
``torch``   ``torch.Tensor`` on a CUDA device           ``cupy.from_dlpack``
``cuda``    anything with ``__cuda_array_interface__``  ``cupy.asarray`` (a CuPy array
            (Numba device arrays, ...)                  comes back)
``dlpack``  anything else with ``__dlpack__`` on the    ``numpy.from_dlpack`` (read-only
            host (``jax.Array`` on the CPU, ...)        for JAX; bfloat16 through
                                                        ``numpy.asarray``); back through
                                                        its array namespace
                                                        (``jax.numpy.from_dlpack``, which
                                                        copies)
==========  ==========================================  ===============================

bfloat16 has no numpy dtype of its own: a bfloat16 tensor is viewed as
``ml_dtypes.bfloat16`` (the dtype JAX uses), which numpy can add, so partial
sums of it are combined by numpy (MPI has no bfloat16 reduction).  CuPy has
no bfloat16 at all: on the device a bfloat16 tensor is viewed as a CuPy
``int16`` array of its bits (:func:`device_dtype`), which move as they are
and come back as bfloat16 (:meth:`Backend.wrap`); partial sums of them are
combined on the device through float32 (:func:`combiner`), bit for bit as
numpy combines ``ml_dtypes.bfloat16`` on the host.

A tensor that requires grad is refused: mpiredist moves values, not the
autograd graph (pass ``t.detach()``).  CuPy is imported here and nowhere
else; torch and ml_dtypes only when an array of theirs is seen.
"""

import functools
import math
import sys

import numpy as np

from .errors import ShapeError

__all__ = ["Backend", "backend_of", "as_dtype", "dtype_of", "dtype_text", "device_dtype",
           "combiner", "array_module", "bytes_as",
           "is_gpu", "synchronize", "cupy_or_error", "c_contiguous", "copy_into",
           "on_device_of", "KINDS"]

# every backend name, in the order errors list them
KINDS = ("numpy", "torch", "cupy", "cuda", "dlpack")


def cupy_or_error():
    """Import CuPy or raise ImportError with how to install it."""
    try:
        import cupy
    except ImportError as exc:
        raise ImportError("CuPy is required for GPU arrays: pip install "
                          "mpiredist[cupy]") from exc
    return cupy


def is_gpu(array):
    """True for CuPy (or other CUDA) arrays."""
    return type(array) is not np.ndarray and hasattr(array, "__cuda_array_interface__")


def array_module(array):
    """``numpy`` or ``cupy``: the module that owns native ``array``."""
    if is_gpu(array):
        return cupy_or_error()
    return np


def c_contiguous(array):
    """True if native ``array`` (numpy or CuPy) is C-contiguous."""
    flags = array.flags
    return flags["C_CONTIGUOUS"] if hasattr(flags, "__getitem__") else flags.c_contiguous


def synchronize(array):
    """Wait for pending GPU work on ``array`` before MPI reads or writes it."""
    if is_gpu(array):
        cupy_or_error().cuda.get_current_stream().synchronize()


def bytes_as(buffer, at, dtype, shape):
    """The bytes of the 1-D byte ``buffer`` (host or device) from ``at`` as an
    array of ``dtype`` and ``shape``: a view, no copy."""
    dtype = np.dtype(dtype)
    return buffer[at:at + math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)


# Bytes copied between host and device memory by mpiredist (copy_into) in this
# process: what a staged device run touches on the host; none when aware.
HOST_DEVICE_BYTES = [0]


def copy_into(dst, src):
    """``dst[...] = src`` between any two of host and device arrays of one shape:
    host to host in place, device to host by ``get(out=)`` (a host ``dst``
    that is C-contiguous, as a ring span is), host to device by ``set`` (a
    contiguous ``dst``) or through a device copy of ``src``, device to
    device in place.  Waits for the device (a ring span is reused after).
    Bytes between host and device count in :data:`HOST_DEVICE_BYTES`."""
    if type(dst) is np.ndarray and type(src) is np.ndarray:    # host, no subclass: at once
        dst[...] = src
        return
    to_gpu, from_gpu = is_gpu(dst), is_gpu(src)
    if to_gpu != from_gpu:
        HOST_DEVICE_BYTES[0] += dst.nbytes
    if not to_gpu and not from_gpu:
        dst[...] = src
    elif not to_gpu:
        src.get(out=dst)
    elif from_gpu:
        dst[...] = src
    elif c_contiguous(dst):
        dst.set(np.ascontiguousarray(src))
    else:
        dst[...] = cupy_or_error().asarray(src)
    if to_gpu or from_gpu:
        cupy_or_error().cuda.get_current_stream().synchronize()


def on_device_of(like, array):
    """``array`` where ``like`` is: a host ``array`` copied to the device when
    ``like`` is a device array (one part, for combining it there)."""
    if is_gpu(like) and not is_gpu(array):
        return cupy_or_error().asarray(array)
    return array


# ------------------------------------------------------------------ dtypes

def _bfloat16():
    try:
        import ml_dtypes
    except ImportError:
        raise ShapeError("bfloat16 arrays need ml_dtypes (numpy's bfloat16): pip install "
                         "mpiredist[torch] or ml_dtypes") from None
    return np.dtype(ml_dtypes.bfloat16)


def device_dtype(dtype):
    """The dtype of the device (CuPy) arrays that hold values of ``dtype``:
    ``int16`` for bfloat16, which CuPy lacks (the bits, moved as they are),
    else ``dtype`` itself."""
    dtype = np.dtype(dtype)
    return np.dtype(np.int16) if _is_bfloat16(dtype) else dtype


def combiner(ufunc, dtype, device):
    """How partial values of ``dtype`` combine by ``ufunc`` (``numpy.add``,
    ``numpy.maximum``, ...): a function called as ``f(acc, part, out=acc)``.

    The ufunc itself, which CuPy arrays take through ``__array_ufunc__``;
    for ``device`` arrays of bfloat16, which hold its int16 bits
    (:func:`device_dtype`), one that combines the bits as bfloat16 values
    (:func:`_combine_bits`).  Decided by the dtype and the agreed array
    library: alike on every rank.
    """
    if not device or device_dtype(dtype) == np.dtype(dtype):
        return ufunc
    found = _BITS.get(ufunc)
    if found is None:
        found = _BITS[ufunc] = functools.partial(_combine_bits, ufunc)
    return found


_BITS = {}      # ufunc -> its combiner of bfloat16 bits


def _combine_bits(ufunc, a, b, out):
    """``out = ufunc(a, b)`` for bfloat16 values held as int16 bits (numpy
    or CuPy arrays, through numpy's ufuncs), as ``ml_dtypes`` computes it on
    the host: both widened to float32 (exact), combined in float32, rounded
    to the nearest bfloat16, ties to even; a NaN becomes the quiet NaN of
    its sign.  ``maximum`` and ``minimum`` pick one of the two, NaN first.
    Bit for bit equal to numpy's ``ml_dtypes.bfloat16`` result, but for
    which NaN a NaN operand gives (the hardware's choice).  Temporaries:
    9 bytes an element (two float32 arrays and a mask).
    """
    wa, wb = _widen(a), _widen(b)
    fa, fb = wa.view(np.float32), wb.view(np.float32)
    if ufunc is np.maximum or ufunc is np.minimum:
        keep = np.greater(fa, fb) if ufunc is np.maximum else np.less(fa, fb)
        keep |= np.isnan(fa)
        picked = b.copy()
        picked[keep] = a[keep]
        out[...] = picked
        return out
    ufunc(fa, fb, out=fa)
    nan = np.isnan(fa)
    quiet = (np.right_shift(wa[nan], 16) & 0x8000) | 0x7FC0     # the sign, before rounding
    np.right_shift(wa, 16, out=wb)
    wb &= 1
    wb += 0x7FFF                                                # ties to even
    wa += wb
    wa >>= 16
    bits = out.view(np.uint16)
    bits[...] = wa
    bits[nan] = quiet
    return out


def _widen(bits):
    """float32 bits (as uint32) of the bfloat16 values whose bits are ``bits``."""
    wide = bits.view(np.uint16).astype(np.uint32)
    wide <<= 16
    return wide


def _is_torch_dtype(d):
    return type(d).__module__ == "torch" and type(d).__name__ == "dtype"


_TORCH_DTYPES = {}


def _from_torch_dtype(d):
    found = _TORCH_DTYPES.get(d)
    if found is None:
        torch = sys.modules["torch"]
        if d == torch.bfloat16:
            found = _bfloat16()
        else:
            try:
                found = torch.empty((), dtype=d).numpy().dtype
            except (TypeError, RuntimeError):
                raise ShapeError(f"torch dtype {d} has no numpy dtype; mpiredist moves "
                                 "numpy-representable dtypes and bfloat16") from None
        _TORCH_DTYPES[d] = found
    return found


def as_dtype(d):
    """A numpy dtype from a numpy or torch dtype (``torch.bfloat16``:
    ``ml_dtypes.bfloat16``), the text ``"bfloat16"`` (ml_dtypes imported on
    demand) or anything ``numpy.dtype`` takes."""
    if _is_torch_dtype(d):
        return _from_torch_dtype(d)
    if isinstance(d, str) and d == "bfloat16":
        return _bfloat16()
    return np.dtype(d)


def dtype_text(dtype):
    """``dtype`` as text that :func:`as_dtype` reads back as the same dtype on
    any rank: its ``str`` (byte order included), or its name where the
    ``str`` does not say it (bfloat16's is ``'<V2'``, two bytes of void)."""
    dtype = as_dtype(dtype)
    return dtype.str if np.dtype(dtype.str) == dtype else dtype.name


def dtype_of(array):
    """The numpy dtype of any array this module takes (see :func:`as_dtype`)."""
    if not hasattr(array, "__array_interface__") and hasattr(array, "__cuda_array_interface__") \
            and not hasattr(array, "dtype"):
        return np.dtype(array.__cuda_array_interface__["typestr"])
    return as_dtype(array.dtype)


# ------------------------------------------------------------------ backends

def _is_tensor(array):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(array, torch.Tensor)


class Backend:
    """What mpiredist does with one library's arrays: view them as native
    arrays (:meth:`native`) and hand results back (:meth:`wrap`).

    ``name`` is one of :data:`KINDS` (the ranks agree on it); ``device``
    True when the arrays live in GPU memory.  Small and immutable.
    """

    __slots__ = ("name", "device", "_like")

    def __init__(self, name, device, like=None):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "device", device)
        object.__setattr__(self, "_like", like)     # an array of the library (dlpack: its namespace)

    def __setattr__(self, key, value):
        raise AttributeError("Backend is immutable")

    def __eq__(self, other):
        return isinstance(other, Backend) and (self.name, self.device) == (other.name,
                                                                           other.device)

    def __hash__(self):
        return hash((self.name, self.device))

    def __repr__(self):
        return f"Backend({self.name!r}, device={self.device})"

    def __str__(self):
        return f"{self.name} ({'device' if self.device else 'host'})"

    def native(self, array, what="local block"):
        """``array`` as a numpy (host) or CuPy (device) array of the same memory."""
        if self.name in ("numpy", "cupy"):
            return np.asarray(array) if isinstance(array, np.generic) else array
        if self.name == "cuda":
            return cupy_or_error().asarray(array)
        if self.name == "dlpack":
            try:
                return np.from_dlpack(array)
            except (BufferError, RuntimeError, TypeError):   # a dtype DLPack lacks (bfloat16)
                view = np.asarray(array)
                if view.dtype == object:
                    raise ShapeError(f"{what}: a {type(array).__name__} that numpy cannot "
                                     "view (DLPack and numpy both refused it)") from None
                return view
        # torch
        if array.requires_grad:
            raise ShapeError(f"{what} is a tensor that requires grad; mpiredist moves "
                             "values, not the autograd graph: pass tensor.detach()")
        torch = sys.modules["torch"]
        bf16 = array.dtype == torch.bfloat16
        if self.device:     # bfloat16: its bits as int16 (CuPy has no bfloat16)
            return cupy_or_error().from_dlpack(array.view(torch.int16) if bf16 else array)
        if bf16:
            return array.view(torch.int16).numpy().view(_bfloat16())
        _from_torch_dtype(array.dtype)      # a clear error for dtypes numpy lacks
        return array.numpy()

    def wrap(self, native, dtype=None):
        """The native result ``native`` in this backend's library (no copy).

        ``dtype``: the values' dtype, where the native array holds other
        bits (a bfloat16 result on the device is CuPy ``int16``: it comes
        back as a bfloat16 tensor; CuPy and CUDA objects keep ``int16``)."""
        if native is None or self.name in ("numpy", "cupy", "cuda"):
            return native
        if self.name == "dlpack":
            space = self._like
            if space is None:
                return native
            try:
                return space.from_dlpack(native)
            except (BufferError, RuntimeError, TypeError):   # a dtype DLPack lacks (bfloat16)
                return space.asarray(native)
        torch = sys.modules["torch"]
        if self.device:
            tensor = torch.from_dlpack(native)
            if _is_bfloat16(dtype) and tensor.dtype == torch.int16:
                tensor = tensor.view(torch.bfloat16)
            return tensor
        if _is_bfloat16(native.dtype):
            return torch.from_numpy(native.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(native)


def _is_bfloat16(dtype):
    """True for ``ml_dtypes.bfloat16`` (never imports it: a process that has
    not imported it has no such array).  Not ``dtype == bfloat16-or-None``:
    numpy reads ``None`` as float64, so float64 would pass."""
    ml = sys.modules.get("ml_dtypes")
    return ml is not None and np.dtype(dtype) == np.dtype(ml.bfloat16)


_NUMPY = Backend("numpy", False)
_CUPY = Backend("cupy", True)


def backend_of(array, what="local block"):
    """The :class:`Backend` of ``array``; ShapeError for anything else."""
    if type(array) is np.ndarray:                   # the common case, at once
        return _NUMPY
    if isinstance(array, np.ndarray) and not hasattr(array, "__cuda_array_interface__"):
        return _NUMPY
    if isinstance(array, np.generic):
        return _NUMPY
    if _is_tensor(array):
        return Backend("torch", array.device.type != "cpu")
    if type(array).__module__.split(".")[0] == "cupy":
        return _CUPY
    if hasattr(array, "__cuda_array_interface__"):
        return Backend("cuda", True)
    if hasattr(array, "__dlpack__"):
        device = getattr(array, "__dlpack_device__", None)
        if device is not None and device()[0] != 1:        # kDLCPU
            raise ShapeError(f"{what}: a {type(array).__name__} on DLPack device "
                             f"{tuple(device())}; mpiredist takes host DLPack arrays, "
                             "and device arrays through __cuda_array_interface__")
        space = getattr(array, "__array_namespace__", None)
        return Backend("dlpack", False, None if space is None else space())
    raise ShapeError(f"{what} must be an array (numpy, torch, CuPy, or one that exposes "
                     f"__cuda_array_interface__ or __dlpack__), found {type(array).__name__}")
