"""What a failure after data started to move does: abort the job, loudly.

Before the ranks agree, a problem raises on every rank (:mod:`mpiredist.runtime.agree`).
After it, the ranks are inside a sequence of collectives and messages; an
exception on one rank (an MPI error, a ``MemoryError`` while packing, a
``KeyboardInterrupt``, a bug) would leave the others waiting forever.  So
:func:`guard` catches any exception escaping such a run, writes one message
to stderr naming the rank, the call, the step and the exception (with its
traceback), flushes stdout and stderr and waits until the launcher has read
them, and aborts the group (:meth:`Group.abort
<mpiredist.runtime.transport.Group.abort>`: ``MPI_Abort`` over MPI): the
launcher then ends the whole job (``mpiexec``, ``mpirun``; under Slurm also
with ``srun --kill-on-bad-exit``), as ``python -m mpi4py`` does for an
uncaught exception.  The rank never returns to the program.

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
import stat
import sys
import time
import traceback

__all__ = ["ENV", "FAULT_ENV", "on_failure", "guard", "abort", "delivered", "abort_on_exception",
           "fault", "inject"]

ENV = "MPIREDIST_ON_FAILURE"
FAULT_ENV = "MPIREDIST_FAULT"
WAIT = 2.0          # seconds an aborting rank waits at most for its output to be read
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


def guard(group, what, run, *args):
    """``run(*args)``, aborting the job on ``group`` if it raises (see module doc)."""
    try:
        return run(*args)
    except BaseException as exc:
        if on_failure() == "raise":
            raise
        abort(group, what, exc)


def abort(group, what, exc, code=1):
    """Write what failed where, flush stdout and stderr and wait (at most 2 s in
    all) until the launcher has read them (:func:`delivered`), then abort
    ``group`` (:meth:`~mpiredist.runtime.transport.Group.abort`); never returns."""
    rank, size = group.rank, group.size
    step = _where(exc)
    where = f", step {step}" if step else ""
    lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    sys.stderr.write(f"mpiredist: rank {rank} of {size} failed in {what}{where} after data "
                     f"started to move: {type(exc).__name__}: {exc}\n{lines}"
                     f"mpiredist: aborting the job so that no rank waits for rank {rank} "
                     f"({ENV}=raise keeps the exception instead)\n")
    # the program's own output too: a pipe's stdout is block-buffered, and the
    # abort ends the process without flushing it
    deadline = time.monotonic() + WAIT
    for stream in (sys.stdout, sys.stderr):
        delivered(stream, deadline - time.monotonic())
    group.abort(code)
    os._exit(code)          # a transport's abort never returns; should one, end here


def delivered(stream, wait=WAIT):
    """Flush ``stream``, then wait until its reader has taken what was written
    to it, at most ``wait`` seconds; True if it has (or nothing can tell: a
    closed stream, or None where a program replaced it).

    A launcher reads each rank's stderr from a pipe (``mpiexec``'s proxy,
    ``srun``'s step daemon).  When a rank calls ``MPI_Abort`` the launcher kills
    the job, and what still sits in that pipe is lost: without this wait
    MPICH's ``mpiexec`` printed nothing at all in 4 of 30 aborted 4-rank jobs
    on 2 cores.  Linux tells a pipe's writer how many bytes are still unread
    (``FIONREAD``); anything but a pipe (a terminal, a file) is not waited for.
    """
    try:
        stream.flush()
        fd = stream.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return True
        import fcntl
        import termios
        unread = bytearray(4)
        deadline = time.monotonic() + wait
        while True:
            fcntl.ioctl(fd, termios.FIONREAD, unread)
            if not int.from_bytes(unread, sys.byteorder):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
    except (OSError, ValueError, AttributeError, ImportError):
        return True


def abort_on_exception(main, *args, **kwargs):
    """Run an entry point's ``main``; an uncaught exception on any rank aborts the
    whole job on ``MPI.COMM_WORLD`` (where MPI is in use), as ``python -m
    mpi4py`` does.  ``SystemExit`` passes (an exit status is not a failure)."""
    try:
        return main(*args, **kwargs)
    except SystemExit:
        raise
    except BaseException as exc:
        MPI = sys.modules.get("mpi4py.MPI")     # not imported here: in use or not
        if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized() \
                or on_failure() == "raise":
            raise
        from .mpi import world
        abort(world(), getattr(main, "__module__", "main"), exc)


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
