"""A failure on one worker after data started to move ends a torchrun job.

Each case runs ``tests/torchrun_probe.py`` in a fresh torchrun job of 4
workers over gloo (no MPI): an exception injected inside mpiredist on one
worker (``MPIREDIST_FAULT``) ends the job with a message naming the rank
and the step, and a worker killed with SIGKILL ends it too; never a hang
(every job must end within 60 s: torchrun's agent stops the other workers
once one exits with an error, and peers inside a gloo collective fail at
once when a peer's connections close).  Skipped where torchrun is missing.
"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBE = str(ROOT / "tests" / "torchrun_probe.py")
TORCHRUN = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or \
    shutil.which("torchrun")
LIMIT = 60

pytestmark = pytest.mark.skipif(TORCHRUN is None, reason="no torchrun next to this Python")


def _job(mode, **env):
    environ = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        environ.pop(name, None)
    t0 = time.monotonic()
    done = subprocess.run([TORCHRUN, "--nproc-per-node", "4", "--monitor-interval", "0.1",
                           PROBE, mode], capture_output=True, text=True, env=environ,
                          cwd=ROOT, timeout=LIMIT + 60)
    return time.monotonic() - t0, done.returncode, done.stdout + done.stderr


def test_a_fault_inside_a_run_ends_the_job_naming_the_rank_and_step():
    seconds, status, out = _job("fault", MPIREDIST_FAULT="2:0:error:5")
    assert status != 0, out[-3000:]
    assert seconds < LIMIT, f"the job took {seconds:.0f} s to end"
    assert "mpiredist: rank 2 of 4 failed in" in out and "step 0 (all_to_all" in out, \
        out[-3000:]
    assert "done" not in out


def test_a_worker_killed_with_sigkill_ends_the_job():
    seconds, status, out = _job("sigkill")
    assert status != 0 and "done" not in out, out[-3000:]
    assert seconds < LIMIT, f"the job took {seconds:.0f} s to end"
