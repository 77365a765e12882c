"""What a failure after data started to move does: abort the job, loudly.

Before the ranks agree, a problem raises on every rank (:mod:`mpiredist.runtime.agree`).
After it, the ranks are inside a sequence of collectives and messages; an
exception on one rank (an MPI error, a ``MemoryError`` while packing, a
``KeyboardInterrupt``, a bug) would leave the others waiting forever.  So
:func:`guard` catches any exception escaping such a run, writes one message
to stderr naming the rank, the call, the step and the exception (with its
traceback), and calls ``MPI_Abort`` on the communicator: the launcher then
ends the whole job (``mpiexec``, ``mpirun``; under Slurm also with
``srun --kill-on-bad-exit``), as ``python -m mpi4py`` does for an uncaught
exception.

``MPIREDIST_ON_FAILURE=raise`` keeps the exception instead, for programs
that handle failures themselves (ULFM, tests): the other ranks are then
the program's business.

:func:`abort_on_exception` does the same for a whole program (the
benchmark's and the CLI's entry points).

Tests only: ``MPIREDIST_FAULT="RANK:STEP[:KIND[:RUN]]"`` raises ``KIND``
(``error``, the default: a ``RuntimeError``; ``memory``: a
``MemoryError``; ``interrupt``: a ``KeyboardInterrupt``) on rank ``RANK``
when run number ``RUN`` (default 0, the first) of a Transfer starts step
``STEP`` (read when the Transfer's context is made).
"""

import os
import sys
import traceback

__all__ = ["ENV", "FAULT_ENV", "on_failure", "guard", "abort_on_exception", "fault", "inject"]

ENV = "MPIREDIST_ON_FAILURE"
FAULT_ENV = "MPIREDIST_FAULT"
_KINDS = {"error": RuntimeError, "memory": MemoryError, "interrupt": KeyboardInterrupt}


def on_failure():
    """``"abort"`` (the default) or ``"raise"``: what a failure after agreeing does."""
    value = os.environ.get(ENV, "abort").strip().lower() or "abort"
    if value not in ("abort", "raise"):
        raise ValueError(f"{ENV}={value!r}: expected 'abort' or 'raise'")
    return value


def _where(exc):
    """The step a run was in when ``exc`` escaped it (set by the steps' loop)."""
    return getattr(exc, "mpiredist_step", None)


def guard(comm, what, run, *args):
    """``run(*args)``, aborting the job on ``comm`` if it raises (see module doc)."""
    try:
        return run(*args)
    except BaseException as exc:
        if on_failure() == "raise":
            raise
        abort(comm, what, exc)
        raise                                           # MPI_Abort returned: should not


def abort(comm, what, exc, code=1):
    """Write what failed where, then ``MPI_Abort`` on ``comm`` (never returns normally)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    step = _where(exc)
    where = f", step {step}" if step else ""
    lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    sys.stderr.write(f"mpiredist: rank {rank} of {size} failed in {what}{where} after data "
                     f"started to move: {type(exc).__name__}: {exc}\n{lines}"
                     f"mpiredist: aborting the job so that no rank waits for rank {rank} "
                     f"({ENV}=raise keeps the exception instead)\n")
    sys.stderr.flush()
    comm.Abort(code)


def abort_on_exception(main, *args, **kwargs):
    """Run an entry point's ``main``; an uncaught exception on any rank aborts the
    whole job on ``MPI.COMM_WORLD`` (where MPI is in use), as ``python -m
    mpi4py`` does.  ``SystemExit`` passes (an exit status is not a failure)."""
    try:
        return main(*args, **kwargs)
    except SystemExit:
        raise
    except BaseException as exc:
        MPI = sys.modules.get("mpi4py.MPI")
        if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized() \
                or on_failure() == "raise":
            raise
        abort(MPI.COMM_WORLD, getattr(main, "__module__", "main"), exc)
        raise


def fault(rank):
    """The injected fault of this rank from ``MPIREDIST_FAULT``: ``[run, step,
    exception class, runs seen]`` or None (tests only, see the module doc)."""
    spec = os.environ.get(FAULT_ENV, "").strip()
    if not spec:
        return None
    parts = spec.split(":")
    try:
        who, step = int(parts[0]), int(parts[1])
        kind = _KINDS[parts[2] if len(parts) > 2 and parts[2] else "error"]
        run = int(parts[3]) if len(parts) > 3 else 0
    except (ValueError, IndexError, KeyError):
        raise ValueError(f"{FAULT_ENV}={spec!r}: expected "
                         "RANK:STEP[:error|memory|interrupt[:RUN]]") from None
    return [run, step, kind, -1] if who == rank else None


def inject(planned, index):
    """Raise the planned fault if this is its run and step (a no-op without one);
    counts the runs (at step 0)."""
    if planned is None:
        return
    if index == 0:
        planned[3] += 1                 # runs started
    run, step, kind, seen = planned
    if seen == run and step == index:
        raise kind(f"fault injected by {FAULT_ENV} at run {run}, step {index}")
