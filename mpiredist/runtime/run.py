"""The one run path: every redistribution runs this skeleton.

A :class:`~mpiredist.Transfer` (on one mesh or between meshes), a
:class:`~mpiredist.TransferGroup`, the exchanges of the array operations
and the drop-ins (``mr.torch``, ``mr.heat``) are each a compiled *job*
(:class:`Job`): what its items' blocks must be, what its runs agree on, and
how it moves the data.  :func:`run` is the one skeleton they all run:

1. **inputs** -- each item's block and ``out=`` viewed as native arrays
   (numpy or CuPy, :meth:`Backend.native
   <mpiredist.core.backend.Backend.native>`) and checked against this
   rank's expected shapes (:mod:`mpiredist.runtime.inputs`); the job judges
   a donation and whether its bound fits this rank's memory;
2. **one agreement** (:func:`~mpiredist.runtime.agree.agree`): any
   problem raises on every rank before data moves; the ranks agree on the
   job, the array library and the flags that choose a path;
3. **guard** -- from here data moves, and a failure aborts the job
   (:mod:`mpiredist.runtime.failure`);
4. **execute** -- the job's own way of moving data;
5. **wrap** -- results back in the caller's array library.

A job made with ``checked=False`` skips the agreement: a rank whose arrays
are wrong still takes part with zeros, so that no rank waits for it, and
raises.  Nothing here formats text on a run: names and agreed values are
made once per job.
"""

import numpy as np

from ..core.backend import Backend, backend_of
from ..core.errors import ClosedError, MemoryBudgetError, MpiredistError, ShapeError
from .agree import Same, agree
from .devices import gpu_aware
from .failure import abort, on_failure
from .inputs import NOT_DONATED, check_block, check_out

__all__ = ["Job", "Item", "Verdict", "run", "HOST", "native_pair"]

HOST = backend_of(np.empty(0))


class Item:
    """One array of a job: this rank's source and target block shapes (None off
    the mesh) and the dtype, and its name in messages (None for a job of one
    array)."""

    __slots__ = ("source_shape", "target_shape", "dtype", "name")

    def __init__(self, source_shape, target_shape, dtype, name=None):
        self.source_shape = None if source_shape is None else tuple(source_shape)
        self.target_shape = None if target_shape is None else tuple(target_shape)
        self.dtype, self.name = np.dtype(dtype), name

    def __repr__(self):
        return (f"Item({self.source_shape}, {self.target_shape}, {self.dtype}"
                f"{'' if self.name is None else f', name={self.name!r}'})")


class Verdict:
    """What this rank's inputs allow, before the ranks agree: ``donation`` (a
    :class:`~mpiredist.runtime.inputs.Donation`), and ``fits``: the run that
    keeps the source fits this rank's memory."""

    __slots__ = ("donation", "fits")

    def __init__(self, donation=NOT_DONATED, fits=True):
        self.donation, self.fits = donation, fits


KEPT = Verdict()


class Job:
    """A compiled redistribution, as :func:`run` sees it.

    Subclasses set ``group`` (the base group: the agreement and abort run on
    it), ``items`` (a tuple of :class:`Item`), ``what`` (the agreement's
    name), ``name`` (the job in failure messages), ``identity`` (a dict of
    what every run must agree on), ``every_holds`` (every rank holds arrays:
    the array library joins the agreement), ``donate`` and ``checked``, and
    implement :meth:`execute`; :meth:`judge` by default allows no donation
    and checks no memory.
    """

    group = None
    items = ()
    what = "run"
    name = "a redistribution"
    identity = {}
    every_holds = True
    donate = False
    checked = True
    freed = False
    views = False       # outs may be strided views of larger arrays

    def judge(self, natives, outs, extra):
        """This rank's :class:`Verdict`; raise a ValueError for what cannot run."""
        return KEPT

    def execute(self, natives, outs, kind, aware, flags, records, verdict):
        """Move the data (collective, guarded); return the native results.

        ``kind``: the agreed array library; ``aware``: device buffers go to
        the transport itself; ``flags``: the agreed flags; ``verdict``: this
        rank's own :class:`Verdict` (its donation's ``resizable`` and ``why``)."""
        raise NotImplementedError

    def closed(self):
        """Raise ClosedError if the job was freed."""
        if self.freed:
            raise ClosedError(f"rank {self.group.rank}: {self.name} was freed; make a new one")

    same_host = None        # the agreed values of a run of numpy arrays, once made

    def same(self, kind):
        """The agreed values of a run with arrays of library ``kind`` (made once;
        a job whose ranks may hold no arrays agrees without the library)."""
        if kind is HOST or not self.every_holds:
            if self.same_host is None:
                values = dict(self.identity)
                if self.every_holds:
                    values["kind"] = str(HOST)
                self.same_host = Same(self.what, values)
            return self.same_host
        found = self.__dict__.get("_same")
        if found is None:
            found = self.__dict__["_same"] = {}
        same = found.get(str(kind))
        if same is None:
            same = found[str(kind)] = Same(self.what, dict(self.identity, kind=str(kind)))
        return same


