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

from ..core.errors import MismatchError, RemoteError

__all__ = ["raise_together", "fingerprint", "agree_on"]


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
    if comm is None or comm.Get_size() == 1:
        if error is not None:
            raise error
        return
    mine = {k: str(v) for k, v in values.items()}
    if _all_fine(comm, error, mine):
        return
    text = None if error is None else f"{type(error).__name__}: {error}"
    gathered = comm.allgather((text, mine))      # slow path: find the culprit
    raise_together_from(gathered, error, what, comm.Get_rank())


def _all_fine(comm, error, mine):
    """One Allreduce: no rank has an error and all fingerprints are equal."""
    import numpy as np
    from mpi4py import MPI
    h = int(fingerprint(*sorted(mine.items())), 16) >> 2
    flags = np.array([error is not None, h, -h], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, flags, op=MPI.MAX)
    return flags[0] == 0 and flags[1] == -flags[2]


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
