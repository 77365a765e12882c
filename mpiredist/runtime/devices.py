"""Device (CUDA) arrays: whether their buffers go to the transport, and the staged exchange.

Whether device buffers go to the transport itself (a CUDA-aware MPI) or are
staged through host memory is agreed once per group (:func:`gpu_support`)
and kept with it: every rank takes the same path.  Staged, a move is one
exchange from the source layout to the target layout whose every part goes
through host rings (:func:`staged_exchange`, the one factory of such
exchanges): each part is copied from the device into the host send ring,
sent, received into the host receive ring and copied (or added) into the
device result, in the pipeline of :mod:`mpiredist.runtime.p2p`, so the
copies of one part overlap the messages of the others.  Host memory: the
rings, within W; device memory: the block, the result and one part.
"""

import os

from ..core.errors import ShapeError
from .agree import agree
from .context import Context
from .exchange import Exchange

__all__ = ["gpu_support", "gpu_aware", "staged_exchange", "STAGING_ENV"]

STAGING_ENV = "MPIREDIST_GPU_STAGING"


def gpu_support(base):
    """``(aware, staging)`` for device arrays on ``base``, agreed by its ranks
    (collective on first use: one agreement, then kept with the group).

    ``aware``: every rank's transport takes device buffers itself (for MPI:
    the library is CUDA-aware, :func:`mpiredist.runtime.mpi.cuda_aware`);
    ``staging``: no rank forbids staging device arrays through host memory
    (``MPIREDIST_GPU_STAGING=0`` forbids it).
    """
    found = base.kept.get("gpu")
    if found is None:
        staging = os.environ.get(STAGING_ENV, "").strip() not in ("0", "false", "no")
        flags = agree(base, "device buffers", None, None,
                      {"aware": bool(base.device_aware), "staging": staging})
        found = base.kept["gpu"] = (flags["aware"], flags["staging"])
    return found


def gpu_aware(base, what):
    """Whether device buffers go to the transport directly on ``base`` (agreed
    once per group, collective on the first device run); raises on every
    rank when they cannot run at all (not aware, and staging forbidden)."""
    aware, staging = gpu_support(base)
    if not aware and not staging:
        hint = getattr(base, "aware_hint", "")
        raise ShapeError(f"{what}: device arrays, but the transport does not take device "
                         "buffers (the MPI library is not CUDA-aware: MPIX_Query_cuda_support, "
                         "or MPIREDIST_GPU_AWARE=0) and MPIREDIST_GPU_STAGING=0 forbids "
                         f"staging through host memory{'; ' + hint if hint else ''}")
    return aware


def staged_exchange(group, dtype, sources, targets, workspace, op, segments=None):
    """The exchange from ``sources`` to ``targets`` with every part staged
    through host rings (the one factory of staged exchanges)."""
    return Exchange(Context(group, dtype, staged=True), sources, targets, workspace, op,
                    views=True, segments=segments)
