"""The one agreement across ranks, before any data moves.

Each rank validates its own inputs and turns a problem into an exception
object instead of raising it.  :func:`agree` then runs one small Allreduce
of a fixed size on every call site: three 64-bit words under bitwise OR,
holding an error flag, up to :data:`FLAGS` booleans whose AND over ranks
decides a path every rank must take alike (such as a donation), and a
fingerprint of the call (24 bits) and of the values that must be equal
(40 bits) beside its complement: the ranks' fingerprints are equal where
no bit is set in both the OR of the fingerprints and the OR of their
complements.  Three words because MPICH's Allreduce takes recursive
doubling for fewer elements than the power of two of the group, and a
slower reduce-scatter and all-gather from there: at 8 ranks on 2 cores,
after a barrier, 9 words took 1.07 ms, 3 words 0.81 ms.  A rank that cannot know the values yet (it holds no
block) says so and is left out of their comparison.
Only when some rank has a problem does a second exchange find which rank
and why.  Every rank raises or none does, and the message is the same on
every rank: that of the first rank at fault, naming it once
(``"rank 2: ..."``).  That rank raises its own exception; the others raise
the matching remote class (:func:`mpiredist.core.errors.remote`), so
``except mr.ShapeError`` catches it everywhere and ``isinstance(e,
mr.RemoteError)`` tells a rank that was not at fault.

Every agreement of the package has the same size and names its call in
the fingerprint, so ranks that reach different agreements (different
arguments on one rank) meet in one Allreduce and raise
:class:`~mpiredist.MismatchError` together instead of hanging.
:func:`check_together` runs a validation body and agrees on its outcome.
"""

import hashlib
import re

import numpy as np

from ..core.errors import MismatchError, MpiredistError, ShapeError, remote
from ..core.mesh import Mesh
from ..planning import profile as profiles
from .groups import base_group, world_group

__all__ = ["agree", "check_together", "fingerprint", "Same", "FLAGS"]

# The booleans one agreement carries at most (all agreements have one size).
FLAGS = 4
# Bits of the call's and of the values' fingerprints in one word.
_CALL_BITS, _VALUE_BITS = 24, 40
_CALL_MASK, _VALUE_MASK = (1 << _CALL_BITS) - 1, (1 << _VALUE_BITS) - 1


def fingerprint(*values):
    """A short stable digest of the ``str`` of ``values``."""
    text = "\x1f".join(str(v) for v in values)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


_DIGESTS = {}           # (what, sorted values) -> agree()'s fingerprint words
_DIGESTS_KEPT = 4096    # distinct calls remembered, at most (a Transfer's run is one)


def _digests(what, items):
    """``(known, known's complement, call, call's complement)``: the words a rank
    sends (``call`` alone where it does not know the values), worked out once
    per distinct call (a sha1 per run was a tenth of a small run's Python)."""
    key = (what, items)
    found = _DIGESTS.get(key)
    if found is None:
        if len(_DIGESTS) >= _DIGESTS_KEPT:
            _DIGESTS.clear()
        h = int(fingerprint(what), 16) & _CALL_MASK
        v = int(fingerprint(what, *items), 16) & _VALUE_MASK
        found = _DIGESTS[key] = (h << _VALUE_BITS | v,
                                 (~h & _CALL_MASK) << _VALUE_BITS | (~v & _VALUE_MASK),
                                 h << _VALUE_BITS, (~h & _CALL_MASK) << _VALUE_BITS)
    return found


class Same:
    """Values every rank must agree on, with their fingerprint worked out once:
    what a compiled job passes to :func:`agree` on each run (no formatting
    or hashing per run)."""

    __slots__ = ("values", "words")

    def __init__(self, what, values):
        self.values = {k: str(v) for k, v in values.items()}
        self.words = _digests(what, tuple(sorted(self.values.items())))

    def __repr__(self):
        return f"Same({self.values!r})"


