"""The collective operations of a save and a load, all of them, in one place.

A save runs three: the agreement on the arguments (every rank raises
before anything is written), one allgather of what each rank wrote (small
Python objects: offsets and checksums, or the error that stopped it), and
a last agreement once rank 0 has published (no rank returns before the
checkpoint is visible, or every rank raises).  A load runs two agreements:
before anything is read, and after (a checksum mismatch or an I/O error on
any rank raises on every rank).  Between them, a failure this package did
not expect aborts the job (:func:`guarded`), as a redistribution does,
so that no rank waits forever for another.  All of them go through the
transport seam (:class:`~mpiredist.runtime.transport.Group`): MPI under
``mpiexec``, torch.distributed under torchrun.
"""

from ..core.errors import CheckpointError, MpiredistError, ShapeError
from ..runtime import failure
from ..runtime.agree import agree
from ..runtime.groups import base_group, world_group

__all__ = ["world", "communicator", "rank_size", "agree_on", "agree_error", "allgather", "guarded"]


def world():
    """The group of a call without a mesh: the job's (:func:`world_group`)."""
    return world_group()


def communicator(mesh):
    """The group ``mesh`` runs on."""
    return base_group(mesh)


def rank_size(group):
    """``(rank, size)`` of this process in ``group``."""
    return group.rank, group.size


def agree_on(comm, what, body):
    """Run ``body() -> (result, values)``; every rank raises if any failed or the
    ``values`` differ, else every rank gets its ``result``."""
    result, values, error = None, {}, None
    try:
        result, values = body()
    except (ValueError, MpiredistError) as exc:
        error = exc
    except (TypeError, AttributeError) as exc:
        rank = comm.rank
        error = ShapeError(f"rank {rank}: {what}: argument of the wrong type: {exc}")
    except Exception as exc:    # noqa: BLE001 - one rank's file or memory trouble
        # (OSError, a truncated zip or pickle of a DCP file, MemoryError's kin):
        # raised on every rank by the agreement, never left to this rank alone
        error = CheckpointError(f"rank {comm.rank}: {what}: {type(exc).__name__}: {exc}")
    agree(comm, what, error, values)
    return result


def agree_error(comm, what, error):
    """Every rank raises ``error`` (the first rank's) if any rank has one."""
    agree(comm, what, error)


def allgather(comm, obj):
    """Every rank's ``obj`` (small Python objects), in rank order."""
    return comm.allgather_object(obj)


def guarded(comm, what, run, *args):
    """``run(*args)``; an exception escaping it aborts the job (see
    :func:`mpiredist.runtime.failure.guard`)."""
    return failure.guard(comm, what, run, *args)
