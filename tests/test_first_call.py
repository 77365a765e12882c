"""The first call in a fresh process stays within max(S, T) + W (tracemalloc).

Each route runs in a fresh ``mpiexec -n 4`` job of ``tests/first_call.py``
(128 KiB blocks: the bound is 1.16 MiB, and a call that imported modules or
built tables inside it would pass it, as the first call did before
everything it needs was imported by ``import mpiredist``).  Serial suite:
the test launches the job itself and skips, saying why, without a launcher.
"""

import json
import subprocess
import sys

import pytest
from jobs import MPIEXEC, ROOT, job_env

PROBE = ROOT / "tests" / "first_call.py"


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec next to this Python or on PATH")
@pytest.mark.parametrize("route", ["redistribute", "transfer", "distarray", "between"])
def test_first_call_within_the_bound(route):
    env = job_env(4)
    done = subprocess.run([MPIEXEC, "-n", "4", sys.executable, str(PROBE), route],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["route"] == route and got["ranks"] == 4
    assert 0 < got["E"] <= got["bound"], f"{route}: E = {got['E']} B > {got['bound']} B"
