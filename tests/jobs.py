"""What the tests that start MPI jobs of their own share.

:data:`MPIEXEC`: the ``mpiexec`` next to this Python (the venv's MPI), else
the first on ``PATH``, else None.  :func:`job_env`: the environment of such a
job -- this checkout first on ``PYTHONPATH``, and, when the ranks outnumber
the cores, the same yield settings as ``mpi_oversubscription_env`` in
``scripts/common.sh`` (MPICH's heavy yield, Open MPI's yield when idle, Intel
MPI's sleeping yield; see there for the measurements).  A value already in the environment wins.
"""

import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = shutil.which("mpiexec", path=os.pathsep.join(
    [str(Path(sys.executable).parent), os.environ.get("PATH", "")]))

YIELD = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1", "OMPI_MCA_mpi_yield_when_idle": "1",
         "I_MPI_THREAD_YIELD": "3"}


def job_env(ranks, **extra):
    """``os.environ`` for a job of ``ranks`` ranks, with ``extra`` set."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.update(extra)
    if ranks > (os.cpu_count() or 1):
        for name, value in YIELD.items():
            env.setdefault(name, value)
    return env
