"""Array backends: numpy, and CuPy for CUDA-aware MPI.

CuPy is imported here and nowhere else.  A CuPy array is passed to mpi4py
through ``__cuda_array_interface__``; the MPI library must be CUDA-aware, and
the current stream is synchronised before every MPI call.
"""

import numpy as np

__all__ = ["array_module", "is_gpu", "synchronize", "cupy_or_error", "c_contiguous"]


def cupy_or_error():
    """Import CuPy or raise ImportError with how to install it."""
    try:
        import cupy
    except ImportError as exc:
        raise ImportError("CuPy is required for GPU arrays: pip install "
                          "mpiredist[cupy] (and a CUDA-aware MPI)") from exc
    return cupy


def is_gpu(array):
    """True for CuPy (or other CUDA) arrays."""
    return hasattr(array, "__cuda_array_interface__")


def array_module(array):
    """``numpy`` or ``cupy``: the module that owns ``array``."""
    if is_gpu(array):
        return cupy_or_error()
    return np


def c_contiguous(array):
    """True if ``array`` (numpy or CuPy) is C-contiguous."""
    flags = array.flags
    return flags["C_CONTIGUOUS"] if hasattr(flags, "__getitem__") else flags.c_contiguous


def synchronize(array):
    """Wait for pending GPU work on ``array`` before MPI reads or writes it."""
    if is_gpu(array):
        cupy_or_error().cuda.get_current_stream().synchronize()
