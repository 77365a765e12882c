"""Agreement across ranks before any communication of data.

Each rank validates its own inputs and turns a problem into an exception
object instead of raising it.  :func:`agree_on` then runs one small
Allreduce (an error flag and a fingerprint of the arguments); only when some
rank has a problem does a second exchange find which rank and why.  Every
rank raises (its own error, or a :class:`RemoteError` naming the rank at
fault) or none does.  No rank is left
waiting in a collective that its peers never enter.
"""

import hashlib

from ..core.errors import MismatchError, RemoteError, ShapeError
from ..core.mesh import Mesh
from ..planning import profile as profiles
from .comm import base_comm, mpi

__all__ = ["raise_together", "fingerprint", "agree_on", "agree_flags", "check_together"]


def raise_together(comm, error, what="mpiredist"):
    """Raise on every rank of ``comm`` if ``error`` is not None on any rank.

    ``error`` is this rank's exception (or None).  Costs one small allgather.
    """
    agree_on(comm, what, error)


def fingerprint(*values):
    """A short stable digest of the ``str`` of ``values``."""
    text = "\x1f".join(str(v) for v in values)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def agree_on(comm, what, error=None, **values):
    """Raise on every rank unless all ranks pass the same ``values``.

    ``what`` names the call in the message; ``error`` is this rank's own
    validation error, combined into the same exchange.
    """
    agree_flags(comm, what, error, values)


def agree_flags(comm, what, error=None, same=None, every=None):
    """One small collective: raise together, or return the AND of ``every``.

    ``same`` (a dict) must be equal on every rank, else every rank raises
    :class:`MismatchError`; ``error`` (this rank's exception or None) is
    raised on its rank and a :class:`RemoteError` on the others.  ``every``
    (a dict of booleans) comes back as ``{key: true on every rank}``: the
    facts that decide a path every rank must take alike.
    """
    every = dict(every or {})
    mine = {k: str(v) for k, v in (same or {}).items()}
    if comm is None or comm.Get_size() == 1:
        if error is not None:
            raise error
        return every
    ok, flags = _all_fine(comm, error, mine, list(every.values()))
    if ok:
        return dict(zip(every, flags))
    text = None if error is None else f"{type(error).__name__}: {error}"
    gathered = comm.allgather((text, mine))      # slow path: find the culprit
    raise_together_from(gathered, error, what, comm.Get_rank())
    raise AssertionError("unreachable: ranks disagreed but nothing was raised")


def _all_fine(comm, error, mine, every=()):
    """One Allreduce: no rank has an error, all fingerprints are equal, and
    which of the ``every`` flags hold on every rank."""
    import numpy as np
    from mpi4py import MPI
    h = int(fingerprint(*sorted(mine.items())), 16) >> 2
    flags = np.array([error is not None, h, -h, *(not f for f in every)], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, flags, op=MPI.MAX)
    return flags[0] == 0 and flags[1] == -flags[2], [not f for f in flags[3:]]


def raise_together_from(gathered, error, what, rank):
    bad = [(r, t) for r, (t, _) in enumerate(gathered) if t is not None]
    if bad:
        if error is not None:
            raise error
        r, first = bad[0]
        more = f" (and {len(bad) - 1} more rank(s))" if len(bad) > 1 else ""
        raise RemoteError(f"{what}: rank {r} rejected the call{more}: {first}")
    ref = gathered[0][1]
    for r, (_, vals) in enumerate(gathered):
        for key in ref:
            if vals.get(key) != ref[key]:
                raise MismatchError(f"{what}: ranks disagree on {key}: rank 0 has "
                                    f"{ref[key]}, rank {r} has {vals.get(key)}")


def check_together(what, mesh, body, every=None):
    """Run ``body(mesh, rank) -> (result, values)`` on every rank; raise together.

    Any problem on any rank -- a bad mesh, a ValueError from validation, or
    an argument of the wrong type -- raises on every rank (one small
    collective), so that no rank is left waiting in a later collective;
    ``values`` must be equal on every rank, and so must the planner's
    machine profile (:func:`mpiredist.planning.profile.current`).  ``every``, if given, is a
    callable ``result -> dict of bool`` whose AND over ranks comes back; it
    gets ``None`` on a rank whose ``body`` failed and must return the same
    keys then.
    Returns ``(mesh, result)``, or ``(mesh, result, flags)`` with ``every``.
    """
    try:
        mesh = mesh if isinstance(mesh, Mesh) else Mesh(mesh)
        comm = base_comm(mesh)
    except ValueError as exc:
        agree_on(mpi().COMM_WORLD, what, exc)
        raise
    rank = comm.Get_rank()
    result, values, error = None, {}, None
    try:
        result, values = body(mesh, rank)
        # Plans depend on the machine profile: a rank that read another file
        # (or none) would run other MPI calls; disagreeing raises instead.
        values = dict(values, profile=profiles.current().key)
    except ValueError as exc:
        error = exc
    except (TypeError, AttributeError) as exc:
        error = ShapeError(f"rank {rank}: {what}: argument of the wrong type: {exc}")
    # every rank sends the same flags, also a rank whose body failed (result None)
    flags = agree_flags(comm, what, error, values, every(result) if every is not None else {})
    return (mesh, result, flags) if every is not None else (mesh, result)
