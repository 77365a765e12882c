"""A failure on one rank after data started to move ends the whole job, loudly.

Each case runs ``tests/failure_probe.py`` in a fresh job of 4 ranks under
the launcher ``MPIREDIST_FAILURE_LAUNCHER`` (a command prefix; default the
``mpiexec`` next to this Python, i.e. the venv's MPICH; CI also runs these
tests under Open MPI's ``mpiexec --oversubscribe`` and ``srun
--kill-on-bad-exit``).  A fault injected inside mpiredist on one rank
(``MPIREDIST_FAULT``: an exception, a ``MemoryError``, a
``KeyboardInterrupt``) aborts the job with a message naming the rank and
the step; a rank killed with SIGKILL ends the job; with
``MPIREDIST_ON_FAILURE=raise`` the exception reaches the caller on that
rank; the user's own exception between runs ends the job under
``python -m mpi4py``.  Every job must end within 30 s.  A real memory
limit -- ``ulimit -v`` (``RLIMIT_AS``), and a cgroup where this process may
make one (root, a writable memory controller) -- makes every rank raise
``MemoryBudgetError`` before data moves.
"""

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from jobs import MPIEXEC, ROOT, job_env

PROBE = str(ROOT / "tests" / "failure_probe.py")
LAUNCHER = shlex.split(os.environ.get("MPIREDIST_FAILURE_LAUNCHER", "")) or (
    [MPIEXEC] if MPIEXEC else None)
LIMIT = 30          # seconds a failed job may take to end
COUNT = None if LAUNCHER is None else (
    ["--ntasks=4"] if "srun" in Path(LAUNCHER[0]).name else ["-n", "4"])

pytestmark = pytest.mark.skipif(LAUNCHER is None,
                                reason="no mpiexec next to this Python or on PATH")


SHM = Path("/dev/shm")


def _segments():
    return set(SHM.glob("mpich_shm_*")) if SHM.is_dir() else set()


def _mapped():
    """Paths of /dev/shm that some process has mapped."""
    found = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            found.update(line.split()[-1] for line in maps.read_text().splitlines()
                         if "/dev/shm/" in line)
        except OSError:
            continue
    return found


def _remove_leaked(before):
    """Unlink the MPICH shared-memory segments an aborted job left behind.

    MPICH names them after the job (under Slurm, after the job id, which a
    fresh slurmctld counts from 1 again): a segment left by a killed job
    would be opened by a later job of the same id and break its MPI_Init
    ("Message truncated").  Only segments made during the job and mapped by
    no process are removed.
    """
    new = _segments() - before
    for _ in range(30):                 # the killed ranks may still be exiting
        if not new:
            return
        mapped = _mapped()
        for path in list(new):
            if str(path) not in mapped:
                path.unlink(missing_ok=True)
                new.discard(path)
        time.sleep(0.1)


def _job(mode, python_args=(), once_more=False, **env):
    """``(seconds, status, output)`` of the probe in a fresh 4-rank job.

    A launcher drops what an aborted rank left in its stderr pipe: before
    mpiredist waited for its message to leave the pipe, MPICH's mpiexec
    printed nothing at all for 5 of 36 aborted jobs here.  mpiredist's abort
    and the probe's own now wait, so a silent job fails the test; only
    ``once_more`` (for mpi4py's abort, which does not wait) runs a job that
    failed with no output once more.
    """
    environ = job_env(4, **env)
    for attempt in range(2 if once_more else 1):
        before = _segments()
        t0 = time.monotonic()
        try:
            done = subprocess.run([*LAUNCHER, *COUNT, sys.executable, *python_args, PROBE,
                                   mode], capture_output=True, text=True, env=environ,
                                  cwd=ROOT, timeout=LIMIT + 60)
        finally:
            _remove_leaked(before)
        out = done.stdout + done.stderr
        if done.returncode == 0 or out.strip():
            break
        print(f"_job({mode!r}): the launcher failed with status {done.returncode} and no "
              "output", file=sys.stderr)
    return time.monotonic() - t0, done.returncode, out


@pytest.mark.parametrize("kind, name", [("error", "RuntimeError"), ("memory", "MemoryError"),
                                        ("interrupt", "KeyboardInterrupt")])
