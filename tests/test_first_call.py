"""The first call in a fresh process stays within max(S, T) + W (tracemalloc).

Each route runs in a fresh ``mpiexec -n 4`` job of ``tests/first_call.py``
(128 KiB blocks: the bound is 1.16 MiB, and a call that imported modules or
built tables inside it would pass it, as the first call did before
everything it needs was imported by ``import mpiredist``).  Serial suite:
the test launches the job itself and skips, saying why, without a launcher.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "tests" / "first_call.py"
LAUNCHER = shutil.which("mpiexec", path=os.pathsep.join(
    [str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


@pytest.mark.skipif(LAUNCHER is None, reason="no mpiexec next to this Python or on PATH")
@pytest.mark.parametrize("route", ["redistribute", "transfer", "distarray", "between"])
def test_first_call_within_the_bound(route):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    if os.cpu_count() < 4:
        env.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
    done = subprocess.run([LAUNCHER, "-n", "4", sys.executable, str(PROBE), route],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["route"] == route and got["ranks"] == 4
    assert 0 < got["E"] <= got["bound"], f"{route}: E = {got['E']} B > {got['bound']} B"