def agree(group, what, error=None, same=None, every=None, knows=True):
    """One small collective: raise on every rank together, or return the AND of ``every``.

    Parameters
    ----------
    group : Group or None
        Every rank of it calls :func:`agree` (None or one rank: local only).
    what : str
        The call, named in messages and in the fingerprint.
    error : Exception or None
        This rank's validation error: raised on this rank if it is the first
        at fault, as the remote class of the first error elsewhere.
    same : dict or Same, optional
        Values that must be equal on every rank (by ``str``), else every rank
        raises :class:`~mpiredist.MismatchError` naming the first that differs.
        A :class:`Same` made with the same ``what`` carries them worked out.
    every : dict of bool, optional
        At most :data:`FLAGS` facts; comes back as ``{key: true on every rank}``.
    knows : bool
        False on a rank that cannot say ``same`` yet (it holds no block and
        learns the values from the others afterwards): its ``same`` is not
        compared, the others' must still be equal among themselves.  The
        caller learns whether every rank knew by an ``every`` flag of its own.

    Returns
    -------
    dict of bool
    """
    every = {} if every is None else every
    if len(every) > FLAGS:
        raise ValueError(f"agree({what!r}): at most {FLAGS} flags, given {len(every)}")
    if group is None or group.size == 1:
        if error is not None:
            raise error
        return dict(every)
    if type(same) is Same:
        mine, (known, known_not, call, call_not) = same.values, same.words
    else:
        mine = {k: str(v) for k, v in (same or {}).items()}
        known, known_not, call, call_not = _digests(what, tuple(sorted(mine.items())))
    bits = int(error is not None)
    for i, f in enumerate(every.values()):
        bits |= (not f) << (i + 1)          # set where the fact is false on this rank
    # a rank that does not know the values leaves their bits 0: OR ignores it
    values = np.array([bits, known if knows else call, known_not if knows else call_not],
                      dtype=np.uint64)
    group.bitwise_or(values)
    bits = int(values[0])
    if not bits & 1 and not int(values[1]) & int(values[2]):
        return {k: not bits >> (i + 1) & 1 for i, k in enumerate(every)}
    text = None if error is None else (type(error).__name__, str(error))
    gathered = group.allgather_object((text, what, mine if knows else None))   # the culprit
    _raise(gathered, error, what, group.rank)
    raise AssertionError("unreachable: ranks disagreed but nothing was raised")


def _raise(gathered, error, what, rank):
    """Raise the first culprit's error (or the first mismatch) on this rank.

    A problem that only some ranks have is named by its first rank
    (``"rank r: ..."``); one that every rank has in the same words is
    raised as it is, each rank with its own exception object.
    """
    bad = [(r, t) for r, (t, _, _) in enumerate(gathered) if t is not None]
    if bad:
        first, (name, message) = bad[0]
        if len(bad) < len(gathered) and not message.startswith(f"rank {first}"):
            message = f"rank {first}: {message}"
        if len(bad) < len(gathered) or any(t != bad[0][1] for _, t in bad):
            alike = [r for r, t in bad[1:] if _problem(t) == _problem(bad[0][1])]
            others = len(bad) - 1 - len(alike)
            if alike:
                shown = ", ".join(map(str, alike[:8])) + (", ..." if len(alike) > 8 else "")
                message += f" (also on rank(s) {shown})"
            if others:
                message += f" (and {others} more rank(s) with other problems)"
        if error is not None and (type(error).__name__, str(error)) == (name, message):
            raise error
        if rank == first:
            raise _again(error, message) from error
        raise remote(name, message, first) from error
    knowing = [(r, vals) for r, (_, _, vals) in enumerate(gathered) if vals is not None]
    if knowing:                        # the first rank that knows: its words on every rank
        first, ref = knowing[0]
        common = [k for k in ref if all(k in vals for _, vals in knowing)]
        for key in common + [k for k in ref if k not in common]:
            for r, vals in knowing:
                if vals.get(key) != ref.get(key):
                    raise MismatchError(f"{gathered[0][1]}: ranks disagree on {key}: rank "
                                        f"{first} has {ref.get(key)}, rank {r} has "
                                        f"{vals.get(key)}")
    found = ", ".join(f"rank {r}: {c}" for r, (_, c, _) in enumerate(gathered))
    raise MismatchError(f"{what}: ranks are in different calls ({found})")


def _problem(text):
    """``(class, message)`` with its numbers blanked: the same problem on two
    ranks (their ranks, their shapes) reads the same."""
    name, message = text
    return name, re.sub(r"\d+", "#", message)


def _again(error, message):
    """``error``'s class with ``message`` (this package's errors), else ``error``."""
    if isinstance(error, MpiredistError):
        return type(error)(message)
    return error


def check_together(what, mesh, body, every=None):
    """Run ``body(mesh, rank) -> (result, values)`` on every rank; agree on the outcome.

    Any problem on any rank -- a bad mesh, a ValueError from validation, or
    an argument of the wrong type -- raises on every rank (one agreement),
    so that no rank is left waiting in a later collective; ``values`` must
    be equal on every rank, and so must the planner's machine profile
    (:func:`mpiredist.planning.profile.current`).  ``every``, if given, is a
    callable ``result -> dict of bool`` whose AND over ranks comes back; it
    gets ``None`` on a rank whose ``body`` failed and must return the same
    keys then.  Returns ``(mesh, result)``, or ``(mesh, result, flags)``
    with ``every``.
    """
    try:
        mesh = mesh if isinstance(mesh, Mesh) else Mesh(mesh)
        group = base_group(mesh)
    except ValueError as exc:
        agree(world_group(), what, exc)
        raise
    rank = group.rank
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
    flags = agree(group, what, error, values, every(result) if every is not None else {})
    return (mesh, result, flags) if every is not None else (mesh, result)