def run(job, blocks, outs, records=None, extra=0, error=None, agreed=None):
    """Run ``job`` on this rank's ``blocks`` (a sequence, one per item; None off
    the source mesh) into ``outs`` (one per item, or None); return the target
    blocks, in the blocks' library (collective; see the module doc).

    ``extra``: references to the blocks beyond those the entry point allows
    (a donation counts them, :func:`~mpiredist.runtime.inputs.references`);
    ``error``: a problem the entry point found in this rank's arguments
    (raised on every rank by the agreement).  ``agreed``: the entry point
    has agreed on everything already, this array library included (a
    :class:`~mpiredist.core.backend.Backend`): the run makes no agreement of
    its own (a drop-in whose own agreement taught every rank the source).
    """
    if agreed is not None or not job.checked:
        if error is not None:
            raise error
        return _unchecked(job, blocks, outs, records, agreed)
    group = job.group
    kind, natives, targets, verdict, holds = HOST, blocks, outs, KEPT, True
    if error is None:
        try:
            if job.freed:
                job.closed()
            items = job.items
            if len(items) == 1 and outs[0] is None and type(blocks[0]) is np.ndarray \
                    and blocks[0].shape == items[0].source_shape \
                    and blocks[0].dtype == items[0].dtype:
                pass                                # one numpy block as it should be, at once
            else:
                kind, natives, targets, holds = inputs(job, blocks, outs)
            verdict = job.judge(natives, targets, extra)
        except (ValueError, MpiredistError) as exc:
            error = exc
    same = job.same_host
    if same is None or kind is not HOST and job.every_holds:
        same = job.same(kind)
    flags = agree(group, job.what, error, same,
                  {"donate": verdict.donation.usable, "fits": verdict.fits, "holds": holds,
                   "host": kind is HOST or not holds})
    if job.donate and not flags["donate"] and not flags["fits"]:
        raise MemoryBudgetError(
            f"{job.name}: a donation was not honoured on some rank, and the run that "
            "copies instead does not fit the memory of every rank")
    if not job.every_holds and not flags["host"]:
        kind = agreed_kind(group, job.name, kind, holds)
    aware = False
    if kind is not HOST and kind.device:
        aware = gpu_aware(group, job.name)
    try:
        results = job.execute(natives, targets, kind, aware, flags, records, verdict)
    except BaseException as exc:        # data moves from here: a failure aborts
        if on_failure() == "raise":
            raise
        abort(group, job.name, exc)
    if kind is HOST:
        return [o if o is not None else r for o, r in zip(outs, results)]
    return [o if o is not None else (None if r is None else kind.wrap(r, i.dtype))
            for o, r, i in zip(outs, results, job.items)]


def inputs(job, blocks, outs):
    """``(library, natives, outs, holds)``: every item's block and ``out`` as
    native arrays of one library, checked against the item's shapes; ``holds``:
    this rank passed an array for every item it has a block of.  ShapeError
    names the item and this rank."""
    rank = group_rank = job.group.rank
    natives, targets, kinds, holds = [], [], set(), True
    for item, local, out in zip(job.items, blocks, outs):
        if out is None and type(local) is np.ndarray and local.shape == item.source_shape \
                and local.dtype == item.dtype:          # a numpy block as it should be
            natives.append(local)
            targets.append(None)
            kinds.add(HOST)
            continue
        try:
            k, local, out = native_pair(local, out, rank)
            if local is not None or out is not None:
                kinds.add(k)
            if item.source_shape is None:
                if local is not None:
                    raise ShapeError(f"rank {rank} is outside the source mesh: pass None "
                                     "as its block")
            elif local is None:
                raise ShapeError(f"rank {rank} is in the source mesh but passed None as "
                                 "its block")
            else:
                check_block(local, item.source_shape, item.dtype, rank)
            if out is not None:
                if item.target_shape is None:
                    raise ShapeError(f"rank {rank} is outside the target mesh: pass None "
                                     "as out")
                check_out(out, local, item.target_shape, item.dtype, rank, job.views)
            if local is None and item.source_shape is None and out is None \
                    and item.target_shape is not None:
                holds = False
        except (ValueError, MpiredistError) as exc:
            if item.name is None:
                raise
            raise type(exc)(f"item {item.name!r}: {exc}") from None
        natives.append(local)
        targets.append(out)
    if not kinds:
        holds = False
    if len(kinds) > 1:
        raise ShapeError(f"rank {group_rank}: the arrays are of different libraries: "
                         f"{sorted(map(str, kinds))}")
    return (kinds.pop() if kinds else HOST), natives, targets, holds


