"""The call path of a warm DistArray.redistribute: at most 30 named functions in
at most 10 modules of mpiredist before the first MPI call that moves data.

The one run path keeps the hot path short (docs/architecture.md lists it); a
change that adds hops or modules to it shows here.  The probe
(``tests/callpath.py``) runs in a fresh ``mpiexec -n 2`` job; the serial
suite skips, saying why, without a launcher.
"""

import json
import subprocess
import sys

import pytest
from jobs import MPIEXEC, ROOT, job_env

PROBE = ROOT / "tests" / "callpath.py"


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec next to this Python or on PATH")
def test_a_warm_redistribute_reaches_mpi_in_few_hops():
    done = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(PROBE)],
                          capture_output=True, text=True, env=job_env(2), cwd=ROOT,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert "Alltoall" in got["call"], got            # it reached the data call
    assert got["functions"] <= 30 and len(got["modules"]) <= 10, got