def test_a_fault_inside_a_run_aborts_the_job_naming_the_rank_and_step(kind, name):
    # PYTHONUNBUFFERED empty: the ranks' stdout block-buffered, as without a terminal
    seconds, status, out = _job("fault", MPIREDIST_FAULT=f"2:0:{kind}:5", PYTHONUNBUFFERED="")
    assert status != 0, out[-3000:]
    assert seconds < LIMIT, f"the job took {seconds:.0f} s to end"
    assert "mpiredist: rank 2 of 4 failed in" in out and "step 0 (all_to_all" in out, out[-3000:]
    assert name in out and "done" not in out
    assert "caught" not in out          # no code of the program ran after the abort
    assert "rank 2 starts" in out       # its own output, unflushed, was flushed


def test_a_rank_killed_with_sigkill_ends_the_job():
    seconds, status, out = _job("sigkill")
    assert status != 0 and "done" not in out, out[-3000:]
    assert seconds < LIMIT, f"the job took {seconds:.0f} s to end"


def test_on_failure_raise_keeps_the_exception_on_that_rank():
    seconds, status, out = _job("fault", MPIREDIST_FAULT="2:0:error:5",
                                MPIREDIST_ON_FAILURE="raise")
    assert "rank 2 caught RuntimeError: fault injected" in out, out[-3000:]
    assert "failed in" not in out                    # no abort by mpiredist
    assert status != 0 and seconds < LIMIT


def test_a_users_exception_between_runs_ends_the_job_under_python_m_mpi4py():
    seconds, status, out = _job("between", ("-m", "mpi4py"), once_more=True)
    assert status != 0 and "the user's own error between two runs" in out, out[-3000:]
    assert seconds < LIMIT, f"the job took {seconds:.0f} s to end"


def test_finalize_with_live_transfers_does_not_crash():
    seconds, status, out = _job("finalize")
    assert status == 0 and "done" in out, out[-3000:]


def _budget_errors(out):
    """The MemoryBudgetError messages printed (ranks' lines may run together)."""
    return [part.split(" (also on")[0] for part in out.split("MemoryBudgetError: ")[1:]]


def test_under_ulimit_v_every_rank_raises_memory_budget_error():
    seconds, status, out = _job("limited", MPIREDIST_PROBE_ULIMIT="1")
    found = _budget_errors(out)
    assert status == 0 and len(found) == 4 and " ran\n" not in out, out[-3000:]
    assert all("(ulimit -v)" in line for line in found), found


def _cgroup_dir():
    """A new memory cgroup below this process's own (v1 or v2), or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory" + path)
        elif hid == "0":
            base = Path("/sys/fs/cgroup" + path)
            if not (base / "memory.max").exists():
                continue
        else:
            continue
        mine = base / f"mpiredist-test-{os.getpid()}"
        try:
            mine.mkdir()
        except OSError:
            return None
        return mine
    return None


def test_in_a_cgroup_every_rank_raises_memory_budget_error():
    group = _cgroup_dir()
    if group is None:
        pytest.skip("no memory cgroup can be made here (needs root and a writable "
                    "memory controller)")
    try:
        limit = group / ("memory.limit_in_bytes" if (group / "memory.limit_in_bytes").exists()
                         else "memory.max")
        # 4 ranks of about 230 MiB each (a 160 MiB block): some 100 MiB left each
        limit.write_text(str(1280 << 20))
        environ = job_env(4)
        script = 'echo $$ > "$0/cgroup.procs" && exec "$@"'
        done = subprocess.run(["bash", "-c", script, str(group), *LAUNCHER, *COUNT,
                               sys.executable, PROBE, "limited"], capture_output=True,
                              text=True, env=environ, cwd=ROOT, timeout=LIMIT + 60)
        out = done.stdout + done.stderr
        found = _budget_errors(out)
        # what the ranks allocated at start decides how much is left: either
        # every rank raised (the cgroup named), or the limit left room for all
        assert done.returncode == 0, out[-3000:]
        assert len(found) == 4 or out.count(" ran\n") == 4, out[-3000:]
        assert all("the cgroup's memory limit" in line for line in found), found
        if not found:
            pytest.skip("the cgroup left room for every rank's run on this machine")
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