def native_pair(local, out, rank):
    """``(backend, local, out)``: the caller's arrays as numpy or CuPy views of the
    same memory (:mod:`mpiredist.core.backend`); ShapeError for arrays of no
    library, a tensor that requires grad, or ``out`` of another library."""
    if type(local) is np.ndarray and (out is None or type(out) is np.ndarray):
        return HOST, local, out                     # numpy arrays as they are, at once
    kind = None if local is None else backend_of(local, f"rank {rank}: local block")
    if out is not None:
        theirs = backend_of(out, f"rank {rank}: out")
        if kind is not None and theirs != kind:
            raise ShapeError(f"rank {rank}: out is a {theirs} array but the block is a "
                             f"{kind} array")
        kind, out = kind or theirs, theirs.native(out, f"rank {rank}: out")
    if local is not None:
        local = kind.native(local, f"rank {rank}: local block")
    return kind or HOST, local, out


# the backends a rank without arrays can take by name (between meshes)
_BY_NAME = {str(b): b for b in (Backend("torch", False), Backend("torch", True),
                                Backend("cupy", True), Backend("cuda", True))}


def agreed_kind(group, what, kind, holds):
    """Between meshes: the one library of the ranks that hold arrays (an
    allgather of its name, after the agreement, collective); ShapeError on
    every rank when they differ.  A rank with no array (``holds`` False)
    takes that library (a host DLPack library: numpy)."""
    names = group.allgather_object(str(kind) if holds else None)
    found = sorted({n for n in names if n is not None})
    if len(found) > 1:
        first = {n: names.index(n) for n in found}
        raise ShapeError(f"{what}: ranks pass arrays of different libraries: "
                         + ", ".join(f"rank {r}: {n}" for n, r in sorted(
                             first.items(), key=lambda x: x[1])))
    if not holds and found:
        kind = _BY_NAME.get(found[0], kind)
    return kind


def _unchecked(job, blocks, outs, records, agreed=None):
    """A run without an agreement of its own: ``checked=False``, or arguments the
    entry point agreed on (``agreed``: the array library of every rank).

    A rank whose arrays are wrong still takes part, with zeros of the right
    shape, so that no rank waits for it; then it raises.  The other ranks
    cannot know: their results are undefined then.
    """
    kind = HOST if agreed is None else agreed
    try:
        if job.freed:
            job.closed()
        mine, natives, targets, _ = inputs(job, blocks, outs)
        if agreed is None and mine is not HOST:     # the path must not depend on it
            raise ShapeError(f"rank {job.group.rank}: checked=False runs take host "
                             f"arrays, found a {mine} array")
    except (ValueError, MpiredistError):
        if not job.freed and agreed is None:
            zeros = [None if i.source_shape is None else np.zeros(i.source_shape, i.dtype)
                     for i in job.items]
            job.execute(zeros, [None] * len(zeros), HOST, False, _UNCHECKED, None, KEPT)
        raise
    aware = False
    if kind is not HOST and kind.device:
        aware = gpu_aware(job.group, job.name)
    try:
        results = job.execute(natives, targets, kind, aware, _UNCHECKED, records, KEPT)
    except BaseException as exc:
        if on_failure() == "raise":
            raise
        abort(job.group, job.name, exc)
    if kind is HOST:
        return [o if o is not None else r for o, r in zip(outs, results)]
    return [o if o is not None else (None if r is None else kind.wrap(r, i.dtype))
            for o, r, i in zip(outs, results, job.items)]


_UNCHECKED = {"donate": False, "fits": True, "holds": True, "host": True}
